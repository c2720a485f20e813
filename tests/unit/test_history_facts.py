"""The two facts the agents keep for ``coordinator status --history`` at no request more: when the closing
agent first saw an event Started (``evidence.note_started``, written with the done mark), and the acks an
approval was released on (written with the approval), through the agent loop on the fake ZooKeeper."""

from __future__ import annotations

from pathlib import Path

from coordinator.evidence import STARTED_KEPT, note_started
from coordinator.groupstatus.history import history_entry
from coordinator.models import Document, parse_document
from tests.unit.test_safety_regressions import Bench, E

T0 = 1_700_000_000.0


def _document(*events: tuple[str, str]) -> Document:
    return parse_document({"DocumentIncarnation": 1, "Events": [
        {"EventId": eid, "EventStatus": status, "EventType": "Reboot", "ResourceType": "VirtualMachine",
         "Resources": ["vm0"], "NotBefore": ""} for eid, status in events]})


def test_the_first_time_an_event_is_seen_started_is_kept_until_it_has_neither_document_nor_record() -> None:
    seen = note_started({}, _document(("e1", "Scheduled")), {"E1"}, T0)
    assert seen == {}
    seen = note_started(seen, _document(("e1", "Started")), {"E1"}, T0 + 5)
    assert seen == {"E1": T0 + 5}
    seen = note_started(seen, _document(("E1", "Started")), {"E1"}, T0 + 9)
    assert seen == {"E1": T0 + 5}  # the first sighting, not the latest
    seen = note_started(seen, _document(), {"E1"}, T0 + 20)
    assert seen == {"E1": T0 + 5}  # gone from IMDS, its record still there: for the done mark
    seen = note_started(seen, _document(), None, T0 + 25)
    assert seen == {"E1": T0 + 5}  # the store could not be read: nothing forgotten
    assert note_started(seen, _document(), set(), T0 + 30) == {}


def test_the_started_sightings_are_bounded_the_earliest_forgotten_first() -> None:
    many = {f"E{i}": T0 + i for i in range(STARTED_KEPT)}
    seen = note_started(many, _document(("new", "Started")), None, T0 + 10_000)
    assert len(seen) == STARTED_KEPT and "E0" not in seen and seen["NEW"] == T0 + 10_000


def test_a_finished_event_keeps_its_start_its_admission_and_the_acks_its_approval_was_released_on(
        tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    approved_at = bench.clock.wall
    bench.run(5)  # the POST started it: the agents' next documents show it Started
    assert bench.group.events[E]["EventStatus"] == "Started"
    bench.group.remove(E)
    bench.run(30, until=lambda: bench.cluster.events[E].record.done_at is not None)
    record = bench.vms["vm2"].store.read_view("vm2").records[E]
    assert record.done_at is not None and record.approval is None  # deleted by the done mark...
    assert record.started_at is not None and approved_at <= record.started_at <= record.done_at
    assert record.closed is not None and record.closed.approval is not None  # ...and kept for the history
    assert record.closed.approval.acks == ("vm0", "vm1")
    acked_at = record.closed.approval.acked_at
    assert acked_at is not None and set(acked_at) == {"vm0", "vm1"}
    assert all(acked <= record.closed.approval.at for acked in acked_at.values())
    leader = bench.cluster.leader_name
    assert record.closed.admitted_by == leader and record.closed.admitted_at is not None
    entry = history_entry(record)
    assert entry.approval is not None and entry.approval.by == "vm0" and entry.approval.acks == ["vm0", "vm1"]
    assert entry.admitted is not None and entry.admitted.by == leader and entry.started_at is not None
