"""How long the agent has gone without its cluster view, said in a few log lines rather than one a cycle.

The agent reads the cluster view from ZooKeeper every cycle (about once a second); while ZooKeeper is
out of reach every read fails the same way. ``ViewOutage`` turns that stream into what an operator
needs: one WARNING when the view is first lost (with why), a reminder about once every
``remind_every`` seconds saying how long it has lasted and why now, and one INFO line when a view is
read again, with how long the outage lasted. It also answers how long the current outage has lasted,
for the readiness answer (``coordinator.telemetry``).

It is fed by the agent loop only (``unavailable`` on a failed read, ``available`` on a view read), on
the loop's monotonic clock; ``lasting`` may be read from any thread.
"""

from __future__ import annotations

import logging

__all__ = ["ViewOutage"]


class ViewOutage:
    """The current outage of the cluster view, if any, and its log lines."""

    def __init__(self, vm: str, logger: logging.Logger, *, remind_every: float = 60.0) -> None:
        self._vm = vm
        self._log = logger
        self.remind_every = remind_every
        self._since: float | None = None  # monotonic time of the first failed read of this outage
        self._reminded: float = 0.0  # monotonic time of the last line about it
        self._problem = ""  # why the last read failed
        self._failures = 0  # failed reads since the last line

    def unavailable(self, problem: object, mono: float) -> None:
        """A read of the view failed at ``mono`` because of ``problem`` (its text is logged). The first
        failure of an outage is logged at once; later ones at most once every ``remind_every`` s."""
        self._problem = str(problem)
        self._failures += 1
        if self._since is None:
            self._since = self._reminded = mono
            self._failures = 0
            self._log.warning("cluster view unavailable (vm=%s): %s; nothing is approved until it is back",
                              self._vm, self._problem)
            return
        if mono - self._reminded >= self.remind_every:
            self._log.warning("cluster view still unavailable after %.0f s (vm=%s): %s (%d failed reads since "
                              "the last line)", mono - self._since, self._vm, self._problem, self._failures)
            self._reminded = mono
            self._failures = 0

    def available(self, mono: float) -> None:
        """A view was read at ``mono``: ends the outage, if one was under way, with one line."""
        since = self._since
        if since is None:
            return
        self._since = None
        self._failures = 0
        self._log.info("cluster view back after %.0f s unavailable (vm=%s; it was: %s)", mono - since, self._vm,
                       self._problem)

    def lasting(self, mono: float) -> tuple[float, str] | None:
        """(seconds since the first failed read, why the last one failed) while the view is unavailable;
        None while it is read."""
        since = self._since
        if since is None:
            return None
        return mono - since, self._problem
