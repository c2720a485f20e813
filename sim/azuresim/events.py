"""What the group holds about one event and one rollout, and how events become the served document."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from azuresim.catalogue import (
    DEFAULT_IMPACT_SECONDS,
    EVENT_TYPE_SINCE,
    SCHEDULED,
    Delivery,
    EventStatus,
    ImpactKind,
    VmInfo,
)
from azuresim.httpdate import format_http_date
from azuresim.schema import RolloutRequest

__all__ = ["Event", "Render", "Rollout", "ServedEvent", "imds_document", "served_events"]

#: Maps a simulated NotBefore (epoch seconds) to the one served (see ``SimTime.served_not_before``).
Render = Callable[[int], int]


@dataclass
class Event:
    """One current event. Times are simulated epoch seconds; ``not_before`` is None once created Started.

    ``unit`` is the delivery unit the event belongs to (``Lifecycle.unit_of``), as the group's first VM of that
    unit spells it.
    """

    event_id: str
    event_type: str
    resources: tuple[str, ...]
    resource_type: str
    description: str
    source: str
    duration_in_seconds: int | None
    started_for: float
    created_at: float
    status: EventStatus
    not_before: int | None
    impact: ImpactKind
    impact_seconds: float | None
    deliver_to_named_only: bool
    unit: str = ""
    rollout: int | None = None
    approved_by: list[str] = field(default_factory=list)
    approved_at: float | None = None
    started_at: float | None = None
    held_by: tuple[str, ...] = ()
    #: Simulated time at which the impact on the VMs is over (the last pause ends, the killed VMs are
    #: back); the event stays Started at least until then. None before the start or without impact.
    impact_until: float | None = None

    @property
    def impact_length(self) -> float:
        """How long the impact lasts: a freeze's pause, or how long killed VMs stay down (``down_seconds``)."""
        if self.impact == "freeze":
            return self.pause_seconds
        if self.impact == "kill":
            return self.down_seconds
        return 0.0

    @property
    def down_seconds(self) -> float:
        """How long a kill impact keeps the VMs down before they are back: ``impact_seconds``, else
        DurationInSeconds when >= 0, else 0 (back as soon as whoever restarts their processes does)."""
        if self.impact_seconds is not None:
            return self.impact_seconds
        if self.duration_in_seconds is not None and self.duration_in_seconds >= 0:
            return float(self.duration_in_seconds)
        return 0.0

    @property
    def pause_seconds(self) -> float:
        """How long a freeze impact pauses the VMs: ``impact_seconds``, else DurationInSeconds."""
        if self.impact_seconds is not None:
            return self.impact_seconds
        if self.duration_in_seconds is not None and self.duration_in_seconds >= 0:
            return float(self.duration_in_seconds)
        return DEFAULT_IMPACT_SECONDS

    def names(self, vm: str) -> bool:
        return any(r.lower() == vm.lower() for r in self.resources)

    def delivered_to(self, vm: VmInfo, delivery: Delivery) -> bool:
        """Whether IMDS shows this event to ``vm`` when the group delivers by ``delivery``.

        ``unit``: to every VM of the event's unit (an availability set or a placement group sees all its
        events); ``named``, or an event ``deliver_to_named_only``: to the VMs it names only (GPU VMs of a
        one-fault-domain scale set).
        """
        if delivery == "named" or self.deliver_to_named_only:
            return self.names(vm.name)
        return self.unit.lower() == vm.unit.lower()

    def view(self, render: Render = lambda epoch: epoch) -> dict[str, Any]:
        """The internal state; ``not_before_text`` is NotBefore as served."""
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "resources": list(self.resources),
            "resource_type": self.resource_type,
            "description": self.description,
            "source": self.source,
            "duration_in_seconds": self.duration_in_seconds,
            "not_before": self.not_before,
            "not_before_text": format_http_date(render(self.not_before)) if self.not_before is not None else "",
            "started_for": self.started_for,
            "created_at": self.created_at,
            "approved_by": list(self.approved_by),
            "approved_at": self.approved_at,
            "started_at": self.started_at,
            "impact": self.impact,
            "impact_seconds": self.impact_length if self.impact in ("freeze", "kill") else None,
            "impact_until": self.impact_until,
            "deliver_to_named_only": self.deliver_to_named_only,
            "unit": self.unit,
            "rollout": self.rollout,
            "held_by": list(self.held_by),
        }


@dataclass
class Rollout:
    """Back-to-back events, one per group of VMs; ``step`` is the index of the current (last created) group."""

    rollout_id: int
    request: RolloutRequest
    groups: list[list[str]]
    step: int = 0
    event_id: str | None = None
    next_at: float | None = None

    def view(self) -> dict[str, Any]:
        return {
            "rollout": self.rollout_id,
            "event_type": self.request.event_type,
            "groups": [list(g) for g in self.groups],
            "gap": self.request.gap,
            "step": self.step,
            "event_id": self.event_id,
            "next_at": self.next_at,
            "done": self.event_id is None and self.next_at is None,
        }


@dataclass(frozen=True)
class ServedEvent:
    """One event as a VM is served it: a snapshot, taken under the group's lock, of what the document says.

    The simulator writes the document itself, field by field as IMDS does; it never goes through the
    agent's model of the document, which is what the document is there to test.
    """

    event_id: str
    event_type: str
    event_status: str
    resource_type: str
    resources: tuple[str, ...]
    not_before: int | None  # epoch seconds as served; None once Started
    description: str
    event_source: str
    duration_in_seconds: int

    def to_imds(self, api_version: str | None) -> dict[str, Any]:
        """The event as IMDS serializes it for ``api_version`` (None: the newest): the fields the
        api-version predates are absent (not null)."""
        body: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.event_status,
            "EventType": self.event_type,
            "ResourceType": self.resource_type or "VirtualMachine",
            "Resources": list(self.resources),
            "NotBefore": format_http_date(self.not_before) if self.not_before is not None else "",
        }
        if api_version is None or api_version >= "2019-04-01":
            body["Description"] = self.description
        if api_version is None or api_version >= "2019-08-01":
            body["EventSource"] = self.event_source or "Platform"
        if api_version is None or api_version >= "2020-07-01":
            body["DurationInSeconds"] = self.duration_in_seconds
        return body


def served_events(
    events: Iterable[Event], vm: VmInfo, api_version: str | None, render: Render, *, delivery: Delivery = "unit"
) -> tuple[ServedEvent, ...]:
    """The events ``vm`` is served with ``api_version`` (None: the newest), as immutable snapshots.

    Event types the api-version predates are left out, and so are events not delivered to ``vm``
    (``Event.delivered_to``: of another unit, or, delivered to the VMs they name only, not naming it).
    Events are mutable: call this under the group's lock so that the document is one consistent snapshot.
    """
    return tuple(
        _served(e, render)
        for e in events
        if (api_version is None or api_version >= EVENT_TYPE_SINCE.get(e.event_type, "0000"))
        and e.delivered_to(vm, delivery)
    )


def imds_document(incarnation: int, events: tuple[ServedEvent, ...], api_version: str | None) -> dict[str, Any]:
    """The Scheduled Events document as IMDS serializes it for ``api_version``.

    Fields the api-version predates are absent (not null); with 2017-03-01 resource names carry the
    leading underscore that 2017-08-01 dropped.
    """
    document: dict[str, Any] = {
        "DocumentIncarnation": incarnation,
        "Events": [event.to_imds(api_version) for event in events],
    }
    if api_version == "2017-03-01":
        for body in document["Events"]:
            body["Resources"] = ["_" + r for r in body["Resources"]]
    return document


def _served(event: Event, render: Render) -> ServedEvent:
    return ServedEvent(
        event_id=event.event_id,
        event_type=event.event_type,
        event_status=event.status,
        resource_type=event.resource_type,
        resources=tuple(event.resources),
        not_before=render(event.not_before) if event.status == SCHEDULED and event.not_before is not None else None,
        description=event.description or "",
        event_source=event.source,
        duration_in_seconds=-1 if event.duration_in_seconds is None else event.duration_in_seconds,
    )
