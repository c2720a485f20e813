"""Hostile IMDS answers, served over HTTP by the simulator's ``body`` fault, read by the real client and
by a real agent (see ``tests.hostile.imds_bench``). Each answer must end in a clear error or a document
that is safe: no cycle raises, an unreadable document never counts as "event gone" (a drained VM stays
drained), and nothing is approved that should not be.

Hypothesis runs ``HOSTILE_EXAMPLES`` examples (default 20), derandomized; ``scripts/hostile.py`` runs
many more and counts.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from coordinator.errors import ImdsUnavailable, MalformedDocument
from coordinator.imds import MAX_BODY_BYTES, ImdsClient
from coordinator.models import parse_document, parse_not_before
from tests.hostile.imds_bench import ImdsBench, baseline_document, valid_not_before
from tests.hostile.inputs import EVENT_ID, HostileBody, bodies, encode

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def bench() -> Iterator[ImdsBench]:
    with ImdsBench() as running:
        yield running


def _read(bench: ImdsBench, body: HostileBody) -> object:
    """What the real client makes of ``body``: a document, or the ``ImdsError`` it raised."""
    bench.serve(body)
    with bench.client() as client:
        try:
            return client.get_document(attempts=1)
        except (MalformedDocument, ImdsUnavailable) as exc:
            return exc


def _document(**extra: object) -> bytes:
    return json.dumps({**baseline_document(), **extra}).encode()


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=bodies(valid_not_before()))
def test_generated_answers_neither_crash_nor_release_an_undrained_vm(bench: ImdsBench, body: HostileBody) -> None:
    trial = bench.trial(body)
    assert trial.crashes == []
    assert trial.unsafe == []


# -- sizes and nesting --------------------------------------------------------------------------------------


def test_a_body_over_the_size_limit_is_malformed_and_not_read_whole(bench: ImdsBench) -> None:
    padding = b"x" * (MAX_BODY_BYTES + 10)
    outcome = _read(bench, HostileBody(_document()[:-1] + b', "pad": "' + padding + b'"}', "huge"))
    assert isinstance(outcome, MalformedDocument)
    assert "exceeds the limit" in str(outcome)


def test_a_body_without_length_is_cut_at_the_limit() -> None:
    """Chunked, with no Content-Length: the client stops reading at the limit."""
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            sent.append(1)
            yield b" " * 65_536

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=chunks()))
    with ImdsClient("http://127.0.0.1:9", transport=transport) as client, pytest.raises(MalformedDocument) as caught:
        client.get_document(attempts=1)
    assert "exceeds the limit" in str(caught.value)
    assert len(sent) <= MAX_BODY_BYTES // 65_536 + 1


def test_a_gzip_bomb_is_malformed_without_being_inflated_whole(bench: ImdsBench) -> None:
    bomb = gzip.compress(_document()[:-1] + b', "pad": "' + b" " * (64 * 1024 * 1024) + b'"}')
    outcome = _read(bench, HostileBody(bomb, "gzip", headers={"Content-Encoding": "gzip"}))
    assert isinstance(outcome, MalformedDocument)
    assert "exceeds the limit" in str(outcome)


@pytest.mark.parametrize("where", ["Events", "extra"])
def test_json_nested_100k_levels_is_a_malformed_document(bench: ImdsBench, where: str) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    if where == "Events":
        body = b'{"DocumentIncarnation": 3, "Events": ' + nested + b"}"
    else:
        body = _document()[:-1] + b', "deep": ' + nested + b"}"
    outcome = _read(bench, HostileBody(body, "nested"))
    assert isinstance(outcome, MalformedDocument)
    assert "recursion" in str(outcome)
    trial = bench.trial(HostileBody(body, "nested"))
    assert trial.crashes == [] and trial.unsafe == []


def test_thousands_of_events_neither_crash_nor_approve(bench: ImdsBench) -> None:
    events = [{**baseline_document()["Events"][0], "EventId": f"{n:08X}-0000-0000-0000-000000000000",
               "Resources": [f"vm{n % 50}", "vmx"]} for n in range(3000)]
    body = encode({"DocumentIncarnation": 9, "Events": events}, "utf-8")
    assert len(body.body) < MAX_BODY_BYTES
    trial = bench.trial(body)
    assert trial.client_outcome == "document"
    assert trial.crashes == [] and trial.unsafe == []


# -- encodings, content types, truncation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        ("utf-16", MalformedDocument),
        ("utf-8-bom", MalformedDocument),
        ("invalid-utf-8", MalformedDocument),
        ("gzip-broken", MalformedDocument),
        ("br", MalformedDocument),
        ("truncated", ImdsUnavailable),
        ("gzip", None),  # not asked for, but decoded within the limit: the document it carries
    ],
)
def test_odd_encodings_give_a_clear_error_or_the_document(
    bench: ImdsBench, encoding: str, expected: type[Exception] | None
) -> None:
    body = encode(baseline_document(), encoding, cut=40)
    outcome = _read(bench, body)
    if expected is None:
        assert not isinstance(outcome, Exception)
    else:
        assert isinstance(outcome, expected), outcome
    trial = bench.trial(body)
    assert trial.crashes == [] and trial.unsafe == []


def test_invalid_utf8_in_a_name_is_refused_not_replaced(bench: ImdsBench) -> None:
    """Read with replacement characters, ``vm\\xff0`` would be an event that does not name vm0: a drained vm0
    would count its event as gone. The whole document is refused instead."""
    body = _document().replace(b'"vm0"', b'"vm\xff0"')
    outcome = _read(bench, HostileBody(body, "invalid-utf-8"))
    assert isinstance(outcome, MalformedDocument) and "not UTF-8" in str(outcome)
    trial = bench.trial(HostileBody(body, "invalid-utf-8"))
    assert trial.crashes == [] and trial.unsafe == []


@pytest.mark.parametrize(
    "content_type", ["text/html", "", "application/octet-stream", "application/json; charset=utf-16"]
)
def test_a_wrong_content_type_does_not_matter_to_a_valid_document(bench: ImdsBench, content_type: str) -> None:
    outcome = _read(bench, HostileBody(_document(), "utf-8", content_type=content_type))
    assert not isinstance(outcome, Exception)


# -- fields -------------------------------------------------------------------------------------------------


def test_an_incarnation_of_thousands_of_digits_is_malformed_not_a_crash(bench: ImdsBench) -> None:
    """Before the fix the document parsed and every cycle then raised on exporting the incarnation as a metric."""
    body = _document()[:-1].replace(b'"DocumentIncarnation": 2', b'"DocumentIncarnation": ' + b"9" * 4000) + b"}"
    assert isinstance(_read(bench, HostileBody(body, "utf-8")), MalformedDocument)
    trial = bench.trial(HostileBody(body, "utf-8"))
    assert trial.crashes == [] and trial.unsafe == []


@pytest.mark.parametrize(
    ("text", "year"),
    [("Mon, 01 Jan 0001 00:00:00 GMT", 1), ("Tue, 31 Dec 0099 23:59:59 GMT", 99),
     ("Fri, 31 Dec 9999 23:59:59 GMT", 9999)],
)
def test_four_digit_years_below_100_are_not_read_as_two_digit_years(text: str, year: int) -> None:
    parsed = parse_not_before(text)
    assert parsed is not None and parsed.year == year


def test_an_event_id_listed_twice_over_http_is_not_approved(bench: ImdsBench) -> None:
    document = baseline_document()
    mine = {**document["Events"][0], "Resources": ["vm0"]}
    twin = {**mine, "EventId": EVENT_ID.lower(), "Resources": ["vmx"]}
    trial = bench.trial(encode({"DocumentIncarnation": 3, "Events": [mine, twin]}, "utf-8"))
    assert trial.crashes == [] and trial.unsafe == []


def test_the_judge_sees_an_unsafe_approval() -> None:
    """The judge is not vacuous: a POST of an event naming a VM without an agent is reported."""
    from tests.hostile.imds_bench import _Post, unsafe_posts

    document = parse_document(_document())
    assert unsafe_posts([_Post((EVENT_ID,), False, document)]) != []
    assert unsafe_posts([_Post((EVENT_ID,), True, None)]) != []
