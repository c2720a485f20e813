"""When HAProxy stopped sending new requests to each server: the observed side of a drain.

A watcher thread reads every server's ``show stat`` status every ``interval`` seconds and keeps only the
changes, stamped with the wall clock (the clock of the simulator's log). A server is *in rotation* while
its status starts with ``UP`` (``UP``, or ``UP 1/2`` while its checks start failing: HAProxy still sends it
requests); ``DOWN`` (its health check, the probe, failed), ``DRAIN`` (admin state ``Down``), ``MAINT``,
``NOLB`` take it out. The resolution is the polling interval plus one runtime API round trip.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Change", "RotationWatch", "in_rotation", "out_of_rotation_since"]


@dataclass(frozen=True)
class Change:
    t: float  # wall clock
    server: str
    status: str


def in_rotation(status: str) -> bool:
    """HAProxy sends new requests to a server in this status."""
    return status.startswith("UP")


def out_of_rotation_since(changes: Sequence[Change], server: str, since: float,
                          until: float | None = None) -> Change | None:
    """The first moment at or after ``since`` (and not after ``until``) when ``server`` was out of rotation:
    the change that took it out, or, if it was already out at ``since``, that earlier change. None if it
    stayed in rotation throughout."""
    mine = [c for c in changes if c.server == server]
    before = [c for c in mine if c.t <= since]
    if before and not in_rotation(before[-1].status):
        return before[-1]
    for change in mine:
        if change.t > since and (until is None or change.t <= until) and not in_rotation(change.status):
            return change
    return None


class RotationWatch:
    """Polls ``statuses()`` (server -> status) on a thread from ``start()`` to ``stop()``; ``changes``
    holds every change seen, the first reading of each server included. A failed reading (HAProxy busy or
    restarting) is skipped: the next one records whatever changed meanwhile."""

    def __init__(self, statuses: Callable[[], dict[str, str]], interval: float = 0.05,
                 clock: Callable[[], float] = time.time) -> None:
        self._statuses = statuses
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()
        self._changes: list[Change] = []

    @property
    def changes(self) -> list[Change]:
        with self._lock:
            return list(self._changes)

    def poll(self) -> None:
        """One reading: record each server whose status differs from the last reading."""
        try:
            current = self._statuses()
        except OSError:
            return
        now = self._clock()
        with self._lock:
            for server, status in current.items():
                if self._last.get(server) != status:
                    self._changes.append(Change(now, server, status))
                    self._last[server] = status

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rotation-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval)
