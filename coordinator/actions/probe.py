"""The load-balancer health probe: 200 while serving, 503 while draining or before the agent knows.

Azure Load Balancer stops sending new flows to an instance whose probe fails ``probeThreshold``
times in a row, ``interval`` seconds apart (15 s x 2 by default); existing flows continue. The drain
wait before acknowledging (``drain.wait_seconds``) must cover that, plus time for connections to end.
"""

from __future__ import annotations

import threading

from coordinator.actions.base import ActionContext

__all__ = ["ProbeAction", "ProbeState"]


class ProbeState:
    """Thread-safe flag read by the probe HTTP handler. Starts failing: a fresh agent does not yet
    know whether an event holds its VM. A dry-run agent starts (and, its actions only logging, stays)
    serving: observing must never take a VM out of its load balancer."""

    def __init__(self, serving: bool = False) -> None:
        self._serving = serving
        self._lock = threading.Lock()

    @property
    def serving(self) -> bool:
        with self._lock:
            return self._serving

    def set(self, serving: bool) -> None:
        with self._lock:
            self._serving = serving


class ProbeAction:
    name = "probe"
    always_recover = True  # cheap and idempotent: also run when a restart found the VM serving

    def __init__(self, state: ProbeState) -> None:
        self._state = state

    def drain(self, ctx: ActionContext) -> None:
        self._state.set(False)

    def recover(self, ctx: ActionContext) -> None:
        self._state.set(True)
