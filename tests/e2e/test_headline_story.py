"""End to end: the headline story, reduced (a Freeze on vm0 and vm1, then a Reboot of vm2), once per strategy.

Real processes: the simulator with real impacts (the Freeze pauses the app servers and agents of vm0 and
vm1, the Reboot kills vm2's and the story restarts them once the simulator says vm2 is back), HAProxy
whose health check is each VM's probe, a load of 20 requests/s through it, and for ``coordinated`` the
agents on the session's ZooKeeper. Notices run 120 times faster (15 minutes last 7.5 s), enough for a
drain of 1.5 s. What must hold whatever the timing:

* coordinated: every event approved early (the default policy allows both), after its VMs drained, so
  no request failed while an event's impact was on;
* admin-state: the same, and the VMs are also drained through the load balancer's admin state: the
  simulated ARM applies each write to HAProxy (none failed), every VM named was out of HAProxy's rotation
  before its event started, and no address is left ``Down`` at the end;
* wait: no approval was ever sent; every event started at its NotBefore;
* self-approve: the approvals came from the VMs the events name; the Freeze was approved before its VMs
  could drain, so requests failed while it was on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.testbed.story import StoryConfig, StoryOutcome, run_story

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

CONFIG = StoryConfig(time_scale=120.0, steps=("freeze", "reboot"), reboot_vms=("vm2",), timeout=120.0)


def play(tmp_path: Path, strategy: str, zk_hosts: str) -> StoryOutcome:
    outcome = run_story(tmp_path / strategy, strategy, CONFIG, zk_hosts=zk_hosts)
    assert [(e.step, e.event_type, e.resources) for e in outcome.events] == [
        ("freeze", "Freeze", ["vm0", "vm1"]), ("reboot", "Reboot", ["vm2"])]
    assert all(e.started_t is not None and e.removed_t is not None for e in outcome.events)
    assert outcome.sent > 0
    return outcome


def test_coordinated_approves_every_event_early_and_loses_no_request_to_an_impact(
        tmp_path: Path, zk_hosts: str) -> None:
    outcome = play(tmp_path, "coordinated", zk_hosts)
    for event in outcome.events:
        assert event.start_reason == "approved", event
        assert event.reclaimed > 0, event
        assert len(event.approved_by) == 1, event
        assert outcome.drained_before_start[event.event_id]
        assert event.failed_during_impact == 0, (event, outcome.failed)


def test_admin_state_drains_through_the_lb_and_leaves_no_vm_down(tmp_path: Path, zk_hosts: str) -> None:
    outcome = play(tmp_path, "admin-state", zk_hosts)
    for event in outcome.events:
        assert event.start_reason == "approved", event
        assert event.drained_t is not None and event.to_drained is not None, event  # out before the start
        assert event.failed_during_impact == 0, (event, outcome.failed)
    assert outcome.pool_at_end == {"vm0": "None", "vm1": "None", "vm2": "None"}
    assert outcome.left_down == []
    assert outcome.data_plane is not None and outcome.data_plane["failed"] == 0, outcome.data_plane
    named = sum(len(e.resources) for e in outcome.events)
    assert outcome.data_plane["applied"] >= 2 * named, outcome.data_plane  # Down, then None, per VM named


def test_wait_never_approves_and_every_event_starts_at_not_before(tmp_path: Path, zk_hosts: str) -> None:
    outcome = play(tmp_path, "wait", zk_hosts)
    assert outcome.approvals == []
    for event in outcome.events:
        assert event.start_reason == "not_before", event
        assert event.started_sim_t is not None and event.not_before is not None
        assert event.started_sim_t >= event.not_before


def test_self_approve_approves_from_the_named_vms_and_the_freeze_hits_them_undrained(
        tmp_path: Path, zk_hosts: str) -> None:
    outcome = play(tmp_path, "self-approve", zk_hosts)
    assert outcome.approvals
    resources = {e.event_id: {r.lower() for r in e.resources} for e in outcome.events}
    for approval in outcome.approvals:
        for event_id in approval["accepted"]:
            assert approval["vm"].lower() in resources[event_id], approval
    freeze, reboot = outcome.events
    assert freeze.start_reason == reboot.start_reason == "approved"
    assert freeze.started_t is not None and freeze.started_t - freeze.created_t < CONFIG.drain_wait
    assert freeze.failed_during_impact > 0, outcome.failed
