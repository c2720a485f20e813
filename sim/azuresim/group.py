"""The simulated Scheduled Events service of one VM group: pure model, no sockets, no sleeps.

``SimulatedGroup`` holds the VMs of one coordinated group, the events of the group and an append-only
log. The group is made of one or more delivery units (``VmInfo.unit``: availability sets, scale-set
placement groups). Every VM sees every event of its unit (Azure delivers an event to all VMs of the
unit; each VM reads ``Resources`` to know whether it is hit), and no event of another unit; with the
group's ``delivery="named"``, or for events marked ``deliver_to_named_only``, a VM sees only the events
naming it (GPU VMs of a one-fault-domain scale set).

It is a facade over small collaborators, each in its own module: ``lifecycle`` (events, approvals,
rollouts, the incarnation), ``impacts`` (signals to the VMs' processes), ``faults``, ``service`` (each
VM's first call, idle reset and incarnation offset), ``replay`` (recorded documents and timelines),
``log``, and ``clock`` (simulated time; see there for time scales and NotBefore rendering). ``core``
builds them and holds what the operations share. Input is checked with the models of ``schema``;
Azure's constants live in ``catalogue``.

Every operation is thread-safe (one re-entrant lock, held around every collaborator call). Reads
(``document``, ``events``) first bring the lifecycle up to date with the clock, so a document never
shows a state the clock has already left, whether or not a ticker thread calls ``tick``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from azuresim.catalogue import SCHEDULED_EVENTS_API_VERSIONS, compute_metadata, placement_group_id
from azuresim.core import GroupCore
from azuresim.errors import InvalidRequest
from azuresim.events import imds_document, served_events
from azuresim.faults import Fault
from azuresim.schema import (
    FaultRequest,
    ImpactRequest,
    PidsRequest,
    ReplayRequest,
    ResetIncarnationRequest,
    RolloutRequest,
    ScheduleRequest,
    SkipIncarnationRequest,
    parse,
    parse_timeline,
)

__all__ = ["SimulatedGroup"]


class SimulatedGroup(GroupCore):
    """Scheduled Events of one VM group. See ``lifecycle`` for the rules an event follows, and
    ``GroupCore`` for the constructor's arguments.

    Raises ``InvalidRequest`` for malformed arguments, ``UnknownVm`` and ``UnknownEvent`` for names
    that do not exist. Every method takes the group's lock and first brings the model up to the clock.
    """

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
        status: str = "Scheduled",
        resource_type: str = "VirtualMachine",
        impact: str | None = None,
        impact_seconds: float | None = None,
        deliver_to_named_only: bool = False,
        not_before_at: float | None = None,
        unit: str | None = None,
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
        nobody, as hand-made documents do. The event belongs to the delivery unit of the VMs of the group
        it names; one naming none is of ``unit`` (a unit of the group), by default the default unit ``""``.
        Raises ``InvalidRequest`` for an event naming VMs of two units, or a ``unit`` that is not theirs.
        """
        request = parse(
            ScheduleRequest,
            {
                "event_type": event_type,
                "resources": resources,
                "not_before_in": not_before_in,
                "not_before_at": not_before_at,
                "duration_in_seconds": duration_in_seconds,
                "started_for": started_for,
                "description": description,
                "source": source,
                "event_id": event_id,
                "status": status,
                "resource_type": resource_type,
                "impact": impact,
                "impact_seconds": impact_seconds,
                "deliver_to_named_only": deliver_to_named_only,
                "unit": unit,
            },
        )
        with self._lock:
            self._advance()
            return self._lifecycle.create(request).view(self._time.served_not_before)

    def cancel(self, event_id: str) -> dict[str, Any]:
        """Remove an event at once, whatever its status; returns its last view.

        On a Scheduled event this is a cancellation; on a Started one it ends the event early.
        Raises ``UnknownEvent``.
        """
        with self._lock:
            self._advance()
            return self._lifecycle.cancel(event_id).view(self._time.served_not_before)

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

    def approve_from_outside(self, event_ids: Sequence[str]) -> dict[str, str]:
        """Approve events through the Maintenance resource provider (``acknowledge``): the same approval as
        one through any VM's IMDS, logged as by ``maintenance-api``; results as ``approve``'s, by the ids as
        given (matched case-insensitively: ARM's are GUIDs)."""
        with self._lock:
            self._advance()
            current = {event_id.upper(): event_id for event_id in self._lifecycle.events}
            spelled = {event_id: current.get(event_id.upper(), event_id) for event_id in event_ids}
            results = self._approve("maintenance-api", list(spelled.values()))
            self._advance()
            return {event_id: results[spelled[event_id]] for event_id in event_ids}

    def reject_approval(self, vm: str, reason: str, status: int = 400) -> None:
        """Log an approval request that never reached ``approve`` (malformed body)."""
        self.record("approval", vm=vm, event_ids=[], accepted=[], results={}, status=status, error=reason)

    def impact(self, event_id: str, seconds: float | None = None, pause: bool = False) -> dict[str, Any]:
        """A second impact while ``event_id`` is Started: logged; the event stays Started.

        With ``pause`` the registered PIDs of the named VMs are paused again for ``seconds`` (default:
        the event's freeze length). Raises ``UnknownEvent``, and ``InvalidRequest`` if the event is
        not Started. Returns the ``impact`` log entry.
        """
        request = parse(ImpactRequest, {"seconds": seconds, "pause": pause})
        with self._lock:
            self._advance()
            return self._lifecycle.second_impact(event_id, request.seconds, request.pause)

    def rollout(
        self, event_type: str, groups: Sequence[Sequence[str]] | None = None, gap: float = 0.0, **fields: Any
    ) -> dict[str, Any]:
        """Back-to-back events: one per group of VMs, each created once the previous one is removed.

        ``groups`` defaults to the group's VMs by fault domain (lowest domain first); ``gap`` is the
        time between the removal of one event and the creation of the next. ``fields`` are those of
        ``schedule`` except ``resources``, ``event_id`` and ``not_before_at``; ``not_before_in`` is
        counted from each event's creation. Returns the rollout's view with the first event.

        In a group of several delivery units the default groups are per unit and fault domain; a group
        naming VMs of two units is refused (``InvalidRequest``), as its event would be.
        """
        request = parse(RolloutRequest, {**fields, "event_type": event_type, "groups": groups, "gap": gap})
        with self._lock:
            self._advance()
            return self._lifecycle.start_rollout(request)

    def rollouts(self) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            return self._lifecycle.rollouts()

    def tick(self) -> list[dict[str, Any]]:
        """Advance the lifecycle to the clock's present; returns the transitions it logged."""
        with self._lock:
            since = self._log.last_seq
            self._advance()
            return self._log.entries(since, "transition")

    def events(self) -> dict[str, Any]:
        """Current events with their internal state, the incarnation and the simulated time."""
        with self._lock:
            self._advance()
            return {
                "incarnation": self._lifecycle.incarnation,
                "approval_delay": self._options.approval_delay,
                "now": self._time.now(),
                "events": [e.view(self._time.served_not_before) for e in self._lifecycle.events.values()],
            }

    def event(self, event_id: str) -> dict[str, Any]:
        """The internal view of one current event; raises ``UnknownEvent``."""
        with self._lock:
            self._advance()
            return self._lifecycle.get(event_id).view(self._time.served_not_before)

    def document(self, vm: str, api_version: str | None = None) -> dict[str, Any]:
        """The Scheduled Events document IMDS would serve to ``vm`` with ``api_version``.

        ``None`` means the newest version. Fields and event types that the api-version predates are
        absent (not null); with 2017-03-01 resource names carry the leading underscore that
        2017-08-01 dropped. Events of another delivery unit are left out, and so are events not naming
        ``vm`` when the group delivers to the named VMs only (``delivery="named"``) or the event is
        ``deliver_to_named_only``.
        While replaying, the recorded document is served as it is, whatever the api-version. Raises
        ``UnknownVm``, and ``InvalidRequest`` for an unknown api-version.
        """
        info = self.vm(vm)
        if api_version is not None and api_version not in SCHEDULED_EVENTS_API_VERSIONS:
            raise InvalidRequest(f"unknown api-version {api_version!r}")
        with self._lock:
            self._advance()
            if self._replay.active:
                return self._replay.served()
            incarnation = self._services.served(info.name, self._lifecycle.incarnation)
            events = served_events(
                self._lifecycle.events.values(), info, api_version, self._time.served_not_before,
                delivery=self._options.delivery,
            )
        return imds_document(incarnation, events, api_version)

    def compute(self, vm: str) -> dict[str, Any]:
        """The ``/metadata/instance/compute`` answer for ``vm`` (numbers as strings, as IMDS has them)."""
        return compute_metadata(self.vm(vm))

    def layout(self) -> dict[str, Any]:
        """The group's VMs and delivery units: ``{"delivery", "vms": [...], "units": {UNIT: [VM, ...]}}``.

        Each VM is ``{"name", "unit", "scale_set_name", "placement_group_id", "fault_domain",
        "update_domain", "zone"}`` (``placement_group_id`` as its compute metadata serves it); ``units``
        lists the VMs of each unit in the group's order, each unit as its first VM spells it.
        """
        units: dict[str, list[str]] = {}
        spelled: dict[str, str] = {}
        for info in self._vms:
            key = spelled.setdefault(info.unit.lower(), info.unit)
            units.setdefault(key, []).append(info.name)
        return {
            "delivery": self._options.delivery,
            "vms": [
                {
                    "name": info.name,
                    "unit": info.unit,
                    "scale_set_name": info.scale_set_name,
                    "placement_group_id": placement_group_id(info),
                    "fault_domain": info.fault_domain,
                    "update_domain": info.update_domain,
                    "zone": info.zone,
                }
                for info in self._vms
            ],
            "units": units,
        }

    # -- the service of each VM: first call, idle reset, incarnation offsets -------------------

    def begin_request(self, vm: str) -> float:
        """Note a Scheduled Events request of ``vm``; return how long (simulated s) to hold its answer.

        See ``service``: the first request, and the first after an idle reset, is held
        ``first_call_delay``; an idle reset also restarts the VM's DocumentIncarnation from 1.
        """
        name = self.vm(vm).name
        with self._lock:
            self._advance()
            return self._services.begin_request(
                name, self._time.now(), self._lifecycle.incarnation, self._replay.active
            )

    def skip_incarnation(self, vm: str | None = None, by: int = 1) -> list[dict[str, Any]]:
        """Raise the DocumentIncarnation ``vm`` (None: every VM) is served by ``by``, events unchanged.

        What a VM sees when it missed documents (down while Started). Returns the log entries.
        """
        request = parse(SkipIncarnationRequest, {"vm": vm, "by": by})
        with self._lock:
            self._advance()
            return self._shift_incarnation(request.vm, request.by)

    def reset_incarnation(self, vm: str | None = None) -> list[dict[str, Any]]:
        """Serve ``vm`` (None: every VM) a DocumentIncarnation that starts again from 1."""
        request = parse(ResetIncarnationRequest, {"vm": vm})
        with self._lock:
            self._advance()
            return self._shift_incarnation(request.vm, None)

    def served_incarnation(self, vm: str) -> int:
        name = self.vm(vm).name
        with self._lock:
            self._advance()
            return self._services.served(name, self._lifecycle.incarnation)

    # -- PIDs and impacts ----------------------------------------------------------------------

    def register_pids(self, vm: str, pids: Sequence[int]) -> dict[str, Any]:
        """Set the PIDs that stand for ``vm`` (replacing earlier ones); returns ``{"vm", "pids"}``.

        Impacts signal these PIDs only. PIDs must be integers > 1 and not the simulator's own.
        """
        name = self.vm(vm).name
        request = parse(PidsRequest, {"pids": pids})
        with self._lock:
            self._advance()
            return {"vm": name, "pids": self._impacts.register(name, request.pids)}

    def pids(self, vm: str) -> list[int]:
        name = self.vm(vm).name
        with self._lock:
            return self._impacts.pids(name)

    def paused(self) -> dict[int, dict[str, Any]]:
        """PIDs paused by an impact: ``{pid: {"vm", "until", "event_id"}}`` (simulated time)."""
        with self._lock:
            return self._impacts.paused()

    def release_paused(self) -> int:
        """Continue (``SIGCONT``) every PID an impact paused; returns how many. Used at shutdown."""
        with self._lock:
            return self._impacts.release_all()

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
        **served: Any,
    ) -> list[dict[str, Any]]:
        """Queue a fault (see ``faults`` for the kinds) on the Scheduled Events endpoint of ``vm``, or of every VM.

        With ``vm=None`` each VM gets its own copy, served ``count`` times to that VM. ``count`` None
        serves the fault until ``clear_faults``. Faults queue behind earlier ones, per VM. ``refuse``
        is not queued but carried out at once by the refuse handler. ``served`` holds the fields of a
        ``body`` fault (``body`` in base64, ``repeat``, ``content_type``, ``headers``, ``content_length``).
        Returns the views of the faults.
        """
        request = parse(
            FaultRequest,
            {"kind": kind, "vm": vm, "count": count, "status": status, "seconds": seconds, "methods": methods,
             "field": field, **served},
        )
        with self._lock:
            self._advance()
            return self._add_fault(request)

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return self._faults.views()

    def clear_faults(self, vm: str | None = None) -> int:
        """Drop queued faults of ``vm`` (or all VMs); returns how many were dropped."""
        with self._lock:
            return self._faults.clear(self._targets(vm))

    def take_fault(self, vm: str, method: str, path: str = "/metadata/scheduledevents") -> Fault | None:
        """The fault to serve now for this request, if any; consumes one use and logs it."""
        name = self.vm(vm).name
        with self._lock:
            return self._faults.take(name, method, path)

    # -- replay --------------------------------------------------------------------------------

    def load_documents(self, documents: Sequence[Any], interval: float = 0.0) -> dict[str, Any]:
        """Serve recorded documents, verbatim, instead of the model; returns the replay's view.

        Every VM is served ``documents[i]``; ``replay_next`` moves to the next one, and so does the
        clock every ``interval`` seconds if it is > 0. The last document stays served. Approvals
        are still checked against the served document and logged. Events, rollouts and incarnation
        shifts are refused while replaying.
        """
        request = parse(ReplayRequest, {"documents": documents, "interval": interval})
        assert request.documents is not None
        with self._lock:
            self._advance()
            if self._lifecycle.events:
                raise InvalidRequest("cannot replay documents while the model has events")
            return self._replay.load(request.documents, request.interval, self._time.now())

    def replay_next(self) -> dict[str, Any]:
        """Serve the next recorded document (no change at the last); returns the replay's view."""
        with self._lock:
            self._advance()
            return self._replay.next(self._time.now())

    def replay(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return self._replay.view()

    def load_timeline(self, steps: Sequence[Any]) -> int:
        """Run control operations at given times: ``[{"at": S, ACTION: ARGS}, ...]``.

        ``at`` is in seconds from now; ACTION is one of ``TIMELINE_ACTIONS`` with the arguments of
        the method of that name (``cancel`` takes an event id). Steps are checked here, run when due,
        and logged (``timeline``); a step that fails is logged with its error and the rest go on.
        Returns how many steps are pending.
        """
        parsed = parse_timeline(steps)
        with self._lock:
            self._advance()
            pending = self._timeline.load(parsed, self._time.now())
            self._log.record("timeline", action="loaded", steps=len(parsed))
            return pending
