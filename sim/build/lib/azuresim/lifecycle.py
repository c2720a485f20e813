"""The event lifecycle: scheduling, approval, start, removal, and rollouts of back-to-back events.

Rules (see the Scheduled Events documentation):

* ``Scheduled -> Started`` when the event has been approved (by any VM of the group) and the group's
  ``approval_delay`` has elapsed since the first approval, or when ``NotBefore`` passes, whichever
  comes first. Approval only shortens the wait. Terminate batch rule: an approved Terminate waits while
  another Terminate of the group is Scheduled and unapproved (so deletes sharing a NotBefore start
  together once all are approved); NotBefore still wins.
* When an event starts, its impact hits the VMs it names (``Impacts``).
* ``Started -> removed`` once the event has been Started for its ``started_for`` seconds and its impact
  is over (the last pause has ended, the killed VMs are back): as on Azure, an event never leaves the
  document while the VMs it names are still frozen or down.
* ``cancel`` removes an event at once (a Scheduled event vanishing without ever starting).
* Hardware failure: an event may be created directly as ``Started``.
* A user-initiated Reboot or Redeploy (``EventSource: User``) of a VM whose ``scheduledEventsPolicy``
  approves it automatically (``userInitiatedReboot`` / ``userInitiatedRedeploy``: the VM's own, its
  availability set's or its scale set's, as the simulated ARM holds them; ``auto_approved``) is created
  ``Started``: it has no Scheduled phase, and no time to drain.
* Delivery units: an event belongs to the unit of the VMs of the group it names (see ``unit_of``); one
  naming VMs of two units is refused, since Azure names several VMs in one event only for one atomic
  operation, and that is inside one availability set or placement group.

``DocumentIncarnation`` starts at 1 and grows by one on every change of the Events array: creation,
status change, removal. Each transition is its own change, so two events starting in the same tick
raise it by two.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from azuresim.catalogue import DEFAULT_IMPACT, SCHEDULED, STARTED, VmInfo, default_description, notice
from azuresim.clock import SimTime
from azuresim.errors import InvalidRequest, SimulatorError, UnknownEvent
from azuresim.events import Event, Rollout
from azuresim.impacts import Impacts
from azuresim.log import Log
from azuresim.replay import Replay
from azuresim.schema import RolloutRequest, ScheduleRequest

__all__ = ["Lifecycle"]


class Lifecycle:
    """The current events of the group, its rollouts and its DocumentIncarnation.

    Not locked: callers hold the group's lock. Creating events and rollouts is refused while
    ``replay`` serves recorded documents. Transitions are logged (``transition``), and so are holds of
    the Terminate batch rule (``hold``).
    """

    def __init__(
        self,
        vms: Sequence[VmInfo],
        time: SimTime,
        log: Log,
        impacts: Impacts,
        replay: Replay,
        *,
        approval_delay: float,
        started_for: float,
        terminate_notice: float,
    ) -> None:
        self._vms = tuple(vms)
        self._by_key = {info.name.lower(): info for info in self._vms}
        #: The group's units, lower-cased, each as its first VM spells it.
        self._units: dict[str, str] = {}
        for info in self._vms:
            self._units.setdefault(info.unit.lower(), info.unit)
        self._time = time
        self._log = log
        self._impacts = impacts
        self._replay = replay
        self._approval_delay = approval_delay
        self._started_for = started_for
        self._terminate_notice = terminate_notice
        self.events: dict[str, Event] = {}
        self.incarnation = 1
        self._rollouts: dict[int, Rollout] = {}
        # Whether the platform policy approves a user event of this type naming these VMs at once (None:
        # no simulated ARM holds a policy); set by the simulator's server from its ``AzureModel``.
        self.auto_approved: Callable[[str, Sequence[VmInfo]], bool] | None = None

    def get(self, event_id: object) -> Event:
        """The current event ``event_id``; raises ``UnknownEvent``."""
        event = self.events.get(event_id) if isinstance(event_id, str) else None
        if event is None:
            raise UnknownEvent(f"no current event {event_id!r}")
        return event

    def unit_of(self, resources: Sequence[str], unit: str | None = None) -> str:
        """The delivery unit of an event naming ``resources``, as the group's first VM of that unit spells it.

        The unit of the VMs of the group it names (the first one decides, and every other one must be of
        it); for an event naming no VM of the group (hand-made documents name VMs outside it, or nobody),
        ``unit`` if given, else the default unit ``""``. ``unit``, if given, must be a unit of the group and
        that of the VMs named. Raises ``InvalidRequest`` otherwise.
        """
        first: VmInfo | None = None
        for name in resources:
            info = self._by_key.get(name.lower())
            if info is None:
                continue
            if first is None:
                first = info
            elif info.unit.lower() != first.unit.lower():
                raise InvalidRequest(
                    f"the event names VMs of two delivery units ({first.name} of {_unit_text(first.unit)}, "
                    f"{info.name} of {_unit_text(info.unit)}): Azure names several VMs in one event only for "
                    "one atomic operation, inside one availability set or placement group; schedule one event "
                    "per unit"
                )
        if unit is not None:
            known = self._units.get(unit.lower())
            if known is None:
                units = ", ".join(repr(u) for u in self._units.values())
                raise InvalidRequest(f"unit {unit!r} is not a delivery unit of the group (its units: {units})")
            if first is not None and first.unit.lower() != known.lower():
                raise InvalidRequest(
                    f"unit {unit!r} is not the unit of {first.name} ({_unit_text(first.unit)}), which the event names"
                )
            return known
        return self._units[first.unit.lower()] if first is not None else ""

    def create(self, request: ScheduleRequest, rollout: int | None = None) -> Event:
        """Create the event ``request`` describes, completing it with the defaults of its type.

        Raises ``InvalidRequest`` if its id is taken, if it names VMs of two delivery units (``unit_of``),
        or while replaying.
        """
        self._replay.refuse_if_active()
        event_id = request.event_id if request.event_id is not None else str(uuid.uuid4()).upper()
        if event_id in self.events:
            raise InvalidRequest(f"event {event_id} already exists")
        unit = self.unit_of(request.resources, request.unit)
        now = self._time.now()
        not_before: int | None = None
        started_at: float | None = None
        status = request.status
        why = "scheduled"
        if status == SCHEDULED and self._auto_approved(request):
            status, why = STARTED, "scheduled: approved at once by the platform's scheduledEventsPolicy"
        if status == STARTED:
            started_at = now
        else:
            if request.not_before_at is not None:
                when = request.not_before_at
            else:
                wait = request.not_before_in
                when = now + (notice(request.event_type, self._terminate_notice) if wait is None else wait)
            # NotBefore has a resolution of one second; round up so the event never starts before
            # the time it announces.
            not_before = math.ceil(when)
        event = Event(
            event_id=event_id,
            event_type=request.event_type,
            resources=tuple(request.resources),
            resource_type=request.resource_type,
            description=(
                request.description
                if request.description is not None
                else default_description(request.event_type, request.source)
            ),
            source=request.source,
            duration_in_seconds=request.duration_in_seconds,
            started_for=(
                request.started_for
                if request.started_for is not None
                else max(float(request.duration_in_seconds or 0), self._started_for)
            ),
            created_at=now,
            status=status,
            not_before=not_before,
            started_at=started_at,
            impact=request.impact if request.impact is not None else DEFAULT_IMPACT.get(request.event_type, "none"),
            impact_seconds=request.impact_seconds,
            deliver_to_named_only=request.deliver_to_named_only,
            unit=unit,
            rollout=rollout,
        )
        self.events[event_id] = event
        self._transition(event, None, event.status, why)
        if event.status == STARTED:
            self._hit(event, now)
        return event

    def _auto_approved(self, request: ScheduleRequest) -> bool:
        """Whether the platform approves this user event at once (``scheduledEventsPolicy``)."""
        if self.auto_approved is None or request.source != "User" or request.event_type not in ("Reboot", "Redeploy"):
            return False
        named = [self._by_key[name.lower()] for name in request.resources if name.lower() in self._by_key]
        return bool(named) and self.auto_approved(request.event_type, named)

    def cancel(self, event_id: object) -> Event:
        """Remove an event at once, whatever its status; returns it. Raises ``UnknownEvent``."""
        event = self.get(event_id)
        self._remove(event, "cancelled")
        return event

    def approve(self, vm: str, event_ids: Sequence[str]) -> dict[str, str]:
        """Approve on behalf of ``vm``: per id, ``approved``, ``already_approved``, ``already_started``, ``unknown``."""
        now = self._time.now()
        results: dict[str, str] = {}
        for event_id in event_ids:
            event = self.events.get(event_id)
            if event is None:
                results[event_id] = "unknown"
                continue
            if vm not in event.approved_by:
                event.approved_by.append(vm)
            if event.status == STARTED:
                results[event_id] = "already_started"
            elif event.approved_at is None:
                event.approved_at = now
                results[event_id] = "approved"
            else:
                results[event_id] = "already_approved"
        return results

    def second_impact(self, event_id: object, seconds: float | None, pause: bool) -> dict[str, Any]:
        """A further impact of a Started event (see ``Impacts.second``); raises ``InvalidRequest`` otherwise."""
        event = self.get(event_id)
        if event.status != STARTED:
            raise InvalidRequest("a second impact needs a Started event")
        entry = self._impacts.second(event, self._named_vms(event), seconds, pause)
        if pause and entry["seconds"] > 0:
            until = self._time.now() + entry["seconds"]
            event.impact_until = until if event.impact_until is None else max(event.impact_until, until)
        return entry

    def start_rollout(self, request: RolloutRequest) -> dict[str, Any]:
        """Start a rollout and create its first event; returns the rollout's view with that event.

        Without ``groups``: one group per delivery unit and fault domain (units in the order of the group's
        VMs, lowest fault domain first in each), since each unit has fault domains of its own. Raises
        ``InvalidRequest`` if a group names VMs of two units (an event of it would be refused).
        """
        self._replay.refuse_if_active()
        if request.groups is not None:
            groups = [list(g) for g in request.groups]
            for index, group in enumerate(groups):
                try:
                    self.unit_of(group)
                except InvalidRequest as exc:
                    raise InvalidRequest(f"groups[{index}]: {exc}") from None
        else:
            groups = []
            for unit in self._units:
                members = [info for info in self._vms if info.unit.lower() == unit]
                for domain in sorted({info.fault_domain for info in members}):
                    groups.append([info.name for info in members if info.fault_domain == domain])
        rollout = Rollout(rollout_id=len(self._rollouts) + 1, request=request, groups=groups)
        self._rollouts[rollout.rollout_id] = rollout
        event = self._next_rollout_event(rollout)
        view = rollout.view()
        view["event"] = event.view(self._time.served_not_before) if event is not None else None
        return view

    def rollouts(self) -> list[dict[str, Any]]:
        return [r.view() for r in self._rollouts.values()]

    def advance(self, now: float) -> None:
        """Start, remove and create what is due at ``now``."""
        for event in list(self.events.values()):
            if event.event_id not in self.events:
                continue
            if event.status == SCHEDULED:
                reason = self._start_reason(event, now)
                if reason is None:
                    continue
                event.status = STARTED
                event.started_at = now
                self._transition(event, SCHEDULED, STARTED, reason)
                self._hit(event, now)
            elif (event.started_at is not None and event.started_at + event.started_for <= now
                  and (event.impact_until is None or event.impact_until <= now)):
                self._remove(event, "started_for_elapsed")
        for rollout in self._rollouts.values():
            if rollout.next_at is not None and rollout.next_at <= now:
                rollout.next_at = None
                rollout.step += 1
                self._next_rollout_event(rollout)

    def _hit(self, event: Event, now: float) -> None:
        length = event.impact_length
        if length > 0:
            event.impact_until = now + length
        self._impacts.hit(event, self._named_vms(event), "started")

    def _named_vms(self, event: Event) -> list[str]:
        return [info.name for info in self._vms if event.names(info.name)]

    def _remove(self, event: Event, reason: str) -> None:
        del self.events[event.event_id]
        self._transition(event, event.status, None, reason)
        if event.rollout is not None:
            rollout = self._rollouts[event.rollout]
            rollout.event_id = None
            if rollout.step + 1 < len(rollout.groups):
                rollout.next_at = self._time.now() + rollout.request.gap

    def _start_reason(self, event: Event, now: float) -> str | None:
        release = event.approved_at + self._approval_delay if event.approved_at is not None else None
        if release is not None and release <= now and (event.not_before is None or release <= event.not_before):
            blockers = self._terminate_blockers(event, now)
            if not blockers:
                # A held delete released because NotBefore came is a start at NotBefore.
                held_until_not_before = event.held_by and event.not_before is not None and event.not_before <= now
                return "not_before" if held_until_not_before else "approved"
            if blockers != event.held_by:
                event.held_by = blockers
                self._log.record(
                    "hold",
                    event_id=event.event_id,
                    event_type=event.event_type,
                    held_by=list(blockers),
                    rule="terminate_pending",
                )
        if event.not_before is not None and event.not_before <= now:
            return "not_before"
        return None

    def _terminate_blockers(self, event: Event, now: float) -> tuple[str, ...]:
        """Other Terminate events still Scheduled and unapproved: they hold an approved Terminate back."""
        if event.event_type != "Terminate":
            return ()
        return tuple(
            other.event_id
            for other in self.events.values()
            if other is not event
            and other.event_type == "Terminate"
            and other.status == SCHEDULED
            and other.approved_at is None
            and (other.not_before is None or other.not_before > now)
        )

    def _next_rollout_event(self, rollout: Rollout) -> Event | None:
        try:
            event = self.create(rollout.request.step(rollout.groups[rollout.step]), rollout=rollout.rollout_id)
        except SimulatorError as exc:
            self._log.record("timeline", action="rollout", rollout=rollout.rollout_id, error=str(exc))
            return None
        rollout.event_id = event.event_id
        return event

    def _transition(self, event: Event, before: str | None, after: str | None, reason: str) -> None:
        self.incarnation += 1
        self._log.record(
            "transition",
            event_id=event.event_id,
            event_type=event.event_type,
            resources=list(event.resources),
            **{"from": before, "to": after},
            reason=reason,
            incarnation=self.incarnation,
            not_before=event.not_before,
            source=event.source,
        )


def _unit_text(unit: str) -> str:
    return f"unit {unit!r}" if unit else "the default unit"
