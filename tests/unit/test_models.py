"""The document model against every captured or published document, and against arbitrary JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.decide import LocalState, Policy, Snapshot, decide
from coordinator.errors import MalformedDocument
from coordinator.models import Document, format_not_before, parse_document, parse_not_before
from coordinator.store.base import ClusterView, ConnectionState

SCENARIOS = Path(__file__).parent.parent / "fixtures" / "imds-scenarios"
FILES = sorted(SCENARIOS.rglob("*.json"))


def _documents(path: Path) -> list[Any]:
    data = json.loads(path.read_text())
    return data if path.name.endswith(".sequence.json") else [data]


def test_fixtures_are_present() -> None:
    assert len(FILES) >= 11
    assert (SCENARIOS / "SOURCES.md").exists()


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SCENARIOS)))
def test_every_fixture_parses_and_round_trips(path: Path) -> None:
    for raw in _documents(path):
        document = parse_document(json.dumps(raw))
        assert document.document_incarnation == raw["DocumentIncarnation"]
        assert [e.event_id for e in document.events] == [e["EventId"] for e in raw["Events"]]
        for event, source in zip(document.events, raw["Events"], strict=True):
            assert event.resources == tuple(source.get("Resources", ()))
            assert event.event_status == source["EventStatus"]
            if source.get("NotBefore"):
                assert event.not_before is not None
                assert event.not_before.tzinfo is UTC
            else:
                assert event.not_before is None
        again = parse_document(json.dumps(document.to_imds()))
        key = [(e.event_id, e.event_type, e.event_status, e.resources, e.not_before) for e in document.events]
        assert [(e.event_id, e.event_type, e.event_status, e.resources, e.not_before) for e in again.events] == key


def test_live_migration_sequence_keeps_the_event_id() -> None:
    path = SCENARIOS / "field/docs-live-migration-freeze.sequence.json"
    docs = [parse_document(json.dumps(d)) for d in _documents(path)]
    assert [d.document_incarnation for d in docs] == [1, 2, 3, 4]
    assert docs[1].events[0].event_id == docs[2].events[0].event_id
    assert docs[1].events[0].is_scheduled and docs[2].events[0].is_started
    assert docs[2].events[0].not_before is None
    assert docs[1].events[0].names("westno_1")


def test_old_schema_fields_are_absent_not_null() -> None:
    document = parse_document((SCENARIOS / "field/controlplane-reboot-2017-08-01.json").read_text())
    event = document.events[0]
    assert (event.description, event.event_source, event.duration_in_seconds) == (None, None, None)
    old = event.to_imds("2017-08-01")
    assert "Description" not in old and "EventSource" not in old and "DurationInSeconds" not in old


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon, 11 Apr 2022 22:26:58 GMT", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
        ("Mon, 19 Dec 2018 18:29:47 GMT", datetime(2018, 12, 19, 18, 29, 47, tzinfo=UTC)),  # wrong weekday
        ("2026-11-22T03:44:45Z", datetime(2026, 11, 22, 3, 44, 45, tzinfo=UTC)),
        ("2026-11-22T03:44:45", datetime(2026, 11, 22, 3, 44, 45, tzinfo=UTC)),
        ("", None),
        (None, None),
    ],
)
def test_not_before_formats(text: str | None, expected: datetime | None) -> None:
    assert parse_not_before(text) == expected


def test_not_before_is_formatted_as_imds_does() -> None:
    assert format_not_before(datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)) == "Mon, 11 Apr 2022 22:26:58 GMT"


def test_unknown_event_type_is_kept() -> None:
    document = parse_document('{"DocumentIncarnation": 3, "Events": [{"EventId": "X", "EventType": "Hibernate",'
                              ' "EventStatus": "Scheduled", "Resources": ["vm0"]}]}')
    assert document.events[0].event_type == "Hibernate"
    assert not document.events[0].is_known_type


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>502 Bad Gateway</html>",
        b'{"DocumentIncarnation": "2", "Events": []}',
        b'{"DocumentIncarnation": 2}',
        b'{"DocumentIncarnation": 2, "Events": {}}',
        b'{"DocumentIncarnation": 2, "Events": [{"EventId": 7, "EventType": "Freeze", "EventStatus": "Scheduled"}]}',
        b'{"DocumentIncarnation": 2, "Events": [{"EventId": "A", "EventType": "Freeze", "EventStatus": "Scheduled",'
        b' "Resources": "vm0"}]}',
        b"[" * 5000,
        b"\xff\xfe",
    ],
)
def test_malformed_documents_raise_with_content(body: bytes) -> None:
    with pytest.raises(MalformedDocument) as info:
        parse_document(body)
    assert isinstance(info.value.content, str)


@pytest.mark.parametrize("value", ["tomorrow", 1700000000, ["Mon"], {"at": 1}])
def test_an_unreadable_not_before_keeps_the_event_and_says_why(value: object) -> None:
    # One odd field must not hide the event (or the whole document) from the agent: the event stays,
    # without a NotBefore, and the decision treats it as one that cannot be timed or approved early.
    body = {"DocumentIncarnation": 2, "Events": [{"EventId": "A", "EventType": "Freeze", "EventStatus": "Scheduled",
                                                   "Resources": ["vm0"], "NotBefore": value}]}
    [event] = parse_document(json.dumps(body)).events
    assert event.not_before is None
    assert event.not_before_error is not None and "NotBefore" in event.not_before_error


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9999-12-31T23:59:59-01:00", datetime.max.replace(tzinfo=UTC)),
     ("0001-01-01T00:00:00+01:00", datetime.min.replace(tzinfo=UTC))],
)
def test_not_before_past_the_ends_of_the_calendar_is_clamped(text: str, expected: datetime) -> None:
    parsed = parse_not_before(text)
    assert parsed == expected
    assert parsed is not None and isinstance(parsed.timestamp(), float)  # used by every decision


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "EventId": JSON | st.uuids().map(lambda u: str(u).upper()),
        "EventType": JSON | st.sampled_from(["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "Other"]),
        "EventStatus": JSON | st.sampled_from(["Scheduled", "Started", "Completed"]),
        "Resources": JSON | st.lists(st.sampled_from(["vm0", "vm1", "VM2", "../x", "", "a" * 80]), max_size=4),
        "NotBefore": JSON | st.sampled_from(["", "Mon, 11 Apr 2022 22:26:58 GMT", "2026-11-22T03:44:45Z"]),
        "DurationInSeconds": JSON,
        "Description": JSON,
        "EventSource": JSON,
    },
)
DOCS = st.fixed_dictionaries(
    {}, optional={"DocumentIncarnation": JSON | st.integers(min_value=-2, max_value=2**40),
                  "Events": JSON | st.lists(FIELDS, max_size=4)}
) | JSON


@settings(max_examples=400, deadline=None)
@given(DOCS)
def test_no_json_value_crashes_the_parser_or_the_decision(value: Any) -> None:
    try:
        document: Document | None = parse_document(json.dumps(value))
    except MalformedDocument:
        document = None
    cluster = ClusterView(frozenset({"vm0", "vm1"}), "vm1", False, {}, ConnectionState.CONNECTED)
    snapshot = Snapshot(me="vm0", now=1e9, mono=10.0, document=document, last_document=document, cluster=cluster)
    plan = decide(snapshot, LocalState(), Policy())
    assert isinstance(plan.describe(), str)
    # Whatever the input, nothing unvalidated can be approved.
    for intent in plan.approve:
        assert document is not None
        assert any(e.event_id == intent.event_id and e.is_known_type for e in document.events)
