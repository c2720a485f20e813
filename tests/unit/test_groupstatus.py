"""``coordinator status`` for the whole group, without ZooKeeper: from a read to the model (approvers,
blockers by the decision function, what needs attention), the model to the table and to JSON, the admin
URLs and answers of the agents, and the read-only client."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
from rich.console import Console

from coordinator.blockers import Blocker as Held
from coordinator.blockers import Hold
from coordinator.cli import main
from coordinator.decide import Policy
from coordinator.groupstatus import analyse
from coordinator.groupstatus.analyse import NOT_ADMITTED, build_status
from coordinator.groupstatus.history import build_history
from coordinator.groupstatus.model import (
    SCHEMA_VERSION,
    Absent,
    Ack,
    AgentReport,
    Blocker,
    EventStatus,
    GroupHistory,
    GroupStatus,
    HistoryAdmission,
    HistoryApproval,
    Leader,
    Member,
    OutOfRotation,
    Paused,
    Placement,
    utc,
)
from coordinator.groupstatus.read import (
    AgentAnswer,
    GroupRead,
    PauseNode,
    ReadOnlyKazooClient,
    admin_status_url,
    ask_agents,
)
from coordinator.groupstatus.render import clock, relative, render, render_history
from coordinator.store.base import Approval, Closed, ClusterView, ConnectionState, EventRecord, OutMark

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
E1 = "E1-FREEZE"
E2 = "E2-REBOOT"


def _record(event_id: str, resources: tuple[str, ...], *, event_type: str = "Freeze", not_before: float = NOW + 240,
            acks: Mapping[str, float] | None = None, admitted: float | None = None,
            approval: Approval | None = None, done: float | None = None) -> EventRecord:
    return EventRecord(event_id=event_id, event_type=event_type, resources=resources, not_before=not_before,
                       published_by=resources[0], published_at=NOW - 30, acks=dict(acks or {}), approval=approval,
                       done_at=done, admitted_at=admitted)


def _agent(vm: str, phase: str, events: list[dict[str, Any]] | None = None) -> AgentAnswer:
    return AgentAnswer(f"http://{vm}:9110/status", body={
        "vm": vm, "phase": phase, "cycles": 42, "last_cycle": "nothing to do",
        "cluster": {"connection": "connected"}, "events": events or [], "action_error": None, "stays_out": "",
    })


def _read(records: Mapping[str, EventRecord], *, members: tuple[str, ...] = ("vm0", "vm1", "vm2"),
          leader: str | None = "vm2", agents: Mapping[str, AgentAnswer] | None = None,
          out: Mapping[str, OutMark] | None = None, absent: Mapping[str, float] | None = None,
          paused: PauseNode | None = None, paused_unreadable: str | None = None) -> GroupRead:
    view = ClusterView(
        members=frozenset(members), leader=leader, i_am_leader=False, records=dict(records),
        connection=ConnectionState.CONNECTED, known=frozenset(members) | frozenset(absent or {}),
        absent_since=dict(absent or {}), out=dict(out or {}),
    )
    info = {vm: {"vm": vm, "version": "0.1.0", "admin": "127.0.0.1:9110", "probe": f"http://{vm}:8090/health",
                 "fault_domain": "1", "update_domain": "0", "zone": ""} for vm in members}
    return GroupRead(cluster="demo", base_path="/azure-maintenance/demo", hosts="zk:2181", read_at=NOW, mono=1000.0,
                     view=view, member_info=info, leader_since=NOW - 300, paused=paused,
                     paused_unreadable=paused_unreadable, pause_ctime=NOW - 60 if paused_unreadable else None,
                     read_only_server=False, agents=dict(agents or {}))


def _event(status: GroupStatus, event_id: str) -> EventStatus:
    return next(e for e in [*status.events, *status.done] if e.event_id == event_id)


# -- the model: approvers and blockers ------------------------------------------------------------------


def test_a_missing_ack_blocks_the_approver_and_names_the_vm() -> None:
    drained = {"vm0": NOW - 20}
    record = _record(E1, ("vm0", "vm1"), acks=drained, admitted=NOW - 25)
    reported = [{"event_id": E1.lower(), "status": "Scheduled", "waiting_for": ["vm1 has not acknowledged"]}]
    agents = {"vm0": _agent("vm0", "drained", reported), "vm1": _agent("vm1", "drained"),
              "vm2": _agent("vm2", "serving")}
    status = build_status(_read({E1: record}, agents=agents), Policy(), "test")
    event = _event(status, E1)
    assert event.approver == "vm0" and event.approver_as_leader is False
    assert event.state == "blocked"
    assert event.blockers == [Blocker(kind="not_acknowledged", vm="vm1", reason="vm1 has not acknowledged")]
    assert event.missing_acks == ["vm1"]
    assert [a.vm for a in event.acks] == ["vm0"]
    assert (event.status, event.status_reported_by) == ("Scheduled", "vm0")
    assert event.approver_reports == ["vm1 has not acknowledged"]
    assert event.not_before_in_seconds == 240
    assert [m.agent.phase for m in status.members] == ["drained", "drained", "serving"]


def test_an_event_held_by_the_budget_says_why_from_the_leaders_perspective() -> None:
    # E1 (vm0) is admitted and in maintenance; E2 names vm1, whose approver (vm1) is not the leader (vm2).
    records = {
        E1: _record(E1, ("vm0",), acks={"vm0": NOW - 5}, admitted=NOW - 10),
        E2: _record(E2, ("vm1",), event_type="Reboot", not_before=NOW + 600),
    }
    status = build_status(_read(records, out={"vm0": OutMark(since=NOW - 10, events=(E1,))}), Policy(), "test")
    event = _event(status, E2)
    assert event.approver == "vm1"
    reasons = [b.reason for b in event.blockers]
    assert reasons[0] == f"maintenance budget: 1 event(s) in maintenance ({E1})"
    assert Blocker(kind="not_acknowledged", vm="vm1", reason="vm1 has not acknowledged") in event.blockers
    # E1 is approvable (everything acked and admitted): its approver approves it on its next cycle.
    assert _event(status, E1).state == "approvable"
    assert _event(status, E1).blockers == []


def test_not_admitted_gives_its_true_cause_never_the_budget_when_it_has_room() -> None:
    # A Freeze on vm0 and vm1, vm1 never seen in the group: its running no agent is the whole story.
    agentless = build_status(_read({E1: _record(E1, ("vm0", "vm9"))}), Policy(), "test")
    assert [b.reason for b in _event(agentless, E1).blockers][:2] == ["vm0 has not acknowledged", "vm9 runs no agent"]
    assert not any("admitted" in b.reason or "budget" in b.reason for b in _event(agentless, E1).blockers)
    # The budget has room: the leader (vm2) admits it on its next cycle.
    room = build_status(_read({E1: _record(E1, ("vm1",))}), Policy(), "test")
    assert _event(room, E1).blockers[0].reason == "not admitted yet (the leader vm2 admits it on its next cycle)"
    # No leader: nobody admits anything.
    leaderless = build_status(_read({E1: _record(E1, ("vm1",))}, leader=None), Policy(), "test")
    assert _event(leaderless, E1).blockers[0].reason == "not admitted: no leader to admit it"


def _said(event_id: str, *held: Held) -> dict[str, object]:
    """An event as an agent's ``/status`` gives it, held by ``held``."""
    return {"event_id": event_id, "status": "Scheduled", "waiting_for": [str(b) for b in held],
            "blockers": [b.as_json() for b in held]}


def test_the_leaders_own_reason_heads_the_blockers_over_what_the_command_works_out() -> None:
    # vm2's agent answers the command, but the leader vm1's probe of vm2 does not: admitting E1 (vm0 and vm1)
    # would leave no VM confirmed in rotation. Worked out from the phases alone, the leader would admit it.
    unconfirmed = Held(Hold.PEER_NOT_SERVING,
                       "it would leave no VM serving (not confirmed in rotation: vm2: no answer)", lasting=True)
    record = _record(E1, ("vm0", "vm1"))
    unacked = [Held(Hold.NOT_ACKNOWLEDGED, f"{vm} has not acknowledged", vm) for vm in ("vm0", "vm1")]
    own = [Held(Hold.NOT_ADMITTED, "not admitted by the leader vm1 yet (the budget has room for it)"), *unacked]
    leader = [unconfirmed, *unacked]
    agents = {"vm0": _agent("vm0", "serving", [_said(E1, *own)]),
              "vm1": _agent("vm1", "serving", [_said(E1, *leader)]),
              "vm2": _agent("vm2", "serving")}
    status = build_status(_read({E1: record}, leader="vm1", agents=agents), Policy(), "test")
    event = _event(status, E1)
    assert event.approver == "vm0"
    assert [b.reason for b in event.blockers] == [str(b) for b in leader]
    assert [b.kind for b in event.blockers] == ["peer_not_serving", "not_acknowledged", "not_acknowledged"]
    assert not any("admits it on its next cycle" in b.reason for b in event.blockers)
    assert f"Blocked by  {unconfirmed}" in _rendered(status)  # the headline of the event's panel

    # The leader approves it itself (it names only vm1): worked out here it is admitted, by the leader it is not.
    alone = _record(E2, ("vm1",), acks={"vm1": NOW - 5})
    agents["vm1"] = _agent("vm1", "drained", [_said(E2, unconfirmed)])
    event = _event(build_status(_read({E2: alone}, leader="vm1", agents=agents), Policy(), "test"), E2)
    assert (event.approver, event.state, [b.reason for b in event.blockers]) == ("vm1", "blocked", [str(unconfirmed)])

    # Admitted before the probe stopped answering: the approver holds it at approval, by its own probes.
    held = unconfirmed.weighed_at_approval()
    admitted = _record(E1, ("vm0", "vm1"), acks={"vm0": NOW - 5, "vm1": NOW - 5}, admitted=NOW - 10)
    agents = {"vm0": _agent("vm0", "drained", [_said(E1, held)]),
              "vm1": _agent("vm1", "drained"), "vm2": _agent("vm2", "serving")}
    event = _event(build_status(_read({E1: admitted}, leader="vm1", agents=agents), Policy(), "test"), E1)
    assert (event.state, [b.reason for b in event.blockers]) == ("blocked", ["at approval: " + str(unconfirmed)])
    assert event.blockers[0].lasting  # a peer whose probe does not answer: it does not clear by itself

    # Words alone (an agent of a version before the blockers' kinds) choose nothing: what is worked out stands.
    agents["vm0"] = _agent("vm0", "drained", [{"event_id": E1, "status": "Scheduled", "waiting_for": [str(held)]}])
    event = _event(build_status(_read({E1: admitted}, leader="vm1", agents=agents), Policy(), "test"), E1)
    assert event.state == "approvable"


def test_a_vm_without_an_agent_blocks_and_is_named() -> None:
    record = _record(E1, ("vm0", "vm9"), acks={"vm0": NOW - 5}, admitted=NOW - 10)
    status = build_status(_read({E1: record}, absent={"vm9": NOW - 3600}), Policy(), "test")
    event = _event(status, E1)
    assert Blocker(kind="no_agent", vm="vm9", reason="vm9 runs no agent") in event.blockers
    assert status.absent == [Absent(vm="vm9", since=utc(NOW - 3600))]
    assert any(a.vm == "vm9" and "runs no agent" in a.message for a in status.attention)


def test_the_leader_approves_when_no_named_vm_runs_an_agent() -> None:
    record = _record(E1, ("vm7",), admitted=NOW - 10)
    event = _event(build_status(_read({E1: record}), Policy(), "test"), E1)
    assert (event.approver, event.approver_as_leader) == ("vm2", True)


def test_no_leader_and_no_live_vm_in_resources_means_nobody_can_approve() -> None:
    record = _record(E1, ("vm7",))
    status = build_status(_read({E1: record}, leader=None), Policy(), "test")
    event = _event(status, E1)
    assert event.approver is None
    assert "no live agent named in Resources and no leader" in [b.reason for b in event.blockers]
    assert status.leader is None
    assert any(a.message.startswith("no leader") for a in status.attention)


def test_approved_started_and_done_events_have_no_blockers() -> None:
    approval = Approval(by="vm0", at=NOW - 3, as_leader=False)
    records = {
        E1: _record(E1, ("vm0",), acks={"vm0": NOW - 5}, admitted=NOW - 10, approval=approval),
        E2: _record(E2, ("vm1",), event_type="Reboot", not_before=NOW - 10),  # NotBefore passed: Started
        "E3": _record("E3", ("vm1",), done=NOW - 100),
    }
    status = build_status(_read(records), Policy(), "test")
    assert (_event(status, E1).state, _event(status, E1).blockers) == ("approved", [])
    assert _event(status, E1).approval is not None
    started = _event(status, E2)
    assert (started.state, started.status, started.status_reported_by) == ("started", "Started", None)
    assert [e.event_id for e in status.done] == ["E3"]
    assert (status.done[0].state, status.done[0].approver, status.done[0].status) == ("done", None, None)


def _fresh(vm: str, phase: str, events: list[dict[str, Any]]) -> AgentAnswer:
    """An agent's answer whose last document was read fresh and lists ``events``."""
    answer = _agent(vm, phase, events)
    return AgentAnswer(answer.url, body={**(answer.body or {}), "imds": {"fresh": True, "incarnation": 3}})


def test_an_approved_event_shows_started_once_imds_says_so_and_done_once_gone_never_scheduled_again() -> None:
    approval = Approval(by="vm0", at=NOW - 20, as_leader=False)
    record = _record(E1, ("vm0", "vm1"), acks={"vm0": NOW - 30, "vm1": NOW - 30}, admitted=NOW - 40,
                     approval=approval)  # approved early: NotBefore still 4 min ahead
    started = [{"event_id": E1, "status": "Started", "waiting_for": []}]
    agents = {"vm0": _fresh("vm0", "drained", started), "vm1": _fresh("vm1", "drained", started),
              "vm2": _fresh("vm2", "serving", [])}
    status = build_status(_read({E1: record}, agents=agents), Policy(), "test")
    event = _event(status, E1)
    assert (event.state, event.status, event.status_reported_by) == ("started", "Started", "vm0")
    assert "STARTED" in _rendered(status)

    # Gone from the documents of the VMs it names, the leader has not marked it done yet.
    agents = {vm: _fresh(vm, "drained" if vm != "vm2" else "serving", []) for vm in ("vm0", "vm1", "vm2")}
    status = build_status(_read({E1: record}, agents=agents), Policy(), "test")
    event = _event(status, E1)
    assert (event.state, event.status, event.status_reported_by, event.done_at) == ("done", None, "vm0", None)
    assert event.blockers == [] and event.approval is not None
    text = _rendered(status)
    assert "gone from IMDS (per vm0): the leader marks it done" in text and "DONE" in text
    assert "Scheduled" not in text
    # vm2 is not named and nothing says its documents show the events of others: its empty one proves nothing.
    only_vm2 = {"vm2": agents["vm2"]}
    event = _event(build_status(_read({E1: record}, agents=only_vm2), Policy(), "test"), E1)
    assert (event.state, event.status, event.status_reported_by) == ("approved", "Scheduled", None)
    # An event nobody approved and whose NotBefore is ahead may just not be read by every agent yet.
    new = _record(E2, ("vm0",))
    assert _event(build_status(_read({E2: new}, agents=agents), Policy(), "test"), E2).status == "Scheduled"


def test_a_never_rule_waits_for_not_before() -> None:
    from coordinator.config import ApprovalRule

    record = _record(E1, ("vm0",), event_type="Redeploy")
    policy = Policy(approval={"Redeploy": ApprovalRule.NEVER})
    reasons = [b.reason for b in _event(build_status(_read({E1: record}), policy, "test"), E1).blockers]
    assert reasons[0] == "policy: Redeploy events are never approved early"
    assert reasons[-1].startswith("waiting for NotBefore")


def test_blockers_fall_back_to_the_records_when_the_decision_function_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(analyse, "decide", broken)
    record = _record(E1, ("vm0", "vm1"), acks={"vm0": NOW - 5})
    event = _event(build_status(_read({E1: record}), Policy(), "test"), E1)
    reasons = [b.reason for b in event.blockers]
    assert reasons[0].startswith("(decision function failed: RuntimeError: boom")
    assert NOT_ADMITTED in reasons
    assert Blocker(kind="not_acknowledged", vm="vm1", reason="vm1 has not acknowledged") in event.blockers
    assert reasons[-1].startswith("waiting for NotBefore")


def test_pause_node_is_shown_and_an_unreadable_one_still_pauses() -> None:
    status = build_status(_read({}, paused=PauseNode(reason="kernel upgrade", by="alice", at=NOW - 720)),
                          Policy(), "test")
    assert status.paused == Paused(reason="kernel upgrade", by="alice", at=utc(NOW - 720))
    odd = build_status(_read({}, paused_unreadable="data: Invalid JSON"), Policy(), "test")
    assert odd.paused is not None and odd.paused.reason.startswith("(pause node unreadable")
    assert odd.paused.at == utc(NOW - 60)
    assert build_status(_read({}), Policy(), "test").paused is None


def test_attention_lists_what_looks_stuck() -> None:
    records = {
        E1: _record(E1, ("vm0",), not_before=NOW - 3600),  # could start an hour ago, not done
        E2: _record(E2, ("vm1",), event_type="Reboot", not_before=NOW + 120),  # blocked, starts in 2 min
        "E3": _record("E3", ("vm2",), acks={"vm2": NOW - 7200}, done=NOW - 3600),  # ack standing after done
    }
    agents = {"vm0": AgentAnswer("http://10.0.0.4:9110/status", error="no answer within 1 s"),
              "vm1": _agent("vm1", "serving"), "vm2": _agent("vm2", "drained")}
    agents["vm1"] = AgentAnswer(agents["vm1"].url, body={**(agents["vm1"].body or {}),
                                                         "action_error": "drain failed: exit 3"})
    out = {"vm2": OutMark(since=NOW - 7200, events=("E3",))}
    messages = [a.message for a in build_status(_read(records, agents=agents, out=out), Policy(), "t").attention]
    assert any(m.startswith(f"Freeze {E1} could start 60 min ago and is not done") for m in messages), messages
    assert any(m.startswith(f"Reboot {E2} starts in 2 min without an approval") for m in messages), messages
    assert any(m.startswith("vm2 still acknowledges E3") for m in messages), messages
    assert "vm2 has been out of rotation for E3 for 2.0 h" in messages
    assert "vm0: its agent does not answer (no answer within 1 s)" in messages
    assert "vm1: drain failed: exit 3" in messages


def test_a_drain_held_by_a_fallback_is_shown_with_its_cause() -> None:
    fallback = ("azure-lb drain fell back to the health probe alone: cannot set backend address vm1 Down "
                "through ARM (403 AuthorizationFailed)")
    agents = {"vm0": _agent("vm0", "serving"), "vm2": _agent("vm2", "serving")}
    agents["vm1"] = AgentAnswer("http://vm1:9110/status", body={**(_agent("vm1", "drained").body or {}),
                                                                "action_fallback": fallback})
    status = build_status(_read({}, agents=agents), Policy(), "t")
    assert [m.agent.action_fallback for m in status.members] == [None, fallback, None]
    assert [(a.vm, a.message) for a in status.attention] == [("vm1", f"vm1: {fallback}")]
    assert json.loads(status.to_json())["members"][1]["agent"]["action_fallback"] == fallback
    assert f"- vm1: {fallback}" in _rendered(status, width=300)


def test_events_draining_as_they_should_need_no_attention_however_short_their_notice() -> None:
    # A Freeze announced 5 minutes ahead, admitted at once: vm0 went out of rotation 5 s ago and acknowledges
    # once its drain wait has passed. Blocked, as every event is while its VMs drain, and it makes it.
    policy = Policy(drain_wait_by_type={"Preempt": 5.0})  # the configuration's default for a Preempt
    records = {E1: _record(E1, ("vm0",), not_before=NOW + 295, admitted=NOW - 5),
               # a Preempt's 30 s of notice, not admitted nor drained yet: its 5 s drain wait fits
               "E3": _record("E3", ("vm1",), event_type="Preempt", not_before=NOW + 30)}
    out = {"vm0": OutMark(since=NOW - 5, events=(E1,))}
    agents = {"vm0": _agent("vm0", "draining"), "vm1": _agent("vm1", "serving"), "vm2": _agent("vm2", "serving")}
    status = build_status(_read(records, agents=agents, out=out), policy, "t")
    assert [_event(status, key).state for key in (E1, "E3")] == ["blocked", "blocked"]
    assert status.attention == []
    assert "Nothing needs attention yet; 2 blocked events below say what they wait for." in _rendered(status)


def test_an_event_that_cannot_be_approved_before_its_not_before_needs_attention() -> None:
    # The drain still needs longer than the notice left: vm1 went out 10 s ago, its drain wait is 120 s.
    policy = Policy(drain_wait=120.0)
    record = _record(E1, ("vm1",), not_before=NOW + 60, admitted=NOW - 10)
    out = {"vm1": OutMark(since=NOW - 10, events=(E1,))}
    status = build_status(_read({E1: record}, out=out), policy, "t")
    assert [a.message for a in status.attention] == [
        f"Freeze {E1} starts in 60 s, before it can be approved: vm1 needs 110 s more to drain before it can "
        "acknowledge (drain.wait_seconds for a Freeze: 120 s)"]
    # The same event while early approvals are paused: it starts at NotBefore, as the operator asked.
    paused = PauseNode(reason="release", by="alice", at=NOW - 60)
    assert build_status(_read({E1: record}, out=out, paused=paused), policy, "t").attention == []
    # Held by what does not clear by itself, however far its NotBefore: a VM it names runs no agent.
    far = _record(E2, ("vm0", "vm9"), event_type="Reboot", not_before=NOW + 900)
    status = build_status(_read({E2: far}), Policy(), "t")
    assert [a.message for a in status.attention if a.vm is None] == [
        f"Reboot {E2} starts in 15 min without an approval unless unblocked (vm9 runs no agent)"]


def test_an_event_held_in_the_budget_behind_a_drain_that_keeps_failing_needs_attention_with_the_chain() -> None:
    # A Reboot of vm2 holds the budget (one event at a time); vm2's drain fails (its HAProxy socket is
    # missing), so it never acknowledges. A Freeze of the healthy vm0 waits behind it for its whole notice.
    policy = Policy(max_events=1)
    failing = "drain failed: haproxy: cannot connect to /run/haproxy/admin.sock: No such file or directory"
    records = {"E-HAP": _record("E-HAP", ("vm2",), event_type="Reboot", not_before=NOW + 800, admitted=NOW - 60),
               E1: _record(E1, ("vm0",), not_before=NOW + 600)}
    agents = {"vm0": _agent("vm0", "serving"), "vm1": _agent("vm1", "serving"), "vm2": _agent("vm2", "draining")}
    agents["vm2"] = AgentAnswer(agents["vm2"].url, body={**(agents["vm2"].body or {}), "action_error": failing})
    out = {"vm2": OutMark(since=NOW - 60, events=("E-HAP",))}
    status = build_status(_read(records, agents=agents, out=out), policy, "t")
    assert _event(status, E1).state == "blocked"
    held = [a for a in status.attention if a.event_id == E1]
    assert [a.message for a in held] == [
        f"Freeze {E1} starts in 10 min without an approval unless unblocked (held by the budget behind Reboot "
        f"E-HAP, whose drain on vm2 fails: {failing}; fix or cancel that drain)"], status.attention
    # Once vm2's drain works again, the Freeze follows when the Reboot is done: nothing to say about it.
    agents["vm2"] = _agent("vm2", "draining")
    assert [a for a in build_status(_read(records, agents=agents, out=out), policy, "t").attention
            if a.event_id == E1] == []


def test_an_unreachable_loopback_admin_is_not_called_stuck() -> None:
    agents = {vm: AgentAnswer("http://127.0.0.1:9110/status", error="answered as 'vm5'") for vm in ("vm0", "vm1")}
    status = build_status(_read({}, members=("vm0", "vm1"), leader="vm0", agents=agents), Policy(), "t")
    assert status.attention == []
    assert [m.agent.reachable for m in status.members] == [False, False]


# -- rendering ---------------------------------------------------------------------------------------------


def _rendered(status: GroupStatus, width: int = 200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(render(status))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


def _model() -> GroupStatus:
    at = utc(NOW)
    unreachable = AgentReport(reachable=False, url="http://10.0.0.6:9110/status", error="no answer within 1 s")
    members = [
        Member(vm="vm0", leader=False, version="0.1.0", placement=Placement(fault_domain="0", update_domain="1"),
               probe="http://vm0:8090/health", admin="0.0.0.0:9110",
               agent=AgentReport(reachable=True, url="u", phase="drained", cycles=7, last_cycle="vm1 not acked")),
        Member(vm="vm1", leader=False, agent=AgentReport(reachable=True, url="u", phase="drained", cycles=3)),
        Member(vm="vm2", leader=True, agent=unreachable),
    ]
    blocked = EventStatus(
        event_id=E1, type="Freeze", status="Scheduled", status_reported_by="vm0", resources=["vm0", "vm1"],
        published_by="vm0", published_at=at - timedelta(seconds=12), not_before=at + timedelta(minutes=4),
        not_before_in_seconds=240, acks=[Ack(vm="vm0", at=at - timedelta(seconds=3))], missing_acks=["vm1"],
        admitted_at=at - timedelta(seconds=11), approval=None, done_at=None, approver="vm0",
        approver_as_leader=False, state="blocked",
        blockers=[Blocker(kind="not_acknowledged", vm="vm1", reason="vm1 has not acknowledged")],
        approver_reports=["vm1 has not acknowledged"],
    )
    done = blocked.model_copy(update={"event_id": "E0-DONE", "state": "done", "blockers": [], "approver": None,
                                      "done_at": at - timedelta(minutes=20), "acks": []})
    return GroupStatus(
        cluster="demo", base_path="/azure-maintenance/demo", zookeeper="zk:2181", read_at=at, read_only_server=False,
        policy="defaults (no --config)",
        paused=Paused(reason="kernel upgrade [CHG-1]", by="alice", at=at - timedelta(minutes=12)),
        leader=Leader(vm="vm2", since=at - timedelta(minutes=5)), members=members,
        registered=["vm0", "vm1", "vm2", "vm3"],
        out_of_rotation=[OutOfRotation(vm="vm0", since=at - timedelta(seconds=15), events=[E1], member=True)],
        absent=[Absent(vm="vm3", since=at - timedelta(hours=2))], events=[blocked], done=[done], attention=[],
    )


def test_table_shows_pause_leader_members_events_and_blockers() -> None:
    text = _rendered(_model())
    lines = text.splitlines()
    assert "Group demo" in lines[0]
    assert "PAUSED since 12 min ago (07:48:00 UTC) by alice: kernel upgrade [CHG-1]" in text  # brackets kept
    assert "Leader: vm2 (since 5 min ago)" in text
    # the event below is BLOCKED: not "Nothing looks stuck." above it
    assert "Nothing looks stuck." not in text
    assert "Nothing needs attention yet; 1 blocked event below says what it waits for." in text
    vm0 = next(line for line in lines if "│ vm0" in line)
    assert "drained" in vm0 and "#7: vm1 not acked" in vm0 and "0/1" in vm0
    vm2 = next(line for line in lines if "vm2 (leader)" in line)
    assert "unreachable" in vm2 and "no answer within 1 s" in vm2
    assert "Freeze E1-FREEZE" in text and "BLOCKED" in text
    assert "in 4 min (08:04:00 UTC)" in text
    assert "vm0 acked 3 s ago · vm1 not acked" in text
    assert "none yet; approver vm0 (first live VM in Resources)" in text
    blocked_line = next(line for line in lines if "Blocked by" in line)
    assert "vm1 has not acknowledged" in blocked_line
    assert "vm0 says" not in text  # the approver's own report adds nothing here
    assert "absent since 2.0 h ago" in text
    assert "Recently finished (1 shown)" in text and "20 min ago" in text


def test_table_of_a_quiet_group_and_of_a_group_without_leader() -> None:
    quiet = _model().model_copy(update={"paused": None, "events": [], "done": [], "out_of_rotation": [],
                                        "absent": []})
    text = _rendered(quiet)
    assert "PAUSED" not in text and "No pending events." in text and "Recently finished" not in text
    from coordinator.groupstatus.model import Attention

    troubled = quiet.model_copy(update={"leader": None, "attention": [Attention(message="no leader: nobody admits")]})
    text = _rendered(troubled)
    assert "Leader: none" in text and "- no leader: nobody admits" in text and "Nothing looks stuck" not in text


def test_approver_reports_that_differ_are_shown() -> None:
    model = _model()
    event = model.events[0].model_copy(update={"approver_reports": ["approval waits for a document read after it "
                                                                    "became approvable"]})
    text = _rendered(model.model_copy(update={"events": [event]}))
    assert "vm0 says" in text and "approval waits for a document" in text


def test_relative_and_clock_times() -> None:
    now = utc(NOW)
    assert relative(now - timedelta(seconds=12), now) == "12 s ago"
    assert relative(now + timedelta(minutes=4), now) == "in 4 min"
    assert relative(now + timedelta(seconds=0.2), now) == "now"
    assert relative(now - timedelta(hours=3), now) == "3.0 h ago"
    assert relative(now + timedelta(days=3), now) == "in 3.0 d"
    assert relative(None, now) == "-"
    assert clock(now + timedelta(minutes=4), now) == "08:04:00 UTC"
    assert clock(now + timedelta(days=1), now) == "2027-01-16 08:00:00 UTC"


# -- JSON -----------------------------------------------------------------------------------------------------

TOP_LEVEL = {"schema_version", "cluster", "base_path", "zookeeper", "read_at", "read_only_server", "policy",
             "paused", "leader", "members", "registered", "out_of_rotation",
             "drained_by_hand", "absent", "events", "done", "attention"}
EVENT_KEYS = {"event_id", "type", "status", "status_reported_by", "resources", "published_by", "published_at",
              "not_before", "not_before_in_seconds", "acks", "missing_acks", "admitted_at", "approval", "vouched",
              "done_at",
              "approver", "approver_as_leader", "state", "blockers", "approver_reports"}


def test_json_has_the_documented_schema_and_absolute_times() -> None:
    data = json.loads(_model().to_json())
    assert set(data) == TOP_LEVEL
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["read_at"] == "2027-01-15T08:00:00Z"
    assert data["paused"] == {"reason": "kernel upgrade [CHG-1]", "by": "alice", "at": "2027-01-15T07:48:00Z"}
    event = data["events"][0]
    assert set(event) == EVENT_KEYS
    assert event["not_before"] == "2027-01-15T08:04:00Z"
    assert event["blockers"] == [{"kind": "not_acknowledged", "vm": "vm1", "reason": "vm1 has not acknowledged",
                                  "lasting": False}]
    assert event["acks"] == [{"vm": "vm0", "at": "2027-01-15T07:59:57Z"}]
    assert set(data["members"][0]) == {"vm", "leader", "version", "started_at", "placement", "probe", "admin", "agent"}
    assert set(data["members"][0]["agent"]) == {"reachable", "url", "error", "phase", "cycles", "last_cycle",
                                                "connection", "action_error", "action_fallback", "stays_out"}
    assert GroupStatus.model_validate_json(_model().to_json()) == _model()
    paused_none = json.loads(_model().model_copy(update={"paused": None}).to_json())
    assert paused_none["paused"] is None


def test_the_documented_schema_lists_every_field() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent.parent / "docs/status.md").read_text()
    for key in TOP_LEVEL | EVENT_KEYS:
        assert f"`{key}`" in doc, f"docs/status.md does not document {key}"


# -- the agents' /status ---------------------------------------------------------------------------------------


def test_admin_status_url_from_member_info() -> None:
    assert admin_status_url({"admin": "127.0.0.1:9110"}) == "http://127.0.0.1:9110/status"
    wildcard = {"admin": "0.0.0.0:9110", "probe": "http://10.0.0.5:8090/health"}
    assert admin_status_url(wildcard) == "http://10.0.0.5:9110/status"
    assert admin_status_url({"admin": "[::]:9110", "probe": "http://[fd00::5]:8090/health"}) == \
        "http://[fd00::5]:9110/status"
    assert admin_status_url({"admin": "0.0.0.0:9110"}) is None
    assert admin_status_url({"admin": "http://vm0.internal:9110/"}) == "http://vm0.internal:9110/status"
    assert admin_status_url({}) is None
    assert admin_status_url({"admin": "no-port"}) is None


def test_agents_are_asked_and_only_an_answer_naming_the_member_counts() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host == "vm0":
            return httpx.Response(200, json={"vm": "VM0", "phase": "serving"})
        if host == "vm1":
            return httpx.Response(200, json={"vm": "vm5", "phase": "serving"})  # a loopback address elsewhere
        if host == "vm2":
            return httpx.Response(500, text="internal error")
        if host == "vm3":
            raise httpx.ConnectError("refused", request=request)
        raise httpx.ReadTimeout("slow", request=request)

    urls = {vm: f"http://{vm}:9110/status" for vm in ("vm0", "vm1", "vm2", "vm3", "vm4")} | {"vm5": None}
    answers = ask_agents(urls, 0.5, httpx.MockTransport(answer))
    assert answers["vm0"].body == {"vm": "VM0", "phase": "serving"}
    assert answers["vm1"].error == "answered as 'vm5': this address does not reach vm1"
    assert answers["vm2"].error == "HTTP 500"
    assert answers["vm3"].error == "connection refused or unreachable"
    assert answers["vm4"].error == "no answer within 0.5 s"
    assert answers["vm5"] == AgentAnswer(None, error="no admin address in its member info")


# -- the read-only client and the command line -----------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda c: c.create("/x", b""), lambda c: c.create_async("/x"), lambda c: c.ensure_path("/x"),
    lambda c: c.set("/x", b""), lambda c: c.set_async("/x", b""), lambda c: c.delete("/x"),
    lambda c: c.delete_async("/x"), lambda c: c.transaction(), lambda c: c.set_acls("/x", []),
])
def test_read_only_client_refuses_every_write(call: Any) -> None:
    client = ReadOnlyKazooClient(hosts="127.0.0.1:1")  # never started: nothing could be sent anyway
    try:
        with pytest.raises(PermissionError, match="read-only"):
            call(client)
    finally:
        client.close()


def test_status_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--zookeeper", "127.0.0.1:2181"]) == 2
    assert "give --config FILE, or --zookeeper HOSTS and --cluster NAME" in capsys.readouterr().err
    assert main(["status", "--url", "http://127.0.0.1:9110", "--cluster", "demo"]) == 2
    assert "do not combine it" in capsys.readouterr().err
    assert main(["status", "--zookeeper", "not-a-host-port", "--cluster", "demo"]) == 2
    assert "zookeeper.hosts" in capsys.readouterr().err
    assert main(["status", "--zookeeper", "127.0.0.1:2181", "--cluster", "demo", "--watch", "0"]) == 2
    assert "--watch must be positive" in capsys.readouterr().err


def test_times_beyond_the_calendar_do_not_break_the_view() -> None:
    assert utc(NOW).year == 2027
    assert utc(NOW * 1000).year == 9999  # milliseconds written as seconds
    assert utc(float("nan")).year == 1
    status = build_status(_read({}, paused=PauseNode(reason="r", by="b", at=NOW * 1000)), Policy(), "test")
    assert "PAUSED since in " in _rendered(status)


def test_watch_renders_each_read_shows_errors_and_stops_on_ctrl_c(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.groupstatus import command
    from coordinator.groupstatus.read import GroupStatusError

    monkeypatch.setattr(command, "_MIN_GAP", 0.0)
    reads = iter([_read({E1: _record(E1, ("vm0", "vm1"), admitted=NOW - 5)}), GroupStatusError("ZooKeeper gone"),
                  KeyboardInterrupt()])

    class Reader:
        wakeups = 0

        def set_wakeup(self, callback: object) -> None:
            self.wakeups += 1

        def read(self) -> GroupRead:
            item = next(reads)
            if isinstance(item, BaseException):
                raise item
            return item

    reader = Reader()
    assert command._watch(reader, lambda read: build_status(read, Policy(), "t"), 0.01, as_json=False) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert reader.wakeups == 1
    assert "ZooKeeper gone" in out and "last good read" in out  # the error, above the last good read
    assert "vm0 has not acknowledged" in out

    reads = iter([_read({}), GroupStatusError("ZooKeeper gone"), KeyboardInterrupt()])
    assert command._watch(Reader(), lambda read: build_status(read, Policy(), "t"), 0.01, as_json=True) == 0  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["cluster"] == "demo"
    assert json.loads(lines[1]) == {"error": "ZooKeeper gone"}
    assert len(lines) == 2


def test_watch_stopped_by_sigterm_ends_as_ctrl_c_does(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import signal

    from coordinator.groupstatus import command

    monkeypatch.setattr(command, "_MIN_GAP", 0.0)

    class Reader:
        reads = 0

        def set_wakeup(self, callback: object) -> None:
            pass

        def read(self) -> GroupRead:
            self.reads += 1
            if self.reads == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # as a supervisor stopping the command would
            return _read({E1: _record(E1, ("vm0", "vm1"), admitted=NOW - 5)})

    def unhandled(signum: int, frame: object) -> None:
        raise AssertionError("SIGTERM reached the handler in place before --watch")

    previous = signal.signal(signal.SIGTERM, unhandled)  # the default would end the test run itself
    try:
        assert command._watch(Reader(), lambda read: build_status(read, Policy(), "t"), 0.01,  # type: ignore[arg-type]
                              as_json=False) == 0
        assert signal.getsignal(signal.SIGTERM) is unhandled  # given back once the command is done
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "vm0 has not acknowledged" in capsys.readouterr().out  # the last table, as at Ctrl-C


def test_watch_is_for_the_group_view(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--watch"]) == 2
    assert "--watch needs --config, or --zookeeper and --cluster" in capsys.readouterr().err


def test_a_vm_never_seen_in_the_group_is_flagged_and_blocks() -> None:
    # a Freeze on vm0 and vm1; vm1 has never run an agent (not a member, not known as absent)
    record = _record(E1, ("vm0", "vm1"), acks={"vm0": NOW - 5}, admitted=NOW - 10, not_before=NOW + 3600)
    status = build_status(_read({E1: record}, members=("vm0", "vm2")), Policy(), "test")
    assert Blocker(kind="no_agent", vm="vm1", reason="vm1 runs no agent") in _event(status, E1).blockers
    assert [a.message for a in status.attention if a.vm == "vm1"] == [
        f"vm1 is named by {E1} but runs no agent (never seen in this group)"]
    text = _rendered(status)
    assert "Nothing looks stuck." not in text and "BLOCKED" in text


def test_members_not_asked_with_no_agents_say_so() -> None:
    record = _record(E1, ("vm0",), acks={"vm0": NOW - 5}, admitted=NOW - 10)
    status = build_status(_read({E1: record}, agents={}), Policy(), "test")  # --no-agents: nobody asked
    assert status.attention == []
    member_lines = [line for line in _rendered(status).splitlines() if "│ vm" in line]
    assert member_lines and all("not asked" in line and "unreachable" not in line for line in member_lines)


# -- the history (--history) ---------------------------------------------------------------------------------

E3 = "E3-REDEPLOY"
E4 = "E4-OLD"


def _history_read() -> GroupRead:
    """Four finished events and one pending: E1 admitted and approved on two acks, seen Started, done last;
    E2 never approved early, gone before its NotBefore; E3 started at NotBefore unapproved; E4 marked done
    by an agent of an earlier version (no history kept)."""
    released = Approval(by="vm0", at=NOW - 500, as_leader=False, acks=("vm0", "vm1"))
    e1 = replace(_record(E1, ("vm0", "vm1"), not_before=NOW - 200, done=NOW - 60), published_at=NOW - 700,
                 started_at=NOW - 480, closed=Closed(admitted_at=NOW - 600, admitted_by="vm2", approval=released))
    e2 = replace(_record(E2, ("vm1",), event_type="Reboot", not_before=NOW - 100, done=NOW - 3000),
                 published_at=NOW - 3600, closed=Closed())
    e3 = replace(_record(E3, ("vm2",), event_type="Redeploy", not_before=NOW - 2000, done=NOW - 1000),
                 published_at=NOW - 2500, started_at=NOW - 1990, closed=Closed())
    e4 = replace(_record(E4, ("vm0",), event_type="Reboot", not_before=NOW - 90000, done=NOW - 86000),
                 published_at=NOW - 90500)
    pending = _record("E5-PENDING", ("vm0",))
    return _read({r.event_id: r for r in (e1, e2, e3, e4, pending)})


def _history_text(history: GroupHistory, width: int = 200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(render_history(history))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


def test_the_history_lists_every_finished_event_newest_first_with_its_timeline() -> None:
    history = build_history(_history_read(), Policy(done_retention=3 * 86400), "test")
    assert [e.event_id for e in history.events] == [E1, E3, E2, E4]  # the pending record is no history
    assert history.kept_for_seconds == 3 * 86400 and history.budgeted is True
    e1, e3, e2, e4 = history.events
    assert (e1.published_by, e1.published_at, e1.recorded) == ("vm0", utc(NOW - 700), True)
    assert e1.admitted == HistoryAdmission(at=utc(NOW - 600), by="vm2")
    assert e1.approval == HistoryApproval(by="vm0", at=utc(NOW - 500), as_leader=False, acks=["vm0", "vm1"])
    assert (e1.started_at, e1.done_at) == (utc(NOW - 480), utc(NOW - 60))
    assert (e2.admitted, e2.approval, e2.started_at, e2.recorded) == (None, None, None, True)
    assert (e3.approval, e3.started_at) == (None, utc(NOW - 1990))
    assert (e4.recorded, e4.admitted, e4.approval, e4.started_at) == (False, None, None, None)
    assert GroupHistory.model_validate_json(history.to_json()) == history
    data = json.loads(history.to_json())
    assert data["events"][0]["approval"]["acks"] == ["vm0", "vm1"]
    assert data["events"][0]["admitted"] == {"at": "2027-01-15T07:50:00Z", "by": "vm2"}


def test_the_history_as_text_has_each_timeline_line_and_no_placeholder() -> None:
    text = _history_text(build_history(_history_read(), Policy(), "test"))
    assert "None" not in text and "null" not in text
    assert "Finished events (4 kept, newest first)" in text
    e1 = text[text.index(f"Freeze {E1}"):text.index(f"Redeploy {E3}")]
    assert "on vm0, vm1" in e1 and "NotBefore 07:56:40 UTC" in e1
    assert "announced  07:48:20 UTC by vm0" in e1
    assert "admitted   07:50:00 UTC by the leader vm2" in e1
    assert ("approved   07:51:40 UTC by vm0 as the first live VM named in Resources, 5 min before NotBefore; "
            "released by the acks of vm0, vm1") in e1
    assert "started    07:52:00 UTC: first seen Started in the IMDS document of the agent that marked it done" in e1
    assert "gone       07:59:00 UTC (60 s ago): it left the IMDS documents and its record was marked done" in e1
    e3 = text[text.index(f"Redeploy {E3}"):text.index(f"Reboot {E2}")]
    assert "admitted   not admitted" in e3 and "approved   not approved early: it started at NotBefore" in e3
    e2 = text[text.index(f"Reboot {E2}"):text.index(f"Reboot {E4}")]
    assert "not approved early: it was gone before its NotBefore" in e2 and "started    not recorded" in e2
    e4 = text[text.index(f"Reboot {E4}"):]
    assert e4.count("not recorded (marked done by an agent of an earlier version)") == 2  # admitted, approved
    assert "announced  2027-01-14 06:51:40 UTC by vm0" in e4  # another day: with its date
    assert ("Kept as long as the records are: the leader purges a finished event's record 7.0 d "
            "(done_retention_seconds: 604800) after it was done") in text


def test_the_history_of_a_group_without_a_budget_leaves_the_admission_out() -> None:
    unbudgeted = Policy(max_events=None, max_vms=None, keep_one_serving=False)
    text = _history_text(build_history(_history_read(), unbudgeted, "test"))
    e3 = text[text.index(f"Redeploy {E3}"):text.index(f"Reboot {E2}")]
    assert "admitted" not in e3 and "not approved early" in e3
    assert "admitted   07:50:00 UTC by the leader vm2" in text  # E1's admission is still shown


def test_an_approval_without_its_acks_recorded_or_unreadable_says_so() -> None:
    older = Approval(by="vm2", at=NOW - 400, as_leader=True)
    unreadable = Approval(by="?", at=0.0, as_leader=False)
    none_needed = Approval(by="vm2", at=NOW - 400, as_leader=True, acks=())
    for approval, said in ((older, "by vm2 as the leader, "), (none_needed, "no acknowledgement was required"),
                           (unreadable, "approved, by whom and when not recorded (its approval node did not parse)")):
        record = replace(_record(E1, ("vm0",), done=NOW - 10), closed=Closed(approval=approval))
        text = _history_text(build_history(_read({E1: record}), Policy(), "test"))
        assert said in text and "None" not in text
    record = replace(_record(E1, ("vm0",), done=NOW - 10), closed=Closed(approval=older))
    assert "the acks it was released on not recorded" in _history_text(build_history(_read({E1: record}), Policy(),
                                                                                      "test"))


def test_an_empty_history_says_so_and_how_long_it_would_be_kept() -> None:
    text = _history_text(build_history(_read({}), Policy(done_retention=7200), "test"))
    assert "No finished event is kept in the store." in text
    assert "2.0 h (done_retention_seconds: 7200)" in text


@pytest.mark.parametrize("argv", [
    ["status", "--zookeeper", "127.0.0.1:2181", "--cluster", "demo", "--history", "--watch"],
    ["status", "--config", "/nonexistent.yaml", "--history", "--watch", "5"],
    ["status", "--history", "--watch"],
])
def test_history_is_refused_with_watch(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == "coordinator: status: --history shows what the store keeps, once: it does not combine " \
                           "with --watch\n"
    assert captured.out == ""


@pytest.mark.parametrize("argv", [["status", "--history"], ["status", "--history", "--url", "http://127.0.0.1:9"],
                                  ["status", "--history", "--cluster", "demo", "--url", "http://127.0.0.1:9"]])
def test_history_reads_the_group_never_one_agent(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--history reads the group from ZooKeeper" in err and "not --url" in err
