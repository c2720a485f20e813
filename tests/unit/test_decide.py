"""The decision function as tables: (document x membership x acks x local state) -> plan."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.config import ApproverMode
from coordinator.decide import LocalState, Phase, Policy, Snapshot, choose_approver, decide
from coordinator.models import Document, parse_document
from coordinator.store.base import Approval, ClusterView, ConnectionState, EventRecord

EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
NOW = 1_700_000_000.0


def doc(*events: dict[str, Any], incarnation: int = 2) -> Document:
    return parse_document({"DocumentIncarnation": incarnation, "Events": list(events)})


def event(resources: list[str], *, status: str = "Scheduled", etype: str = "Freeze", eid: str = EID) -> dict[str, Any]:
    return {"EventId": eid, "EventStatus": status, "EventType": etype, "ResourceType": "VirtualMachine",
            "Resources": resources, "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT" if status == "Scheduled" else ""}


def record(resources: tuple[str, ...], acks: tuple[str, ...] = (), eid: str = EID, **kw: Any) -> EventRecord:
    return EventRecord(event_id=eid, event_type="Freeze", resources=resources, not_before=None,
                       published_by="vm0", published_at=NOW - 10, acks={a: NOW - 5 for a in acks}, **kw)


def view(members: tuple[str, ...], records: tuple[EventRecord, ...] = (), *, leader: str | None = "vm2",
         me: str = "vm0", connection: ConnectionState = ConnectionState.CONNECTED) -> ClusterView:
    return ClusterView(frozenset(members), leader, leader == me, {r.event_id: r for r in records}, connection)


def snap(me: str, document: Document | None, cluster: ClusterView | None, *, last: Document | None = None,
         mono: float = 100.0) -> Snapshot:
    return Snapshot(me=me, now=NOW, mono=mono, document=document,
                    last_document=document if document is not None else last, cluster=cluster)


SERVING = LocalState(phase=Phase.SERVING, phase_since=0.0)
DRAINED = LocalState(phase=Phase.DRAINED, phase_since=0.0)
POLICY = Policy(drain_wait=10.0, max_events=None, keep_one_serving=False)  # no disruption budget, no admissions

ALL3 = ("vm0", "vm1", "vm2")


# --- who approves -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("resources", "members", "leader", "mode", "expected"),
    [
        (("vm0", "vm1"), ALL3, "vm2", ApproverMode.FIRST_RESOURCE, ("vm0", False)),
        (("vm1", "vm0"), ALL3, "vm2", ApproverMode.FIRST_RESOURCE, ("vm1", False)),
        (("vm0", "vm1"), ("vm1", "vm2"), "vm2", ApproverMode.FIRST_RESOURCE, ("vm1", False)),  # vm0 down
        (("vmx",), ALL3, "vm2", ApproverMode.FIRST_RESOURCE, ("vm2", True)),  # nobody named runs an agent
        (("vm0", "vm1"), ALL3, "vm2", ApproverMode.LEADER, ("vm2", True)),
        (("vmx",), ALL3, None, ApproverMode.FIRST_RESOURCE, (None, True)),  # no leader either
    ],
)
def test_choose_approver(resources: tuple[str, ...], members: tuple[str, ...], leader: str | None,
                         mode: ApproverMode, expected: tuple[str | None, bool]) -> None:
    assert choose_approver(resources, view(members, leader=leader), mode) == expected


# --- when to approve ----------------------------------------------------------------------------------

APPROVAL_TABLE = [
    # me, members, acks, connection, expected approve?, expected blocker fragment
    ("vm0", ALL3, ("vm0", "vm1"), ConnectionState.CONNECTED, True, None),
    ("vm0", ALL3, ("vm0",), ConnectionState.CONNECTED, False, "vm1 has not acknowledged"),
    ("vm0", ALL3, (), ConnectionState.CONNECTED, False, "vm1 has not acknowledged"),  # vm0 acks this cycle
    ("vm0", ("vm0", "vm2"), ("vm0",), ConnectionState.CONNECTED, False, "vm1 runs no agent"),
    ("vm0", ALL3, ("vm0", "vm1"), ConnectionState.SUSPENDED, False, "ZooKeeper connection suspended"),
    ("vm1", ALL3, ("vm0", "vm1"), ConnectionState.CONNECTED, False, None),  # vm0 is the approver, not vm1
    ("vm2", ALL3, ("vm0", "vm1"), ConnectionState.CONNECTED, False, None),  # vm2 is leader but not approver
]


@pytest.mark.parametrize(("me", "members", "acks", "connection", "approves", "blocker"), APPROVAL_TABLE)
def test_approval_table(me: str, members: tuple[str, ...], acks: tuple[str, ...], connection: ConnectionState,
                        approves: bool, blocker: str | None) -> None:
    d = doc(event(["vm0", "vm1"]))
    cluster = view(members, (record(("vm0", "vm1"), acks),), me=me, connection=connection)
    plan = decide(snap(me, d, cluster), SERVING if me == "vm2" else DRAINED, POLICY)
    assert [i.event_id for i in plan.approve] == ([EID] if approves else [])
    if blocker:
        assert any(blocker in r for r in plan.reasons(EID))
    if approves:
        intent = plan.approve[0]
        assert intent.required == ("vm0", "vm1")
        assert intent.as_leader is False


def test_approver_that_has_not_finished_draining_does_not_approve() -> None:
    d = doc(event(["vm0", "vm1"]))
    draining = LocalState(phase=Phase.DRAINING, phase_since=99.0, drain_started=99.0, job_running=True)
    plan = decide(snap("vm0", d, view(ALL3, (record(("vm0", "vm1"), ("vm1",)),))), draining, POLICY)
    assert plan.approve == ()
    assert plan.ack == ()
    assert plan.reasons(EID) == ("vm0 has not acknowledged",)


def test_leader_approves_when_no_named_vm_runs_an_agent_but_only_with_every_ack() -> None:
    d = doc(event(["vmx"]))
    without = decide(snap("vm2", d, view(ALL3, (record(("vmx",)),), leader="vm2", me="vm2")), SERVING, POLICY)
    assert without.approve == ()
    assert without.reasons(EID) == ("vmx runs no agent",)
    with_ack = decide(snap("vm2", d, view(ALL3, (record(("vmx",), ("vmx",)),), leader="vm2", me="vm2")),
                      SERVING, POLICY)
    assert [(i.event_id, i.as_leader) for i in with_ack.approve] == [(EID, True)]


def test_leader_mode_only_leader_approves() -> None:
    d = doc(event(["vm0", "vm1"]))
    rec = record(("vm0", "vm1"), ("vm0", "vm1"))
    policy = Policy(approver=ApproverMode.LEADER, drain_wait=10.0, max_events=None, keep_one_serving=False)
    assert decide(snap("vm0", d, view(ALL3, (rec,), leader="vm2")), DRAINED, policy).approve == ()
    plan = decide(snap("vm2", d, view(ALL3, (rec,), leader="vm2", me="vm2")), SERVING, policy)
    assert [(i.event_id, i.as_leader) for i in plan.approve] == [(EID, True)]


@pytest.mark.parametrize(
    ("ev", "fragment"),
    [
        (event(["vm0"], etype="Hibernate"), "unknown event type 'Hibernate'"),
        (event([]), "Resources is empty"),
        (event(["vm0", "../etc"]), "not a valid VM name"),
    ],
)
def test_never_auto_approved(ev: dict[str, Any], fragment: str) -> None:
    acks = tuple(r for r in ev["Resources"] if r.isalnum())
    cluster = view(ALL3, (record(tuple(r for r in ev["Resources"] if r.isalnum()), acks),), leader="vm0")
    plan = decide(snap("vm0", doc(ev), cluster), DRAINED, POLICY)
    assert plan.approve == ()
    assert any(fragment in r for r in plan.reasons(EID))


def test_started_event_is_never_approved() -> None:
    cluster = view(ALL3, (record(("vm0",), ("vm0",)),))
    plan = decide(snap("vm0", doc(event(["vm0"], status="Started")), cluster), DRAINED, POLICY)
    assert plan.approve == ()


def test_no_approval_from_a_stale_document_or_without_cluster_view() -> None:
    d = doc(event(["vm0"]))
    cluster = view(ALL3, (record(("vm0",), ("vm0",)),))
    assert decide(snap("vm0", None, cluster, last=d), DRAINED, POLICY).approve == ()
    assert decide(snap("vm0", d, None), DRAINED, POLICY).approve == ()


def test_already_posted_is_not_posted_again() -> None:
    d = doc(event(["vm0"]))
    cluster = view(ALL3, (record(("vm0",), ("vm0",), approval=Approval("vm0", NOW, False)),))
    local = LocalState(phase=Phase.DRAINED, posted=frozenset({EID}))
    assert decide(snap("vm0", d, cluster), local, POLICY).approve == ()
    # A restarted agent has an empty posted set: approval is idempotent, so it POSTs again.
    assert [i.event_id for i in decide(snap("vm0", d, cluster), DRAINED, POLICY).approve] == [EID]


def test_approver_acking_in_this_cycle_may_approve_store_rechecks() -> None:
    d = doc(event(["vm0"]))
    cluster = view(ALL3, (record(("vm0",)),))
    plan = decide(snap("vm0", d, cluster), DRAINED, POLICY)
    assert plan.ack == (EID,)
    assert [i.required for i in plan.approve] == [("vm0",)]


def test_several_events_approved_independently() -> None:
    other = "A626E37F-793E-44E1-89B5-99AE0B96044C"
    d = doc(event(["vm0"]), event(["vm1"], eid=other))
    cluster = view(ALL3, (record(("vm0",), ("vm0",)), record(("vm1",), (), eid=other)))
    plan = decide(snap("vm0", d, cluster), DRAINED, POLICY)
    assert [i.event_id for i in plan.approve] == [EID]
    assert plan.approvers[other] == "vm1"


# --- drain and recovery ------------------------------------------------------------------------------

DRAIN_TABLE = [
    # phase, job_running, job_failed, phase age, named?, fresh doc?, -> next phase, drain, recover
    (Phase.UNKNOWN, False, False, 0, True, True, Phase.DRAINING, True, False),
    (Phase.UNKNOWN, False, False, 0, False, True, Phase.RECOVERING, False, True),
    (Phase.UNKNOWN, False, False, 0, False, False, None, False, False),  # no document yet: stay 503
    (Phase.SERVING, False, False, 50, True, True, Phase.DRAINING, True, False),
    (Phase.SERVING, False, False, 50, False, True, None, False, False),
    (Phase.DRAINING, True, False, 50, True, True, None, False, False),  # actions still running
    (Phase.DRAINING, False, False, 5, True, True, Phase.DRAINED, False, False),  # actions done
    (Phase.DRAINING, False, True, 10, True, True, None, False, False),  # drain failed: no ack
    (Phase.DRAINING, False, True, 50, True, True, Phase.DRAINING, True, False),  # tried again after 30 s
    (Phase.DRAINING, False, False, 10, True, True, Phase.DRAINED, False, False),
    (Phase.DRAINED, False, False, 50, True, False, None, False, False),  # stale doc still names us
    (Phase.DRAINED, False, False, 50, False, False, None, False, False),  # IMDS down: stay drained
    (Phase.DRAINED, False, False, 50, False, True, Phase.RECOVERING, False, True),
    (Phase.DRAINING, True, False, 1, False, True, Phase.RECOVERING, False, True),  # cancelled mid-drain
    (Phase.RECOVERING, True, False, 1, False, True, None, False, False),
    (Phase.RECOVERING, False, False, 1, False, True, Phase.SERVING, False, False),
    (Phase.RECOVERING, False, True, 1, False, True, None, False, False),  # failed: retry after a pause
    (Phase.RECOVERING, False, True, 6, False, True, Phase.RECOVERING, False, True),
    (Phase.RECOVERING, True, False, 1, True, True, Phase.DRAINING, True, False),  # second event
]


@pytest.mark.parametrize(
    ("phase", "running", "failed", "age", "named", "fresh", "next_phase", "drain", "recover"), DRAIN_TABLE
)
def test_drain_table(phase: Phase, running: bool, failed: bool, age: float, named: bool, fresh: bool,
                     next_phase: Phase | None, drain: bool, recover: bool) -> None:
    d = doc(event(["vm0", "vm1"] if named else ["vm1"], status="Started"))
    local = LocalState(phase=phase, phase_since=100.0 - age, job_running=running, job_failed=failed)
    # ZooKeeper read this cycle and holding no ack of vm0: nothing but the local state decides.
    plan = decide(snap("vm0", d if fresh else None, view(ALL3), last=d), local, POLICY)
    assert (plan.next_phase, plan.start_drain, plan.start_recover) == (next_phase, drain, recover)


def test_drained_vm_acks_publishes_and_withdraws_before_it_recovers() -> None:
    d = doc(event(["vm0", "vm1"]))
    first = decide(snap("vm0", d, view(ALL3)), DRAINED, POLICY)
    assert [r.event_id for r in first.publish] == [EID]
    assert first.publish[0].resources == ("vm0", "vm1")
    assert first.ack == (EID,)
    cluster = view(ALL3, (record(("vm0", "vm1"), ("vm0",)),))
    gone = decide(snap("vm0", doc(), cluster), DRAINED, POLICY)
    # An ack means "drained now": it goes before the VM may serve, and the VM waits to see it gone.
    assert gone.withdraw == (EID,)
    assert not gone.start_recover and gone.next_phase is None
    assert "withdrawing its acknowledgement" in gone.waiting
    withdrawn = view(ALL3, (record(("vm0", "vm1")),))
    recover = decide(snap("vm0", doc(), withdrawn), DRAINED, POLICY)
    assert recover.start_recover and recover.withdraw == ()
    assert recover.mark_out == ()  # still out of rotation, for no event: the budget keeps counting it


def test_ack_waits_for_the_drain_wait_of_the_event_type() -> None:
    policy = Policy(drain_wait=30.0, drain_wait_by_type={"Preempt": 2.0}, max_events=None, keep_one_serving=False)
    drained = LocalState(phase=Phase.DRAINED, phase_since=95.0, drain_started=95.0)  # 5 s ago
    freeze = decide(snap("vm0", doc(event(["vm0"])), view(ALL3, (record(("vm0",)),))), drained, policy)
    assert freeze.ack == ()
    assert freeze.reasons(EID) == ("vm0 has not acknowledged",)
    preempt = decide(snap("vm0", doc(event(["vm0"], etype="Preempt")), view(ALL3, (record(("vm0",)),))),
                     drained, policy)
    assert preempt.ack == (EID,)


def test_vm_not_named_never_drains_nor_acks() -> None:
    d = doc(event(["vm0", "vm1"]))
    plan = decide(snap("vm2", d, view(ALL3, (record(("vm0", "vm1")),), me="vm2")), SERVING, POLICY)
    assert not plan.start_drain
    assert plan.ack == ()


def test_leader_marks_gone_events_done_and_purges_once_one_has_expired() -> None:
    cluster = view(ALL3, (record(("vm0",)),), leader="vm2", me="vm2")
    plan = decide(snap("vm2", doc(), cluster), SERVING, POLICY)
    assert plan.mark_done == (EID,)
    assert plan.purge_before is None  # nothing done yet, so nothing to purge: no sweep of the records
    cutoff = NOW - POLICY.done_retention
    recent = view(ALL3, (record(("vm0",), done_at=cutoff + 1),), leader="vm2", me="vm2")
    assert decide(snap("vm2", doc(), recent), SERVING, POLICY).purge_before is None
    expired = view(ALL3, (record(("vm0",), done_at=cutoff - 1),), leader="vm2", me="vm2")
    assert decide(snap("vm2", doc(), expired), SERVING, POLICY).purge_before == cutoff
    follower = decide(snap("vm1", doc(), view(ALL3, (record(("vm0",)),), leader="vm2", me="vm1")), SERVING, POLICY)
    assert follower.mark_done == ()
    assert follower.purge_before is None


def test_case_insensitive_names() -> None:
    d = doc(event(["VM0", "Vm1"]))
    plan = decide(snap("vm0", d, view(ALL3, (record(("vm0", "vm1"), ("vm0", "vm1")),))), DRAINED, POLICY)
    assert [i.event_id for i in plan.approve] == [EID]


def test_invalid_event_id_still_drains_but_is_never_coordinated() -> None:
    d = doc(event(["vm0"], eid="../../zookeeper"))
    plan = decide(snap("vm0", d, view(ALL3)), SERVING, POLICY)
    assert plan.start_drain
    assert plan.publish == () and plan.approve == ()
    assert any("invalid event id" in p for p in plan.invalid)


def test_a_cycle_that_could_read_neither_imds_nor_zookeeper_says_so_instead_of_nothing_to_do() -> None:
    plan = decide(snap("vm0", None, None), SERVING, POLICY)
    assert plan.describe() == "no fresh IMDS document and no ZooKeeper view: the VM stays as it is"
    assert decide(snap("vm0", doc(), None), SERVING, POLICY).describe() == "no ZooKeeper view: the VM stays as it is"
    assert decide(snap("vm0", doc(), view(("vm0",))), SERVING, POLICY).describe() == "nothing to do"


def test_a_cycle_without_zookeeper_that_drains_the_vm_says_so_instead_of_that_it_stays_as_it_is() -> None:
    # An event naming this VM, past its NotBefore, first seen while ZooKeeper is unreachable: it drains anyway.
    plan = decide(snap("vm0", doc(event(["vm0"])), None), SERVING, POLICY)
    assert plan.start_drain and plan.approve == ()
    assert plan.describe() == f"drain for {EID}; no ZooKeeper view: drains on this VM's own evidence, approves nothing"
    drained = decide(snap("vm0", doc(event(["vm0"])), None), DRAINED, POLICY)  # nothing changes: it stays drained
    assert drained.describe() == "no ZooKeeper view: the VM stays as it is"
