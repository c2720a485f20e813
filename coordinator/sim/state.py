"""The simulated Scheduled Events service of one VM group: pure model, no sockets, no sleeps.

``SimulatedGroup`` holds the VMs of one availability set or scale-set placement group, the events of
the group and an append-only log. Every VM sees every event of the group (Azure delivers an event to
all VMs of the group; each VM reads ``Resources`` to know whether it is hit). Time comes from an
injected clock (a callable returning epoch seconds), so unit tests drive the lifecycle with a fake
clock and the HTTP server drives it with ``time.time``.

Lifecycle (see the Scheduled Events documentation):

* ``Scheduled -> Started`` when the event has been approved (by any VM of the group) and the group's
  ``approval_delay`` has elapsed since the first approval, or when ``NotBefore`` passes, whichever
  comes first. Approval only shortens the wait.
* ``Started -> removed`` once the event has been Started for its ``started_for`` seconds.
* ``cancel`` removes an event at once (a Scheduled event vanishing without ever starting).
* Hardware failure: an event may be created directly as ``Started``.

``DocumentIncarnation`` starts at 1 and grows by one on every change of the Events array: creation,
status change, removal. Each transition is its own change, so two events starting in the same tick
raise it by two.

Every operation is thread-safe (one re-entrant lock). Reads (``document``, ``events``) first bring the
lifecycle up to date with the clock, so a document never shows a state the clock has already left,
whether or not a ticker thread calls ``tick``.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from coordinator.models import Document, ScheduledEvent, format_not_before

__all__ = [
    "DEFAULT_DESCRIPTIONS",
    "EVENT_TYPE_SINCE",
    "FAULT_KINDS",
    "INSTANCE_API_VERSIONS",
    "LOG_KINDS",
    "MINIMUM_NOTICE",
    "SCHEDULED_EVENTS_API_VERSIONS",
    "Clock",
    "Fault",
    "InvalidRequest",
    "RateLimiter",
    "SimulatedGroup",
    "SimulatorError",
    "UnknownEvent",
    "UnknownVm",
    "VmInfo",
]

Clock = Callable[[], float]

#: api-versions of the Scheduled Events endpoint, oldest first.
SCHEDULED_EVENTS_API_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)

#: api-versions accepted by the instance metadata endpoint (``/metadata/instance``), oldest first.
INSTANCE_API_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-08-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
)

#: Event types that an api-version predates are left out of the document served with it
#: (Preempt appeared with 2017-11-01, Terminate with 2019-01-01).
EVENT_TYPE_SINCE: Mapping[str, str] = {"Preempt": "2017-11-01", "Terminate": "2019-01-01"}

#: Documented minimum notice per event type, in seconds (Terminate: the 5-minute lower bound).
MINIMUM_NOTICE: Mapping[str, float] = {
    "Freeze": 900.0,
    "Reboot": 900.0,
    "Redeploy": 600.0,
    "Preempt": 30.0,
    "Terminate": 300.0,
}
_UNKNOWN_TYPE_NOTICE = 900.0

#: Descriptions seen in real documents, used when ``schedule`` is given none.
DEFAULT_DESCRIPTIONS: Mapping[str, str] = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to a different host.",
    "Preempt": "",
    "Terminate": "",
}
_PLATFORM_DESCRIPTION = "Host server is undergoing maintenance."

LOG_KINDS: tuple[str, ...] = ("request", "approval", "transition", "fault")
FAULT_KINDS: tuple[str, ...] = ("status", "malformed", "delay", "drop")

_SCHEDULED = "Scheduled"
_STARTED = "Started"
_MAX_DELAY = 300.0


class SimulatorError(Exception):
    """Base of the errors the simulator raises for bad control input."""


class InvalidRequest(SimulatorError, ValueError):
    """A control request is malformed; the message names the field."""


class UnknownEvent(SimulatorError, KeyError):
    """No current event has this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown event"


class UnknownVm(SimulatorError, KeyError):
    """The VM is not part of the simulated group."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown VM"


@dataclass(frozen=True)
class VmInfo:
    """A VM of the group, as its instance metadata describes it.

    ``name`` is used as given in ``Resources`` and in the compute metadata; lookups are
    case-insensitive, as Azure names are. ``scale_set_name`` is ``""`` for availability-set VMs.
    """

    name: str
    scale_set_name: str = ""
    fault_domain: int = 0
    update_domain: int = 0
    zone: str = ""
    vm_size: str = "Standard_D2s_v3"
    location: str = "westeurope"
    resource_group: str = "maintenance-sim"
    subscription_id: str = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Fault:
    """A fault queued for one VM's Scheduled Events endpoint.

    ``remaining`` is None for a fault served until cleared.
    """

    kind: str
    vm: str
    remaining: int | None = 1
    status: int | None = None
    seconds: float | None = None
    methods: tuple[str, ...] = ("GET",)

    def view(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vm": self.vm,
            "remaining": self.remaining,
            "status": self.status,
            "seconds": self.seconds,
            "methods": list(self.methods),
        }


@dataclass
class _Event:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    resource_type: str
    description: str
    source: str
    duration_in_seconds: int | None
    started_for: float
    created_at: float
    status: str
    not_before: int | None
    approved_by: list[str] = field(default_factory=list)
    approved_at: float | None = None
    started_at: float | None = None

    def view(self) -> dict[str, Any]:
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
            "not_before_text": _rfc1123(self.not_before) if self.not_before is not None else "",
            "started_for": self.started_for,
            "created_at": self.created_at,
            "approved_by": list(self.approved_by),
            "approved_at": self.approved_at,
            "started_at": self.started_at,
        }


class RateLimiter:
    """Sliding one-window limiter: at most ``limit`` admitted requests in any ``window`` seconds.

    Only admitted requests count, so a client that backs off after a 429 is served again as soon
    as its oldest admitted request leaves the window. ``limit`` 0 disables the limiter.
    """

    def __init__(self, limit: int, *, window: float = 1.0, clock: Clock = time.monotonic) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self._limit = limit
        self._window = window
        self._clock = clock
        self._admitted: deque[float] = deque()
        self._lock = threading.Lock()

    def admit(self) -> bool:
        if self._limit == 0:
            return True
        with self._lock:
            now = self._clock()
            while self._admitted and self._admitted[0] <= now - self._window:
                self._admitted.popleft()
            if len(self._admitted) >= self._limit:
                return False
            self._admitted.append(now)
            return True


class SimulatedGroup:
    """Scheduled Events of one VM group. See the module docstring for the lifecycle.

    Raises ``InvalidRequest`` for malformed arguments, ``UnknownVm`` and ``UnknownEvent`` for names
    that do not exist. ``on_record`` is called with every log entry as it is appended, under the
    group's lock: it must not block or call back into the group.
    """

    def __init__(
        self,
        vms: Iterable[str | VmInfo],
        *,
        clock: Clock = time.time,
        approval_delay: float = 0.0,
        started_for: float = 5.0,
        unknown_approval_status: int = 200,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        infos = tuple(vm if isinstance(vm, VmInfo) else VmInfo(name=vm) for vm in vms)
        if not infos:
            raise InvalidRequest("a group needs at least one VM")
        by_key: dict[str, VmInfo] = {}
        for info in infos:
            if not isinstance(info.name, str) or not info.name:
                raise InvalidRequest(f"invalid VM name {info.name!r}")
            key = info.name.lower()
            if key in by_key:
                raise InvalidRequest(f"VM {info.name!r} is listed twice")
            by_key[key] = info
        _check_seconds("approval_delay", approval_delay)
        _check_seconds("started_for", started_for)
        if unknown_approval_status not in (200, 400, 404):
            raise InvalidRequest("unknown_approval_status must be 200, 400 or 404")
        self._vms = infos
        self._by_key = by_key
        self._clock = clock
        self._approval_delay = float(approval_delay)
        self._started_for = float(started_for)
        self._unknown_approval_status = unknown_approval_status
        self._on_record = on_record
        self._lock = threading.RLock()
        self._events: dict[str, _Event] = {}
        self._incarnation = 1
        self._log: list[dict[str, Any]] = []
        self._seq = 0
        self._faults: dict[str, list[Fault]] = {info.name: [] for info in infos}

    # -- group ---------------------------------------------------------------------------------

    @property
    def vms(self) -> tuple[VmInfo, ...]:
        return self._vms

    @property
    def approval_delay(self) -> float:
        return self._approval_delay

    @property
    def started_for(self) -> float:
        return self._started_for

    @property
    def incarnation(self) -> int:
        with self._lock:
            return self._incarnation

    def vm(self, name: str) -> VmInfo:
        """The VM called ``name`` (case-insensitive); raises ``UnknownVm``."""
        info = self._by_key.get(name.lower()) if isinstance(name, str) else None
        if info is None:
            raise UnknownVm(f"no VM {name!r} in the group")
        return info

    # -- events --------------------------------------------------------------------------------

    def schedule(
        self,
        event_type: str,
        resources: Sequence[str],
        not_before_in: float | None = None,
        duration_in_seconds: int | None = None,
        started_for: float | None = None,
        description: str | None = None,
        source: str = "Platform",
        event_id: str | None = None,
        status: str = _SCHEDULED,
        resource_type: str = "VirtualMachine",
    ) -> dict[str, Any]:
        """Create an event and return its internal view.

        ``not_before_in`` defaults to the documented minimum notice of the type (``MINIMUM_NOTICE``;
        900 s for an unknown type). ``started_for`` (how long the event stays Started before it is
        removed) defaults to ``max(duration_in_seconds, group started_for)``. ``status="Started"``
        creates the event already started, as a hardware failure does; it then has no NotBefore.
        ``Resources`` may name VMs outside the group, or nobody, as hand-made documents do.
        """
        if not isinstance(event_type, str) or not event_type:
            raise InvalidRequest("event_type must be a non-empty string")
        if isinstance(resources, str) or not isinstance(resources, Sequence):
            raise InvalidRequest("resources must be a list of VM names")
        if not all(isinstance(r, str) for r in resources):
            raise InvalidRequest("resources must be a list of strings")
        if not_before_in is not None:
            _check_seconds("not_before_in", not_before_in)
        if duration_in_seconds is not None and (
            isinstance(duration_in_seconds, bool)
            or not isinstance(duration_in_seconds, int)
            or duration_in_seconds < -1
        ):
            raise InvalidRequest("duration_in_seconds must be an integer >= -1")
        if started_for is not None:
            _check_seconds("started_for", started_for)
        if description is not None and not isinstance(description, str):
            raise InvalidRequest("description must be a string")
        if not isinstance(source, str) or not source:
            raise InvalidRequest("source must be a non-empty string")
        if not isinstance(resource_type, str) or not resource_type:
            raise InvalidRequest("resource_type must be a non-empty string")
        if status not in (_SCHEDULED, _STARTED):
            raise InvalidRequest("status must be 'Scheduled' or 'Started'")
        if event_id is None:
            event_id = str(uuid.uuid4()).upper()
        elif not isinstance(event_id, str) or not event_id or not event_id.isprintable():
            raise InvalidRequest("event_id must be a non-empty printable string")
        if description is None:
            if source == "Platform" and event_type in ("Reboot", "Redeploy"):
                description = _PLATFORM_DESCRIPTION
            else:
                description = DEFAULT_DESCRIPTIONS.get(event_type, "")
        if started_for is None:
            started_for = max(float(duration_in_seconds or 0), self._started_for)

        with self._lock:
            self._advance()
            if event_id in self._events:
                raise InvalidRequest(f"event {event_id} already exists")
            now = self._clock()
            if status == _STARTED:
                not_before = None
                started_at: float | None = now
            else:
                notice = (
                    MINIMUM_NOTICE.get(event_type, _UNKNOWN_TYPE_NOTICE)
                    if not_before_in is None
                    else float(not_before_in)
                )
                # NotBefore has a resolution of one second; round up so the event never starts
                # before the time it announces.
                not_before = math.ceil(now + notice)
                started_at = None
            event = _Event(
                event_id=event_id,
                event_type=event_type,
                resources=tuple(resources),
                resource_type=resource_type,
                description=description,
                source=source,
                duration_in_seconds=duration_in_seconds,
                started_for=float(started_for),
                created_at=now,
                status=status,
                not_before=not_before,
                started_at=started_at,
            )
            self._events[event_id] = event
            self._transition(event, None, status, "scheduled")
            return event.view()

    def cancel(self, event_id: str) -> dict[str, Any]:
        """Remove an event at once, whatever its status; returns its last view.

        On a Scheduled event this is a cancellation; on a Started one it ends the event early.
        Raises ``UnknownEvent``.
        """
        with self._lock:
            self._advance()
            event = self._events.pop(event_id, None)
            if event is None:
                raise UnknownEvent(f"no current event {event_id!r}")
            self._transition(event, event.status, None, "cancelled")
            return event.view()

    def approve(self, vm: str, event_ids: Sequence[str]) -> dict[str, str]:
        """Approve events on behalf of ``vm``; returns a result per id.

        Results: ``approved`` (first approval), ``already_approved``, ``already_started``,
        ``unknown`` (no current event with exactly this id). Any VM of the group may approve any
        current event, and approving releases it for every VM in its Resources. With an
        ``approval_delay`` of 0 the event is Started when this returns. Raises ``UnknownVm``.
        """
        info = self.vm(vm)
        with self._lock:
            self._advance()
            now = self._clock()
            results: dict[str, str] = {}
            for event_id in event_ids:
                event = self._events.get(event_id)
                if event is None:
                    results[event_id] = "unknown"
                    continue
                if info.name not in event.approved_by:
                    event.approved_by.append(info.name)
                if event.status == _STARTED:
                    results[event_id] = "already_started"
                elif event.approved_at is None:
                    event.approved_at = now
                    results[event_id] = "approved"
                else:
                    results[event_id] = "already_approved"
            self.record(
                "approval",
                vm=info.name,
                event_ids=list(event_ids),
                accepted=[i for i in event_ids if results[i] != "unknown"],
                results=results,
                status=self.approval_status(results),
            )
            self._advance()
            return results

    def approval_status(self, results: Mapping[str, str]) -> int:
        """The HTTP status IMDS answers for an approval with these per-id results.

        What IMDS answers for an unknown or expired id is not documented; the group's
        ``unknown_approval_status`` decides (200 by default).
        """
        if any(r == "unknown" for r in results.values()):
            return self._unknown_approval_status
        return 200

    def reject_approval(self, vm: str, reason: str, status: int = 400) -> None:
        """Log an approval request that never reached ``approve`` (malformed body)."""
        self.record("approval", vm=vm, event_ids=[], accepted=[], results={}, status=status, error=reason)

    def tick(self) -> list[dict[str, Any]]:
        """Advance the lifecycle to the clock's present; returns the transitions it logged."""
        with self._lock:
            return self._advance()

    def events(self) -> dict[str, Any]:
        """Current events with their internal state, and the incarnation."""
        with self._lock:
            self._advance()
            return {
                "incarnation": self._incarnation,
                "approval_delay": self._approval_delay,
                "events": [e.view() for e in self._events.values()],
            }

    def event(self, event_id: str) -> dict[str, Any]:
        """The internal view of one current event; raises ``UnknownEvent``."""
        with self._lock:
            self._advance()
            event = self._events.get(event_id)
            if event is None:
                raise UnknownEvent(f"no current event {event_id!r}")
            return event.view()

    def document(self, vm: str, api_version: str | None = None) -> dict[str, Any]:
        """The Scheduled Events document IMDS would serve to ``vm`` with ``api_version``.

        ``None`` means the newest version. Fields and event types that the api-version predates are
        absent (not null); with 2017-03-01 resource names carry the leading underscore that
        2017-08-01 dropped. Raises ``UnknownVm``, and ``InvalidRequest`` for an unknown api-version.
        """
        self.vm(vm)
        if api_version is not None and api_version not in SCHEDULED_EVENTS_API_VERSIONS:
            raise InvalidRequest(f"unknown api-version {api_version!r}")
        with self._lock:
            self._advance()
            incarnation = self._incarnation
            # Events are mutable: take their models while the lock is held, so that the document
            # is one consistent snapshot (incarnation and statuses from the same instant).
            models = tuple(
                _to_model(e)
                for e in self._events.values()
                if api_version is None or api_version >= EVENT_TYPE_SINCE.get(e.event_type, "0000")
            )
        document = Document.model_validate({"DocumentIncarnation": incarnation, "Events": models}).to_imds(
            api_version
        )
        if api_version == "2017-03-01":
            for body in document["Events"]:
                body["Resources"] = ["_" + r for r in body["Resources"]]
        return document

    def compute(self, vm: str) -> dict[str, Any]:
        """The ``/metadata/instance/compute`` answer for ``vm`` (numbers as strings, as IMDS has them)."""
        info = self.vm(vm)
        provider = "Microsoft.Compute"
        if info.scale_set_name:
            instance = info.name.rsplit("_", 1)[-1]
            resource_id = (
                f"/subscriptions/{info.subscription_id}/resourceGroups/{info.resource_group}/providers/"
                f"{provider}/virtualMachineScaleSets/{info.scale_set_name}/virtualMachines/{instance}"
            )
        else:
            resource_id = (
                f"/subscriptions/{info.subscription_id}/resourceGroups/{info.resource_group}/providers/"
                f"{provider}/virtualMachines/{info.name}"
            )
        return {
            "azEnvironment": "AzurePublicCloud",
            "location": info.location,
            "name": info.name,
            "osType": "Linux",
            "platformFaultDomain": str(info.fault_domain),
            "platformUpdateDomain": str(info.update_domain),
            "provider": provider,
            "resourceGroupName": info.resource_group,
            "resourceId": resource_id,
            "subscriptionId": info.subscription_id,
            "tags": "",
            "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, "imds-sim:" + resource_id.lower())),
            "vmScaleSetName": info.scale_set_name,
            "vmSize": info.vm_size,
            "zone": info.zone,
        }

    # -- faults --------------------------------------------------------------------------------

    def add_fault(
        self,
        kind: str,
        vm: str | None = None,
        count: int | None = 1,
        status: int | None = None,
        seconds: float | None = None,
        methods: Sequence[str] = ("GET",),
    ) -> list[dict[str, Any]]:
        """Queue a fault on the Scheduled Events endpoint of ``vm``, or of every VM if None.

        With ``vm=None`` each VM gets its own copy, served ``count`` times to that VM. ``count`` None
        serves the fault until ``clear_faults``. Faults queue behind earlier ones, per VM.
        Kinds: ``status`` (answer ``status``, 400-599), ``malformed`` (200 with a body that is not
        JSON), ``delay`` (wait ``seconds``, then answer normally), ``drop`` (close the connection
        without an answer). Returns the views of the queued faults.
        """
        if kind not in FAULT_KINDS:
            raise InvalidRequest(f"fault kind must be one of {', '.join(FAULT_KINDS)}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise InvalidRequest("count must be a positive integer, or null for until cleared")
        if kind == "status":
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                raise InvalidRequest("a status fault needs a status between 400 and 599")
        elif status is not None:
            raise InvalidRequest(f"status is only for status faults, not {kind}")
        if kind == "delay":
            if seconds is None:
                raise InvalidRequest("a delay fault needs seconds")
            _check_seconds("seconds", seconds)
            if seconds > _MAX_DELAY:
                raise InvalidRequest(f"seconds must be at most {_MAX_DELAY:g}")
        elif seconds is not None:
            raise InvalidRequest(f"seconds is only for delay faults, not {kind}")
        if isinstance(methods, str) or not methods:
            raise InvalidRequest("methods must be a non-empty list")
        wanted = tuple(m.upper() for m in methods if isinstance(m, str))
        if len(wanted) != len(methods) or not set(wanted) <= {"GET", "POST"}:
            raise InvalidRequest("methods may only contain GET and POST")
        targets = [info.name for info in self._vms] if vm is None else [self.vm(vm).name]
        queued = []
        with self._lock:
            for name in targets:
                fault = Fault(
                    kind=kind,
                    vm=name,
                    remaining=count,
                    status=status,
                    seconds=None if seconds is None else float(seconds),
                    methods=wanted,
                )
                self._faults[name].append(fault)
                queued.append(fault.view())
        return queued

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.view() for queue in self._faults.values() for f in queue]

    def clear_faults(self, vm: str | None = None) -> int:
        """Drop queued faults of ``vm`` (or all VMs); returns how many were dropped."""
        with self._lock:
            names = [info.name for info in self._vms] if vm is None else [self.vm(vm).name]
            dropped = 0
            for name in names:
                dropped += len(self._faults[name])
                self._faults[name].clear()
            return dropped

    def take_fault(self, vm: str, method: str, path: str = "/metadata/scheduledevents") -> Fault | None:
        """The fault to serve now for this request, if any; consumes one use and logs it."""
        name = self.vm(vm).name
        with self._lock:
            queue = self._faults[name]
            for index, fault in enumerate(queue):
                if method.upper() not in fault.methods:
                    continue
                remaining = None if fault.remaining is None else fault.remaining - 1
                if remaining == 0:
                    del queue[index]
                else:
                    queue[index] = replace(fault, remaining=remaining)
                self.record(
                    "fault",
                    vm=name,
                    method=method.upper(),
                    path=path,
                    fault=fault.kind,
                    status=fault.status,
                    seconds=fault.seconds,
                    remaining=remaining,
                )
                return fault
            return None

    # -- log -----------------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append an entry ``{"seq", "t", "kind", **fields}``; ``t`` is the clock's epoch seconds."""
        if kind not in LOG_KINDS:
            raise InvalidRequest(f"log kind must be one of {', '.join(LOG_KINDS)}")
        with self._lock:
            self._seq += 1
            entry = {"seq": self._seq, "t": self._clock(), "kind": kind, **fields}
            self._log.append(entry)
            if self._on_record is not None:
                self._on_record(entry)
            return dict(entry)

    def log(self, since: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Entries with ``seq > since``, oldest first, optionally of one kind only."""
        with self._lock:
            # seq n is at index n - 1: start there instead of scanning the whole log.
            start = max(0, min(since, len(self._log)))
            return [dict(e) for e in self._log[start:] if kind is None or e["kind"] == kind]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    # -- internals -----------------------------------------------------------------------------

    def _advance(self) -> list[dict[str, Any]]:
        now = self._clock()
        logged: list[dict[str, Any]] = []
        for event in list(self._events.values()):
            if event.status == _SCHEDULED:
                release = event.approved_at + self._approval_delay if event.approved_at is not None else None
                if (
                    release is not None
                    and release <= now
                    and (event.not_before is None or release <= event.not_before)
                ):
                    reason = "approved"
                elif event.not_before is not None and event.not_before <= now:
                    reason = "not_before"
                else:
                    continue
                event.status = _STARTED
                event.started_at = now
                logged.append(self._transition(event, _SCHEDULED, _STARTED, reason))
            elif event.started_at is not None and event.started_at + event.started_for <= now:
                del self._events[event.event_id]
                logged.append(self._transition(event, _STARTED, None, "started_for_elapsed"))
        return logged

    def _transition(
        self, event: _Event, before: str | None, after: str | None, reason: str
    ) -> dict[str, Any]:
        self._incarnation += 1
        return self.record(
            "transition",
            event_id=event.event_id,
            event_type=event.event_type,
            resources=list(event.resources),
            **{"from": before, "to": after},
            reason=reason,
            incarnation=self._incarnation,
        )


def _to_model(event: _Event) -> ScheduledEvent:
    not_before = (
        datetime.fromtimestamp(event.not_before, UTC)
        if event.status == _SCHEDULED and event.not_before is not None
        else None
    )
    return ScheduledEvent.model_validate(
        {
            "EventId": event.event_id,
            "EventType": event.event_type,
            "EventStatus": event.status,
            "ResourceType": event.resource_type,
            "Resources": event.resources,
            "NotBefore": not_before,
            "Description": event.description,
            "EventSource": event.source,
            "DurationInSeconds": -1 if event.duration_in_seconds is None else event.duration_in_seconds,
        }
    )


def _rfc1123(epoch: int) -> str:
    return format_not_before(datetime.fromtimestamp(epoch, UTC))


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{name} must be a finite number of seconds >= 0")
