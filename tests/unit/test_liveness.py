"""Liveness: every event the policy allows is approved early, and nothing that is over holds the budget.

``docs/safety.md`` states L1-L4 beside the safety invariants. Each test here is a way a group once waited
for NotBefore although the policy allowed an early start: as tables of the pure decision where one cycle
shows it, and with real ``Agent`` objects on the fake ZooKeeper (``Bench``) where it takes restarts,
leader changes or a store that cannot be read. Each fails on the code before its fix.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from coordinator.decide import LocalState, Phase, Policy, Sighting, Snapshot, decide
from coordinator.models import format_not_before, parse_document
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, OutMark
from tests.unit.test_safety_regressions import E2, Bench, E

NOW = 1_700_000_000.0
MONO = 1_000.0
SERVING = LocalState(phase=Phase.SERVING)
F = "5C2F1D0B-7C1A-4E0B-9A57-3F0E2B9C1D44"
T = "9A1B7C3D-2E4F-4A6B-8C0D-1E2F3A4B5C6D"


def _event(eid: str, etype: str, resources: list[str], in_s: float) -> dict[str, Any]:
    return {"EventId": eid, "EventType": etype, "EventStatus": "Scheduled", "Resources": resources,
            "NotBefore": format_not_before(datetime.fromtimestamp(NOW + in_s, UTC)), "EventSource": "Platform"}


def _record(eid: str, etype: str, resources: tuple[str, ...], *, done: bool = False,
            admitted: bool = False) -> EventRecord:
    return EventRecord(event_id=eid, event_type=etype, resources=resources, not_before=NOW + 600,
                       published_by="vm0", published_at=NOW - 60, done_at=NOW - 30 if done else None,
                       admitted_at=NOW - 50 if admitted else None)


def _leader_snapshot(events: list[dict[str, Any]], records: list[EventRecord], *, members: tuple[str, ...],
                     out: dict[str, tuple[str, ...]] | None = None, absent_for: dict[str, float] | None = None,
                     ) -> Snapshot:
    """vm0 leads, on a fresh document listing ``events``, a view holding ``records`` and ``out`` marks."""
    document = parse_document({"DocumentIncarnation": 5, "Events": events})
    cluster = ClusterView(frozenset(members), "vm0", True, {r.event_id: r for r in records},
                          ConnectionState.CONNECTED, known=frozenset(members) | frozenset(absent_for or {}),
                          out={vm: OutMark(NOW - 120, keys) for vm, keys in (out or {}).items()})
    listed = {e["EventId"] for e in events}
    seen = {r.event_id: Sighting(MONO - 1) if r.event_id in listed else Sighting(MONO - 200, 50, MONO - 1)
            for r in records}
    return Snapshot(me="vm0", now=NOW, mono=MONO, document=document, last_document=document, cluster=cluster,
                    seen=seen, absent_for=absent_for or {}, started=0.0, connected_at=MONO)


# --- one event that can never be admitted does not hold back the events behind it -------------------------


def test_an_event_that_no_budget_could_ever_admit_does_not_hold_back_one_that_fits() -> None:
    """A Reboot of every VM of the group (never admissible while one VM must stay serving) comes first by its
    NotBefore; a Freeze of one VM, which nothing else stops, is admitted past it."""
    reboot = _event(E, "Reboot", ["vm0", "vm1", "vm2"], 300)
    freeze = _event(F, "Freeze", ["vm1"], 600)
    records = [_record(E, "Reboot", ("vm0", "vm1", "vm2")), _record(F, "Freeze", ("vm1",))]
    plan = decide(_leader_snapshot([reboot, freeze], records, members=("vm0", "vm1", "vm2")), SERVING, Policy())
    assert plan.admit == (F,)
    assert plan.reasons(E)[0] == "it would leave no VM serving even with nothing else in maintenance"


def test_an_event_that_waits_for_room_still_keeps_its_place_in_the_queue() -> None:
    """First come, first served holds for an event that fits once the budget frees: a Freeze of vm1 waits
    while vm2 is out for another event, and the later Freeze of vm0 does not jump ahead of it."""
    first = _event(E, "Freeze", ["vm1"], 300)
    later = _event(F, "Freeze", ["vm0"], 600)
    other = _event(E2, "Freeze", ["vm2"], 200)
    records = [_record(E, "Freeze", ("vm1",)), _record(F, "Freeze", ("vm0",)),
               _record(E2, "Freeze", ("vm2",), admitted=True)]
    snapshot = _leader_snapshot([first, later, other], records, members=("vm0", "vm1", "vm2", "vm3"),
                                out={"vm2": (E2,)})
    plan = decide(snapshot, SERVING, Policy())
    assert plan.admit == ()
    assert "maintenance budget: 1 event(s) in maintenance" in plan.reasons(E)[0]
    assert "maintenance budget" in plan.reasons(F)[0]


# --- what is over holds no budget slot ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", [Policy(), Policy(max_events=None, max_vms=1)], ids=["max_events", "max_vms"])
def test_a_vm_deleted_by_its_terminate_holds_no_budget(policy: Policy) -> None:
    """vm2 was deleted by a scale-in: its Terminate is over (its record done), its agent is gone, and its
    ``/out`` node, which nobody will delete, still names the Terminate. The next Freeze is admitted."""
    freeze = _event(F, "Freeze", ["vm1"], 600)
    records = [_record(T, "Terminate", ("vm2",), done=True), _record(F, "Freeze", ("vm1",))]
    snapshot = _leader_snapshot([freeze], records, members=("vm0", "vm1"), out={"vm2": (T,)},
                                absent_for={"vm2": 30.0})
    assert decide(snapshot, SERVING, policy).admit == (F,)


# --- a gone record is closed whoever leads and whatever it saw before ----------------------------------------


def _admitted(bench: Bench, eid: str) -> bool:
    return eid in bench.cluster.events and bench.cluster.events[eid].admitted is not None


def test_a_cancelled_event_frees_the_budget_when_every_agent_restarted_as_imds_dropped_it(tmp_path: Path) -> None:
    """Every agent restarts (a deploy) just as IMDS drops an admitted Reboot (cancelled). The new leader has
    never seen it listed; its record was published by a VM it does not name, so every VM's document would
    list it: the leader's own documents say it is gone, and its record is closed within ``gone_after``. A
    Freeze of another VM is then approved early, not after the Reboot's NotBefore."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(15)
    bench.group.schedule(E, ["vm1"])
    bench.run(5, until=lambda: _admitted(bench, E))
    assert _admitted(bench, E) and not bench.group.approved(E)
    for name in ("vm0", "vm1", "vm2"):
        bench.crash(name)
    bench.group.remove(E)
    bench.step()
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E2, ["vm2"], etype="Freeze")
    bench.run(10, until=lambda: bench.cluster.events[E].record.done_at is not None)
    assert bench.cluster.events[E].record.done_at is not None, "closed on the leader's own documents"
    bench.run(60, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2), "approved early, not held by the cancelled Reboot until its NotBefore"
    bench.assert_drained_at_every_post(E2, ["vm2"])


def test_a_leader_that_could_not_read_zookeeper_as_an_event_went_still_closes_its_record(tmp_path: Path) -> None:
    """vm1 saw the Reboot first (its record says so, and names it: no sign that every VM sees every event).
    The leader's ZooKeeper is unreadable while IMDS drops the Reboot; it kept its own sightings meanwhile,
    so once it reads the view again it closes the record on them, instead of taking the record for one
    shown only to the VMs it names and holding it until NotBefore."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(15)
    bench.group.schedule(E, ["vm1"])
    bench.vms["vm0"].imds.omit_once = {E}  # vm0 polls first: this time vm1 is the first to see it
    bench.run(5, until=lambda: _admitted(bench, E))
    assert bench.cluster.events[E].record.published_by == "vm1"
    assert _admitted(bench, E) and not bench.group.approved(E)
    bench.vms["vm0"].store.suspend()
    bench.vms["vm1"].store.suspend()  # nor can its closer (vm1, the VM it names) write meanwhile
    bench.group.remove(E)
    bench.run(10)
    assert bench.cluster.events[E].record.done_at is None  # nobody else closes a record
    bench.vms["vm0"].store.resume()
    bench.run(10, until=lambda: bench.cluster.events[E].record.done_at is not None)
    assert bench.cluster.events[E].record.done_at is not None  # the leader, on the sightings it kept
    bench.vms["vm1"].store.resume()
    bench.group.schedule(E2, ["vm2"], etype="Freeze")
    bench.run(60, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2)
    bench.assert_drained_at_every_post(E2, ["vm2"])


def test_a_restarted_agent_that_leads_is_not_held_by_its_own_finished_event(tmp_path: Path) -> None:
    """vm2 was rebooted by an approved Reboot; every agent restarted meanwhile, vm2's first. Back, vm2
    leads and drains at once for its Redeploy; its ``/out`` node still names the finished Reboot, whose
    record it never saw listed (vm2 published it, so nothing says every VM sees every event). The Reboot
    names vm2: vm2's own documents say it is gone, its record is closed, and the Redeploy is approved
    early instead of waiting its whole notice behind it."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(15)
    bench.group.schedule(E, ["vm2"])
    bench.vms["vm0"].imds.omit_once = {E}
    bench.vms["vm1"].imds.omit_once = {E}
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E) and bench.cluster.events[E].record.published_by == "vm2"
    bench.group.events[E]["EventStatus"] = "Started"
    bench.run(2)
    for name in ("vm0", "vm1", "vm2"):
        bench.crash(name)
    bench.group.remove(E)
    bench.group.schedule(E2, ["vm2"], etype="Redeploy", in_s=100.0)  # within latest_start: drained at once
    bench.add("vm2")
    bench.run(2)
    assert bench.cluster.leader is not None and bench.cluster.leader.vm == "vm2"
    bench.add("vm0")
    bench.add("vm1")
    bench.run(60, until=lambda: bool(bench.group.approved(E2)))
    assert bench.cluster.events[E].record.done_at is not None
    assert bench.group.approved(E2), "approved early (60 s of its 100 s notice), not at its NotBefore"
    bench.assert_drained_at_every_post(E2, ["vm2"])
