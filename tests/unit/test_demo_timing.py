"""The demo's default time scale leaves every event of its story time to drain, and its verdict judges the
product's two halves: no request failed where a drain was possible, and no event started late that the policy
let start early."""

from __future__ import annotations

import argparse

from azuresim.catalogue import MINIMUM_NOTICE
from coordinator.testbed.demo import DEMO_TIME_SCALE, add_arguments, verdict
from coordinator.testbed.story import EventOutcome, StoryConfig, StoryOutcome

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


def _outcome(*events: EventOutcome) -> StoryOutcome:
    outcome = StoryOutcome("coordinated", DEMO_TIME_SCALE, sent=100, events=list(events))
    outcome.drained_before_start = {e.event_id: True for e in events}
    return outcome


def _event(eid: str, start_reason: str, waited_by: str | None = None, *reasons: str) -> EventOutcome:
    return EventOutcome("reboot", "Reboot", eid, ["vm2"], 0.0, 0.0, 900.0, started_t=10.0, started_sim_t=60.0,
                        start_reason=start_reason, waited_by=waited_by, waited_for=list(reasons))


def test_the_demo_fails_on_an_event_the_policy_let_start_early_that_waited_for_its_not_before() -> None:
    config = StoryConfig()
    ok, text = verdict(_outcome(_event("E1", "approved")), config)
    assert ok and text.startswith("demo: OK")
    held = _event("E2", "not_before", "vm1", "maintenance budget: 1 event(s) in maintenance (E0)")
    ok, text = verdict(_outcome(_event("E1", "approved"), held), config)
    assert not ok and "E2 (vm1: maintenance budget: 1 event(s) in maintenance (E0))" in text
    ok, text = verdict(_outcome(_event("E3", "not_before")), config)
    assert not ok and "no agent recorded why" in text


def test_an_event_the_policy_never_approves_early_may_wait_for_its_not_before() -> None:
    never = _event("E4", "not_before", "vm2", "policy: Redeploy events are never approved early")
    assert not never.missed
    assert verdict(_outcome(never), StoryConfig())[0]
