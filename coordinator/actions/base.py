"""The action protocol.

An action makes one side of the VM stop or resume serving: the load-balancer probe, an HAProxy
server, a command hook, a webhook. ``drain`` and ``recover`` are called from the executor thread,
never from the agent loop; both must be idempotent (a restart may repeat either) and raise
``ActionError`` on failure. A failed drain means no acknowledgement; a failed recover is retried.
A drain that holds by a fallback instead of the way it is configured (the ``azure-lb`` action draining
through the health probe alone) returns one line saying so and why: the job goes on and counts as done,
and ``run_drain`` returns these lines, which the agent shows in ``/status`` (``action_fallback``).

``run_drain`` and ``run_recover`` report how long each action and the whole job took, and how they
ended, to an optional ``ActionTimings`` (the agent's metrics): an action that returned a fallback is
reported with outcome ``fallback``, not ``ok``, so that a drain holding by a fallback shows in the
metrics; its job still ends ``ok``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr

from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent

__all__ = ["Action", "ActionContext", "ActionTimings", "mask_secrets", "run_drain", "run_recover"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionContext:
    vm: str
    events: tuple[ScheduledEvent, ...]  # the events that hold the VM (empty on recovery)

    @property
    def event_ids(self) -> str:
        return ",".join(e.event_id for e in self.events) or "-"


MASKED = "<redacted>"
_SHORTEST_MASKED = 4  # a shorter value is no secret, and masking it would garble the text around it


def mask_secrets(text: str, secrets: Iterable[SecretStr]) -> str:
    """``text`` with every secret's value replaced by ``<redacted>``: what a command printed or a webhook
    answered goes into logs and errors, and may echo the token the action was given."""
    values = {secret.get_secret_value() for secret in secrets}
    for value in sorted(values, key=len, reverse=True):  # the longest first: one may contain another
        if len(value) >= _SHORTEST_MASKED:
            text = text.replace(value, MASKED)
    return text


class Action(Protocol):
    name: str
    # Its recover also runs when a restart found the VM serving (cheap and idempotent, as the probe's); the
    # others recover only a VM that was, or may have been, out of rotation.
    always_recover: bool

    def drain(self, ctx: ActionContext) -> str | None:
        """None once drained as configured; else the fallback it drained by, and why (one line)."""
        ...

    def recover(self, ctx: ActionContext) -> None: ...


class ActionTimings(Protocol):
    """Where a job reports its durations. ``phase`` is "drain" or "recover". ``outcome`` of an action is
    "ok", "fallback" (it returned a fallback: it held, but not the way it is configured) or "failed"; of a
    job, "ok" (every action returned, by a fallback or not) or "failed"."""

    def action_done(self, phase: str, action: str, outcome: str, seconds: float) -> None: ...

    def job_done(self, phase: str, outcome: str, seconds: float) -> None: ...


def _run(
    actions: Sequence[Action], ctx: ActionContext, verb: str, timings: ActionTimings | None,
    clock: Callable[[], float],
) -> tuple[str, ...]:
    """Run ``verb`` of each action in turn; returns the fallbacks they reported (see the module docstring)."""
    began = clock()
    outcome = "failed"
    fallbacks: list[str] = []
    try:
        for action in actions:
            started = clock()
            try:
                said = getattr(action, verb)(ctx)
            except ActionError:
                if timings is not None:
                    timings.action_done(verb, action.name, "failed", clock() - started)
                raise
            except Exception as exc:  # an action's own bug must not kill the executor
                if timings is not None:
                    timings.action_done(verb, action.name, "failed", clock() - started)
                log.exception(
                    "action %s %s raised unexpectedly (vm=%s events=%s)", action.name, verb, ctx.vm, ctx.event_ids
                )
                raise ActionError(f"{action.name} {verb} failed: {exc!r}") from exc
            fell_back = isinstance(said, str) and bool(said)
            if timings is not None:
                timings.action_done(verb, action.name, "fallback" if fell_back else "ok", clock() - started)
            log.info("%s %s done%s (vm=%s events=%s)", action.name, verb, " by a fallback" if fell_back else "",
                     ctx.vm, ctx.event_ids)
            if fell_back:
                fallbacks.append(said)
        outcome = "ok"
    finally:
        if timings is not None:
            timings.job_done(verb, outcome, clock() - began)
    return tuple(fallbacks)


def run_drain(
    actions: Sequence[Action], ctx: ActionContext, *, timings: ActionTimings | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, ...]:
    """Run every action's drain in order; stop at the first failure (raises ``ActionError``). Returns the
    fallbacks the drain holds by, one line each (empty: every action drained as configured)."""
    return _run(actions, ctx, "drain", timings, clock)


def run_recover(
    actions: Sequence[Action], ctx: ActionContext, *, timings: ActionTimings | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, ...]:
    """Run every action's recover in reverse order; stop at the first failure. An action with a true
    ``recover_after_probe`` attribute recovers last, after the health probe (always the first action,
    so the last to recover otherwise): a load balancer whose own check of the VM is that probe (HAProxy)
    is put back only once the probe serves. Returns the fallbacks reported, as ``run_drain`` does."""
    backwards = list(reversed(actions))
    late = [a for a in backwards if getattr(a, "recover_after_probe", False)]
    return _run([a for a in backwards if a not in late] + late, ctx, "recover", timings, clock)
