"""Drains by hand (``coordinator drain VM``) in the decision: the leader admits them through the budget,
the VM drains once admitted and stays out until the drain is undone, and the budget counts it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide
from coordinator.models import Document, parse_document
from coordinator.store.base import BY_HAND, ClusterView, ConnectionState, EventRecord, HandDrain, OutMark, Part

NOW = 1_700_000_000.0
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
ALL3 = frozenset({"vm0", "vm1", "vm2"})
SERVING = LocalState(phase=Phase.SERVING, phase_since=0.0)
ASKED = HandDrain(reason="disk swap", by="ops@bastion", at=NOW - 60)
ADMITTED = replace(ASKED, admitted_by="vm2", admitted_at=NOW - 30)
ONE_VM = Policy(drain_wait=10.0, max_events=None, max_vms=1, keep_one_serving=False)


def empty() -> Document:
    return parse_document({"DocumentIncarnation": 1, "Events": []})


def freeze_of(vm: str) -> Document:
    return parse_document({"DocumentIncarnation": 2, "Events": [{
        "EventId": EID, "EventStatus": "Scheduled", "EventType": "Freeze", "ResourceType": "VirtualMachine",
        "Resources": [vm], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]})


def view(me: str, *, drains: dict[str, HandDrain] | None = None, out: dict[str, OutMark] | None = None,
         records: tuple[EventRecord, ...] = (), members: frozenset[str] = ALL3) -> ClusterView:
    return ClusterView(members, "vm2", me == "vm2", {r.event_id: r for r in records}, ConnectionState.CONNECTED,
                       known=ALL3, out=out or {}, drains=drains or {})


def snap(me: str, cluster: ClusterView | None, document: Document | None = None) -> Snapshot:
    document = document or empty()
    # A clock far past NotBefore's date would make the Freeze due at once: keep "now" before it.
    return Snapshot(me=me, now=NOW - 400_000_000, mono=100.0, document=document, last_document=document,
                    cluster=cluster)


# --- the leader admits through the budget ---------------------------------------------------------------

def test_the_leader_admits_a_drain_by_hand_that_keeps_the_budget() -> None:
    plan = decide(snap("vm2", view("vm2", drains={"vm1": ASKED})), SERVING, ONE_VM)
    assert plan.admit_drains == {"vm1": 0}
    assert plan.drain_waits == {}


def test_a_drain_by_hand_waits_while_the_budget_is_full_and_the_first_asked_goes_first() -> None:
    later = replace(ASKED, at=NOW - 10)
    cluster = view("vm2", drains={"vm1": later, "vm0": ASKED}, out={"vm2": OutMark(since=NOW - 5)})
    plan = decide(snap("vm2", cluster), SERVING, ONE_VM)
    assert plan.admit_drains == {}
    assert plan.drain_waits == {"vm0": "maintenance budget: 1 VM(s) in maintenance, at most 1",
                                "vm1": "maintenance budget: 1 VM(s) in maintenance, at most 1"}
    freed = decide(snap("vm2", replace(cluster, out={})), SERVING, ONE_VM)
    assert freed.admit_drains == {"vm0": 0}  # asked first; vm1 then waits behind it
    assert freed.drain_waits == {"vm1": "maintenance budget: 1 VM(s) in maintenance, at most 1"}


def test_an_admitted_drain_holds_its_slot_before_its_vm_is_out() -> None:
    cluster = view("vm2", drains={"vm1": ADMITTED, "vm0": ASKED})
    plan = decide(snap("vm2", cluster), SERVING, ONE_VM)
    assert plan.admit_drains == {}
    assert "vm0" in plan.drain_waits


def test_a_drain_that_would_leave_no_vm_serving_is_never_admitted() -> None:
    policy = Policy(drain_wait=10.0, max_events=None, keep_one_serving=True)
    cluster = view("vm2", drains={"vm2": ASKED}, members=frozenset({"vm2"}))
    plan = decide(snap("vm2", cluster), SERVING, policy)
    assert plan.admit_drains == {}
    assert plan.drain_waits == {"vm2": "it would leave no VM serving even with nothing else in maintenance"}


def test_a_drain_takes_a_vm_not_an_event_slot() -> None:
    # One event in maintenance, at most one event: a drain by hand of another VM still goes (no VM limit).
    policy = Policy(drain_wait=10.0, max_events=1, keep_one_serving=False)
    rec = EventRecord(event_id=EID, event_type="Freeze", resources=("vm0",), not_before=None, published_by="vm0",
                      published_at=NOW - 100, admitted_at=NOW - 90)
    plan = decide(snap("vm2", view("vm2", drains={"vm1": ASKED}, records=(rec,)), freeze_of("vm0")), SERVING, policy)
    assert plan.admit_drains == {"vm1": 0}


def test_a_drain_of_a_vm_without_an_agent_waits_for_it() -> None:
    plan = decide(snap("vm2", view("vm2", drains={"vm1": ASKED}, members=frozenset({"vm0", "vm2"}))), SERVING,
                  ONE_VM)
    assert plan.admit_drains == {}
    assert plan.drain_waits == {"vm1": "vm1 runs no agent: its drain is admitted once its agent runs"}


def test_a_vm_drained_by_hand_holds_the_budget_against_events() -> None:
    rec = EventRecord(event_id=EID, event_type="Freeze", resources=("vm0",), not_before=None, published_by="vm0",
                      published_at=NOW - 100)
    cluster = view("vm2", drains={"vm1": ADMITTED}, out={"vm1": OutMark(since=NOW - 20, events=(BY_HAND,))},
                   records=(rec,))
    plan = decide(snap("vm2", cluster, freeze_of("vm0")), SERVING, ONE_VM)
    assert plan.admit == ()
    assert "maintenance budget" in " ".join(plan.reasons(EID))
    # Undone and back in rotation: the event is admitted.
    back = decide(snap("vm2", replace(cluster, drains={}, out={}), freeze_of("vm0")), SERVING, ONE_VM)
    assert back.admit == (EID,)


# --- the VM drains once admitted, and stays out until undone -------------------------------------------

def test_the_vm_drains_only_once_its_drain_is_admitted() -> None:
    waiting = decide(snap("vm1", view("vm1", drains={"vm1": ASKED})), SERVING, ONE_VM)
    assert not waiting.start_drain and waiting.holding == ()
    admitted = decide(snap("vm1", view("vm1", drains={"vm1": ADMITTED})), SERVING, ONE_VM)
    assert admitted.start_drain and admitted.holding == (BY_HAND,)
    assert admitted.mark_out == (BY_HAND,)


def test_without_a_budget_the_vm_drains_at_once() -> None:
    policy = Policy(drain_wait=10.0, max_events=None, keep_one_serving=False)
    plan = decide(snap("vm1", view("vm1", drains={"vm1": ASKED})), SERVING, policy)
    assert plan.start_drain and plan.holding == (BY_HAND,)


DRAINED_BY_HAND = LocalState(phase=Phase.DRAINED, phase_since=0.0, draining_for=frozenset({BY_HAND}))


@pytest.mark.parametrize("part", [Part.OWN, Part.NAMED, Part.WHOLE])
def test_a_vm_drained_by_hand_stays_out_while_the_drain_is_there_in_every_part_it_reads(part: Part) -> None:
    cluster = replace(view("vm1", drains={"vm1": ADMITTED}, out={"vm1": OutMark(NOW - 20, (BY_HAND,))}), part=part)
    plan = decide(snap("vm1", cluster), DRAINED_BY_HAND, ONE_VM)
    assert plan.holding == (BY_HAND,)
    assert not plan.start_recover and plan.next_phase is None


def test_without_a_view_a_vm_drained_by_hand_stays_out() -> None:
    plan = decide(snap("vm1", None), DRAINED_BY_HAND, ONE_VM)
    assert plan.holding == (BY_HAND,)
    assert not plan.start_recover


def test_undone_the_vm_recovers_and_clears_its_mark_once_back() -> None:
    cluster = view("vm1", out={"vm1": OutMark(NOW - 20, (BY_HAND,))})
    plan = decide(snap("vm1", cluster), DRAINED_BY_HAND, ONE_VM)
    assert plan.holding == ()
    assert plan.start_recover and plan.next_phase is Phase.RECOVERING
    assert not plan.clear_out  # only once the load balancer routes to it again
    back = LocalState(phase=Phase.RECOVERING, phase_since=0.0, job_done_at=0.0)
    assert decide(snap("vm1", cluster), back, ONE_VM).clear_out


def test_an_admitted_drain_restarted_agent_drains_again_from_the_view_alone() -> None:
    # The state file lost: the process starts UNKNOWN, and the drain in the view holds it.
    plan = decide(snap("vm1", view("vm1", drains={"vm1": ADMITTED})), LocalState(), ONE_VM)
    assert plan.holding == (BY_HAND,) and plan.start_drain


def test_an_event_of_the_vm_drained_by_hand_still_drains_and_acks_for_it() -> None:
    policy = Policy(drain_wait=0.0, max_events=None, keep_one_serving=False)
    rec = EventRecord(event_id=EID, event_type="Freeze", resources=("vm1",), not_before=None, published_by="vm1",
                      published_at=NOW - 100)
    cluster = view("vm1", drains={"vm1": ADMITTED}, out={"vm1": OutMark(NOW - 20, (BY_HAND,))}, records=(rec,))
    plan = decide(snap("vm1", cluster, freeze_of("vm1")), DRAINED_BY_HAND, policy)
    assert set(plan.holding) == {EID, BY_HAND}
    assert plan.ack == (EID,)
    assert plan.mark_out == (BY_HAND, EID)


def test_the_leader_forgets_an_admission_that_admits_no_drain() -> None:
    cluster = replace(view("vm2"), stale_admissions=frozenset({"vm1"}))
    assert decide(snap("vm2", cluster), SERVING, ONE_VM).forget_admissions == ("vm1",)
    # Only the leader, on its whole view.
    assert decide(snap("vm0", replace(cluster, i_am_leader=False)), SERVING, ONE_VM).forget_admissions == ()
