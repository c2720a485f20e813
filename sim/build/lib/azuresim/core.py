"""The state of a simulated group and the operations its public methods share.

``GroupCore`` builds the collaborators (see ``group`` for the list), holds the lock and the VMs, and
brings the model up to the clock's present (``_advance``), running due timeline steps on the way. Its
``_`` methods expect the lock to be held. ``SimulatedGroup`` adds the public operations.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from azuresim.catalogue import MINIMUM_NOTICE, Delivery, VmInfo
from azuresim.clock import Clock, SimTime
from azuresim.errors import InvalidRequest, SimulatorError, UnknownVm
from azuresim.faults import Faults, RefuseHandler
from azuresim.impacts import Impacts, SignalSender
from azuresim.lifecycle import Lifecycle
from azuresim.log import Log
from azuresim.replay import Replay, Timeline
from azuresim.schema import (
    ApproveRequest,
    CancelRequest,
    FaultRequest,
    GroupOptions,
    ResetIncarnationRequest,
    RolloutRequest,
    ScheduleRequest,
    SkipIncarnationRequest,
    TimelineImpact,
    TimelineStep,
    parse,
)
from azuresim.service import Services

__all__ = ["GroupCore"]


class GroupCore:
    """The VMs, options, clocks, lock and collaborators of one group.

    Raises ``InvalidRequest`` for malformed arguments. ``on_record`` is called with every log entry
    as it is appended, under the group's lock: it must not block or call back into the group.
    ``signal_sender(pid, signum)`` (default ``os.kill``) is the only way the group touches processes,
    and only for PIDs registered with ``register_pids``.

    Delivery units come with the VMs (``VmInfo.unit``); ``delivery`` says who sees an event (``Delivery``):
    ``unit``, every VM of its unit, or ``named``, only the VMs it names (GPU VMs of a one-fault-domain
    scale set).

    Clocks: ``clock`` gives simulated epoch seconds; ``wall_clock`` the ``t`` of log entries (default:
    ``clock`` when one is given, else the wall clock). Without ``clock``, a ``time_scale`` other than 1
    builds a ``ScaledClock`` starting at the wall clock's present. Every duration is in simulated seconds.
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
        delivery: str = "unit",
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
            if not isinstance(info.unit, str) or not info.unit.isprintable():
                raise InvalidRequest(f"invalid delivery unit {info.unit!r} of VM {info.name!r}")
            key = info.name.lower()
            if key in by_key:
                raise InvalidRequest(f"VM {info.name!r} is listed twice")
            by_key[key] = info
        options = parse(
            GroupOptions,
            {
                "time_scale": time_scale,
                "approval_delay": approval_delay,
                "started_for": started_for,
                "unknown_approval_status": unknown_approval_status,
                "terminate_notice": terminate_notice,
                "first_call_delay": first_call_delay,
                "idle_reset_after": idle_reset_after,
                "not_before_clock": not_before_clock,
                "delivery": delivery,
            },
        )
        names = [info.name for info in infos]
        self._vms = infos
        self._by_key = by_key
        self._options = options
        self._lock = threading.RLock()
        self._time = SimTime(clock, wall_clock, options.time_scale, options.not_before_clock)
        self._log = Log(self._time, on_record)
        self._impacts = Impacts(names, signal_sender, self._log, self._time)
        self._faults = Faults(names, self._log)
        self._services = Services(
            names, self._log, first_call_delay=options.first_call_delay, idle_reset_after=options.idle_reset_after
        )
        self._replay = Replay(self._log)
        self._timeline = Timeline()
        self._lifecycle = Lifecycle(
            infos,
            self._time,
            self._log,
            self._impacts,
            self._replay,
            approval_delay=options.approval_delay,
            started_for=options.started_for,
            terminate_notice=options.terminate_notice,
        )

    # -- group ---------------------------------------------------------------------------------

    @property
    def vms(self) -> tuple[VmInfo, ...]:
        return self._vms

    @property
    def approval_delay(self) -> float:
        return self._options.approval_delay

    @property
    def started_for(self) -> float:
        return self._options.started_for

    @property
    def time_scale(self) -> float:
        return self._options.time_scale

    @property
    def terminate_notice(self) -> float:
        return self._options.terminate_notice

    @property
    def delivery(self) -> Delivery:
        """Who sees an event: every VM of its unit (``unit``), or the VMs it names only (``named``)."""
        return self._options.delivery

    @property
    def incarnation(self) -> int:
        with self._lock:
            return self._lifecycle.incarnation

    def now(self) -> float:
        """The simulated clock's present (epoch seconds)."""
        return self._time.now()

    def real_seconds(self, simulated: float) -> float:
        """How many real seconds ``simulated`` seconds of the model last."""
        return self._time.real_seconds(simulated)

    def served_not_before(self, not_before: int) -> int:
        """The NotBefore (epoch seconds) served for a simulated ``not_before`` (see ``SimTime``)."""
        return self._time.served_not_before(not_before)

    def vm(self, name: str) -> VmInfo:
        """The VM called ``name`` (case-insensitive); raises ``UnknownVm``."""
        info = self._by_key.get(name.lower()) if isinstance(name, str) else None
        if info is None:
            raise UnknownVm(f"no VM {name!r} in the group")
        return info

    def set_refuse_handler(self, handler: RefuseHandler | None) -> None:
        """Who carries out ``refuse`` faults (the server closes the VM's listening socket).

        Called under the group's lock with ``(vm, real_seconds)``: it must not block.
        """
        with self._lock:
            self._faults.on_refuse = handler

    def set_platform_policy(self, approves: Callable[[str, Sequence[tuple[str, str]]], bool] | None) -> None:
        """Who says whether ``scheduledEventsPolicy`` approves a user-initiated Reboot or Redeploy at once:
        ``approves(event_type, [(vm, scale set name or "")])`` (the server hands its ``AzureModel``'s), called
        under the group's lock; such an event is then created Started (``Lifecycle``)."""
        with self._lock:
            self._lifecycle.auto_approved = None if approves is None else (
                lambda event_type, infos: approves(event_type, [(i.name, i.scale_set_name) for i in infos]))

    def approval_status(self, results: Mapping[str, str]) -> int:
        """The HTTP status IMDS answers for an approval with these per-id results.

        What IMDS answers for an unknown or expired id is not documented; the group's
        ``unknown_approval_status`` decides (200 by default).
        """
        if any(r == "unknown" for r in results.values()):
            return self._options.unknown_approval_status
        return 200

    # -- log -----------------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append ``{"seq", "t", "sim_t", "kind", **fields}``: wall-clock and simulated epoch seconds."""
        with self._lock:
            return self._log.record(kind, **fields)

    def log(self, since: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Entries with ``seq > since``, oldest first, optionally of one kind only."""
        with self._lock:
            return self._log.entries(since, kind)

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._log.last_seq

    # -- internals (the lock is held) ----------------------------------------------------------

    def _advance(self) -> None:
        """Bring the model to the clock's present: due timeline steps, replay, impacts over (resumed PIDs,
        VMs back), then starts and removals (an event leaves the document only once its impact is over)."""
        with self._time.frozen() as now:
            self._run_timeline(now)
            self._replay.advance(now)
            self._impacts.resume_due(now)
            self._lifecycle.advance(now)

    def _targets(self, vm: str | None) -> list[str]:
        return [info.name for info in self._vms] if vm is None else [self.vm(vm).name]

    def _approve(self, vm: str, event_ids: Sequence[str]) -> dict[str, str]:
        # A recording is what IMDS served, not a model: approvals are matched against it and change nothing.
        results = self._replay.approve(event_ids) if self._replay.active else self._lifecycle.approve(vm, event_ids)
        self._log.record(
            "approval",
            vm=vm,
            event_ids=list(event_ids),
            accepted=[i for i in event_ids if results[i] != "unknown"],
            results=results,
            status=self.approval_status(results),
        )
        return results

    def _add_fault(self, request: FaultRequest) -> list[dict[str, Any]]:
        return self._faults.add(request, self._targets(request.vm))

    def _shift_incarnation(self, vm: str | None, by: int | None) -> list[dict[str, Any]]:
        self._replay.refuse_if_active()
        return self._services.shift(self._targets(vm), by, self._lifecycle.incarnation)

    def _run_timeline(self, now: float) -> None:
        while (pending := self._timeline.pop_due(now)) is not None:
            action, _ = pending.step.action
            self._log.record("timeline", action=action, index=pending.index, at=pending.at)
            try:
                self._run_step(pending.step)
            except SimulatorError as exc:
                self._log.record("timeline", action=action, index=pending.index, at=pending.at, error=str(exc))

    def _run_step(self, step: TimelineStep) -> None:
        _, request = step.action
        match request:
            case ScheduleRequest():
                self._lifecycle.create(request)
            case CancelRequest():
                self._lifecycle.cancel(request.event_id)
            case ApproveRequest():
                self._approve(self.vm(request.vm).name, request.event_ids)
            case TimelineImpact():
                self._lifecycle.second_impact(request.event_id, request.seconds, request.pause)
            case FaultRequest():
                self._add_fault(request)
            case RolloutRequest():
                self._lifecycle.start_rollout(request)
            case SkipIncarnationRequest():
                self._shift_incarnation(request.vm, request.by)
            case ResetIncarnationRequest():
                self._shift_incarnation(request.vm, None)
