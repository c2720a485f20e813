"""Groups as Azure makes them: delivery units, and who may close a record in each delivery mode.

Azure shows a VM every event of its delivery unit (its availability set or scale-set placement group), or on
some sizes only the events naming it; one group (one budget, one load balancer) may span several units. Each
test is a way a group once waited for NotBefore, or closed a record of an event still present, because the
agents guessed the delivery from who had published a record. Real ``Agent`` objects on the fake ZooKeeper
(``Bench``), each VM's IMDS showing what Azure would show it. ``docs/safety.md`` (L2, L4, "Delivery units")
states the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide
from coordinator.delivery import Delivery, DeliveryMode
from coordinator.errors import ImdsUnavailable
from coordinator.models import Document, parse_document
from coordinator.store.base import ClusterView
from tests.unit.test_policy import NOW, A, doc, ev, rec, view
from tests.unit.test_safety_regressions import E2, POLICY, Bench, E, FakeImds, Group

F = "5C2F1D0B-7C1A-4E0B-9A57-3F0E2B9C1D44"
TWO_UNITS = {"vm0": "pg0", "vm1": "pg0", "vm2": "pg1", "vm3": "pg1"}


class UnitImds(FakeImds):
    """IMDS of a VM in one delivery unit: every event naming a VM of that unit (``named_only``: only those
    naming this VM), as Azure serves availability sets and placement groups (GPU one-FD scale sets)."""

    def __init__(self, group: Group, vm: str, units: Mapping[str, str], *, named_only: bool = False) -> None:
        super().__init__(group, vm)
        self.units, self.named_only = units, named_only

    def _shown(self, resources: list[str]) -> bool:
        if self.named_only:
            return self.vm in resources
        return any(self.units.get(name) == self.units[self.vm] for name in resources)

    def get_document(self) -> Document:
        if self.failing:
            raise ImdsUnavailable("IMDS timed out", outcome="timeout")
        omit, self.omit_once = self.omit_once, set()
        hidden = {eid for eid, e in self.group.events.items() if not self._shown(e.get("Resources", []))}
        return parse_document(self.group.raw(hidden | omit))


def _group(tmp_path: Path, units: Mapping[str, str], delivery: DeliveryMode | None, *,
           named_only: bool = False, without_agent: frozenset[str] = frozenset()) -> Bench:
    """A bench of the VMs of ``units`` (those of ``without_agent`` run none), each agent told its unit and
    ``delivery`` (None: told nothing, the default), vm0 leading."""
    bench = Bench(tmp_path)
    for name in units:
        if name not in without_agent:
            _start(bench, name, units, delivery, named_only=named_only)
    bench.run(3)
    assert bench.cluster.leader is not None and bench.cluster.leader.vm == "vm0"
    return bench


def _start(bench: Bench, name: str, units: Mapping[str, str], delivery: DeliveryMode | None, *,
           named_only: bool = False) -> None:
    policy = POLICY if delivery is None else replace(POLICY, delivery=Delivery(units[name], delivery))
    first = name not in bench.vms
    vm = bench.add(name, policy=policy)
    if first:
        vm.imds = UnitImds(bench.group, name, units, named_only=named_only)
        vm.rewire(imds=vm.imds)


def _view(bench: Bench) -> ClusterView:
    return bench.vms["vm0"].store.read_view("vm0")


# --- 1. a group across two placement groups -------------------------------------------------------------------


@pytest.mark.parametrize("delivery", [DeliveryMode.UNIT, DeliveryMode.AUTO, None], ids=["unit", "auto", "untold"])
def test_an_event_of_another_placement_group_is_approved_early_and_its_record_kept_while_present(
        tmp_path: Path, delivery: DeliveryMode | None) -> None:
    """vm0 (leading) and vm1 in pg0, vm2 and vm3 in pg1. A Freeze of vm3 is in no document of pg0: the leader
    must not take its own documents' silence for the event gone. vm3 publishes it (vm2 sees it first, but an
    event costs the VMs it names), the leader admits it from its record, vm3 approves it early, and its record
    stays open until the Freeze is over; then vm3 (the first live VM it names) closes it."""
    bench = _group(tmp_path, TWO_UNITS, delivery)
    bench.group.schedule(F, ["vm3"], etype="Freeze")
    bench.run(60, until=lambda: bool(bench.group.approved(F)))
    record = _view(bench).records[F]
    assert record.published_by == "vm3" and record.unit == (None if delivery is None else "pg1")
    assert bench.group.approved(F), "approved early, not at its NotBefore 900 s away"
    assert record.done_at is None, "closed while IMDS still shows the event to pg1"
    bench.assert_drained_at_every_post(F, ["vm3"])
    bench.run(5)
    assert _view(bench).records[F].done_at is None  # Started, still shown to vm2 and vm3
    bench.group.remove(F)
    bench.run(30, until=lambda: _view(bench).records[F].done_at is not None and bench.vms["vm3"].probe.serving)
    assert _view(bench).records[F].done_at is not None
    assert bench.vms["vm3"].probe.serving


def test_a_leader_that_knows_its_unit_closes_a_cancelled_record_of_its_unit_though_no_vm_it_names_runs_an_agent(
        tmp_path: Path) -> None:
    """The delivery unit as a fact: vm0 and vm1 of availability set as0 are told their unit, and that IMDS
    shows them every event of it. A Reboot of vmx (of as0, running no agent), published by vm1, is cancelled
    while both agents restart: the restarted leader never saw it listed, yet its own documents speak for an
    event of its unit, and it closes the record once they miss it instead of holding it until NotBefore."""
    units = {"vm0": "as0", "vm1": "as0", "vmx": "as0"}
    bench = _group(tmp_path, units, DeliveryMode.UNIT, without_agent=frozenset({"vmx"}))
    bench.vms["vm0"].imds.omit_once = {E}  # vm1 publishes it
    bench.group.schedule(E, ["vmx"])
    bench.run(5)
    assert _view(bench).records[E].published_by == "vm1"
    assert _view(bench).records[E].unit == "as0"
    for name in ("vm0", "vm1"):
        bench.crash(name)
    bench.group.remove(E)
    for name in ("vm0", "vm1"):
        _start(bench, name, units, DeliveryMode.UNIT)
    bench.run(20, until=lambda: _view(bench).records[E].done_at is not None)
    assert _view(bench).records[E].done_at is not None, "held open until its NotBefore"


# --- 2. named-only delivery: a Terminate deletes its VM ---------------------------------------------------------


def test_a_vm_deleted_by_its_terminate_holds_nothing_where_imds_shows_each_vm_only_its_own_events(
        tmp_path: Path) -> None:
    """IMDS shows each VM only the events naming it. A scale-in Terminate of vm3 is approved and Azure deletes
    vm3: its agent dies with it, its ``/out`` node stays, naming the Terminate. The leader, which never saw the
    Terminate, closes its record (a VM deleted by its Terminate holds nothing), and the budget no longer counts
    vm3: a later Freeze of vm1 is approved early instead of waiting for its NotBefore."""
    units = dict.fromkeys(TWO_UNITS, "ss0")
    bench = _group(tmp_path, units, DeliveryMode.NAMED, named_only=True)
    bench.group.schedule(E, ["vm3"], etype="Terminate", in_s=600.0)
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.run(2)
    bench.crash("vm3")  # deleted
    bench.group.remove(E)
    assert "vm3" in _view(bench).out  # nobody is left to delete it
    bench.run(60, until=lambda: _view(bench).records[E].done_at is not None)
    assert _view(bench).records[E].done_at is not None, "the Terminate's record never closes"
    bench.group.schedule(F, ["vm1"], etype="Freeze")
    bench.run(60, until=lambda: bool(bench.group.approved(F)))
    assert bench.group.approved(F), "held by a VM that no longer exists, until its NotBefore"
    bench.assert_drained_at_every_post(F, ["vm1"])


# --- 3. every agent restarts while IMDS cancels an admitted event ---------------------------------------------


@pytest.mark.parametrize("delivery", [None, DeliveryMode.UNIT], ids=["untold", "unit"])
def test_an_admitted_event_cancelled_while_every_agent_restarted_frees_the_budget(
        tmp_path: Path, delivery: DeliveryMode | None) -> None:
    """One availability set, every VM shown every event; the only record so far was published by the VM it
    names (vm1), so nothing in the store says that every VM sees every event. Every agent restarts while IMDS
    cancels the admitted Reboot of vm1. The VMs whose documents list it (vm1, and with its unit known the
    leader) close its record once it is gone from them; a Freeze of vm2 is then approved early instead of
    waiting behind it until its NotBefore."""
    units = {"vm0": "as0", "vm1": "as0", "vm2": "as0"}
    bench = _group(tmp_path, units, delivery)
    bench.vms["vm0"].imds.omit_once = {E}  # vm0 polls first: vm1 is the first to see it
    bench.group.schedule(E, ["vm1"])
    bench.run(5, until=lambda: _view(bench).records.get(E) is not None
              and _view(bench).records[E].admitted_at is not None)
    record = _view(bench).records[E]
    assert record.published_by == "vm1" and record.admitted_at is not None and not bench.group.approved(E)
    for name in units:
        bench.crash(name)
    bench.group.remove(E)
    for name in units:
        _start(bench, name, units, delivery)
    bench.run(30, until=lambda: _view(bench).records[E].done_at is not None)
    assert _view(bench).records[E].done_at is not None, "kept admitted until its NotBefore"
    bench.group.schedule(E2, ["vm2"], etype="Freeze")
    bench.run(60, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2), "waited behind a cancelled event"
    bench.assert_drained_at_every_post(E2, ["vm2"])


# --- two VMs judge a record: they never undo each other's writes cycle after cycle ----------------------------


@pytest.mark.parametrize(("sent", "reopens"), [(99.0, False), (101.0, True)])
def test_a_record_marked_done_is_reopened_only_on_a_reading_requested_after_the_done_mark_was_seen(
        sent: float, reopens: bool) -> None:
    """The closer (vm1, on a newer reading) marked the Reboot's record done; the leader (vm3) still holds a
    reading that lists it, requested before its view showed the done mark (at 100). Cycles woken by the
    record's changes run on that one reading: reopening on it undid the closer's mark, the closer marked it
    done again, and so on, dozens of writes a second until the leader's next poll (seen in a group of 30
    agents whose closer had been frozen). Only a reading requested after the done mark was seen reopens."""
    cluster = view(rec(A, ("vm1",), done_at=NOW - 1))
    document = doc(ev(A, ["vm1"]))
    snap = Snapshot(me="vm3", now=NOW, mono=102.0, document=document, last_document=document, cluster=cluster,
                    read_sent=sent, done_seen={A: 100.0}, connected_at=102.0, started=0.0)
    plan = decide(snap, LocalState(phase=Phase.SERVING), Policy(latest_start=120))
    assert (A in plan.reopen) is reopens
