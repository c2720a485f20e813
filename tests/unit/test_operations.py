"""A plan's operations: the order the decision gives them (``decide.order.in_order``), how ``carry_out`` hands
them to an executor and stops the store's after one fails, and how each result is folded into the local
state (``decide.local.reported``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.decide import LocalState, Phase, Plan, Policy, Snapshot, in_order, reported
from coordinator.execute import carry_out
from coordinator.models import parse_document
from coordinator.operations import (
    DONE,
    FAILED,
    Acknowledge,
    Admit,
    ApprovalIntent,
    Approve,
    Archive,
    ClearOut,
    Done,
    MarkDone,
    MarkOut,
    Operation,
    ProbePeers,
    Purge,
    ReadImdsNow,
    SaveState,
    StartDrain,
    StartRecover,
    WithdrawAck,
)
from coordinator.state import PersistedState
from coordinator.store.base import ClusterView, ConnectionState
from tests.unit.test_safety_regressions import POLICY, Bench

NOW = 1_700_000_000.0
MONO = 500.0
E = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
DOCUMENT = parse_document({"DocumentIncarnation": 2, "Events": [
    {"EventId": E, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
     "Resources": ["vm0"], "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"},
    {"EventId": "OTHER", "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
     "Resources": ["vm1"], "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"},
]})
VIEW = ClusterView(members=frozenset({"vm0", "vm1"}), leader="vm0", i_am_leader=True, records={},
                   connection=ConnectionState.CONNECTED, known=frozenset({"vm0", "vm1"}))
SNAP = Snapshot("vm0", NOW, MONO, DOCUMENT, DOCUMENT, VIEW, started_seen={E: NOW - 30}, peers_confirmed_at=MONO - 0.1)
INTENT = ApprovalIntent(E, E, ("vm0",), as_leader=True)
DRAINING = PersistedState(Phase.DRAINING.value, frozenset({E}), NOW)
DRAINED = PersistedState(Phase.DRAINED.value, frozenset({E}), NOW)
# Every field of a plan that becomes an operation, at once (no real cycle plans all of them together).
EVERYTHING = Plan(
    read_now=True, save_first=DRAINING, start_drain=True, start_recover=True, recover_all=False,
    mark_out=(E,), admit=(E,), ack=(E,), withdraw=("OLD",), mark_done=(E, "GONE"), clear_out=True,
    archive=("GONE",), history_from=NOW - 86400, purge_before=NOW - 3600, approve=(INTENT,), save=DRAINED,
    probe_peers=True, local=LocalState(phase=Phase.DRAINING, drain_started=MONO - 12.0),
)


def test_the_operations_come_in_the_order_safety_rests_on() -> None:
    """The write-ahead before the drain job; ``/out/{me}`` before everything else in the store, the ack after
    it; the mark cleared after every write that rests on this VM being out; the approval last of the store's,
    on what the writes before it left; the state file once the cycle is carried out; the peers last."""
    ops = in_order(EVERYTHING, SNAP)
    assert [type(op).__name__ for op in ops] == [
        "ReadImdsNow", "SaveState", "StartDrain", "StartRecover", "MarkOut", "Admit", "Acknowledge", "WithdrawAck",
        "MarkDone", "MarkDone", "ClearOut", "Archive", "Purge", "Approve", "SaveState", "ProbePeers",
    ]
    assert ops[1] == SaveState(DRAINING, ahead=True) and ops[-2] == SaveState(DRAINED)
    assert ops[2] == StartDrain((DOCUMENT.events[0],))  # the events that name this VM, not vm1's
    assert ops[3] == StartRecover(every_action=False)
    assert ops[4] == MarkOut((E,), NOW) and ops[5] == Admit(E, NOW)
    assert ops[6] == Acknowledge(E, NOW, MONO - 12.0, 12.0)  # the drain latency: from the drain's start
    assert ops[8] == MarkDone(E, NOW, NOW - 30) and ops[9] == MarkDone("GONE", NOW, None)
    assert ops[11] == Archive(("GONE",), NOW - 86400) and ops[12] == Purge(NOW - 3600)
    approve = ops[13]
    assert isinstance(approve, Approve) and approve.intents == (INTENT,)
    assert approve.peers_confirmed_at == MONO - 0.1
    assert ops[15] == ProbePeers(VIEW.members, True)


def test_without_a_view_of_the_group_no_store_operation_is_planned() -> None:
    """Decided blind (ZooKeeper unreachable): this VM still drains, saves its state and reads IMDS early,
    and nothing is sent to the store or the peers' probes."""
    ops = in_order(EVERYTHING, replace(SNAP, cluster=None))
    assert [type(op).__name__ for op in ops] == ["ReadImdsNow", "SaveState", "StartDrain", "StartRecover",
                                                 "SaveState"]
    assert not any(op.in_store for op in ops)


def test_what_changes_anything_and_what_the_store_carries_are_said_by_the_operation() -> None:
    ops = in_order(EVERYTHING, SNAP)
    assert [type(op).__name__ for op in ops if not op.changes] == ["ReadImdsNow", "ProbePeers"]
    assert {type(op).__name__ for op in ops if op.in_store} == {
        "MarkOut", "Admit", "Acknowledge", "WithdrawAck", "MarkDone", "ClearOut", "Archive", "Purge", "Approve"}


class Recording:
    """An executor that records what it is handed, and fails the operations it is told to."""

    def __init__(self, failing: tuple[type, ...] = ()) -> None:
        self.failing = failing
        self.plans: list[Plan] = []
        self.carried: list[Operation] = []

    def planned(self, plan: Plan, snap: Snapshot) -> None:
        self.plans.append(plan)

    def carry(self, op: Operation, snap: Snapshot) -> Done:
        self.carried.append(op)
        return FAILED if isinstance(op, self.failing) else DONE


def test_a_failed_store_operation_stops_the_store_operations_after_it_and_nothing_else() -> None:
    """The ack fails: the withdrawal, done marks, the mark cleared and the approval wait for the next cycle,
    which decides again from what the store then shows; the state file and the peers are carried out."""
    plan = replace(EVERYTHING, operations=in_order(EVERYTHING, SNAP))
    executor = Recording(failing=(Acknowledge,))
    results = carry_out(executor, plan, SNAP)
    assert executor.plans == [plan]
    assert [type(op).__name__ for op in executor.carried] == [
        "ReadImdsNow", "SaveState", "StartDrain", "StartRecover", "MarkOut", "Admit", "Acknowledge", "SaveState",
        "ProbePeers"]
    assert [op for op, _ in results] == executor.carried
    assert [done.ok for op, done in results if isinstance(op, Acknowledge)] == [False]


@pytest.mark.parametrize("failing", [(), (SaveState,), (StartDrain,)])
def test_operations_outside_the_store_never_stop_the_store_operations(failing: tuple[type, ...]) -> None:
    plan = replace(EVERYTHING, operations=in_order(EVERYTHING, SNAP))
    executor = Recording(failing=failing)
    carry_out(executor, plan, SNAP)
    assert executor.carried == list(plan.operations)


BEFORE = LocalState(phase=Phase.DRAINING, job_running=True, saved=DRAINING, posted=frozenset({"EARLIER"}))


@pytest.mark.parametrize(("op", "done", "after"), [
    (SaveState(DRAINED), DONE, replace(BEFORE, saved=DRAINED)),
    # A save that failed removed the file: a restart assumes the worst, and the next save is not skipped.
    (SaveState(DRAINED), FAILED, replace(BEFORE, saved=None)),
    (Approve((INTENT,), NOW), Done(posted=frozenset({E})), replace(BEFORE, posted=frozenset({"EARLIER", E}))),
    (Approve((INTENT,), NOW), DONE, BEFORE),  # refused, fenced or failed: the next cycle decides again
    # A job left on the job thread: its end is read from it by the next cycles.
    (StartDrain(()), DONE, BEFORE),
    # A job carried out at once (a dry run's): over, at that time.
    (StartDrain(()), Done(finished_at=MONO), replace(BEFORE, job_running=False, job_done_at=MONO)),
    (StartRecover(True), Done(finished_at=MONO), replace(BEFORE, job_running=False, job_done_at=MONO)),
    (Acknowledge(E, NOW), FAILED, BEFORE),
    (ReadImdsNow(), DONE, BEFORE),
    (ClearOut(), DONE, BEFORE),
    (WithdrawAck(E), DONE, BEFORE),
])
def test_each_result_is_folded_into_the_local_state(op: Operation, done: Done, after: LocalState) -> None:
    assert reported(BEFORE, op, done) == after


def test_each_cycle_decides_once_and_an_approval_rests_on_peers_asked_again_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vm0 would approve E: that cycle approves nothing and runs the next one at once, which asks the peers
    again before it decides, and approves on their answers. Every cycle calls ``decide`` once."""
    from coordinator import agent as agent_module

    calls: list[bool] = []
    real = agent_module.decide

    def counted(snap: Snapshot, local: LocalState, policy: Policy) -> Plan:
        calls.append(snap.peers_confirmed_at is not None)
        return real(snap, local, policy)

    monkeypatch.setattr(agent_module, "decide", counted)
    bench = Bench(tmp_path, replace(POLICY, peer_fresh=3.0), probe_peers=True)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"])
    bench.run(30, until=lambda: bool(bench.group.posts))
    assert [ids for vm, ids, _ in bench.group.posts] == [(E,)]
    cycles = sum(vm.agent.status()["cycles"] for vm in bench.vms.values())
    assert len(calls) == cycles  # once a cycle, for every agent
    assert bench.peers is not None and bench.peers.confirmed == 1  # asked again once, by the approver
