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

from coordinator.config import ApproverMode
from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide, view_needed
from coordinator.store.base import ClusterView, OutMark, Part, WriteResult, lead_view, named_view, own_view
from tests.fakezk_group import FakeGroup, GroupStore
from tests.unit.test_policy import NOW, A, B, doc, ev, rec, view
from tests.unit.test_safety_regressions import Bench, E

SERVING = LocalState(phase=Phase.SERVING)


def snapshot(me: str, cluster: ClusterView | None, *events: dict[str, Any], **kw: Any) -> Snapshot:
    document = doc(*events)
    return Snapshot(me=me, now=NOW, mono=1000.0, document=document, last_document=document, cluster=cluster, **kw)


def mine(*records: Any) -> ClusterView:
    """vm1's view: vm3 leads."""
    return view(*records, me="vm1")


# -- how much of the group each VM follows ------------------------------------------------------------

OWN, NAMED, LEAD, WHOLE = Part.OWN, Part.NAMED, Part.LEAD, Part.WHOLE


@pytest.mark.parametrize(("case", "me", "cluster", "events", "local", "part"), [
    ("uninvolved", "vm1", mine(rec(A, ("vm0",))), [ev(A, ["vm0"])], SERVING, OWN),
    ("idle", "vm1", mine(), [], SERVING, OWN),
    ("the leader", "vm3", view(rec(A, ("vm0",))), [ev(A, ["vm0"])], SERVING, LEAD),
    ("the leader, an open record no agent is named by", "vm3", view(rec(A, ("vm9",))), [], SERVING, WHOLE),
    ("the leader, a VM out for no event", "vm3", replace(view(), out={"vm0": OutMark(NOW - 5)}), [], SERVING, WHOLE),
    ("the leader, named first", "vm3", view(rec(A, ("vm3", "vm0"))), [ev(A, ["vm3", "vm0"])], SERVING, WHOLE),
    ("the approver of an event of its document", "vm1", mine(), [ev(A, ["vm1", "vm0"])], SERVING, WHOLE),
    ("named second by its document", "vm1", mine(), [ev(A, ["vm0", "vm1"])], SERVING, NAMED),
    ("named second, the first runs no agent", "vm1", mine(), [ev(A, ["vm9", "vm1"])], SERVING, WHOLE),
    ("named second, in another case", "vm1", mine(), [ev(A, ["VM0", "vm1"])], SERVING, NAMED),
    ("the closer of an open record only", "vm1", mine(rec(A, ("vm1",))), [], SERVING, WHOLE),
    ("named second by an open record only", "vm1", mine(rec(A, ("vm0", "vm1"))), [], SERVING, NAMED),
    ("named by a record marked done", "vm1", mine(rec(A, ("vm1",), done_at=NOW - 5)), [], SERVING, OWN),
    ("holding an ack", "vm1", mine(rec(A, ("vm0",), ("vm1",))), [], SERVING, NAMED),
    ("draining", "vm1", mine(), [], LocalState(phase=Phase.DRAINING), NAMED),
    ("recovering", "vm1", mine(), [], LocalState(phase=Phase.RECOVERING), NAMED),
    ("just started", "vm1", mine(), [], LocalState(), WHOLE),
    ("a job running", "vm1", mine(), [], replace(SERVING, job_running=True), NAMED),
    ("held for an event", "vm1", mine(), [], replace(SERVING, draining_for=frozenset({A})), NAMED),
    ("an approval POSTed", "vm1", mine(), [], replace(SERVING, posted=frozenset({A})), WHOLE),
    ("an event no live agent is named by", "vm1", mine(), [ev(B, ["vm9"])], SERVING, WHOLE),
    ("no view", "vm1", None, [], SERVING, WHOLE),
])
def test_how_much_of_the_group_each_vm_follows(case: str, me: str, cluster: ClusterView | None,
                                               events: list[dict[str, Any]], local: LocalState, part: Part) -> None:
    assert view_needed(snapshot(me, cluster, *events), local, Policy()) is part, case


def test_a_leader_in_the_leader_approver_mode_follows_the_whole_group() -> None:
    """It approves every event, on every VM's ack."""
    leading = view(rec(A, ("vm0",)))
    assert view_needed(snapshot("vm3", leading, ev(A, ["vm0"])), SERVING, Policy()) is LEAD
    assert view_needed(snapshot("vm3", leading, ev(A, ["vm0"])), SERVING,
                       Policy(approver=ApproverMode.LEADER)) is WHOLE


def test_another_agent_under_its_name_follows_the_whole_group() -> None:
    assert view_needed(snapshot("vm1", mine(), duplicate="another agent runs as vm1"), SERVING, Policy()) is WHOLE


# -- what a cut-down view is never used for --------------------------------------------------------------

BUDGET = Policy(max_events=1, latest_start=120)
# vm0 is still out of rotation for an event that is over: the budget is full until it serves again.
FULL = replace(view(rec(A, ("vm0",), done_at=NOW - 5), rec(B, ("vm1",))), out={"vm0": OutMark(NOW - 60, (A,))})


def test_a_leader_never_admits_on_a_cut_down_view() -> None:
    whole = decide(snapshot("vm3", FULL, ev(B, ["vm1"])), SERVING, BUDGET)
    assert whole.admit == () and "maintenance budget" in whole.reasons(B)[0]
    # Cut down, vm0's mark is not read: deciding on it would admit B while vm0 is still out. A VM's own part
    # holds no record today (nothing to admit); a view marked incomplete that holds records all the same (as
    # a cut-down view once did) is never decided on for the group either.
    assert decide(snapshot("vm3", own_view(FULL, "vm3"), ev(B, ["vm1"])), SERVING, BUDGET).admit == ()
    cut = replace(FULL, out={}, absent_since={}, part=Part.NAMED)
    assert decide(snapshot("vm3", cut, ev(B, ["vm1"])), SERVING, BUDGET).admit == ()


def test_a_leader_admits_on_its_lead_view_as_on_the_whole_view() -> None:
    """Without the other VMs' acks (``lead_view``) the leader weighs the same budget: a VM that acknowledges
    is out of rotation by its ``/out`` mark, which names the event for as long as the ack stands."""
    acked = replace(FULL, records={**FULL.records, A: replace(FULL.records[A], acks={"vm0": NOW - 50})})
    for cluster in (acked, lead_view(acked, "vm3")):
        plan = decide(snapshot("vm3", cluster, ev(B, ["vm1"])), SERVING, BUDGET)
        assert plan.admit == () and "maintenance budget" in (plan.reasons(B) or ("maintenance budget",))[0]
    served = replace(acked, out={}, records={B: FULL.records[B]})
    assert decide(snapshot("vm3", lead_view(served, "vm3"), ev(B, ["vm1"])), SERVING, BUDGET).admit == (B,)
    assert lead_view(acked, "vm3").records[A].acks == {} and lead_view(acked, "vm3").out == acked.out


def test_an_approver_never_weighs_the_budget_on_a_cut_down_view() -> None:
    immediately = Policy(max_events=1, freeze_immediately_below=10, latest_start=120)
    freeze = ev(B, ["vm1"], etype="Freeze", duration=5)
    admitted = replace(FULL, i_am_leader=False,
                       records={**FULL.records, B: replace(FULL.records[B], admitted_at=NOW - 1)})
    whole = decide(snapshot("vm1", admitted, freeze), SERVING, immediately)
    assert whole.approve == () and "maintenance budget" in whole.reasons(B)[0]
    assert decide(snapshot("vm1", own_view(admitted, "vm1"), freeze), SERVING, immediately).approve == ()
    # Its named part leaves vm0's mark out too: the first VM an event names approves on the whole view only.
    assert decide(snapshot("vm1", named_view(admitted, "vm1"), freeze), SERVING, immediately).approve == ()


def test_an_uninvolved_vm_on_its_own_part_publishes_nothing_and_weighs_nothing() -> None:
    """vm1, named by neither event, reads no record on its own part: it publishes neither (the VMs they name
    do), approves and admits nothing, and follows the group only for an event no live agent is named by."""
    cluster = own_view(mine(rec(A, ("vm0",), ("vm0",))), "vm1")
    assert cluster.records == {}
    plan = decide(snapshot("vm1", cluster, ev(A, ["vm0"]), ev(B, ["vm2"])), SERVING, BUDGET)
    assert plan.publish == ()
    assert dict(plan.approvers) == {A: "vm0", B: "vm2"}
    assert plan.approve == () and plan.admit == () and dict(plan.blocked) == {}
    assert view_needed(snapshot("vm1", cluster, ev(A, ["vm0"]), ev(B, ["vm2"])), SERVING, Policy()) is OWN
    # An event naming only a VM without an agent: somebody who sees it must publish it, on the whole view.
    assert view_needed(snapshot("vm1", cluster, ev(B, ["vm9"])), SERVING, Policy()) is WHOLE
    whole = decide(snapshot("vm1", mine(), ev(B, ["vm9"])), SERVING, BUDGET)
    assert [r.event_id for r in whole.publish] == [B]


def test_only_a_vm_an_event_names_publishes_its_record_while_one_of_them_runs_an_agent() -> None:
    named, other = (decide(snapshot(me, mine(), ev(B, ["vm2"])), SERVING, BUDGET) for me in ("vm2", "vm1"))
    assert [r.event_id for r in named.publish] == [B] and other.publish == ()


def test_the_store_cuts_down_the_view_as_own_view_does() -> None:
    cluster = FakeGroup(lambda: NOW)
    a, b = cluster.store(lambda: NOW), cluster.store(lambda: NOW)
    a.start()
    b.start()
    a.join("vm0", {})
    b.join("vm1", {})
    a.publish_event(rec(A, ("vm0",)))
    a.acknowledge(A, "vm0", NOW)
    b.acknowledge(A, "vm1", NOW)
    a.admit(A, "vm0", NOW)
    a.mark_out("vm0", (A,), NOW)
    cut = b.read_view("vm1", part=OWN)
    assert cut == own_view(b.read_view("vm1"), "vm1")
    assert not cut.complete and cut.records == {} and cut.out == {}
    assert cut.members == {"vm0", "vm1"} and cut.absent_since == {}
    named = b.read_view("vm1", part=NAMED)
    assert named == named_view(b.read_view("vm1"), "vm1") and named.part is NAMED and not named.complete
    # An agent's view lists the acks by name, without their times (``ZooKeeperStore(ack_times=False)``).
    assert dict(named.records[A].acks) == {"vm1": None} and named.records[A].admitted_at == NOW
    assert named.out == {} and a.read_view("vm0", part=NAMED).out.keys() == {"vm0"}


# -- the agent ------------------------------------------------------------------------------------------

class Counting(GroupStore):
    """A store that notes, per read, whether the whole view was asked for, and every join,
    campaign and read in order."""

    def __init__(self, store: GroupStore) -> None:
        self.__dict__.update(store.__dict__)
        self.reads: list[Part] = []
        self.calls: list[str] = []

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        self.calls.append("join")
        return super().join(vm, info)

    def campaign(self, vm: str) -> bool:
        self.calls.append("campaign")
        return super().campaign(vm)

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        self.reads.append(part)
        self.calls.append({Part.WHOLE: "whole view", Part.NAMED: "named part", Part.OWN: "own part"}[part])
        return super().read_view(vm, part=part)


def three_vms_reads_of_vm2_counted(tmp_path: Path) -> tuple[Bench, Any, Counting]:
    """vm0-vm2, started, recovered and serving, with every read of vm2's agent counted."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    vm2 = bench.vms["vm2"]
    counting = Counting(vm2.store)
    vm2.rewire(store=counting)
    bench.run(10)
    return bench, vm2, counting


def test_an_agent_reads_its_own_part_until_an_event_names_it_and_the_whole_view_in_that_cycle(
    tmp_path: Path
) -> None:
    bench, _, counting = three_vms_reads_of_vm2_counted(tmp_path)
    assert bench.vms["vm0"].agent._state.part is LEAD  # the leader, approving nothing
    assert counting.reads[-3:] == [OWN, OWN, OWN]  # idle, not leading: its own part only

    bench.group.schedule(E, ["vm1"], in_s=100)  # names vm1 only: vm2 stays out of it
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    assert set(counting.reads[-5:]) == {OWN}
    bench.group.remove(E)  # the maintenance is over; vm1 serves again and the budget frees
    bench.run(30, until=lambda: bench.vms["vm1"].agent.phase() == "serving")
    bench.run(5)

    counting.reads.clear()
    counting.calls.clear()
    bench.group.schedule("EEEEEEEE-0000-0000-0000-000000000009", ["vm2"], in_s=100)
    bench.step()
    # The cycle that first sees the event read its own part, found it named, and read the whole view;
    # it joined and campaigned once, not again for the second read.
    assert counting.reads[:2] == [OWN, WHOLE]  # its approver
    assert counting.calls[:4] == ["join", "campaign", "own part", "whole view"]
    bench.run(60, until=lambda: bool(bench.group.approved("EEEEEEEE-0000-0000-0000-000000000009")))
    assert bench.group.approved("EEEEEEEE-0000-0000-0000-000000000009")
    bench.assert_drained_at_every_post("EEEEEEEE-0000-0000-0000-000000000009", ["vm2"])


def test_a_vm_named_second_reads_the_named_part_drains_acks_and_serves_again_while_its_approver_approves(
    tmp_path: Path
) -> None:
    """vm2, named after vm1, follows the event on its named part (every record, its own ack only) from the
    cycle it first sees it until it serves again: it drains, acks and withdraws there, and vm1, which
    reads the whole view, approves on its ack. Neither the leader's upkeep nor vm1's ack cost vm2 a read
    of the whole view."""
    bench, vm2, counting = three_vms_reads_of_vm2_counted(tmp_path)
    counting.reads.clear()
    bench.group.schedule(E, ["vm1", "vm2"], in_s=100)

    def acked_here() -> bool:
        return any(e["event_id"] == E and e["acked_here"] for e in vm2.agent.status().get("events", []))

    bench.run(60, until=acked_here)
    # Its /status says its own ack stands; the acks of the others it does not read.
    (shown,) = [e for e in vm2.agent.status()["events"] if e["event_id"] == E]
    assert shown["acked_here"] is True and shown["acks"] is None
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm1", "vm2"])
    assert counting.reads[0] is OWN and set(counting.reads[1:]) == {NAMED}
    bench.group.remove(E)
    bench.run(30, until=lambda: vm2.agent.phase() == "serving" and bench.vms["vm1"].agent.phase() == "serving")
    assert vm2.agent.phase() == "serving"
    bench.run(5)
    assert counting.reads[-1] is OWN  # serving again, nothing names it: its own part
    assert WHOLE not in counting.reads
