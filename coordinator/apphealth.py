"""The health signal for Azure's automatic instance repairs: an endpoint in the Application Health
extension's "rich health states" format.

A scale set with automatic repairs replaces, reimages or restarts an instance whose health source
reports it unhealthy. The load balancer's drain probe is the wrong source: it answers 503 for as long as
the VM is drained, up to an event's NotBefore when a peer blocks the early approval, and a drained VM
could then be repaired in the middle of its planned maintenance. This endpoint answers instead, with a
2xx status and the body ``{"ApplicationHealthState": "Healthy"}`` or ``{"ApplicationHealthState":
"Unhealthy"}`` (the extension reads any other status, a timeout, or any other body as *Unknown*, which
repairs treat like *Unhealthy*).

*Healthy*: serving, starting, draining, drained, recovering, and whatever ZooKeeper or IMDS say (an
unreachable ensemble or metadata service is no fault of this VM: repairing every VM of the group would
fix nothing). *Unhealthy* only for the agent's own failures that a restart or a reimage can fix:

* **stuck**: the agent's loop has completed no cycle for ``stuck_after`` seconds (a hung process: the
  VM is never brought back into rotation, nor drained for the next event);
* **recovery failing**: after its events are gone, the VM's recovery has failed, retry after retry, for
  ``recover_failing_after`` seconds (it stays out of rotation: a local service that does not come back,
  a hook that keeps failing).

A recovery that keeps failing only because of a service outside this VM (the action's error says so:
``ActionError.outside_vm``, as Azure Resource Manager's for the ``azure-lb`` action: a missing role, ARM
unreachable or throttling) stays *Healthy*, its reason saying that the recovery is failing outside this VM
and is retried: a repair would reimage or replace a VM whose only fault is elsewhere, and fix nothing.
Failures inside and outside the VM are timed apart: a failure of the other kind starts the count anew.

``decide`` is the whole decision, a pure function; ``AppHealth`` samples a running agent for it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

__all__ = ["AgentView", "AppHealth", "Observed", "State", "Verdict", "body", "decide"]

log = logging.getLogger(__name__)

_PHASES_HELD = ("draining", "drained")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")
REASON_MAX = 200  # characters of the reason header


class State(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Observed:
    """What the decision looks at, sampled from the agent.

    ``running``: the agent's loop exists (False while the process learns this VM's name from IMDS);
    ``since_cycle``: seconds since the loop last completed a cycle (since it started, before the first);
    ``phase``: this VM's phase; ``recover_failing_for``: seconds the recovery has kept failing (of the
    same kind, inside or outside this VM), None while it is not failing; ``error``: the last action
    failure, if any; ``outside_vm``: that failure lies outside this VM (``ActionError.outside_vm``)."""

    running: bool
    since_cycle: float = 0.0
    phase: str = "unknown"
    recover_failing_for: float | None = None
    error: str | None = None
    outside_vm: bool = False


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str

    @property
    def healthy(self) -> bool:
        return self.state is State.HEALTHY


def decide(observed: Observed, *, stuck_after: float, recover_failing_after: float | None) -> Verdict:
    """The health state to report for ``observed``. Never Unhealthy for a drain, for ZooKeeper, for IMDS
    or for a failure outside this VM: only for a stuck loop and, unless ``recover_failing_after`` is None,
    a recovery that has kept failing that long for a reason inside this VM."""
    if not observed.running:
        return Verdict(State.HEALTHY, "starting: learning this VM's name from IMDS")
    if observed.since_cycle >= stuck_after:
        return Verdict(State.UNHEALTHY, f"agent stuck: its loop has completed no cycle for "
                                        f"{observed.since_cycle:.0f} s (bound {stuck_after:g} s)")
    failing = observed.recover_failing_for
    if failing is not None and observed.outside_vm:
        return Verdict(State.HEALTHY, f"recovery failing outside this VM for {failing:.0f} s (a repair would not fix "
                                      f"it), retried: {observed.error or 'no detail'}")
    if failing is not None and recover_failing_after is not None and failing >= recover_failing_after:
        return Verdict(State.UNHEALTHY, f"recovery failing for {failing:.0f} s (bound {recover_failing_after:g} "
                                        f"s) after its events are gone: {observed.error or 'no detail'}")
    if observed.phase in _PHASES_HELD:
        return Verdict(State.HEALTHY, f"{observed.phase} for planned maintenance (out of rotation on purpose)")
    if failing is not None:
        return Verdict(State.HEALTHY, f"recovery failing for {failing:.0f} s, retried: {observed.error or 'no detail'}")
    return Verdict(State.HEALTHY, f"agent running, phase {observed.phase}")


def body(verdict: Verdict) -> bytes:
    """The response body, exactly as the extension documents it."""
    return json.dumps({"ApplicationHealthState": verdict.state.value}).encode()


def reason_header(verdict: Verdict) -> str:
    """The reason, safe as one HTTP header value: printable ASCII, bounded (an action's error text may
    hold anything)."""
    return _UNPRINTABLE.sub(" ", verdict.reason).strip()[:REASON_MAX]


class AgentView(Protocol):
    """What ``AppHealth`` reads of a running agent (``coordinator.agent.Agent``)."""

    def since_last_cycle(self) -> float: ...

    def status(self) -> dict[str, Any]: ...


class AppHealth:
    """Samples the agent at each request and decides. Since when the recovery has been failing is seen
    here, across the agent's retries (each retry starts the phase anew): a failing recovery is counted
    from the first request that saw it, so between requests that are far apart it is counted late, never
    early. Logs each change of state. Safe from any thread."""

    def __init__(self, agent: Callable[[], AgentView | None], *, stuck_after: float,
                 recover_failing_after: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._agent = agent
        self._stuck_after = stuck_after
        self._recover_failing_after = recover_failing_after
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._failing_outside = False  # whether the failures timed since then lie outside this VM
        self._last: State | None = None

    def verdict(self) -> Verdict:
        agent = self._agent()
        with self._lock:
            observed = self._observe(agent, self._clock())
            verdict = decide(observed, stuck_after=self._stuck_after,
                             recover_failing_after=self._recover_failing_after)
            changed, self._last = verdict.state is not self._last, verdict.state
        if changed:
            if verdict.healthy:
                log.info("application health: Healthy (%s)", verdict.reason)
            else:
                log.warning("application health: Unhealthy, automatic repairs may act on this VM: %s", verdict.reason)
        return verdict

    def _observe(self, agent: AgentView | None, now: float) -> Observed:
        if agent is None:
            self._failing_since = None
            return Observed(running=False)
        since = agent.since_last_cycle()
        status = agent.status()
        phase = str(status.get("phase", "unknown"))
        error = status.get("action_error")
        error = str(error) if error is not None else None
        outside = status.get("action_error_outside_vm") is True
        if phase == "recovering" and error is not None and error.startswith("recover failed"):
            if self._failing_since is None or outside is not self._failing_outside:
                self._failing_since, self._failing_outside = now, outside
        else:
            self._failing_since = None
        failing = now - self._failing_since if self._failing_since is not None else None
        return Observed(running=True, since_cycle=since, phase=phase, recover_failing_for=failing, error=error,
                        outside_vm=outside)
