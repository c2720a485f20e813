"""What an operator sees of an agent: its metrics, its liveness and its readiness.

Real ``Agent`` objects on the fake ZooKeeper and a small IMDS group driven by the test (the bench of
``tests/unit/test_safety_regressions.py``), with a fake clock and actions that run inline. Metrics are
read from each agent's own registry.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coordinator.actions.base import ActionContext
from coordinator.blockers import DECIDED, Hold
from coordinator.config import ApprovalRule
from coordinator.errors import ActionError
from coordinator.metrics import BLOCKED_REASONS, EventRow, Metrics
from tests.unit.test_safety_regressions import AT_ONCE, E2, POLICY, Bench, E, Vm

E3 = "0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0"


def registry(vm: Vm) -> CollectorRegistry:
    metrics: Metrics = vm.agent._metrics
    return metrics.registry


def value(vm: Vm, name: str, **labels: str) -> float | None:
    return registry(vm).get_sample_value(name, labels)


def three(tmp_path: Path, policy: Any = POLICY, **extra: Any) -> Bench:
    bench = Bench(tmp_path, policy)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name, extra=extra.get(name, ()))
    return bench


# --- once per drain, whatever IMDS does to the event id ------------------------------------------------

def test_a_drain_is_acknowledged_and_timed_once_however_often_imds_reissues_the_event_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0"], status="Started", in_s=None)  # being hit: no notice, no approval
    bench.run(20)
    assert "vm0" in bench.cluster.events[E].acks
    caplog.set_level(logging.WARNING)
    for old, new in ((E, E2), (E2, E3)):
        bench.group.remove(old)  # the same maintenance, re-issued under another id while Started
        bench.group.schedule(new, ["vm0"], status="Started", in_s=None)
        bench.run(20)
        assert "vm0" in bench.cluster.events[new].acks
    vm0 = bench.vms["vm0"]
    assert value(vm0, "coordinator_acknowledgements_total") == 1
    assert value(vm0, "coordinator_drain_duration_seconds_count") == 1
    assert value(vm0, "coordinator_event_id_changes_total") == 2
    assert value(bench.vms["vm1"], "coordinator_event_id_changes_total") == 0  # not named: not its drain
    changes = [r for r in caplog.records if "came back under a new id (vm=vm0" in r.getMessage()]
    assert [getattr(r, "event_id", None) for r in changes] == [E2, E3]
    assert f"was {E}" in changes[0].getMessage()


def test_a_new_drain_after_recovering_is_counted_again(tmp_path: Path) -> None:
    bench = three(tmp_path, AT_ONCE)
    bench.group.schedule(E, ["vm0", "vmx"])  # vmx runs no agent: vm0 drains at once, nobody approves
    bench.run(20)
    bench.group.remove(E)
    bench.run(30)
    assert bench.vms["vm0"].probe.serving
    bench.group.schedule(E2, ["vm0", "vmx"])
    bench.run(20)
    assert value(bench.vms["vm0"], "coordinator_acknowledgements_total") == 2
    assert value(bench.vms["vm0"], "coordinator_drain_duration_seconds_count") == 2


# --- approvals, and events that started without one ----------------------------------------------------

def test_approvals_are_counted_by_reason_with_the_notice_they_gave_back(tmp_path: Path) -> None:
    bench = three(tmp_path, replace(POLICY, approval={"Freeze": ApprovalRule.IMMEDIATELY}))
    bench.group.schedule(E2, ["vm1"], etype="Freeze", in_s=900)
    bench.run(10, until=lambda: bool(bench.group.approved(E2)))
    bench.group.remove(E2)  # started and over: out of the budget
    bench.run(10)
    bench.group.schedule(E, ["vm0"], in_s=900)
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    vm0, vm1 = bench.vms["vm0"], bench.vms["vm1"]
    assert value(vm1, "coordinator_approved_events_total", reason="immediately") == 1
    assert value(vm1, "coordinator_approved_events_total", reason="after_drain") == 0
    assert value(vm0, "coordinator_approved_events_total", reason="after_drain") == 1
    assert value(vm0, "coordinator_approved_events_total", reason="immediately") == 0
    immediate = value(vm1, "coordinator_notice_reclaimed_seconds_sum")
    after_drain = value(vm0, "coordinator_notice_reclaimed_seconds_sum")
    assert immediate is not None and 880 <= immediate <= 900  # once the group is serving, a few seconds in
    assert after_drain is not None and 850 <= after_drain <= 890  # after the 10 s drain wait and the acks
    assert value(vm0, "coordinator_notice_reclaimed_seconds_count") == 1
    assert value(vm0, "coordinator_events_started_unapproved_total") == 0  # approved: it started early


def test_an_event_that_started_at_not_before_without_approval_is_counted_by_the_vms_it_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0", "vmx"], in_s=60)  # vmx runs no agent: never approved early
    bench.run(10)
    caplog.set_level(logging.WARNING)
    bench.group.events[E].update(EventStatus="Started", NotBefore="")  # NotBefore came
    bench.run(3)
    assert not bench.group.approved(E)
    assert value(bench.vms["vm0"], "coordinator_events_started_unapproved_total") == 1
    assert value(bench.vms["vm1"], "coordinator_events_started_unapproved_total") == 0  # not named
    [line] = [r for r in caplog.records if "without this group's approval" in r.getMessage()]
    assert f"(vm=vm0 event={E})" in line.getMessage() and getattr(line, "event_id", None) == E


def test_an_event_a_peer_approved_while_this_agent_was_cut_off_is_not_called_unapproved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0", "vm1"], in_s=900)
    bench.run(60, until=lambda: E in bench.cluster.events and "vm1" in bench.cluster.events[E].acks)
    assert not bench.group.approved(E)
    vm1 = bench.vms["vm1"]
    caplog.set_level(logging.INFO)
    vm1.store.suspend()  # cut off, its session (and its ack) still alive on the ensemble
    bench.run(30, until=lambda: bool(bench.group.approved(E)))
    assert [vm for vm, ids, _ in bench.group.posts if E in ids] == ["vm0"]  # about 14 minutes before NotBefore
    bench.run(3)  # vm1 reads the event Started, without a view to read its approval from
    assert value(vm1, "coordinator_events_started_unapproved_total") == 0
    assert any(f"(vm=vm1 event={E}); whether this group approved it is not known yet" in r.getMessage()
               for r in caplog.records)
    vm1.store.expire_session()  # back, on a new session
    bench.run(3)
    assert value(vm1, "coordinator_events_started_unapproved_total") == 0
    assert not [r for r in caplog.records if "without this group's approval" in r.getMessage()]
    assert any(f"(vm=vm1 event={E}): approved by vm0" in r.getMessage() for r in caplog.records)


def test_an_event_that_started_unapproved_while_this_agent_was_cut_off_is_counted_once_the_view_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0", "vmx"], in_s=60)  # vmx runs no agent: never approved early
    bench.run(10)
    vm0 = bench.vms["vm0"]
    caplog.set_level(logging.INFO)
    vm0.store.suspend()
    bench.group.events[E].update(EventStatus="Started", NotBefore="")  # NotBefore came
    bench.run(3)
    assert value(vm0, "coordinator_events_started_unapproved_total") == 0  # not known yet
    assert not [r for r in caplog.records if "without this group's approval" in r.getMessage()]
    vm0.store.resume()
    bench.run(3)
    assert value(vm0, "coordinator_events_started_unapproved_total") == 1
    [line] = [r for r in caplog.records if "without this group's approval" in r.getMessage()]
    assert f"(vm=vm0 event={E})" in line.getMessage() and getattr(line, "event_id", None) == E


# --- what holds approvals back, and how soon it matters -------------------------------------------------

def test_blocked_events_are_counted_by_bounded_reason_and_detailed_while_present(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0", "vmx"], in_s=900)
    bench.run(3)
    vm0 = bench.vms["vm0"]
    for reason in ("no_agent", "not_acknowledged"):
        assert value(vm0, "coordinator_events_blocked", reason=reason) == 1, reason
    # vmx running no agent is why the leader does not admit it: said once, as no_agent.
    assert value(vm0, "coordinator_events_blocked", reason="not_admitted") == 0
    assert value(vm0, "coordinator_events_blocked", reason="other") is None  # no such label: every blocker has a kind
    detail = {"event_id": E, "type": "Reboot", "status": "Scheduled"}
    assert value(vm0, "coordinator_event_blocked", **detail, reason="no_agent") == 1
    assert value(vm0, "coordinator_event_named_vms", **detail) == 2
    assert value(vm0, "coordinator_event_acknowledged_vms", **detail) == 0
    assert value(vm0, "coordinator_event_approved", **detail) == 0
    assert value(vm0, "coordinator_event_not_before_timestamp_seconds", **detail) == pytest.approx(
        bench.clock.wall - 3 + 900, abs=1)
    bench.group.remove(E)
    bench.run(10)
    assert E not in generate_latest(registry(vm0)).decode()  # gone from the document, gone from the scrape
    assert value(vm0, "coordinator_events_blocked", reason="no_agent") == 0


def test_seconds_until_the_nearest_unapproved_not_before(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.run(2)
    vm0 = bench.vms["vm0"]
    nothing = value(vm0, "coordinator_next_unapproved_not_before_seconds")
    assert nothing is not None and math.isnan(nothing)
    bench.group.schedule(E2, ["vm1", "vmx"], in_s=1800)  # never approved early
    bench.group.schedule(E, ["vm0"], in_s=900)
    bench.run(1)
    assert value(vm0, "coordinator_next_unapproved_not_before_seconds") == pytest.approx(900, abs=1)
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    bench.run(2)
    left = value(vm0, "coordinator_next_unapproved_not_before_seconds")
    assert left is not None and 1700 < left < 1800  # E is approved: E2 is the nearest now


# --- ZooKeeper, cycles ----------------------------------------------------------------------------------

def test_zookeeper_session_losses_are_counted_even_when_the_loop_never_saw_lost(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.run(3)
    vm0 = bench.vms["vm0"]
    assert value(vm0, "coordinator_zookeeper_session_losses_total") == 0
    vm0.store.expire_session()  # LOST then CONNECTED again, between two cycles
    bench.run(2)
    assert value(vm0, "coordinator_zookeeper_session_losses_total") == 1
    vm0.store.partition()  # suspended, the ensemble expires the session ...
    bench.run(3)
    vm0.store.heal()  # ... and the client learns it: LOST
    bench.run(3)
    assert value(vm0, "coordinator_zookeeper_session_losses_total") == 2
    assert value(bench.vms["vm1"], "coordinator_zookeeper_session_losses_total") == 0


def test_a_zookeeper_disconnection_is_counted_each_time_the_connection_leaves_connected(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.run(3)
    vm0 = bench.vms["vm0"]
    assert value(vm0, "coordinator_zookeeper_disconnects_total") == 0  # exported at 0 from the start
    vm0.store.partition()  # suspended: one disconnection, however many cycles it lasts
    bench.run(3)
    assert value(vm0, "coordinator_zookeeper_disconnects_total") == 1
    vm0.store.heal()
    bench.run(2)
    vm0.store.partition()
    bench.run(1)
    vm0.store.heal()
    bench.run(2)
    assert value(vm0, "coordinator_zookeeper_disconnects_total") == 2
    assert value(bench.vms["vm1"], "coordinator_zookeeper_disconnects_total") == 0


def test_last_completed_cycle_is_a_unix_time(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.run(1)
    assert value(bench.vms["vm0"], "coordinator_last_cycle_timestamp_seconds") == bench.clock.wall - 1


def _view_lines(caplog: pytest.LogCaptureFixture, vm: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "coordinator.agent" and "cluster view" in r.getMessage() and f"vm={vm}" in r.getMessage()]


def test_a_lost_cluster_view_is_said_once_reminded_each_minute_and_its_end_said_with_its_length(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bench = three(tmp_path)
    bench.run(3)
    caplog.set_level(logging.INFO)
    vm0 = bench.vms["vm0"]
    vm0.store.suspend()  # ZooKeeper out of reach for two and a half minutes, one cycle a second
    bench.run(150)
    vm0.store.resume()
    bench.run(3)
    why = "ZooKeeper connection suspended: write not attempted"  # the agent's first call of a cycle (join)
    assert _view_lines(caplog, "vm0") == [
        f"cluster view unavailable (vm=vm0): {why}; nothing is approved until it is back",
        f"cluster view still unavailable after 60 s (vm=vm0): {why} (60 failed reads since the last line)",
        f"cluster view still unavailable after 120 s (vm=vm0): {why} (60 failed reads since the last line)",
        f"cluster view back after 150 s unavailable (vm=vm0; it was: {why})",
    ]
    assert _view_lines(caplog, "vm1") == []
    assert value(vm0, "coordinator_errors_total", stage="store") == 150  # every failed read still counts


def test_readiness_is_kept_through_a_zookeeper_outage_and_says_what_holds_now(tmp_path: Path) -> None:
    bench = three(tmp_path)
    bench.run(3)
    vm0 = bench.vms["vm0"]
    ready = vm0.agent.ready()
    assert ready.ok and ready.detail.startswith("coordinating:"), ready
    vm0.store.suspend()
    bench.run(150)
    ready = vm0.agent.ready()
    assert ready.ok, ready  # the agent is not at fault: restarting it would not bring ZooKeeper back
    assert "coordinating:" not in ready.detail
    assert ready.lead == "not coordinating"
    assert ready.detail == ("no ZooKeeper view for 150 s (ZooKeeper connection suspended: write not attempted): "
                            "nothing is approved until it is back; still ready: it joined its group, and a restart "
                            "would not bring this back"), ready
    vm0.store.resume()
    bench.run(1)
    assert vm0.agent.ready().detail.startswith("coordinating:")
    vm0.imds.failing = True
    bench.run(5)
    ready = vm0.agent.ready()
    assert ready.ok and ready.lead == "not coordinating" and ready.detail.startswith(
        "no valid IMDS document in the last cycle (the last one 6 s ago)"), ready


# --- action durations -----------------------------------------------------------------------------------

class Checkpoint:
    """A drain that takes 2 s, and a recover that fails once."""

    name = "checkpoint"
    always_recover = False

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.recover_failures = 1

    def drain(self, ctx: ActionContext) -> None:
        self.bench.clock.advance(2.0)

    def recover(self, ctx: ActionContext) -> None:
        if self.recover_failures:
            self.recover_failures -= 1
            raise ActionError("checkpoint restore failed")


def test_drain_and_recovery_durations_by_action_and_outcome(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    vm0 = bench.add("vm0", extra=[Checkpoint(bench)])
    bench.add("vm1")
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    bench.group.remove(E)
    bench.run(40)
    assert vm0.probe.serving
    assert value(vm0, "coordinator_action_duration_seconds_sum", phase="drain", action="checkpoint",
                 outcome="ok") == 2.0
    assert value(vm0, "coordinator_action_duration_seconds_count", phase="drain", action="probe", outcome="ok") == 1
    assert value(vm0, "coordinator_action_duration_seconds_count", phase="recover", action="checkpoint",
                 outcome="failed") == 1
    assert value(vm0, "coordinator_action_duration_seconds_count", phase="recover", action="checkpoint",
                 outcome="ok") == 1
    assert value(vm0, "coordinator_job_duration_seconds_sum", phase="drain", outcome="ok") == 2.0
    assert value(vm0, "coordinator_job_duration_seconds_count", phase="recover", outcome="failed") == 1
    assert value(vm0, "coordinator_job_duration_seconds_count", phase="recover", outcome="ok") == 1


# --- liveness and readiness -----------------------------------------------------------------------------

def test_live_while_cycles_complete_and_failing_once_none_has_for_the_bound(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    vm0 = bench.add("vm0")
    assert vm0.agent.live().ok  # starting
    bench.clock.advance(31)  # the default bound: 3 idle cycles of 1 s, at least 30 s
    assert not vm0.agent.live().ok
    assert vm0.agent.live().detail == "no cycle completed since the start 31 s ago (bound 30 s)"
    bench.run(1)
    assert vm0.agent.live().ok
    bench.clock.advance(29)
    assert vm0.agent.live().ok
    bench.clock.advance(1)
    health = vm0.agent.live()
    assert not health.ok and "no cycle completed for 31 s (bound 30 s)" in health.detail


def test_ready_once_a_cycle_had_both_a_zookeeper_view_and_a_valid_document(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    vm0 = bench.add("vm0")
    vm0.store.partition()  # ZooKeeper unreachable
    bench.run(3)
    assert not vm0.agent.ready().ok
    vm0.store.heal()
    vm0.imds.failing = True  # now IMDS fails
    bench.run(3)
    assert not vm0.agent.ready().ok
    vm0.imds.failing = False
    bench.run(1)
    assert vm0.agent.ready().ok


# --- the metrics themselves --------------------------------------------------------------------------------

def test_event_status_label_is_bounded_like_the_type() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.set_events({("Reboot", "Scheduled"): 1, ("Reboot", "Completed"): 2, ("Reboot", "Canceled"): 1,
                        ("Hibernate", "Paused"): 1})
    get = metrics.registry.get_sample_value
    assert get("coordinator_events", {"type": "Reboot", "status": "Scheduled"}) == 1
    assert get("coordinator_events", {"type": "Reboot", "status": "Other"}) == 3
    assert get("coordinator_events", {"type": "Other", "status": "Other"}) == 1
    assert get("coordinator_events", {"type": "Reboot", "status": "Completed"}) is None


def test_acknowledgements_count_once_per_drain() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.acknowledged(100.0, 12.0)
    metrics.acknowledged(100.0, 40.0)  # another id of the same drain
    metrics.acknowledged(500.0, 11.0)  # the next drain
    get = metrics.registry.get_sample_value
    assert get("coordinator_acknowledgements_total") == 2
    assert get("coordinator_drain_duration_seconds_count") == 2
    assert get("coordinator_drain_duration_seconds_sum") == 23.0


def test_every_kind_of_blocker_the_decision_gives_is_a_documented_label() -> None:
    assert tuple(kind.value for kind in DECIDED) == BLOCKED_REASONS
    text = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    table = text.split("### Why approvals wait", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)[1:]  # the header first
    assert documented == list(BLOCKED_REASONS)
    assert {Hold.NOT_BEFORE, Hold.UNDECIDED}.isdisjoint(DECIDED)  # said by `coordinator status` only


def test_the_blocked_gauges_count_each_event_once_per_kind() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.set_blocked(Counter({"not_acknowledged": 2, "budget": 1}))
    get = metrics.registry.get_sample_value
    assert get("coordinator_events_blocked", {"reason": "not_acknowledged"}) == 2
    assert get("coordinator_events_blocked", {"reason": "budget"}) == 1
    assert get("coordinator_events_blocked", {"reason": "paused"}) == 0


def test_event_detail_serves_only_the_events_of_the_last_update() -> None:
    metrics = Metrics(CollectorRegistry())
    get = metrics.registry.get_sample_value
    row = EventRow(E, "Reboot", "Scheduled", named_vms=2, acknowledged_vms=1, approved=False, not_before=1e9,
                   blocked=("not_acknowledged",))
    metrics.event_detail.update([row, replace(row, event_id=E2, not_before=None, blocked=())])
    labels = {"event_id": E, "type": "Reboot", "status": "Scheduled"}
    assert get("coordinator_event_acknowledged_vms", labels) == 1
    assert get("coordinator_event_blocked", {**labels, "reason": "not_acknowledged"}) == 1
    assert get("coordinator_event_not_before_timestamp_seconds", {**labels, "event_id": E2}) is None
    metrics.event_detail.update([replace(row, status="Started", blocked=())])
    assert get("coordinator_event_acknowledged_vms", labels) is None
    assert get("coordinator_event_acknowledged_vms", {**labels, "status": "Started"}) == 1
    assert E2 not in generate_latest(metrics.registry).decode()


def test_an_approved_event_that_comes_back_started_under_a_new_id_is_one_change(tmp_path: Path) -> None:
    """Whether the poll fell between the approval and the re-issue or not, an approved Scheduled event
    that comes back Started under another id is the same maintenance: counted as an id change."""
    bench = three(tmp_path)
    bench.group.schedule(E, ["vm0"])
    vm0 = bench.vms["vm0"]
    real_approve = vm0.imds.approve

    def approve_and_reissue(event_ids: Any, *, fence: Any = None) -> None:
        real_approve(event_ids, fence=fence)
        bench.group.remove(E)  # IMDS re-issues the approved event, now Started, under another id
        bench.group.schedule(E2, ["vm0"], status="Started", in_s=None)

    vm0.imds.approve = approve_and_reissue  # type: ignore[method-assign]
    bench.run(40, until=lambda: E2 in bench.group.events)
    bench.run(5)
    assert value(vm0, "coordinator_event_id_changes_total") == 1


def test_counters_the_alert_rules_take_increase_of_start_at_zero() -> None:
    # A series first scraped at 1 has no increase(): one failed drain would never fire CoordinatorDrainFailed.
    get = Metrics(CollectorRegistry()).registry.get_sample_value
    for stage in ("imds", "store", "action", "state", "bug"):
        assert get("coordinator_errors_total", {"stage": stage}) == 0, stage
    for outcome in ("posted", "refused", "fenced", "failed", "unknown"):
        assert get("coordinator_approvals_total", {"outcome": outcome}) == 0, outcome
