"""The simulated Scheduled Events service of one VM group: pure model, no sockets, no sleeps.

``SimulatedGroup`` holds the VMs of one availability set or scale-set placement group, the events of
the group and an append-only log. Every VM sees every event of the group (Azure delivers an event to
all VMs of the group; each VM reads ``Resources`` to know whether it is hit), except events marked
``deliver_to_named_only`` (GPU VMs of a one-fault-domain scale set see only their own events).

Time comes from an injected clock returning *simulated* epoch seconds, so unit tests drive the
lifecycle with a fake clock and the HTTP server drives it with the wall clock, or with a
``ScaledClock`` that runs ``time_scale`` times faster than real time (a 15-minute notice then lasts
15 real seconds at scale 60). Every duration of the model (notice, approval delay, Started time,
impact, first-call delay, idle reset) is in simulated seconds; ``real_seconds`` converts one for the
server's sleeps. Log entries carry ``t`` (the wall clock, to compare with other observers) and
``sim_t`` (the simulated clock). NotBefore is served in the simulated clock, or, with
``not_before_clock="real"``, as the wall-clock time at which the simulated clock reaches it (for a
client that compares NotBefore with its own clock).

Lifecycle (see the Scheduled Events documentation):

* ``Scheduled -> Started`` when the event has been approved (by any VM of the group) and the group's
  ``approval_delay`` has elapsed since the first approval, or when ``NotBefore`` passes, whichever
  comes first. Approval only shortens the wait. Terminate batch rule: an approved Terminate waits while
  another Terminate of the group is Scheduled and unapproved (so deletes sharing a NotBefore start
  together once all are approved); NotBefore still wins.
* When an event starts, its impact hits the VMs it names: the PIDs registered for those VMs are paused
  (``SIGSTOP``, then ``SIGCONT`` after the impact's seconds) for a freeze impact, or killed
  (``SIGKILL``) for a reboot-like impact. Only registered PIDs are ever signalled.
* ``Started -> removed`` once the event has been Started for its ``started_for`` seconds.
* ``cancel`` removes an event at once (a Scheduled event vanishing without ever starting).
* Hardware failure: an event may be created directly as ``Started``.

``DocumentIncarnation`` starts at 1 and grows by one on every change of the Events array: creation,
status change, removal. Each transition is its own change, so two events starting in the same tick
raise it by two. A VM may be served an offset of it: ``skip_incarnation`` and ``reset_incarnation``
(and an idle reset, as after 24 hours without a request) shift what one VM sees.

Replay: ``load_documents`` serves recorded documents verbatim instead of the model (advanced by
``replay_next`` or every ``interval`` seconds); ``load_timeline`` runs control operations at given
times.

Every operation is thread-safe (one re-entrant lock). Reads (``document``, ``events``) first bring the
lifecycle up to date with the clock, so a document never shows a state the clock has already left,
whether or not a ticker thread calls ``tick``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import yaml

from coordinator.models import Document, ScheduledEvent, format_not_before

__all__ = [
    "DEFAULT_DESCRIPTIONS",
    "DEFAULT_IMPACT",
    "DEFAULT_IMPACT_SECONDS",
    "EVENT_TYPE_SINCE",
    "FAULT_KINDS",
    "IMPACT_KINDS",
    "INSTANCE_API_VERSIONS",
    "LOG_KINDS",
    "MINIMUM_NOTICE",
    "NOT_BEFORE_CLOCKS",
    "ROLLOUT_FIELDS",
    "SCHEDULED_EVENTS_API_VERSIONS",
    "SCHEDULE_FIELDS",
    "TIMELINE_ACTIONS",
    "WRONG_TYPE_FIELDS",
    "Clock",
    "Fault",
    "InvalidRequest",
    "RateLimiter",
    "ScaledClock",
    "SignalSender",
    "SimulatedGroup",
    "SimulatorError",
    "UnknownEvent",
    "UnknownVm",
    "VmInfo",
    "mutate_document",
    "parse_replay",
]

Clock = Callable[[], float]
SignalSender = Callable[[int, int], None]

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

#: Documented minimum notice per event type, in seconds (Terminate: the 5-minute lower bound; the
#: group's ``terminate_notice`` replaces it, as the scale set's configuration does).
MINIMUM_NOTICE: Mapping[str, float] = {
    "Freeze": 900.0,
    "Reboot": 900.0,
    "Redeploy": 600.0,
    "Preempt": 30.0,
    "Terminate": 300.0,
}
_UNKNOWN_TYPE_NOTICE = 900.0
_TERMINATE_NOTICE_RANGE = (300.0, 900.0)

#: Descriptions seen in real documents, used when ``schedule`` is given none.
DEFAULT_DESCRIPTIONS: Mapping[str, str] = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to a different host.",
    "Preempt": "",
    "Terminate": "",
}
_PLATFORM_DESCRIPTION = "Host server is undergoing maintenance."

#: What an event does to the VMs it names when it starts: ``freeze`` pauses their registered PIDs,
#: ``kill`` kills them (the VM reboots, moves, is evicted or deleted), ``none`` leaves them alone.
IMPACT_KINDS: tuple[str, ...] = ("freeze", "kill", "none")
DEFAULT_IMPACT: Mapping[str, str] = {
    "Freeze": "freeze",
    "Reboot": "kill",
    "Redeploy": "kill",
    "Preempt": "kill",
    "Terminate": "kill",
}
#: Length of a freeze impact when the event says nothing usable (DurationInSeconds -1): the
#: documented typical impact.
DEFAULT_IMPACT_SECONDS = 7.0

LOG_KINDS: tuple[str, ...] = (
    "request",
    "approval",
    "transition",
    "fault",
    "hold",
    "impact",
    "signal",
    "pids",
    "service",
    "incarnation",
    "replay",
    "timeline",
)
FAULT_KINDS: tuple[str, ...] = ("status", "malformed", "delay", "drop", "wrong_type", "refuse")
#: How NotBefore is rendered under a time scale: in the simulated clock, or in real (wall-clock) time.
NOT_BEFORE_CLOCKS: tuple[str, ...] = ("simulated", "real")
#: Fields a ``wrong_type`` fault serves with the wrong JSON type.
WRONG_TYPE_FIELDS: tuple[str, ...] = (
    "DocumentIncarnation",
    "Events",
    "EventId",
    "Resources",
    "NotBefore",
    "DurationInSeconds",
)

SCHEDULE_FIELDS = frozenset(
    {
        "event_type",
        "resources",
        "not_before_in",
        "not_before_at",
        "duration_in_seconds",
        "started_for",
        "description",
        "source",
        "event_id",
        "status",
        "resource_type",
        "impact",
        "impact_seconds",
        "deliver_to_named_only",
    }
)
ROLLOUT_FIELDS = (SCHEDULE_FIELDS - {"resources", "event_id", "not_before_at"}) | {"groups", "gap"}
_FAULT_FIELDS = frozenset({"vm", "kind", "count", "status", "seconds", "methods", "field"})
_IMPACT_FIELDS = frozenset({"event_id", "seconds", "pause"})
_APPROVE_FIELDS = frozenset({"vm", "event_ids"})
_INCARNATION_FIELDS = {"skip_incarnation": frozenset({"vm", "by"}), "reset_incarnation": frozenset({"vm"})}
TIMELINE_ACTIONS: tuple[str, ...] = (
    "schedule",
    "cancel",
    "approve",
    "impact",
    "fault",
    "rollout",
    "skip_incarnation",
    "reset_incarnation",
)

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


class ScaledClock:
    """Simulated epoch seconds running ``scale`` times faster than real time.

    At construction the simulated clock reads ``start`` (default: the wall clock); afterwards it
    advances by ``scale`` simulated seconds per real (monotonic) second. ``real_seconds`` converts a
    simulated duration to the real time it takes.
    """

    def __init__(
        self,
        scale: float = 1.0,
        *,
        start: float | None = None,
        wall: Clock = time.time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
            raise InvalidRequest("time scale must be a finite number > 0")
        self.scale = float(scale)
        self.start = wall() if start is None else float(start)
        self._monotonic = monotonic
        self._origin = monotonic()

    def __call__(self) -> float:
        return self.start + (self._monotonic() - self._origin) * self.scale

    def real_seconds(self, simulated: float) -> float:
        return simulated / self.scale


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
    field: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vm": self.vm,
            "remaining": self.remaining,
            "status": self.status,
            "seconds": self.seconds,
            "methods": list(self.methods),
            "field": self.field,
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
    impact: str
    impact_seconds: float | None
    deliver_to_named_only: bool
    rollout: int | None = None
    approved_by: list[str] = field(default_factory=list)
    approved_at: float | None = None
    started_at: float | None = None
    held_by: tuple[str, ...] = ()

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

    def view(self, render: Callable[[int], int] = lambda epoch: epoch) -> dict[str, Any]:
        """The internal state; ``not_before_text`` is NotBefore as served (``render``: see the group)."""
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
            "not_before_text": _rfc1123(render(self.not_before)) if self.not_before is not None else "",
            "started_for": self.started_for,
            "created_at": self.created_at,
            "approved_by": list(self.approved_by),
            "approved_at": self.approved_at,
            "started_at": self.started_at,
            "impact": self.impact,
            "impact_seconds": self.pause_seconds if self.impact == "freeze" else None,
            "deliver_to_named_only": self.deliver_to_named_only,
            "rollout": self.rollout,
            "held_by": list(self.held_by),
        }


@dataclass
class _Rollout:
    rollout_id: int
    event_type: str
    fields: dict[str, Any]
    groups: list[list[str]]
    gap: float
    step: int = 0  # index of the current (last created) group
    event_id: str | None = None
    next_at: float | None = None

    def view(self) -> dict[str, Any]:
        return {
            "rollout": self.rollout_id,
            "event_type": self.event_type,
            "groups": [list(g) for g in self.groups],
            "gap": self.gap,
            "step": self.step,
            "event_id": self.event_id,
            "next_at": self.next_at,
            "done": self.event_id is None and self.next_at is None,
        }


@dataclass
class _Service:
    """Per-VM state of the Scheduled Events service (enabled by the first request)."""

    enabled_at: float | None = None
    last_request: float | None = None
    offset: int = 0  # added to the group's incarnation in this VM's documents


@dataclass
class _Replay:
    documents: list[Any]
    interval: float
    next_at: float | None
    index: int = 0
    approved: set[str] = field(default_factory=set)

    def view(self) -> dict[str, Any]:
        return {
            "active": True,
            "index": self.index,
            "count": len(self.documents),
            "interval": self.interval,
            "at_end": self.index == len(self.documents) - 1,
            "document": copy.deepcopy(self.documents[self.index]),
        }


@dataclass
class _Step:
    due: float
    index: int
    at: float
    action: str
    payload: Any


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
    group's lock: it must not block or call back into the group. ``signal_sender(pid, signum)``
    (default ``os.kill``) is the only way the group touches processes, and only for PIDs registered
    with ``register_pids``.

    Clocks: ``clock`` gives simulated epoch seconds; ``wall_clock`` the ``t`` of log entries (default:
    ``clock`` when one is given, else the wall clock). Without ``clock``, a ``time_scale`` other than 1
    builds a ``ScaledClock`` starting at the wall clock's present.
    """

    def __init__(
        self,
        vms: Iterable[str | VmInfo],
        *,
        clock: Clock | None = None,
        wall_clock: Clock | None = None,
        time_scale: float = 1.0,
        approval_delay: float = 0.0,
        started_for: float = 5.0,
        unknown_approval_status: int = 200,
        terminate_notice: float = MINIMUM_NOTICE["Terminate"],
        first_call_delay: float = 0.0,
        idle_reset_after: float | None = None,
        not_before_clock: str = "simulated",
        signal_sender: SignalSender = os.kill,
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
        if (
            isinstance(time_scale, bool)
            or not isinstance(time_scale, int | float)
            or not math.isfinite(time_scale)
            or time_scale <= 0
        ):
            raise InvalidRequest("time_scale must be a finite number > 0")
        _check_seconds("approval_delay", approval_delay)
        _check_seconds("started_for", started_for)
        _check_seconds("terminate_notice", terminate_notice)
        if not _TERMINATE_NOTICE_RANGE[0] <= terminate_notice <= _TERMINATE_NOTICE_RANGE[1]:
            raise InvalidRequest("terminate_notice must be between 300 and 900 seconds (5 to 15 minutes)")
        _check_seconds("first_call_delay", first_call_delay)
        if idle_reset_after is not None:
            _check_seconds("idle_reset_after", idle_reset_after)
            if idle_reset_after <= 0:
                raise InvalidRequest("idle_reset_after must be > 0")
        if unknown_approval_status not in (200, 400, 404):
            raise InvalidRequest("unknown_approval_status must be 200, 400 or 404")
        if not_before_clock not in NOT_BEFORE_CLOCKS:
            raise InvalidRequest(f"not_before_clock must be one of {', '.join(NOT_BEFORE_CLOCKS)}")
        if clock is None:
            clock = time.time if time_scale == 1 else ScaledClock(time_scale)
            wall_clock = wall_clock or time.time
        self._vms = infos
        self._by_key = by_key
        self._clock = clock
        self._wall_clock = wall_clock or clock
        self._time_scale = float(time_scale)
        self._approval_delay = float(approval_delay)
        self._started_for = float(started_for)
        self._unknown_approval_status = unknown_approval_status
        self._terminate_notice = float(terminate_notice)
        self._first_call_delay = float(first_call_delay)
        self._idle_reset_after = None if idle_reset_after is None else float(idle_reset_after)
        self._not_before_clock = not_before_clock
        # Where the two clocks meet, to render a simulated time in real time (not_before_clock "real").
        self._sim_origin = self._clock()
        self._wall_origin = self._sim_origin if self._wall_clock is self._clock else self._wall_clock()
        self._signal_sender = signal_sender
        self._on_record = on_record
        self._on_refuse: Callable[[str, float], None] | None = None
        self._lock = threading.RLock()
        self._events: dict[str, _Event] = {}
        self._incarnation = 1
        self._log: list[dict[str, Any]] = []
        self._seq = 0
        self._faults: dict[str, list[Fault]] = {info.name: [] for info in infos}
        self._pids: dict[str, list[int]] = {info.name: [] for info in infos}
        self._paused: dict[int, tuple[float, str, str | None]] = {}  # pid -> (resume at, vm, event id)
        self._service: dict[str, _Service] = {info.name: _Service() for info in infos}
        self._rollouts: dict[int, _Rollout] = {}
        self._timeline: list[_Step] = []
        self._replay: _Replay | None = None
        self._collected: list[dict[str, Any]] | None = None
        self._frozen: float | None = None  # the clock reading of the ongoing advance

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
    def time_scale(self) -> float:
        return self._time_scale

    @property
    def terminate_notice(self) -> float:
        return self._terminate_notice

    @property
    def incarnation(self) -> int:
        with self._lock:
            return self._incarnation

    def now(self) -> float:
        """The simulated clock's present (epoch seconds)."""
        return self._clock()

    def real_seconds(self, simulated: float) -> float:
        """How many real seconds ``simulated`` seconds of the model last."""
        return simulated / self._time_scale

    def served_not_before(self, not_before: int) -> int:
        """The NotBefore (epoch seconds) served for a simulated ``not_before``.

        ``not_before_clock`` "simulated" (default) serves the simulated time itself; "real" serves the
        wall-clock time at which the simulated clock reaches it, rounded up to the second.
        """
        if self._not_before_clock == "simulated" or self._time_scale == 1:
            return not_before
        return math.ceil(self._wall_origin + (not_before - self._sim_origin) / self._time_scale)

    def vm(self, name: str) -> VmInfo:
        """The VM called ``name`` (case-insensitive); raises ``UnknownVm``."""
        info = self._by_key.get(name.lower()) if isinstance(name, str) else None
        if info is None:
            raise UnknownVm(f"no VM {name!r} in the group")
        return info

    def set_refuse_handler(self, handler: Callable[[str, float], None] | None) -> None:
        """Who carries out ``refuse`` faults (the server closes the VM's listening socket).

        Called under the group's lock with ``(vm, real_seconds)``: it must not block.
        """
        self._on_refuse = handler

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
        impact: str | None = None,
        impact_seconds: float | None = None,
        deliver_to_named_only: bool = False,
        not_before_at: float | None = None,
    ) -> dict[str, Any]:
        """Create an event and return its internal view.

        ``not_before_in`` defaults to the documented minimum notice of the type (``MINIMUM_NOTICE``,
        Terminate: the group's ``terminate_notice``; 900 s for an unknown type); ``not_before_at``
        (simulated epoch seconds) fixes NotBefore instead, so that several events can share one.
        ``started_for`` (how long the event stays Started before it is removed) defaults to
        ``max(duration_in_seconds, group started_for)``. ``status="Started"`` creates the event
        already started, as a hardware failure does; it then has no NotBefore. ``impact`` (``freeze``,
        ``kill``, ``none``; default from the type, ``DEFAULT_IMPACT``) is what the start does to the
        PIDs registered for the named VMs; a freeze lasts ``impact_seconds`` (default:
        DurationInSeconds when >= 0, else ``DEFAULT_IMPACT_SECONDS``). ``deliver_to_named_only``
        serves the event only to the VMs it names. ``Resources`` may name VMs outside the group, or
        nobody, as hand-made documents do.
        """
        spec = self._normalize(
            event_type=event_type,
            resources=resources,
            not_before_in=not_before_in,
            not_before_at=not_before_at,
            duration_in_seconds=duration_in_seconds,
            started_for=started_for,
            description=description,
            source=source,
            event_id=event_id,
            status=status,
            resource_type=resource_type,
            impact=impact,
            impact_seconds=impact_seconds,
            deliver_to_named_only=deliver_to_named_only,
        )
        with self._lock:
            self._advance()
            return self._create(spec).view(self.served_not_before)

    def cancel(self, event_id: str) -> dict[str, Any]:
        """Remove an event at once, whatever its status; returns its last view.

        On a Scheduled event this is a cancellation; on a Started one it ends the event early.
        Raises ``UnknownEvent``.
        """
        with self._lock:
            self._advance()
            return self._cancel(event_id)

    def approve(self, vm: str, event_ids: Sequence[str]) -> dict[str, str]:
        """Approve events on behalf of ``vm``; returns a result per id.

        Results: ``approved`` (first approval), ``already_approved``, ``already_started``,
        ``unknown`` (no current event with exactly this id). Any VM of the group may approve any
        current event, and approving releases it for every VM in its Resources. With an
        ``approval_delay`` of 0 the event is Started when this returns (unless the Terminate batch
        rule holds it). While replaying recorded documents the ids are matched against the
        document being served and nothing changes. Raises ``UnknownVm``.
        """
        info = self.vm(vm)
        with self._lock:
            self._advance()
            results = self._approve(info.name, event_ids)
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

    def impact(self, event_id: str, seconds: float | None = None, pause: bool = False) -> dict[str, Any]:
        """A second impact while ``event_id`` is Started: logged; the event stays Started.

        With ``pause`` the registered PIDs of the named VMs are paused again for ``seconds`` (default:
        the event's freeze length). Raises ``UnknownEvent``, and ``InvalidRequest`` if the event is
        not Started. Returns the ``impact`` log entry.
        """
        with self._lock:
            self._advance()
            return self._second_impact(event_id, seconds, pause)

    def rollout(
        self, event_type: str, groups: Sequence[Sequence[str]] | None = None, gap: float = 0.0, **fields: Any
    ) -> dict[str, Any]:
        """Back-to-back events: one per group of VMs, each created once the previous one is removed.

        ``groups`` defaults to the group's VMs by fault domain (lowest domain first); ``gap`` is the
        time between the removal of one event and the creation of the next. ``fields`` are those of
        ``schedule`` except ``resources``, ``event_id`` and ``not_before_at``; ``not_before_in`` is
        counted from each event's creation. Returns the rollout's view with the first event.
        """
        with self._lock:
            self._advance()
            return self._start_rollout(event_type, groups, gap, fields)

    def rollouts(self) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            return [r.view() for r in self._rollouts.values()]

    def tick(self) -> list[dict[str, Any]]:
        """Advance the lifecycle to the clock's present; returns the transitions it logged."""
        with self._lock:
            return self._advance()

    def events(self) -> dict[str, Any]:
        """Current events with their internal state, the incarnation and the simulated time."""
        with self._lock:
            self._advance()
            return {
                "incarnation": self._incarnation,
                "approval_delay": self._approval_delay,
                "now": self._clock(),
                "events": [e.view(self.served_not_before) for e in self._events.values()],
            }

    def event(self, event_id: str) -> dict[str, Any]:
        """The internal view of one current event; raises ``UnknownEvent``."""
        with self._lock:
            self._advance()
            event = self._events.get(event_id)
            if event is None:
                raise UnknownEvent(f"no current event {event_id!r}")
            return event.view(self.served_not_before)

    def document(self, vm: str, api_version: str | None = None) -> dict[str, Any]:
        """The Scheduled Events document IMDS would serve to ``vm`` with ``api_version``.

        ``None`` means the newest version. Fields and event types that the api-version predates are
        absent (not null); with 2017-03-01 resource names carry the leading underscore that
        2017-08-01 dropped. Events ``deliver_to_named_only`` are left out for VMs they do not name.
        While replaying, the recorded document is served as it is, whatever the api-version. Raises
        ``UnknownVm``, and ``InvalidRequest`` for an unknown api-version.
        """
        info = self.vm(vm)
        if api_version is not None and api_version not in SCHEDULED_EVENTS_API_VERSIONS:
            raise InvalidRequest(f"unknown api-version {api_version!r}")
        with self._lock:
            self._advance()
            if self._replay is not None:
                served: dict[str, Any] = copy.deepcopy(self._replay.documents[self._replay.index])
                return served
            incarnation = max(0, self._incarnation + self._service[info.name].offset)
            # Events are mutable: take their models while the lock is held, so that the document
            # is one consistent snapshot (incarnation and statuses from the same instant).
            models = tuple(
                _to_model(e, self.served_not_before)
                for e in self._events.values()
                if (api_version is None or api_version >= EVENT_TYPE_SINCE.get(e.event_type, "0000"))
                and (not e.deliver_to_named_only or e.names(info.name))
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

    # -- the service of each VM: first call, idle reset, incarnation offsets -------------------

    def begin_request(self, vm: str) -> float:
        """Note a Scheduled Events request of ``vm``; return how long (simulated s) to hold its answer.

        The first request enables the service for the VM and is held ``first_call_delay``. When
        ``idle_reset_after`` is set and the VM's previous request is at least that old, the service
        had switched itself off: the request enables it again (held again) and the VM's
        DocumentIncarnation starts again from 1 (a field report after 24 h without polling).
        """
        name = self.vm(vm).name
        with self._lock:
            self._advance()
            now = self._clock()
            service = self._service[name]
            if (
                service.last_request is not None
                and self._idle_reset_after is not None
                and now - service.last_request >= self._idle_reset_after
            ):
                idle = now - service.last_request
                service.enabled_at = None
                if self._replay is None:
                    service.offset = 1 - self._incarnation
                self.record("service", vm=name, action="reset", idle=idle, served_incarnation=self._served(name))
            delay = 0.0
            if service.enabled_at is None:
                service.enabled_at = now
                delay = self._first_call_delay
                self.record("service", vm=name, action="enabled", delay=delay)
            service.last_request = now + delay
            return delay

    def skip_incarnation(self, vm: str | None = None, by: int = 1) -> list[dict[str, Any]]:
        """Raise the DocumentIncarnation ``vm`` (None: every VM) is served by ``by``, events unchanged.

        What a VM sees when it missed documents (down while Started). Returns the log entries.
        """
        if isinstance(by, bool) or not isinstance(by, int) or by < 1:
            raise InvalidRequest("by must be an integer >= 1")
        with self._lock:
            self._advance()
            return self._shift_incarnation(vm, by)

    def reset_incarnation(self, vm: str | None = None) -> list[dict[str, Any]]:
        """Serve ``vm`` (None: every VM) a DocumentIncarnation that starts again from 1."""
        with self._lock:
            self._advance()
            return self._shift_incarnation(vm, None)

    def served_incarnation(self, vm: str) -> int:
        name = self.vm(vm).name
        with self._lock:
            self._advance()
            return self._served(name)

    # -- PIDs and impacts ----------------------------------------------------------------------

    def register_pids(self, vm: str, pids: Sequence[int]) -> dict[str, Any]:
        """Set the PIDs that stand for ``vm`` (replacing earlier ones); returns ``{"vm", "pids"}``.

        Impacts signal these PIDs only. PIDs must be integers > 1 and not the simulator's own.
        """
        name = self.vm(vm).name
        if isinstance(pids, str | bytes) or not isinstance(pids, Sequence):
            raise InvalidRequest("pids must be a list of process ids")
        checked: list[int] = []
        for pid in pids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
                raise InvalidRequest("every pid must be an integer > 1")
            if pid == os.getpid():
                raise InvalidRequest("the simulator does not signal itself")
            if pid not in checked:
                checked.append(pid)
        with self._lock:
            self._advance()
            self._pids[name] = checked
            self.record("pids", vm=name, pids=list(checked))
            return {"vm": name, "pids": list(checked)}

    def pids(self, vm: str) -> list[int]:
        name = self.vm(vm).name
        with self._lock:
            return list(self._pids[name])

    def paused(self) -> dict[int, dict[str, Any]]:
        """PIDs paused by an impact: ``{pid: {"vm", "until", "event_id"}}`` (simulated time)."""
        with self._lock:
            return {pid: {"vm": vm, "until": until, "event_id": eid} for pid, (until, vm, eid) in self._paused.items()}

    def release_paused(self) -> int:
        """Continue (``SIGCONT``) every PID an impact paused; returns how many. Used at shutdown."""
        with self._lock:
            count = 0
            for pid, (_, vm, event_id) in list(self._paused.items()):
                del self._paused[pid]
                self._signal(vm, pid, signal.SIGCONT, event_id, "shutdown")
                count += 1
            return count

    # -- faults --------------------------------------------------------------------------------

    def add_fault(
        self,
        kind: str,
        vm: str | None = None,
        count: int | None = 1,
        status: int | None = None,
        seconds: float | None = None,
        methods: Sequence[str] = ("GET",),
        field: str | None = None,
    ) -> list[dict[str, Any]]:
        """Queue a fault on the Scheduled Events endpoint of ``vm``, or of every VM if None.

        With ``vm=None`` each VM gets its own copy, served ``count`` times to that VM. ``count`` None
        serves the fault until ``clear_faults``. Faults queue behind earlier ones, per VM.
        Kinds: ``status`` (answer ``status``, 400-599), ``malformed`` (200 with a body that is not
        JSON), ``delay`` (wait ``seconds``, real time, then answer normally), ``drop`` (close the
        connection without an answer), ``wrong_type`` (200 with the document's ``field`` of the
        wrong JSON type, one of ``WRONG_TYPE_FIELDS``). ``refuse`` is not queued: it happens now, the
        VM's port refusing connections for ``seconds`` (real time; carried out by the refuse handler).
        Returns the views of the queued faults.
        """
        with self._lock:
            self._advance()
            return self._add_fault(kind, vm, count, status, seconds, methods, field)

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
                extra = {"field": fault.field} if fault.field is not None else {}
                self.record(
                    "fault",
                    vm=name,
                    method=method.upper(),
                    path=path,
                    fault=fault.kind,
                    status=fault.status,
                    seconds=fault.seconds,
                    remaining=remaining,
                    **extra,
                )
                return fault
            return None

    # -- replay --------------------------------------------------------------------------------

    def load_documents(self, documents: Sequence[Any], interval: float = 0.0) -> dict[str, Any]:
        """Serve recorded documents, verbatim, instead of the model; returns the replay's view.

        Every VM is served ``documents[i]``; ``replay_next`` moves to the next one, and so does the
        clock every ``interval`` seconds if it is > 0. The last document stays served. Approvals
        are still checked against the served document and logged. Events, rollouts and incarnation
        shifts are refused while replaying.
        """
        if isinstance(documents, str | bytes | Mapping) or not isinstance(documents, Sequence) or not documents:
            raise InvalidRequest("documents must be a non-empty list")
        _check_seconds("interval", interval)
        with self._lock:
            self._advance()
            if self._events:
                raise InvalidRequest("cannot replay documents while the model has events")
            now = self._clock()
            self._replay = _Replay(
                documents=[copy.deepcopy(d) for d in documents],
                interval=float(interval),
                next_at=now + interval if interval > 0 else None,
            )
            self._record_replay()
            return self._replay.view()

    def replay_next(self) -> dict[str, Any]:
        """Serve the next recorded document (no change at the last); returns the replay's view."""
        with self._lock:
            self._advance()
            if self._replay is None:
                raise InvalidRequest("no replay loaded")
            replay = self._replay
            if replay.index < len(replay.documents) - 1:
                replay.index += 1
                if replay.interval > 0:
                    replay.next_at = self._clock() + replay.interval
                self._record_replay()
            return replay.view()

    def replay(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return self._replay.view() if self._replay is not None else {"active": False}

    def load_timeline(self, steps: Sequence[Any]) -> int:
        """Run control operations at given times: ``[{"at": S, ACTION: ARGS}, ...]``.

        ``at`` is in seconds from now; ACTION is one of ``TIMELINE_ACTIONS`` with the arguments of
        the method of that name (``cancel`` takes an event id). Steps are checked here, run when due,
        and logged (``timeline``); a step that fails is logged with its error and the rest go on.
        Returns how many steps are pending.
        """
        parsed = _parse_steps(steps)
        with self._lock:
            self._advance()
            now = self._clock()
            for index, at, action, payload in parsed:
                self._timeline.append(_Step(now + at, index, at, action, payload))
            self._timeline.sort(key=lambda s: (s.due, s.index))
            self.record("timeline", action="loaded", steps=len(parsed))
            return len(self._timeline)

    # -- log -----------------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append ``{"seq", "t", "sim_t", "kind", **fields}``: wall-clock and simulated epoch seconds."""
        if kind not in LOG_KINDS:
            raise InvalidRequest(f"log kind must be one of {', '.join(LOG_KINDS)}")
        with self._lock:
            self._seq += 1
            sim_t = self._now()
            wall_t = sim_t if self._wall_clock is self._clock else self._wall_clock()
            entry = {"seq": self._seq, "t": wall_t, "sim_t": sim_t, "kind": kind, **fields}
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

    # -- internals: events ---------------------------------------------------------------------

    def _normalize(
        self,
        *,
        event_type: Any,
        resources: Any,
        not_before_in: Any = None,
        not_before_at: Any = None,
        duration_in_seconds: Any = None,
        started_for: Any = None,
        description: Any = None,
        source: Any = "Platform",
        event_id: Any = None,
        status: Any = _SCHEDULED,
        resource_type: Any = "VirtualMachine",
        impact: Any = None,
        impact_seconds: Any = None,
        deliver_to_named_only: Any = False,
    ) -> dict[str, Any]:
        """Check ``schedule``'s arguments; returns them completed with their defaults."""
        if not isinstance(event_type, str) or not event_type:
            raise InvalidRequest("event_type must be a non-empty string")
        if isinstance(resources, str) or not isinstance(resources, Sequence):
            raise InvalidRequest("resources must be a list of VM names")
        if not all(isinstance(r, str) for r in resources):
            raise InvalidRequest("resources must be a list of strings")
        if not_before_in is not None:
            _check_seconds("not_before_in", not_before_in)
        if not_before_at is not None:
            if not_before_in is not None:
                raise InvalidRequest("give not_before_in or not_before_at, not both")
            _check_seconds("not_before_at", not_before_at)
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
        if status == _STARTED and not_before_at is not None:
            raise InvalidRequest("a Started event has no NotBefore")
        if event_id is None:
            event_id = str(uuid.uuid4()).upper()
        elif not isinstance(event_id, str) or not event_id or not event_id.isprintable():
            raise InvalidRequest("event_id must be a non-empty printable string")
        if impact is None:
            impact = DEFAULT_IMPACT.get(event_type, "none")
        elif impact not in IMPACT_KINDS:
            raise InvalidRequest(f"impact must be one of {', '.join(IMPACT_KINDS)}")
        if impact_seconds is not None:
            _check_seconds("impact_seconds", impact_seconds)
        if not isinstance(deliver_to_named_only, bool):
            raise InvalidRequest("deliver_to_named_only must be true or false")
        if description is None:
            if source == "Platform" and event_type in ("Reboot", "Redeploy"):
                description = _PLATFORM_DESCRIPTION
            else:
                description = DEFAULT_DESCRIPTIONS.get(event_type, "")
        if started_for is None:
            started_for = max(float(duration_in_seconds or 0), self._started_for)
        return {
            "event_type": event_type,
            "resources": tuple(resources),
            "not_before_in": None if not_before_in is None else float(not_before_in),
            "not_before_at": None if not_before_at is None else float(not_before_at),
            "duration_in_seconds": duration_in_seconds,
            "started_for": float(started_for),
            "description": description,
            "source": source,
            "event_id": event_id,
            "status": status,
            "resource_type": resource_type,
            "impact": impact,
            "impact_seconds": None if impact_seconds is None else float(impact_seconds),
            "deliver_to_named_only": deliver_to_named_only,
        }

    def _notice(self, event_type: str) -> float:
        if event_type == "Terminate":
            return self._terminate_notice
        return MINIMUM_NOTICE.get(event_type, _UNKNOWN_TYPE_NOTICE)

    def _create(self, spec: Mapping[str, Any], rollout: int | None = None) -> _Event:
        self._refuse_while_replaying()
        event_id = spec["event_id"]
        if event_id in self._events:
            raise InvalidRequest(f"event {event_id} already exists")
        now = self._now()
        started_at: float | None
        if spec["status"] == _STARTED:
            not_before = None
            started_at = now
        else:
            if spec["not_before_at"] is not None:
                not_before_time = spec["not_before_at"]
            else:
                notice = spec["not_before_in"]
                not_before_time = now + (self._notice(spec["event_type"]) if notice is None else notice)
            # NotBefore has a resolution of one second; round up so the event never starts before
            # the time it announces.
            not_before = math.ceil(not_before_time)
            started_at = None
        event = _Event(
            event_id=event_id,
            event_type=spec["event_type"],
            resources=spec["resources"],
            resource_type=spec["resource_type"],
            description=spec["description"],
            source=spec["source"],
            duration_in_seconds=spec["duration_in_seconds"],
            started_for=spec["started_for"],
            created_at=now,
            status=spec["status"],
            not_before=not_before,
            started_at=started_at,
            impact=spec["impact"],
            impact_seconds=spec["impact_seconds"],
            deliver_to_named_only=spec["deliver_to_named_only"],
            rollout=rollout,
        )
        self._events[event_id] = event
        self._transition(event, None, event.status, "scheduled")
        if event.status == _STARTED:
            self._apply_impact(event, "started")
        return event

    def _cancel(self, event_id: Any) -> dict[str, Any]:
        if not isinstance(event_id, str) or event_id not in self._events:
            raise UnknownEvent(f"no current event {event_id!r}")
        event = self._events[event_id]
        self._remove(event, "cancelled")
        return event.view(self.served_not_before)

    def _remove(self, event: _Event, reason: str) -> None:
        del self._events[event.event_id]
        self._transition(event, event.status, None, reason)
        if event.rollout is not None:
            rollout = self._rollouts[event.rollout]
            rollout.event_id = None
            if rollout.step + 1 < len(rollout.groups):
                rollout.next_at = self._now() + rollout.gap

    def _approve(self, vm: str, event_ids: Sequence[str]) -> dict[str, str]:
        now = self._now()
        results: dict[str, str] = {}
        if self._replay is not None:
            served = self._replay.documents[self._replay.index]
            statuses = {
                e["EventId"]: e.get("EventStatus")
                for e in (served.get("Events") if isinstance(served, dict) else None) or []
                if isinstance(e, dict) and isinstance(e.get("EventId"), str)
            }
            for event_id in event_ids:
                if event_id not in statuses:
                    results[event_id] = "unknown"
                elif statuses[event_id] == _STARTED:
                    results[event_id] = "already_started"
                elif event_id in self._replay.approved:
                    results[event_id] = "already_approved"
                else:
                    self._replay.approved.add(event_id)
                    results[event_id] = "approved"
        else:
            for event_id in event_ids:
                event = self._events.get(event_id)
                if event is None:
                    results[event_id] = "unknown"
                    continue
                if vm not in event.approved_by:
                    event.approved_by.append(vm)
                if event.status == _STARTED:
                    results[event_id] = "already_started"
                elif event.approved_at is None:
                    event.approved_at = now
                    results[event_id] = "approved"
                else:
                    results[event_id] = "already_approved"
        self.record(
            "approval",
            vm=vm,
            event_ids=list(event_ids),
            accepted=[i for i in event_ids if results[i] != "unknown"],
            results=results,
            status=self.approval_status(results),
        )
        return results

    def _start_reason(self, event: _Event, now: float) -> str | None:
        release = event.approved_at + self._approval_delay if event.approved_at is not None else None
        if release is not None and release <= now and (event.not_before is None or release <= event.not_before):
            blockers = self._terminate_blockers(event, now)
            if not blockers:
                # A held delete released because NotBefore came is a start at NotBefore.
                held_until_not_before = event.held_by and event.not_before is not None and event.not_before <= now
                return "not_before" if held_until_not_before else "approved"
            if blockers != event.held_by:
                event.held_by = blockers
                self.record(
                    "hold",
                    event_id=event.event_id,
                    event_type=event.event_type,
                    held_by=list(blockers),
                    rule="terminate_pending",
                )
        if event.not_before is not None and event.not_before <= now:
            return "not_before"
        return None

    def _terminate_blockers(self, event: _Event, now: float) -> tuple[str, ...]:
        """Other Terminate events still Scheduled and unapproved: they hold an approved Terminate back."""
        if event.event_type != "Terminate":
            return ()
        return tuple(
            other.event_id
            for other in self._events.values()
            if other is not event
            and other.event_type == "Terminate"
            and other.status == _SCHEDULED
            and other.approved_at is None
            and (other.not_before is None or other.not_before > now)
        )

    def _now(self) -> float:
        """The simulated present; one advance reads the clock once, so its changes share one instant."""
        return self._frozen if self._frozen is not None else self._clock()

    def _advance(self) -> list[dict[str, Any]]:
        outer = self._collected is None
        if outer:
            self._collected = []
            self._frozen = self._clock()
        try:
            now = self._now()
            self._run_timeline(now)
            self._advance_replay(now)
            for event in list(self._events.values()):
                if event.event_id not in self._events:
                    continue
                if event.status == _SCHEDULED:
                    reason = self._start_reason(event, now)
                    if reason is None:
                        continue
                    event.status = _STARTED
                    event.started_at = now
                    self._transition(event, _SCHEDULED, _STARTED, reason)
                    self._apply_impact(event, "started")
                elif event.started_at is not None and event.started_at + event.started_for <= now:
                    self._remove(event, "started_for_elapsed")
            for rollout in self._rollouts.values():
                if rollout.next_at is not None and rollout.next_at <= now:
                    rollout.next_at = None
                    rollout.step += 1
                    self._next_rollout_event(rollout)
            for pid, (until, vm, event_id) in list(self._paused.items()):
                if until <= now:
                    del self._paused[pid]
                    self._signal(vm, pid, signal.SIGCONT, event_id, "impact_over")
            return list(self._collected) if self._collected is not None else []
        finally:
            if outer:
                self._collected = None
                self._frozen = None

    def _transition(self, event: _Event, before: str | None, after: str | None, reason: str) -> dict[str, Any]:
        self._incarnation += 1
        entry = self.record(
            "transition",
            event_id=event.event_id,
            event_type=event.event_type,
            resources=list(event.resources),
            **{"from": before, "to": after},
            reason=reason,
            incarnation=self._incarnation,
        )
        if self._collected is not None:
            self._collected.append(entry)
        return entry

    # -- internals: impacts --------------------------------------------------------------------

    def _named_vms(self, event: _Event) -> list[str]:
        return [info.name for info in self._vms if event.names(info.name)]

    def _apply_impact(self, event: _Event, reason: str) -> None:
        vms = self._named_vms(event)
        seconds = event.pause_seconds if event.impact == "freeze" else None
        self.record(
            "impact",
            event_id=event.event_id,
            event_type=event.event_type,
            impact=event.impact,
            seconds=seconds,
            vms=vms,
            reason=reason,
        )
        for vm in vms:
            if event.impact == "freeze" and seconds:
                self._pause(vm, seconds, event.event_id)
            elif event.impact == "kill":
                self._kill(vm, event.event_id)

    def _second_impact(self, event_id: Any, seconds: Any, pause: Any) -> dict[str, Any]:
        if not isinstance(event_id, str) or event_id not in self._events:
            raise UnknownEvent(f"no current event {event_id!r}")
        event = self._events[event_id]
        if event.status != _STARTED:
            raise InvalidRequest("a second impact needs a Started event")
        if seconds is not None:
            _check_seconds("seconds", seconds)
        if not isinstance(pause, bool):
            raise InvalidRequest("pause must be true or false")
        length = float(seconds) if seconds is not None else event.pause_seconds
        vms = self._named_vms(event)
        entry = self.record(
            "impact",
            event_id=event.event_id,
            event_type=event.event_type,
            impact="freeze" if pause else "none",
            seconds=length,
            vms=vms,
            reason="second",
        )
        if pause and length > 0:
            for vm in vms:
                self._pause(vm, length, event.event_id)
        return entry

    def _pause(self, vm: str, seconds: float, event_id: str) -> None:
        until = self._now() + seconds
        for pid in list(self._pids[vm]):
            current = self._paused.get(pid)
            if current is not None:
                self._paused[pid] = (max(current[0], until), vm, event_id)
                continue
            if self._signal(vm, pid, signal.SIGSTOP, event_id, "freeze"):
                self._paused[pid] = (until, vm, event_id)

    def _kill(self, vm: str, event_id: str) -> None:
        for pid in list(self._pids[vm]):
            self._paused.pop(pid, None)
            self._signal(vm, pid, signal.SIGKILL, event_id, "kill")
            # The process is gone: never signal its PID again (it may be reused).
            if pid in self._pids[vm]:
                self._pids[vm].remove(pid)

    def _signal(self, vm: str, pid: int, signum: int, event_id: str | None, reason: str) -> bool:
        try:
            self._signal_sender(pid, signum)
            result = "sent"
        except ProcessLookupError:
            result = "no such process"
            if pid in self._pids[vm]:
                self._pids[vm].remove(pid)
        except OSError as exc:
            result = f"failed: {exc.strerror or exc}"
        self.record(
            "signal",
            vm=vm,
            pid=pid,
            signal=signal.Signals(signum).name,
            event_id=event_id,
            reason=reason,
            result=result,
        )
        return result == "sent"

    # -- internals: rollouts -------------------------------------------------------------------

    def _start_rollout(
        self, event_type: Any, groups: Any, gap: Any, fields: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._refuse_while_replaying()
        unknown = sorted(set(fields) - (ROLLOUT_FIELDS - {"groups", "gap", "event_type"}))
        if unknown:
            raise InvalidRequest(f"a rollout does not take {', '.join(unknown)}")
        _check_seconds("gap", gap)
        if groups is None:
            domains = sorted({info.fault_domain for info in self._vms})
            groups = [[info.name for info in self._vms if info.fault_domain == d] for d in domains]
        if (
            isinstance(groups, str)
            or not isinstance(groups, Sequence)
            or not groups
            or not all(
                not isinstance(g, str) and isinstance(g, Sequence) and g and all(isinstance(n, str) for n in g)
                for g in groups
            )
        ):
            raise InvalidRequest("groups must be a non-empty list of non-empty lists of VM names")
        # Check the fields once, now, rather than when a later event of the rollout is due.
        self._normalize(event_type=event_type, resources=list(groups[0]), **fields)
        rollout = _Rollout(
            rollout_id=len(self._rollouts) + 1,
            event_type=event_type,
            fields=dict(fields),
            groups=[list(g) for g in groups],
            gap=float(gap),
        )
        self._rollouts[rollout.rollout_id] = rollout
        event = self._next_rollout_event(rollout)
        view = rollout.view()
        view["event"] = event.view(self.served_not_before) if event is not None else None
        return view

    def _next_rollout_event(self, rollout: _Rollout) -> _Event | None:
        spec = self._normalize(
            event_type=rollout.event_type, resources=rollout.groups[rollout.step], **rollout.fields
        )
        try:
            event = self._create(spec, rollout=rollout.rollout_id)
        except SimulatorError as exc:
            self.record("timeline", action="rollout", rollout=rollout.rollout_id, error=str(exc))
            return None
        rollout.event_id = event.event_id
        return event

    # -- internals: incarnation, replay, timeline ----------------------------------------------

    def _served(self, name: str) -> int:
        return max(0, self._incarnation + self._service[name].offset)

    def _shift_incarnation(self, vm: Any, by: int | None) -> list[dict[str, Any]]:
        self._refuse_while_replaying()
        if vm is not None and not isinstance(vm, str):
            raise InvalidRequest("vm must be a VM name or null")
        names = [info.name for info in self._vms] if vm is None else [self.vm(vm).name]
        entries = []
        for name in names:
            service = self._service[name]
            if by is None:
                service.offset = 1 - self._incarnation
            else:
                service.offset += by
            entries.append(
                self.record(
                    "incarnation",
                    vm=name,
                    action="reset" if by is None else "skip",
                    by=by,
                    served=self._served(name),
                )
            )
        return entries

    def _refuse_while_replaying(self) -> None:
        if self._replay is not None:
            raise InvalidRequest("the simulator is replaying recorded documents")

    def _record_replay(self) -> None:
        assert self._replay is not None
        served = self._replay.documents[self._replay.index]
        incarnation = served.get("DocumentIncarnation") if isinstance(served, dict) else None
        self.record(
            "replay",
            index=self._replay.index,
            count=len(self._replay.documents),
            incarnation=incarnation,
        )

    def _advance_replay(self, now: float) -> None:
        replay = self._replay
        if replay is None or replay.next_at is None:
            return
        while replay.next_at is not None and replay.next_at <= now and replay.index < len(replay.documents) - 1:
            replay.index += 1
            replay.next_at += replay.interval
            self._record_replay()

    def _run_timeline(self, now: float) -> None:
        while self._timeline and self._timeline[0].due <= now:
            step = self._timeline.pop(0)
            self.record("timeline", action=step.action, index=step.index, at=step.at)
            try:
                self._run_step(step)
            except (SimulatorError, TypeError) as exc:
                self.record("timeline", action=step.action, index=step.index, at=step.at, error=str(exc))

    def _run_step(self, step: _Step) -> None:
        payload = step.payload
        if step.action == "schedule":
            self._create(self._normalize(**payload))
        elif step.action == "cancel":
            self._cancel(payload["event_id"] if isinstance(payload, dict) else payload)
        elif step.action == "approve":
            ids = payload.get("event_ids")
            if isinstance(ids, str) or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise InvalidRequest("approve needs event_ids, a list of strings")
            self._approve(self.vm(payload.get("vm", "")).name, ids)
        elif step.action == "impact":
            self._second_impact(payload.get("event_id"), payload.get("seconds"), payload.get("pause", False))
        elif step.action == "fault":
            self._add_fault(**payload)
        elif step.action == "rollout":
            fields = dict(payload)
            self._start_rollout(fields.pop("event_type", None), fields.pop("groups", None), fields.pop("gap", 0.0),
                                fields)
        elif step.action == "skip_incarnation":
            by = payload.get("by", 1)
            if isinstance(by, bool) or not isinstance(by, int) or by < 1:
                raise InvalidRequest("by must be an integer >= 1")
            self._shift_incarnation(payload.get("vm"), by)
        elif step.action == "reset_incarnation":
            self._shift_incarnation(payload.get("vm"), None)

    # -- internals: faults ---------------------------------------------------------------------

    def _add_fault(
        self,
        kind: Any,
        vm: Any = None,
        count: Any = 1,
        status: Any = None,
        seconds: Any = None,
        methods: Any = ("GET",),
        field: Any = None,
    ) -> list[dict[str, Any]]:
        if kind not in FAULT_KINDS:
            raise InvalidRequest(f"fault kind must be one of {', '.join(FAULT_KINDS)}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise InvalidRequest("count must be a positive integer, or null for until cleared")
        if kind == "status":
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                raise InvalidRequest("a status fault needs a status between 400 and 599")
        elif status is not None:
            raise InvalidRequest(f"status is only for status faults, not {kind}")
        if kind in ("delay", "refuse"):
            if seconds is None:
                raise InvalidRequest(f"a {kind} fault needs seconds")
            _check_seconds("seconds", seconds)
            if seconds > _MAX_DELAY:
                raise InvalidRequest(f"seconds must be at most {_MAX_DELAY:g}")
        elif seconds is not None:
            raise InvalidRequest(f"seconds is only for delay and refuse faults, not {kind}")
        if kind == "wrong_type":
            field = "DocumentIncarnation" if field is None else field
            if field not in WRONG_TYPE_FIELDS:
                raise InvalidRequest(f"field must be one of {', '.join(WRONG_TYPE_FIELDS)}")
        elif field is not None:
            raise InvalidRequest(f"field is only for wrong_type faults, not {kind}")
        if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
            raise InvalidRequest("methods must be a non-empty list")
        wanted = tuple(m.upper() for m in methods if isinstance(m, str))
        if len(wanted) != len(methods) or not set(wanted) <= {"GET", "POST"}:
            raise InvalidRequest("methods may only contain GET and POST")
        if vm is not None and not isinstance(vm, str):
            raise InvalidRequest("vm must be a VM name or null")
        targets = [info.name for info in self._vms] if vm is None else [self.vm(vm).name]
        views = []
        for name in targets:
            fault = Fault(
                kind=kind,
                vm=name,
                remaining=count,
                status=status,
                seconds=None if seconds is None else float(seconds),
                methods=wanted,
                field=field,
            )
            if kind == "refuse":
                # Not queued: the port stops accepting now, for `seconds` of real time.
                assert fault.seconds is not None
                self.record(
                    "fault", vm=name, method=None, path=None, fault="refuse", status=None,
                    seconds=fault.seconds, remaining=0,
                )
                if self._on_refuse is not None:
                    self._on_refuse(name, fault.seconds)
                views.append(replace(fault, remaining=0).view())
                continue
            self._faults[name].append(fault)
            views.append(fault.view())
        return views


def mutate_document(document: dict[str, Any], field: str) -> dict[str, Any]:
    """A copy of ``document`` with ``field`` of the wrong JSON type (for ``wrong_type`` faults).

    Event fields are changed in every event; a document without events is returned unchanged for
    them (the fault then serves a valid document).
    """
    served = copy.deepcopy(document)
    if field == "DocumentIncarnation":
        served["DocumentIncarnation"] = str(served.get("DocumentIncarnation"))
    elif field == "Events":
        served["Events"] = json.dumps(served.get("Events"))
    else:
        for number, event in enumerate(served.get("Events") or [], start=1):
            if not isinstance(event, dict):
                continue
            if field == "EventId":
                event["EventId"] = number
            elif field == "Resources":
                event["Resources"] = ",".join(str(r) for r in event.get("Resources") or [])
            elif field == "NotBefore":
                event["NotBefore"] = 1700000000
            elif field == "DurationInSeconds":
                event["DurationInSeconds"] = str(event.get("DurationInSeconds", -1))
    return served


def parse_replay(text: str, name: str = "replay file") -> tuple[str, list[Any]]:
    """Read a replay file: ``("documents", [doc, ...])`` or ``("timeline", [step, ...])``.

    A ``*.sequence.json`` list of documents, a single document (one object with
    ``DocumentIncarnation`` or ``Events``) or a timeline: a JSON or YAML list of ``{"at": S, ...}``.
    Raises ``InvalidRequest`` naming what is wrong.
    """
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidRequest(f"{name} is neither JSON nor YAML: {exc}") from None
    if isinstance(data, dict) and ("DocumentIncarnation" in data or "Events" in data):
        return "documents", [data]
    if not isinstance(data, list) or not data:
        raise InvalidRequest(f"{name} must hold a document, a list of documents or a list of timeline steps")
    if all(isinstance(item, dict) and "at" in item for item in data):
        _parse_steps(data)
        return "timeline", data
    if any(isinstance(item, dict) and "at" in item for item in data):
        raise InvalidRequest(f"{name} mixes timeline steps and documents")
    return "documents", data


def _parse_steps(steps: Any) -> list[tuple[int, float, str, Any]]:
    if isinstance(steps, str | bytes | Mapping) or not isinstance(steps, Sequence):
        raise InvalidRequest("a timeline is a list of steps")
    parsed = []
    for index, step in enumerate(steps):
        where = f"timeline step {index}"
        if not isinstance(step, dict):
            raise InvalidRequest(f"{where} must be an object")
        at = step.get("at")
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
            raise InvalidRequest(f"{where}: at must be a number of seconds >= 0")
        actions = [k for k in step if k != "at"]
        if len(actions) != 1 or actions[0] not in TIMELINE_ACTIONS:
            raise InvalidRequest(f"{where} needs exactly one action among {', '.join(TIMELINE_ACTIONS)}")
        action = actions[0]
        payload = step[action]
        if action == "cancel":
            named = isinstance(payload, dict) and isinstance(payload.get("event_id"), str)
            if not (isinstance(payload, str) or named):
                raise InvalidRequest(f"{where}: cancel takes an event id")
        else:
            if payload is None and action in _INCARNATION_FIELDS:
                payload = {}
            if not isinstance(payload, dict):
                raise InvalidRequest(f"{where}: {action} takes an object")
            allowed = {
                "schedule": SCHEDULE_FIELDS,
                "rollout": ROLLOUT_FIELDS,
                "fault": _FAULT_FIELDS,
                "impact": _IMPACT_FIELDS,
                "approve": _APPROVE_FIELDS,
                **_INCARNATION_FIELDS,
            }[action]
            unknown = sorted(set(payload) - allowed)
            if unknown:
                raise InvalidRequest(f"{where}: unknown field(s) {', '.join(unknown)} for {action}")
            if action in ("schedule", "rollout") and "event_type" not in payload:
                raise InvalidRequest(f"{where}: {action} needs event_type")
            if action == "schedule" and "resources" not in payload:
                raise InvalidRequest(f"{where}: schedule needs resources")
            if action == "fault" and "kind" not in payload:
                raise InvalidRequest(f"{where}: fault needs kind")
        parsed.append((index, float(at), action, payload))
    return parsed


def _to_model(event: _Event, render: Callable[[int], int]) -> ScheduledEvent:
    not_before = (
        datetime.fromtimestamp(render(event.not_before), UTC)
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
