"""The demo's default time scale leaves every event of its story time to drain."""

from __future__ import annotations

import argparse

from coordinator.sim.catalogue import MINIMUM_NOTICE
from coordinator.testbed.demo import DEMO_TIME_SCALE, add_arguments

# What a drain takes in the demo besides the drain wait: the agent's next poll (0.5 s), the leader's
# admission and the approval on a fresh document; measured at about 1 s on a 2-core machine.
_DETECT_AND_APPROVE = 1.0
_STORY_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt")


def test_every_notice_of_the_story_outlasts_its_drain_at_the_default_scale() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.time_scale == DEMO_TIME_SCALE
    needed = args.drain_wait + _DETECT_AND_APPROVE
    for event_type in _STORY_TYPES:
        real = MINIMUM_NOTICE[event_type] / args.time_scale
        assert real >= 2 * needed, f"{event_type}: {real:.1f} real s of notice for a {needed:.1f} s drain"
