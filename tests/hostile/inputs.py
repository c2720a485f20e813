"""Generators of hostile input: Scheduled Events documents and their HTTP bodies, ZooKeeper node payloads.

Documents range from valid-shaped to broken: wrong types, missing and extra fields, duplicate EventIds,
unknown EventType/EventStatus/ResourceType, hostile names and ids (path separators, ``..``, NUL, unicode
confusables, 10 kB strings, empty strings), NotBefore at the ends of the calendar and in the wrong
format, DurationInSeconds and DocumentIncarnation out of range or of the wrong type. Bodies carry them in
odd encodings (UTF-16, a BOM, Latin-1, invalid UTF-8, gzip that was not asked for, a coding nobody
knows), under wrong content types and statuses, or cut short.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "EVENT_ID",
    "HOSTILE_STRINGS",
    "NOT_BEFORES",
    "HostileBody",
    "bodies",
    "documents",
    "junk_json",
    "payloads",
]

EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
OTHER_ID = "A626E37F-793E-44E1-89B5-99AE0B96044C"

HOSTILE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    ".",
    "..",
    "/",
    "vm0/../vm1",
    "../../zookeeper",
    "vm0/acks",
    "vm0\x00",
    "\x00",
    "vm0\n",
    "vm0\r\nX-Injected: 1",
    "v\u043c0",  # Cyrillic em
    "vm\uff10",  # fullwidth zero
    "vm0\u200b",  # zero-width space
    "VM0",
    "vm0 ",
    "vm0.",
    "-vm0",
    "\ud800",  # a lone surrogate: valid JSON escape, not encodable as UTF-8
    "\U0001f600",
    "%2e%2e",
    "x" * 10_000,
    EVENT_ID + "/acks/vm0",
    EVENT_ID.lower(),
)

NOT_BEFORES: tuple[str, ...] = (
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Mon, 30 Feb 2026 10:00:00 GMT",
    "Mon, 11 Apr 2022 22:26:58 +0100",
    "Mon, 11 Apr 2022 22:26:58 PST",
    "Mon, 11 Apr 2022 24:00:00 GMT",
    "Mon, 11 Apr 2022 23:59:60 GMT",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "Sun, 11 Apr 2100 22:26:58 GMT",
    "2026-11-22T03:44:45Z",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "9999-12-31T23:59:59.999999+14:00",
    "",
    "   ",
    "yesterday",
)

# Mostly plausible values, so that many documents parse and reach the decision code; hostile ones often.
_NAMES = st.one_of(
    st.sampled_from(("vm0", "vm1", "vmx", "VM0")), st.just("vm0"), st.sampled_from(HOSTILE_STRINGS)
)
_IDS = st.one_of(
    st.sampled_from((EVENT_ID, OTHER_ID, EVENT_ID.lower())), st.just(EVENT_ID), st.sampled_from(HOSTILE_STRINGS)
)
_TYPES = st.sampled_from(("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "Hibernate", "reboot", ""))
_STATUSES = st.sampled_from(("Scheduled", "Started", "Completed", "Canceled", "scheduled", ""))
_BIG_INTS = st.sampled_from((-1, 0, 2**31, 2**63 - 1, 2**63, -(2**63), 10**100, -(10**100)))


def junk_json() -> st.SearchStrategy[Any]:
    """Any small JSON value, nested a little."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=12)
        | st.sampled_from(HOSTILE_STRINGS)
    )
    return st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=6,
    )


@st.composite
def _event(draw: st.DrawFn, not_before: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        "EventId": draw(_IDS),
        "EventStatus": draw(_STATUSES),
        "EventType": draw(_TYPES),
        "ResourceType": draw(st.sampled_from(("VirtualMachine", "VirtualMachineScaleSet", ""))),
        "Resources": draw(st.lists(_NAMES, max_size=4)),
        "NotBefore": draw(st.sampled_from(NOT_BEFORES + (not_before,) * 8)),
        "Description": draw(st.text(max_size=20)),
        "EventSource": draw(st.sampled_from(("Platform", "User", "Nobody", ""))),
        "DurationInSeconds": draw(st.integers(-10, 100) | _BIG_INTS),
    }
    if draw(st.integers(0, 2)) == 2:
        for key in draw(st.sets(st.sampled_from(sorted(event)), max_size=3)):
            del event[key]
    if draw(st.integers(0, 2)) == 2:
        for key in draw(st.sets(st.sampled_from(sorted(event) or ["EventId"]), max_size=2)):
            event[key] = draw(junk_json())
    if draw(st.integers(0, 2)) == 2:
        event[draw(st.text(max_size=10))] = draw(junk_json())
    return event


@st.composite
def documents(draw: st.DrawFn, not_before: str) -> Any:
    """A Scheduled Events document, valid-shaped or broken. ``not_before``: a valid NotBefore to use often."""
    events = draw(st.lists(_event(not_before), max_size=5))
    if events and draw(st.integers(0, 4)) == 4:  # the same EventId again, naming other VMs
        twin = dict(events[0])
        twin["Resources"] = draw(st.lists(_NAMES, max_size=3))
        events.append(twin)
    document: dict[str, Any] = {
        "DocumentIncarnation": draw(
            st.integers(0, 50) if draw(st.integers(0, 5)) < 5 else _BIG_INTS | st.sampled_from((1.5, "7", None, True))
        ),
        "Events": events,
    }
    # Hypothesis leans towards small numbers: the broken shapes are the large ones.
    shape = draw(st.integers(0, 15))
    if shape == 15:
        del document[draw(st.sampled_from(("DocumentIncarnation", "Events")))]
    elif shape == 14:
        document["Events"] = draw(junk_json())
    elif shape == 13:
        document[draw(st.text(max_size=10))] = draw(junk_json())
    elif shape == 12:
        return draw(junk_json())
    return document


@dataclass(frozen=True)
class HostileBody:
    """One answer to serve: the exact bytes, how they are labelled, and what was done to them."""

    body: bytes
    encoding: str
    content_type: str = "application/json; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    content_length: int | None = None

    def fault(self, vm: str) -> dict[str, Any]:
        """The arguments of the simulator's ``body`` fault that serves this answer to ``vm`` until cleared."""
        return {
            "kind": "body", "vm": vm, "count": None, "body": base64.b64encode(self.body).decode(),
            "status": self.status, "content_type": self.content_type, "headers": self.headers,
            "content_length": self.content_length,
        }


ENCODINGS = (
    *("utf-8",) * 8,
    "utf-8-bom", "utf-16", "latin-1", "invalid-utf-8", "gzip", "gzip-broken", "br", "truncated",
)
CONTENT_TYPES = ("application/json; charset=utf-8", "application/json", "text/html", "text/plain; charset=utf-16", "")


def encode(document: Any, encoding: str, *, ascii_only: bool = True, cut: int = 0) -> HostileBody:
    """``document`` as JSON text, carried in ``encoding``."""
    text = json.dumps(document, ensure_ascii=ascii_only)
    utf8 = text.encode("utf-8", "surrogatepass")
    match encoding:
        case "utf-8-bom":
            return HostileBody(b"\xef\xbb\xbf" + utf8, encoding)
        case "utf-16":
            return HostileBody(text.encode("utf-16", "surrogatepass"), encoding)
        case "latin-1":
            return HostileBody(text.encode("latin-1", "replace"), encoding)
        case "invalid-utf-8":
            at = cut % (len(utf8) + 1)
            return HostileBody(utf8[:at] + b"\xff\xfe\xc0\x80" + utf8[at:], encoding)
        case "gzip":
            return HostileBody(gzip.compress(utf8), encoding, headers={"Content-Encoding": "gzip"})
        case "gzip-broken":
            return HostileBody(b"\x1f\x8b\x08\x00" + utf8[:40], encoding, headers={"Content-Encoding": "gzip"})
        case "br":
            return HostileBody(utf8, encoding, headers={"Content-Encoding": "br"})
        case "truncated":
            return HostileBody(utf8[: cut % (len(utf8) + 1)], encoding, content_length=len(utf8) + 1)
    return HostileBody(utf8, encoding)


@st.composite
def bodies(draw: st.DrawFn, not_before: str) -> HostileBody:
    """A hostile answer of the Scheduled Events endpoint."""
    document = draw(documents(not_before))
    encoding = draw(st.sampled_from(ENCODINGS))
    body = encode(document, encoding, ascii_only=draw(st.booleans()), cut=draw(st.integers(0, 10_000)))
    if draw(st.integers(0, 5)) == 5:
        body = HostileBody(
            body.body, body.encoding, content_type=draw(st.sampled_from(CONTENT_TYPES)), headers=body.headers,
            status=draw(st.sampled_from((200, 200, 201, 204, 302, 404, 410, 503))), content_length=body.content_length,
        )
    return body


@st.composite
def payloads(draw: st.DrawFn, claims: dict[str, Any]) -> bytes:
    """Garbage for a ZooKeeper node: random bytes, text that is not JSON, JSON of the wrong shape, JSON that
    names other VMs or events (``claims``: field -> value of somebody else), or nothing."""
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        return draw(st.sampled_from((b"", b"{", b"null", b"[]", b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"{}" * 3)))
    if kind == 2:
        return json.dumps(draw(junk_json())).encode()
    if kind == 3:  # the right keys, wrong types
        keys = ("vm", "at", "since", "events", "by", "reason", "as_leader", "event_type", "resources",
                "published_by", "published_at", "done_at", "first_seen")
        data = {key: draw(junk_json()) for key in draw(st.sets(st.sampled_from(keys), min_size=1, max_size=5))}
        return json.dumps(data).encode()
    if kind == 4:  # claims of another VM or event, the rest of the shape left out or broken
        data = dict(claims)
        for key in draw(st.sets(st.sampled_from(sorted(claims)), max_size=len(claims))):
            data[key] = draw(junk_json())
        return json.dumps(data).encode("utf-8", "surrogatepass")
    if kind == 5:
        return json.dumps(draw(st.sampled_from(HOSTILE_STRINGS))).encode("utf-8", "surrogatepass")
    return b"[" * 50_000 + b"]" * 50_000
