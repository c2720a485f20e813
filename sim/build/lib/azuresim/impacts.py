"""What a starting event does to the processes that stand for the VMs it names.

A freeze pauses them (``SIGSTOP``, then ``SIGCONT`` once the impact's seconds have passed); a
reboot-like impact kills them (``SIGKILL``) and, when it has a length, the VM is back once that length
has passed: a ``back`` log entry says so, for whoever restarts the VM's processes. Only PIDs registered
for a VM are ever signalled, and a
killed or vanished PID is forgotten so that a reused number is never signalled. Every signal is logged.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from azuresim.clock import SimTime
from azuresim.events import Event
from azuresim.log import Log

__all__ = ["Impacts", "SignalSender"]

#: ``(pid, signum)``: how the group signals a process (``os.kill`` outside tests).
SignalSender = Callable[[int, int], None]


class Impacts:
    """The registered PIDs of each VM and the ones an impact paused. Not locked: callers hold the group's lock."""

    def __init__(self, vms: Iterable[str], signal_sender: SignalSender, log: Log, time: SimTime) -> None:
        self._signal_sender = signal_sender
        self._log = log
        self._time = time
        self._pids: dict[str, list[int]] = {vm: [] for vm in vms}
        self._paused: dict[int, tuple[float, str, str | None]] = {}  # pid -> (resume at, vm, event id)
        self._down: dict[str, tuple[float, str]] = {}  # vm -> (back at, event id), after a kill

    def register(self, vm: str, pids: Sequence[int]) -> list[int]:
        """Set the PIDs of ``vm`` (checked by the caller), without repeats; returns them."""
        unique = list(dict.fromkeys(pids))
        self._pids[vm] = unique
        self._log.record("pids", vm=vm, pids=list(unique))
        return list(unique)

    def pids(self, vm: str) -> list[int]:
        return list(self._pids[vm])

    def down(self) -> dict[str, dict[str, Any]]:
        """``{vm: {"until", "event_id"}}``: VMs a kill impact took down and that are not back yet (simulated time)."""
        return {vm: {"until": until, "event_id": eid} for vm, (until, eid) in self._down.items()}

    def paused(self) -> dict[int, dict[str, Any]]:
        """``{pid: {"vm", "until", "event_id"}}`` (simulated time)."""
        return {pid: {"vm": vm, "until": until, "event_id": eid} for pid, (until, vm, eid) in self._paused.items()}

    def release_all(self) -> int:
        """Continue every paused PID now; returns how many."""
        count = 0
        for pid, (_, vm, event_id) in list(self._paused.items()):
            del self._paused[pid]
            self._signal(vm, pid, signal.SIGCONT, event_id, "shutdown")
            count += 1
        return count

    def resume_due(self, now: float) -> None:
        """Continue the PIDs whose pause is over."""
        for pid, (until, vm, event_id) in list(self._paused.items()):
            if until <= now:
                del self._paused[pid]
                self._signal(vm, pid, signal.SIGCONT, event_id, "impact_over")
        for vm, (until, event_id) in list(self._down.items()):
            if until <= now:
                del self._down[vm]
                self._log.record("back", vm=vm, event_id=event_id)

    def hit(self, event: Event, vms: Sequence[str], reason: str) -> None:
        """Carry out ``event``'s impact on ``vms`` (the group's VMs it names) and log it."""
        seconds = event.impact_length if event.impact in ("freeze", "kill") else None
        self._log.record(
            "impact",
            event_id=event.event_id,
            event_type=event.event_type,
            impact=event.impact,
            seconds=seconds,
            vms=list(vms),
            reason=reason,
        )
        for vm in vms:
            if event.impact == "freeze" and seconds:
                self._pause(vm, seconds, event.event_id)
            elif event.impact == "kill":
                self._kill(vm, event.event_id)
                if seconds:
                    self._down[vm] = (self._time.now() + seconds, event.event_id)

    def second(self, event: Event, vms: Sequence[str], seconds: float | None, pause: bool) -> dict[str, Any]:
        """A further impact of a Started event: logged, and with ``pause`` the VMs are paused again.

        ``seconds`` defaults to the event's freeze length. Returns the ``impact`` entry.
        """
        length = seconds if seconds is not None else event.pause_seconds
        entry = self._log.record(
            "impact",
            event_id=event.event_id,
            event_type=event.event_type,
            impact="freeze" if pause else "none",
            seconds=length,
            vms=list(vms),
            reason="second",
        )
        if pause and length > 0:
            for vm in vms:
                self._pause(vm, length, event.event_id)
        return entry

    def _pause(self, vm: str, seconds: float, event_id: str) -> None:
        until = self._time.now() + seconds
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
        self._log.record(
            "signal",
            vm=vm,
            pid=pid,
            signal=signal.Signals(signum).name,
            event_id=event_id,
            reason=reason,
            result=result,
        )
        return result == "sent"
