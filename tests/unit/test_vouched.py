"""An operator's word for the VMs an event names that run no agent (``coordinator approve``), in the decision:
the event becomes approvable, admitted through the budget, approved on every other VM's ack, and the VMs
vouched for that ran an agent here are marked out of rotation first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.config import ApprovalRule
from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide
from coordinator.models import Document, parse_document
from coordinator.override import OverrideRefused, vouching
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, Pause, Vouch

NOW = 1_700_000_000.0
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
MEMBERS = frozenset({"vm0", "vm1", "vm2"})
WORD = Vouch(by="ops@bastion", at=NOW - 30, reason="vm9 is decommissioned [CHG-3]", vms=("vm9",))
POLICY = Policy(drain_wait=10.0, max_events=1, keep_one_serving=True)
DRAINED = LocalState(phase=Phase.DRAINED, phase_since=0.0, drain_started=0.0)


def doc() -> Document:
    return parse_document({"DocumentIncarnation": 2, "Events": [{
        "EventId": EID, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
        "Resources": ["vm1", "vm9"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]})


def record(**fields: object) -> EventRecord:
    base = EventRecord(event_id=EID, event_type="Reboot", resources=("vm1", "vm9"), not_before=None,
                       published_by="vm1", published_at=NOW - 60)
    return replace(base, **fields)  # type: ignore[arg-type]


def view(rec: EventRecord, *, me: str, known: frozenset[str] = MEMBERS) -> ClusterView:
    return ClusterView(MEMBERS, "vm0", me == "vm0", {EID: rec}, ConnectionState.CONNECTED, known=known)


def snap(me: str, cluster: ClusterView) -> Snapshot:
    return Snapshot(me=me, now=NOW - 400_000_000, mono=1000.0, document=doc(), last_document=doc(), cluster=cluster)


def test_without_a_word_a_vm_without_an_agent_holds_the_event_and_it_is_never_admitted() -> None:
    leader = decide(snap("vm0", view(record(), me="vm0")), LocalState(phase=Phase.SERVING), POLICY)
    assert leader.admit == ()
    approver = decide(snap("vm1", view(record(acks={"vm1": NOW}), me="vm1")), DRAINED, POLICY)
    assert "vm9 runs no agent" in approver.reasons(EID)


def test_with_a_word_the_leader_admits_it_and_the_approver_approves_on_the_other_acks() -> None:
    leader = decide(snap("vm0", view(record(vouched=WORD), me="vm0")), LocalState(phase=Phase.SERVING), POLICY)
    assert leader.admit == (EID,)
    admitted = record(vouched=WORD, admitted_at=NOW - 20, acks={"vm1": NOW - 15})
    approver = decide(snap("vm1", view(admitted, me="vm1")), DRAINED, POLICY)
    assert [(i.event_id, i.required) for i in approver.approve] == [(EID, ("vm1",))]


def test_a_vm_vouched_for_that_ran_an_agent_here_is_marked_out_before_the_approval() -> None:
    admitted = record(vouched=WORD, admitted_at=NOW - 20, acks={"vm1": NOW - 15})
    plan = decide(snap("vm1", view(admitted, me="vm1", known=MEMBERS | {"vm9"})), DRAINED, POLICY)
    assert plan.approve == ()
    assert plan.mark_out_for == {"vm9": (EID,)}


def test_a_word_for_a_vm_that_runs_an_agent_again_does_not_stand_for_its_ack() -> None:
    members = MEMBERS | {"vm9"}
    cluster = replace(view(record(vouched=WORD, admitted_at=NOW - 20, acks={"vm1": NOW - 15}), me="vm1"),
                      members=members, known=members)
    plan = decide(snap("vm1", cluster), DRAINED, POLICY)
    assert plan.approve == () and "vm9 has not acknowledged" in plan.reasons(EID)


def test_the_command_refuses_what_it_cannot_vouch_for_in_one_line() -> None:
    good = vouching(view(record(), me="vm2"), EID.lower(), POLICY, NOW)
    assert (good.required, good.vouched) == (("vm1",), ("vm9",))
    cases = [
        (view(record(), me="vm2"), "0000", "event 0000 has no record in the group"),
        (view(record(done_at=NOW), me="vm2"), EID, f"event {EID} is over: its record was marked done"),
        (view(replace(record(), resources=("vm1", "vm2")), me="vm2"), EID, f"every VM event {EID} names runs an "
         "agent"),
        (replace(view(record(), me="vm2"), paused=Pause("incident", "alice", NOW)), EID, "approvals paused by "
         "alice: incident"),
    ]
    for cluster, event_id, words in cases:
        with pytest.raises(OverrideRefused) as refused:
            vouching(cluster, event_id, POLICY, NOW)
        assert str(refused.value).startswith(words), str(refused.value)
    never = Policy(drain_wait=10.0, approval={"Reboot": ApprovalRule.NEVER})
    with pytest.raises(OverrideRefused, match="never approves a Reboot early"):
        vouching(view(record(), me="vm2"), EID, never, NOW)
