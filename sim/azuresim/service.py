"""The Scheduled Events service of each VM: enabled by its first request, switched off when idle, and
the offset added to the group's DocumentIncarnation in that VM's documents.

The first request of a VM enables its service and is held ``first_call_delay``. When
``idle_reset_after`` is set and a VM's previous request is at least that old, the service had switched
itself off: the request enables it again (held again) and the VM's DocumentIncarnation starts again
from 1 (a field report after 24 hours without polling). ``shift`` makes a VM see an incarnation that
skipped or restarted, as one that missed documents or whose service was reset does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from azuresim.log import Log

__all__ = ["Services"]


@dataclass
class _Service:
    enabled_at: float | None = None
    last_request: float | None = None
    offset: int = 0  # added to the group's incarnation in this VM's documents


class Services:
    """Per-VM service state. Not locked: callers hold the group's lock. Times are simulated seconds."""

    def __init__(
        self, vms: Iterable[str], log: Log, *, first_call_delay: float, idle_reset_after: float | None
    ) -> None:
        self._log = log
        self._first_call_delay = first_call_delay
        self._idle_reset_after = idle_reset_after
        self._services = {vm: _Service() for vm in vms}

    def served(self, vm: str, incarnation: int) -> int:
        """The DocumentIncarnation ``vm`` is served while the group's is ``incarnation``."""
        return max(0, incarnation + self._services[vm].offset)

    def begin_request(self, vm: str, now: float, incarnation: int, replaying: bool) -> float:
        """Note a Scheduled Events request of ``vm``; return how long to hold its answer.

        While ``replaying`` an idle reset leaves the incarnation alone: recorded documents carry their own.
        """
        service = self._services[vm]
        if (
            service.last_request is not None
            and self._idle_reset_after is not None
            and now - service.last_request >= self._idle_reset_after
        ):
            idle = now - service.last_request
            service.enabled_at = None
            if not replaying:
                service.offset = 1 - incarnation
            self._log.record(
                "service", vm=vm, action="reset", idle=idle, served_incarnation=self.served(vm, incarnation)
            )
        delay = 0.0
        if service.enabled_at is None:
            service.enabled_at = now
            delay = self._first_call_delay
            self._log.record("service", vm=vm, action="enabled", delay=delay)
        service.last_request = now + delay
        return delay

    def shift(self, vms: Iterable[str], by: int | None, incarnation: int) -> list[dict[str, Any]]:
        """Raise what each of ``vms`` is served by ``by``, or with None restart it from 1; returns the log entries."""
        entries = []
        for vm in vms:
            service = self._services[vm]
            if by is None:
                service.offset = 1 - incarnation
            else:
                service.offset += by
            entries.append(
                self._log.record(
                    "incarnation",
                    vm=vm,
                    action="reset" if by is None else "skip",
                    by=by,
                    served=self.served(vm, incarnation),
                )
            )
        return entries
