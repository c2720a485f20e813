"""A dry run says what it would do once per planned action, not every cycle: nothing it would write is
ever written, so the decision plans the same writes again each cycle."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from coordinator.dryrun import Planned
from tests.unit.test_safety_regressions import AT_ONCE, Bench, E


def _said(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    return Counter(r.getMessage() for r in caplog.records
                   if r.name == "coordinator.dryrun" and r.getMessage().startswith("dry-run: would"))


def test_each_planned_write_is_said_once_while_it_stays_planned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    bench = Bench(tmp_path, AT_ONCE)
    bench.add("vm1")
    bench.add("vm2")
    bench.add("vm0", dry_run=True)
    bench.group.schedule(E, ["vm0"], in_s=100)  # within latest_start: vm0 drains, and would stay out
    bench.run(40)
    said = _said(caplog)
    assert said[f"dry-run: would mark vm0 out of rotation for {E}"] == 1  # planned in each of ~40 cycles
    assert said[f"dry-run: would acknowledge event {E} for vm0"] == 1
    assert all(count == 1 for count in said.values()), said
    caplog.clear()
    bench.group.remove(E)
    bench.run(20)
    said = _said(caplog)
    # Its words changed (no event any more): said again, once; the withdrawal too.
    assert said == Counter({"dry-run: would mark vm0 out of rotation while it starts (the budget counts it "
                            "serving once its return wait ends)": 1,
                            f"dry-run: would withdraw the ack of vm0 for event {E}": 1,
                            "dry-run: would save the drain state drained": 1,
                            "dry-run: would save the drain state recovering": 1,
                            "dry-run: would save the drain state serving": 1})


def test_an_action_is_said_again_when_it_changes_or_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    planned = Planned()
    cycles = [["a"], ["a"], ["a", "b"], ["b"], [], ["b"], ["a2"], ["a2"]]
    for said in cycles:
        planned.next_cycle()
        for message in said:
            planned.say(("approve", message[0]), message)
            planned.say(("approve", message[0]), message)  # twice in one cycle: still once
    assert [r.getMessage() for r in caplog.records] == [
        "dry-run: a", "dry-run: b",  # new
        "dry-run: b",  # back after a cycle without it
        "dry-run: a2",  # same action, other words
    ]
