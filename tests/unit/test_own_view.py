"""A VM that no event names and that does not lead follows only its own part of the group
(``coordinator.store.base.own_view``): who needs the whole view (``decide.follows_group``), what a cut-down
view may never be used for (admissions, approvals, the budget), and the agent switching between the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide, follows_group
from coordinator.store.base import ClusterView, OutMark, WriteResult, own_view
from coordinator.store.memory import MemoryCluster, MemoryStore
from tests.unit.test_policy import NOW, A, B, doc, ev, rec, view
from tests.unit.test_safety_regressions import Bench, E

SERVING = LocalState(phase=Phase.SERVING)


def snapshot(me: str, cluster: ClusterView | None, *events: dict[str, Any], **kw: Any) -> Snapshot:
    document = doc(*events)
    return Snapshot(me=me, now=NOW, mono=1000.0, document=document, last_document=document, cluster=cluster, **kw)


def mine(*records: Any) -> ClusterView:
    """vm1's view: vm3 leads."""
    return view(*records, me="vm1")


# -- who follows the whole group ------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "me", "cluster", "events", "local", "follows"), [
    ("uninvolved", "vm1", mine(rec(A, ("vm0",))), [ev(A, ["vm0"])], SERVING, False),
    ("idle", "vm1", mine(), [], SERVING, False),
    ("the leader", "vm3", view(rec(A, ("vm0",))), [ev(A, ["vm0"])], SERVING, True),
    ("named by its document", "vm1", mine(), [ev(A, ["vm1"])], SERVING, True),
    ("named by an open record only", "vm1", mine(rec(A, ("vm1",))), [], SERVING, True),
    ("named by a record marked done", "vm1", mine(rec(A, ("vm1",), done_at=NOW - 5)), [], SERVING, False),
    ("holding an ack", "vm1", mine(rec(A, ("vm0",), ("vm1",))), [], SERVING, True),
    ("draining", "vm1", mine(), [], LocalState(phase=Phase.DRAINING), True),
    ("recovering", "vm1", mine(), [], LocalState(phase=Phase.RECOVERING), True),
    ("just started", "vm1", mine(), [], LocalState(), True),
    ("a job running", "vm1", mine(), [], replace(SERVING, job_running=True), True),
    ("held for an event", "vm1", mine(), [], replace(SERVING, draining_for=frozenset({A})), True),
    ("an approval POSTed", "vm1", mine(), [], replace(SERVING, posted=frozenset({A})), True),
    ("no view", "vm1", None, [], SERVING, True),
])
def test_who_follows_the_whole_group(case: str, me: str, cluster: ClusterView | None, events: list[dict[str, Any]],
                                     local: LocalState, follows: bool) -> None:
    assert follows_group(snapshot(me, cluster, *events), local) is follows, case


def test_another_agent_under_its_name_follows_the_whole_group() -> None:
    assert follows_group(snapshot("vm1", mine(), duplicate="another agent runs as vm1"), SERVING)


# -- what a cut-down view is never used for --------------------------------------------------------------

BUDGET = Policy(max_events=1, latest_start=120)
# vm0 is still out of rotation for an event that is over: the budget is full until it serves again.
FULL = replace(view(rec(A, ("vm0",), done_at=NOW - 5), rec(B, ("vm1",))), out={"vm0": OutMark(NOW - 60, (A,))})


def test_a_leader_never_admits_on_a_cut_down_view() -> None:
    whole = decide(snapshot("vm3", FULL, ev(B, ["vm1"])), SERVING, BUDGET)
    assert whole.admit == () and "maintenance budget" in whole.blocked[B][0]
    # Cut down, vm0's mark is not read: deciding on it would admit B while vm0 is still out. A VM's own part
    # holds no record today (nothing to admit); a view marked incomplete that holds records all the same (as
    # a cut-down view once did) is never decided on for the group either.
    assert decide(snapshot("vm3", own_view(FULL, "vm3"), ev(B, ["vm1"])), SERVING, BUDGET).admit == ()
    cut = replace(FULL, out={}, absent_since={}, complete=False)
    assert decide(snapshot("vm3", cut, ev(B, ["vm1"])), SERVING, BUDGET).admit == ()


def test_an_approver_never_weighs_the_budget_on_a_cut_down_view() -> None:
    immediately = Policy(max_events=1, freeze_immediately_below=10, latest_start=120)
    freeze = ev(B, ["vm1"], etype="Freeze", duration=5)
    admitted = replace(FULL, i_am_leader=False,
                       records={**FULL.records, B: replace(FULL.records[B], admitted_at=NOW - 1)})
    whole = decide(snapshot("vm1", admitted, freeze), SERVING, immediately)
    assert whole.approve == () and "maintenance budget" in whole.blocked[B][0]
    assert decide(snapshot("vm1", own_view(admitted, "vm1"), freeze), SERVING, immediately).approve == ()


def test_an_uninvolved_vm_on_its_own_part_publishes_nothing_and_weighs_nothing() -> None:
    """vm1, named by neither event, reads no record on its own part: it publishes neither (the VMs they name
    do), approves and admits nothing, and follows the group only for an event no live agent is named by."""
    cluster = own_view(mine(rec(A, ("vm0",), ("vm0",))), "vm1")
    assert cluster.records == {}
    plan = decide(snapshot("vm1", cluster, ev(A, ["vm0"]), ev(B, ["vm2"])), SERVING, BUDGET)
    assert plan.publish == ()
    assert dict(plan.approvers) == {A: "vm0", B: "vm2"}
    assert plan.approve == () and plan.admit == () and dict(plan.blocked) == {}
    assert not follows_group(snapshot("vm1", cluster, ev(A, ["vm0"]), ev(B, ["vm2"])), SERVING)
    # An event naming only a VM without an agent: somebody who sees it must publish it, on the whole view.
    assert follows_group(snapshot("vm1", cluster, ev(B, ["vm9"])), SERVING)
    whole = decide(snapshot("vm1", mine(), ev(B, ["vm9"])), SERVING, BUDGET)
    assert [r.event_id for r in whole.publish] == [B]


def test_only_a_vm_an_event_names_publishes_its_record_while_one_of_them_runs_an_agent() -> None:
    named, other = (decide(snapshot(me, mine(), ev(B, ["vm2"])), SERVING, BUDGET) for me in ("vm2", "vm1"))
    assert [r.event_id for r in named.publish] == [B] and other.publish == ()


def test_the_memory_store_cuts_down_the_view_as_own_view_does() -> None:
    cluster = MemoryCluster()
    a, b = MemoryStore(cluster, clock=lambda: NOW), MemoryStore(cluster, clock=lambda: NOW)
    a.start()
    b.start()
    a.join("vm0", {})
    b.join("vm1", {})
    a.publish_event(rec(A, ("vm0",)))
    a.acknowledge(A, "vm0", NOW)
    b.acknowledge(A, "vm1", NOW)
    a.admit(A, "vm0", NOW)
    a.mark_out("vm0", (A,), NOW)
    cut = b.read_view("vm1", complete=False)
    assert cut == own_view(b.read_view("vm1"), "vm1")
    assert not cut.complete and cut.records == {} and cut.out == {}
    assert cut.members == {"vm0", "vm1"} and cut.absent_since == {}


# -- the agent ------------------------------------------------------------------------------------------

class Counting(MemoryStore):
    """A memory store that notes, per read, whether the whole view was asked for, and every join,
    campaign and read in order."""

    def __init__(self, store: MemoryStore) -> None:
        self.__dict__.update(store.__dict__)
        self.reads: list[bool] = []
        self.calls: list[str] = []

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        self.calls.append("join")
        return super().join(vm, info)

    def campaign(self, vm: str) -> bool:
        self.calls.append("campaign")
        return super().campaign(vm)

    def read_view(self, vm: str, *, complete: bool = True) -> ClusterView:
        self.reads.append(complete)
        self.calls.append("whole view" if complete else "own part")
        return super().read_view(vm, complete=complete)


def test_an_agent_reads_its_own_part_until_an_event_names_it_and_the_whole_view_in_that_cycle(
    tmp_path: Path
) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    vm2 = bench.vms["vm2"]
    counting = Counting(vm2.store)
    vm2.agent._store = counting
    bench.run(10)  # started, recovered, serving
    assert bench.vms["vm0"].agent._follow  # the leader
    assert counting.reads[-3:] == [False, False, False]  # idle, not leading: its own part only

    bench.group.schedule(E, ["vm1"], in_s=100)  # names vm1 only: vm2 stays out of it
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    assert True not in counting.reads[-5:]
    bench.group.remove(E)  # the maintenance is over; vm1 serves again and the budget frees
    bench.run(30, until=lambda: bench.vms["vm1"].agent.phase() == "serving")
    bench.run(5)

    counting.reads.clear()
    counting.calls.clear()
    bench.group.schedule("EEEEEEEE-0000-0000-0000-000000000009", ["vm2"], in_s=100)
    bench.step()
    # The cycle that first sees the event read its own part, found it named, and read the whole view;
    # it joined and campaigned once, not again for the second read.
    assert counting.reads[:2] == [False, True]
    assert counting.calls[:4] == ["join", "campaign", "own part", "whole view"]
    bench.run(60, until=lambda: bool(bench.group.approved("EEEEEEEE-0000-0000-0000-000000000009")))
    assert bench.group.approved("EEEEEEEE-0000-0000-0000-000000000009")
    bench.assert_drained_at_every_post("EEEEEEEE-0000-0000-0000-000000000009", ["vm2"])
