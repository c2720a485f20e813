"""The simulator's log: every request, approval, transition, fault, impact and signal, in order.

Tests read it to see what the agents did and when; the command prints it as it grows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azuresim.clock import SimTime
from azuresim.errors import InvalidRequest

__all__ = ["LOG_KINDS", "Log"]

LOG_KINDS: tuple[str, ...] = (
    "request",
    "approval",
    "transition",
    "fault",
    "hold",
    "impact",
    "signal",
    "back",
    "pids",
    "service",
    "incarnation",
    "replay",
    "timeline",
    "admin_state",
)


class Log:
    """Append-only entries ``{"seq", "t", "sim_t", "kind", **fields}``; ``seq`` counts from 1.

    ``t`` is the wall clock (to compare with other observers), ``sim_t`` the simulated clock. Not
    locked: the group calls it under its own lock. ``on_record`` is called with each entry as it is
    appended; it must not block or call back into the group.
    """

    def __init__(self, time: SimTime, on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._time = time
        self._on_record = on_record
        self._entries: list[dict[str, Any]] = []

    @property
    def last_seq(self) -> int:
        return len(self._entries)

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append an entry of ``kind`` (one of ``LOG_KINDS``); returns a copy of it."""
        if kind not in LOG_KINDS:
            raise InvalidRequest(f"log kind must be one of {', '.join(LOG_KINDS)}")
        wall_t, sim_t = self._time.stamp()
        entry = {"seq": len(self._entries) + 1, "t": wall_t, "sim_t": sim_t, "kind": kind, **fields}
        self._entries.append(entry)
        if self._on_record is not None:
            self._on_record(entry)
        return dict(entry)

    def entries(self, since: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Copies of the entries with ``seq > since``, oldest first, optionally of one kind only."""
        # seq n is at index n - 1: start there instead of scanning the whole log.
        start = max(0, min(since, len(self._entries)))
        return [dict(e) for e in self._entries[start:] if kind is None or e["kind"] == kind]
