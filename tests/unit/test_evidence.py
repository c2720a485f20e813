"""``evidence.observed``: one cycle's observations folded into the evidence, as a pure function, and what a
restart could not read from its state file restored from the first observation that can say it."""

from __future__ import annotations

from coordinator.evidence import Evidence, Restart, observed
from coordinator.models import Document, parse_document
from coordinator.store.base import ClusterView, ConnectionState, OutMark

E = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
OTHER = "A626E37F-793E-44E1-89B5-99AE0B96044C"
MONO = 100.0


def _document(*names: str) -> Document:
    return parse_document({"DocumentIncarnation": 1, "Events": [
        {"EventId": eid, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
         "Resources": [vm], "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"} for eid, vm in names]})


def _view(out: dict[str, OutMark] | None = None) -> ClusterView:
    return ClusterView(members=frozenset({"vm0", "vm1"}), leader="vm1", i_am_leader=False, records={},
                       connection=ConnectionState.CONNECTED, known=frozenset({"vm0", "vm1"}), out=out or {})


def _observe(restart: Restart, document: Document | None, cluster: ClusterView | None,
             ) -> tuple[Evidence, Restart, frozenset[str], tuple[str, ...]]:
    return observed(Evidence(), restart, frozenset(), me="vm0", document=document, sent=MONO - 0.2,
                    answered=MONO - 0.1, arrived=1_700_000_000.0, cluster=cluster,
                    connection=ConnectionState.CONNECTED, mono=MONO, gone_after=3.0)


def test_an_unreadable_state_file_holds_every_event_naming_the_vm_in_the_first_fresh_document() -> None:
    document = _document((E.lower(), "vm0"), (OTHER, "vm1"))
    evidence, restart, held, why = _observe(Restart(assume_worst=True), document, None)
    assert held == {E} and restart == Restart()
    assert why == (f"staying drained for {E.lower()} until gone: the state file was unreadable",)
    assert E in evidence.named and OTHER not in evidence.named
    # Once only: the next document holds nothing more by itself.
    _, _, again, _ = observed(evidence, restart, held, me="vm0", document=_document((OTHER, "vm0")),
                              sent=MONO, answered=MONO + 0.1, arrived=1_700_000_001.0, cluster=None,
                              connection=ConnectionState.CONNECTED, mono=MONO + 0.1, gone_after=3.0)
    assert again == frozenset()


def test_without_a_fresh_document_the_unreadable_state_file_waits_for_one() -> None:
    _, restart, held, why = _observe(Restart(assume_worst=True), None, _view())
    assert restart == Restart(assume_worst=True) and held == frozenset() and why == ()


def test_a_missing_state_file_holds_what_the_vms_own_out_node_names_in_the_first_view() -> None:
    cluster = _view({"vm0": OutMark(since=50.0, events=(E,)), "vm1": OutMark(since=50.0, events=(OTHER,))})
    evidence, restart, held, why = _observe(Restart(from_store=True), None, cluster)
    assert held == {E} and restart == Restart()
    assert why == (f"staying drained for {E} until gone: its /out node says so and the state file is missing",)
    assert E in evidence.named
    assert evidence.connected_at == MONO


def test_an_out_node_naming_no_event_holds_nothing_and_a_view_is_needed_to_tell() -> None:
    _, restart, held, _ = _observe(Restart(from_store=True), _document((E, "vm0")), None)
    assert restart == Restart(from_store=True) and held == frozenset()
    _, restart, held, _ = _observe(Restart(from_store=True), None, _view({"vm0": OutMark(since=50.0, events=())}))
    assert restart == Restart() and held == frozenset()
