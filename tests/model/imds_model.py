"""A model of the Scheduled Events service of one VM group: the ground truth of the model-based suite.

``ImdsGroup`` holds the events of the group (every VM sees every event, ``Resources`` says whom it hits;
except, as the simulator's ``deliver_to_named_only``, events that only the VMs they name are shown), their
lifecycle and a log of every approval POST, against a clock the test advances:

* an event is created ``Scheduled`` with a ``NotBefore`` (or directly ``Started``, as a hardware failure);
* an approval POST for a Scheduled event starts it at once (``Started``), except that an approved
  Terminate waits while another Terminate of the group is Scheduled, unapproved and not yet due;
* a Scheduled event starts by itself once its time has come (``start_at``, normally its NotBefore);
* a Started event leaves the document once its impact is over; ``cancel`` removes a Scheduled event;
* ``DocumentIncarnation`` grows by one on every change of the events; each VM may be served an offset of
  it (reset, skip);
* per VM, faults can be queued: failing reads (the exceptions the real client raises), a malformed body
  (parsed, and refused, by the real parser), failing POSTs, POSTs retried after failed attempts (the
  fence asked before every attempt, as the real client does, the world changing between attempts), and
  flaps (an event left out of one read).

``FakeImds`` is one agent's view of it, implementing the agent's ``Imds`` protocol: it serves the
document through the real parser (``coordinator.models.parse_document``), as the real client does, and
forwards approvals to the group. The harness is told of every POST before it reaches the group
(``on_post``) and of every early approval before it changes anything (``ImdsGroup.on_early_approval``),
so that it can check the state of the whole group at that very moment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from coordinator.errors import ImdsBadRequest, ImdsError, ImdsFenced, ImdsUnavailable, MalformedDocument
from coordinator.models import Document, format_not_before, parse_document, parse_not_before
from coordinator.names import is_valid_vm_name

__all__ = [
    "KNOWN_TYPES",
    "READ_FAULTS",
    "ApprovalRecord",
    "FakeImds",
    "ImdsGroup",
    "ModelEvent",
    "event_id_for",
    "iso_not_before",
    "rfc_not_before",
]

SCHEDULED = "Scheduled"
STARTED = "Started"
KNOWN_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
READ_FAULTS = ("timeout", "503", "410", "429", "bad-request", "malformed-error", "malformed-body")
POST_FAULTS = ("lost", "refused", "answer-lost")


def event_id_for(serial: int, *, lower: bool = False) -> str:
    """A GUID-shaped event id, unique per serial."""
    text = f"{serial:08X}-5A1E-4C0D-9E7F-{serial * 7919:012X}"
    return text.lower() if lower else text


def rfc_not_before(epoch: float) -> str:
    return format_not_before(datetime.fromtimestamp(epoch, UTC))


def iso_not_before(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


@dataclass
class ModelEvent:
    serial: int  # unique per instance: a reused EventId is a new instance
    event_id: str
    event_type: str
    source: str | None  # None: EventSource omitted
    resources: tuple[str, ...]
    start_at: float  # when it starts by itself (its NotBefore, unless the served NotBefore is odd)
    not_before_raw: str | None  # NotBefore as served while Scheduled; None: the field is omitted
    impact: float  # seconds from Started to leaving the document
    duration: int | None = None  # DurationInSeconds; None: omitted
    omit: frozenset[str] = frozenset()  # other fields left out of the served event
    status: str = SCHEDULED
    created_at: float = 0.0
    started_at: float | None = None
    approved_at: float | None = None
    approved_by: str | None = None
    early: bool = False  # approved by a POST while Scheduled
    deliver_to_named_only: bool = False  # shown only to the VMs it names (GPU VMs of a one-FD scale set)
    # The delivery unit it belongs to (that of the first VM it names when it was created; None: the group is
    # one unit): shown to every VM of that unit, and to the VMs it names.
    unit: str | None = None
    ended_at: float | None = None
    end_reason: str = ""

    @property
    def served_resources(self) -> tuple[str, ...]:
        """``Resources`` as the agents are served it (nothing while the field is left out)."""
        return () if "Resources" in self.omit else self.resources

    @property
    def named(self) -> frozenset[str]:
        """The VMs it names as served (valid names only, lower case: Azure names are case-insensitive)."""
        return frozenset(r.lower() for r in self.served_resources if is_valid_vm_name(r))

    @property
    def bad_names(self) -> tuple[str, ...]:
        return tuple(r for r in self.served_resources if not is_valid_vm_name(r))

    @property
    def known_type(self) -> bool:
        return self.event_type in KNOWN_TYPES

    @property
    def not_before_epoch(self) -> float | None:
        """NotBefore as the agent parses it, or None (absent, unparsable)."""
        try:
            parsed = parse_not_before(self.not_before_raw)
            return parsed.timestamp() if parsed is not None else None
        except (ValueError, OverflowError):
            return None

    def shown_to(self, vm: str, unit: str | None = None) -> bool:
        """Whether IMDS shows it to ``vm``, of delivery unit ``unit``."""
        if vm in self.named:
            return True
        return not self.deliver_to_named_only and (self.unit is None or unit == self.unit)

    def describe(self) -> str:
        return (f"{self.event_type} {self.event_id} #{self.serial} {self.status} resources={list(self.resources)} "
                f"NotBefore={self.not_before_raw!r}" + (" named-only" if self.deliver_to_named_only else ""))

    def to_imds(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.status,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(self.resources),
            "NotBefore": (self.not_before_raw or "") if self.status == SCHEDULED else "",
            "Description": f"model event {self.serial}",
            "EventSource": self.source,
            "DurationInSeconds": self.duration,
        }
        if self.source is None:
            del body["EventSource"]
        if self.duration is None:
            del body["DurationInSeconds"]
        if self.status == SCHEDULED and self.not_before_raw is None:
            del body["NotBefore"]
        for name in self.omit:
            body.pop(name, None)
        return body


@dataclass(frozen=True)
class ApprovalRecord:
    at: float
    vm: str  # the VM that POSTed
    event_id: str
    serial: int | None  # the event instance approved; None if no present event has that id
    early: bool  # the event was Scheduled and not yet approved: this POST released it


@dataclass
class _VmFeed:
    offset: int = 0
    flaps: set[int] = field(default_factory=set)
    read_faults: list[str] = field(default_factory=list)
    post_faults: list[str] = field(default_factory=list)
    # The next POSTs fail so many attempts each and are retried; what happens between attempts: "pause"
    # (an operator pauses approvals) or "backoff" (the client waits that many seconds; a maintenance
    # window may close meanwhile).
    retries: list[tuple[int, str, float]] = field(default_factory=list)


class ImdsGroup:
    def __init__(self, clock: Callable[[], float], *, named_only: bool = False) -> None:
        self._clock = clock
        self.named_only = named_only  # every event is delivered to the VMs it names only
        # Each VM's delivery unit (placement groups of one scale set); empty: the group is one unit.
        self.units: dict[str, str] = {}
        self.events: dict[int, ModelEvent] = {}  # present, in creation order
        self.ended: dict[int, ModelEvent] = {}
        self.incarnation = 1
        self.approvals: list[ApprovalRecord] = []
        self._feeds: dict[str, _VmFeed] = {}
        self._serials = 0
        # Called with (event, posting VM) right before a POST releases a Scheduled event.
        self.on_early_approval: Callable[[ModelEvent, str], None] = lambda event, vm: None

    # -- events ----------------------------------------------------------------------------------------

    def next_serial(self) -> int:
        self._serials += 1
        return self._serials

    def add(self, event: ModelEvent) -> ModelEvent:
        event.created_at = self._clock()
        event.deliver_to_named_only = event.deliver_to_named_only or self.named_only
        first = next((r.lower() for r in event.served_resources if r.lower() in self.units), None)
        event.unit = self.units.get(first) if first is not None else None  # naming none of them: every VM sees it
        if event.status == STARTED:
            event.started_at = event.created_at
        self.events[event.serial] = event
        self.incarnation += 1
        return event

    def change_resources(self, serial: int, resources: tuple[str, ...]) -> None:
        event = self.events[serial]
        if event.status == SCHEDULED and (event.resources != resources or "Resources" in event.omit):
            event.resources = resources
            event.omit = event.omit - {"Resources"}  # served from now on
            self.incarnation += 1

    def cancel(self, serial: int) -> None:
        event = self.events.get(serial)
        if event is not None and event.status == SCHEDULED:
            self._remove(event, "cancelled")

    def present_with_id(self, event_id: str) -> ModelEvent | None:
        for event in self.events.values():
            if event.event_id == event_id:
                return event
        return None

    def _remove(self, event: ModelEvent, reason: str) -> None:
        del self.events[event.serial]
        event.ended_at = self._clock()
        event.end_reason = reason
        self.ended[event.serial] = event
        self.incarnation += 1

    def _held(self, event: ModelEvent, now: float) -> bool:
        """An approved Terminate waits for the other Terminates of the group that are still Scheduled,
        unapproved and not due (deletes sharing a NotBefore start together)."""
        if event.event_type != "Terminate":
            return False
        return any(
            other is not event and other.event_type == "Terminate" and other.status == SCHEDULED
            and other.approved_at is None and other.start_at > now
            for other in self.events.values()
        )

    def tick(self) -> None:
        """Bring the lifecycle up to date with the clock."""
        now = self._clock()
        changed = True
        while changed:
            changed = False
            for event in list(self.events.values()):
                if event.status == SCHEDULED and (
                    event.start_at <= now or (event.approved_at is not None and not self._held(event, now))
                ):
                    event.status = STARTED
                    event.started_at = now
                    self.incarnation += 1
                    changed = True
                elif event.status == STARTED and now >= (event.started_at or now) + event.impact:
                    self._remove(event, "impact over")
                    changed = True

    def next_start(self) -> float | None:
        """The next time the lifecycle changes by itself."""
        times = [e.start_at if e.status == SCHEDULED else (e.started_at or 0.0) + e.impact
                 for e in self.events.values()]
        return min(times) if times else None

    # -- per-VM feed -----------------------------------------------------------------------------------

    def feed(self, vm: str) -> _VmFeed:
        return self._feeds.setdefault(vm, _VmFeed())

    def flap(self, vm: str, serial: int) -> None:
        self.feed(vm).flaps.add(serial)

    def reset_incarnation(self, vm: str) -> None:
        self.feed(vm).offset = 1 - self.incarnation

    def skip_incarnation(self, vm: str, by: int) -> None:
        self.feed(vm).offset += by

    def heal(self, vm: str) -> None:
        feed = self.feed(vm)
        feed.flaps.clear()
        feed.read_faults.clear()
        feed.post_faults.clear()
        feed.retries.clear()

    def serve(self, vm: str, *, consume: bool = True) -> tuple[list[ModelEvent], bytes]:
        """The events IMDS serves ``vm`` now and the document body (a flap is consumed by the read)."""
        self.tick()
        feed = self.feed(vm)
        events = [e for e in self.events.values()
                  if e.serial not in feed.flaps and e.shown_to(vm, self.units.get(vm))]
        if consume:
            feed.flaps.clear()
        incarnation = max(self.incarnation + feed.offset, 0)
        body = {"DocumentIncarnation": incarnation, "Events": [e.to_imds() for e in events]}
        return events, json.dumps(body).encode()

    def take_read_fault(self, vm: str) -> str | None:
        faults = self.feed(vm).read_faults
        return faults.pop(0) if faults else None

    def take_post_fault(self, vm: str) -> str | None:
        faults = self.feed(vm).post_faults
        return faults.pop(0) if faults else None

    def take_retry(self, vm: str) -> tuple[int, str, float] | None:
        retries = self.feed(vm).retries
        return retries.pop(0) if retries else None

    # -- approvals -------------------------------------------------------------------------------------

    def approve(self, vm: str, event_ids: Sequence[str]) -> None:
        self.tick()
        now = self._clock()
        for event_id in event_ids:
            event = self.present_with_id(event_id)
            early = event is not None and event.status == SCHEDULED and event.approved_at is None
            if event is not None and early:
                self.on_early_approval(event, vm)
                event.approved_at = now
                event.approved_by = vm
                event.early = True
            self.approvals.append(ApprovalRecord(now, vm, event_id, event.serial if event else None, early))
        self.tick()


def _read_error(kind: str) -> ImdsError:
    if kind == "bad-request":
        return ImdsBadRequest("IMDS answered 400", status=400, body='{"error": "bad request"}')
    if kind == "malformed-error":
        return MalformedDocument("not JSON: model fault", content="<html>gateway</html>")
    return ImdsUnavailable(f"model fault {kind}", outcome=kind)


class FakeImds:
    """One agent's IMDS client (the agent's ``Imds`` protocol) over the group model.

    ``on_served`` hears which events a read showed. By default when IMDS answers; with ``shown_later``, only
    when ``shown`` is called with the document, i.e. when the answer reaches the agent. A slow answer
    shows IMDS as it was when the request was sent, and its agent cannot act on it before it arrives."""

    def __init__(
        self,
        group: ImdsGroup,
        vm: str,
        on_post: Callable[[FakeImds, list[str]], None],
        on_served: Callable[[list[ModelEvent]], None] = lambda events: None,
        between_attempts: Callable[[str, float], None] = lambda what, backoff: None,
        *,
        shown_later: bool = False,
    ) -> None:
        self.group = group
        self._shown_later = shown_later
        self._unshown: dict[int, tuple[Document, list[ModelEvent]]] = {}  # by id() of the document
        self.vm = vm
        self._on_post = on_post
        self._on_served = on_served
        self._between = between_attempts
        self.reads = 0
        self.posts = 0

    def get_document(self) -> Document:
        self.reads += 1
        fault = self.group.take_read_fault(self.vm)
        if fault == "malformed-body":
            return parse_document(b'{"DocumentIncarnation": "seven", "Events": {}}')
        if fault is not None:
            raise _read_error(fault)
        events, body = self.group.serve(self.vm)
        document = parse_document(body)
        if self._shown_later:
            self._unshown[id(document)] = (document, events)  # the document kept: its id() is not reused
        else:
            self._on_served(events)
        return document

    def shown(self, document: Document) -> None:
        """The answer that carried ``document`` reached the agent (``shown_later``)."""
        entry = self._unshown.pop(id(document), None)
        if entry is not None and entry[0] is document:
            self._on_served(entry[1])

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        """POST ``StartRequests``. As the real client, ``fence`` is asked right before every attempt is
        sent; when it says no, nothing (more) is sent and ``ImdsFenced`` is raised. A queued retry fails
        its first attempts (lost on the way) and lets the model change the world between attempts."""
        ids = list(event_ids)
        failures, between, backoff = self.group.take_retry(self.vm) or (0, "", 0.0)
        for attempt in range(failures + 1):
            if fence is not None and not fence():
                raise ImdsFenced(f"approval fenced before attempt {attempt + 1}")
            self.posts += 1
            self._on_post(self, ids)
            if attempt < failures:
                self._between(between, backoff)
        fault = self.group.take_post_fault(self.vm)
        if fault == "lost":
            raise ImdsUnavailable("POST timed out before reaching IMDS", outcome="timeout")
        if fault == "refused":
            raise ImdsBadRequest("IMDS answered 400", status=400, body="")
        self.group.approve(self.vm, ids)
        if fault == "answer-lost":
            raise ImdsUnavailable("POST applied, answer lost", outcome="timeout")
