"""The simulated load balancer's data plane, played by a real HAProxy through its runtime API.

``AzureModel`` decides when a backend address's admin state becomes *effective*; ``HAProxyDataPlane``
makes HAProxy do what an Azure Load Balancer does then (Azure Load Balancer documentation, "Administrative
State (Admin State)"):

* ``Down``: no new connections, established ones kept, whatever the probe: ``set server B/S state drain``
  (HAProxy's drain sends a server no new traffic and lets its sessions finish; its health check goes on);
* ``None``: the probe decides again: ``set server B/S state ready`` (and ``enable health`` when leaving
  ``Up``);
* ``Up``: eligible whatever the probe: ``set server B/S state ready`` and ``disable health`` (HAProxy then
  ignores the last check result and treats the server as up).

The HAProxy server of an address is the address's name: the simulator's pools, the testbed's and the
examples', name each address after its VM, and HAProxy's servers are named after the VMs too. A failure to
reach HAProxy, or a command HAProxy refuses (``No such server.``), is logged and counted; it never raises
into the simulator, whose ARM keeps answering whatever HAProxy does.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from typing import Any, Protocol

from azuresim.azure import EffectiveChange
from azuresim.haproxy_runtime import HAProxyUnreachable

__all__ = ["HAProxyDataPlane", "Runtime", "commands_for"]

log = logging.getLogger(__name__)

# What HAProxy accepts as a server name (its configuration manual, "server <name>"): an address named
# otherwise cannot be one of its servers, and must not reach the runtime API as a command fragment.
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class Runtime(Protocol):
    """What is used of ``azuresim.haproxy_runtime.HAProxyRuntime``: one command, HAProxy's answer;
    raises ``HAProxyUnreachable`` when HAProxy cannot be reached or does not answer in time."""

    @property
    def address(self) -> str: ...

    def execute(self, command: str) -> str: ...


def commands_for(backend: str, server: str, before: str, after: str) -> list[str]:
    """The runtime API commands that take ``backend/server`` from admin state ``before`` to ``after``."""
    target = f"{backend}/{server}"
    commands = [f"set server {target} state {'drain' if after == 'Down' else 'ready'}"]
    if after == "Up":
        commands.append(f"disable health {target}")
    elif before == "Up":
        commands.append(f"enable health {target}")
    return commands


class HAProxyDataPlane:
    """``AzureModel.on_effective`` hook applying effective admin states to HAProxy's ``backend``.

    Called by one thread at a time (the model serializes its hook). Each command is sent once: a failed
    one is not retried, since the next change of the same address sets the whole state again; ``view()``
    counts what was sent and what failed, for the control API and the tests."""

    def __init__(self, runtime: Runtime, backend: str) -> None:
        self._runtime = runtime
        self.backend = backend
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._last_error: str | None = None

    def __call__(self, change: EffectiveChange) -> bool:
        """Apply ``change``; True if HAProxy took every command. Never raises for HAProxy's faults."""
        if not _SERVER_NAME.match(change.address):
            return self._failed(change, f"{change.address!r} cannot be a HAProxy server name")
        for command in commands_for(self.backend, change.address, change.before, change.after):
            problem = self._send(command)
            if problem is not None:
                return self._failed(change, problem)
        with self._lock:
            self._counts["applied"] += 1
        log.info("HAProxy %s/%s: admin state %s -> %s applied", self.backend, change.address, change.before,
                 change.after)
        return True

    def _failed(self, change: EffectiveChange, problem: str) -> bool:
        log.warning("cannot apply admin state %s of %s (pool %s) to HAProxy at %s: %s", change.after,
                    change.address, change.pool_id, self._runtime.address, problem)
        with self._lock:
            self._counts["failed"] += 1
            self._last_error = problem
        return False

    def _send(self, command: str) -> str | None:
        """One command; None when HAProxy accepted it (it answers nothing), else what went wrong."""
        with self._lock:
            self._counts["commands"] += 1
        try:
            answer = self._runtime.execute(command)
        except HAProxyUnreachable as exc:
            return str(exc)
        return f"{command!r} refused: {answer.strip()[:200]}" if answer.strip() else None

    def view(self) -> dict[str, Any]:
        """``{"runtime", "backend", "applied", "failed", "commands", "last_error"}``: changes applied and
        failed, runtime commands sent, the last failure's words."""
        with self._lock:
            return {"runtime": self._runtime.address, "backend": self.backend, "applied": self._counts["applied"],
                    "failed": self._counts["failed"], "commands": self._counts["commands"],
                    "last_error": self._last_error}
