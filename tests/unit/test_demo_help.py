"""`coordinator demo --help` says what each strategy it offers does."""

from __future__ import annotations

import argparse

from coordinator.testbed.demo import add_arguments
from coordinator.testbed.story import STRATEGIES, StoryConfig


def test_the_help_explains_every_strategy() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "strategy")
    assert action.help is not None
    for strategy in STRATEGIES:
        assert f"{strategy}: " in action.help, f"--strategy help does not explain {strategy}"
    assert "backend pool" in action.help and f"{StoryConfig().admin_drain_wait:g} s" in action.help
