"""Time in the simulator: simulated epoch seconds, a clock that runs faster than real time, and how
the simulated clock maps onto the wall clock.

Every duration of the model (notice, approval delay, Started time, impact, first-call delay, idle
reset) is in simulated seconds; ``real_seconds`` converts one for the server's sleeps. With a time
scale, NotBefore is served in the simulated clock, or, with ``not_before_clock="real"``, as the
wall-clock time at which the simulated clock reaches it (for a client that compares NotBefore with its
own clock).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from azuresim.catalogue import NotBeforeClock
from azuresim.errors import InvalidRequest

__all__ = ["Clock", "ScaledClock", "SimTime"]

Clock = Callable[[], float]


class ScaledClock:
    """Simulated epoch seconds running ``scale`` times faster than real time.

    At construction the simulated clock reads ``start`` (default: the wall clock); afterwards it
    advances by ``scale`` simulated seconds per real (monotonic) second. ``real_seconds`` converts a
    simulated duration to the real time it takes.
    """

    def __init__(
        self,
        scale: float = 1.0,
        *,
        start: float | None = None,
        wall: Clock = time.time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
            raise InvalidRequest("time scale must be a finite number > 0")
        self.scale = float(scale)
        self.start = wall() if start is None else float(start)
        self._monotonic = monotonic
        self._origin = monotonic()

    def __call__(self) -> float:
        return self.start + (self._monotonic() - self._origin) * self.scale

    def real_seconds(self, simulated: float) -> float:
        return simulated / self.scale


class SimTime:
    """The clocks of one group.

    ``clock`` gives simulated epoch seconds and ``wall_clock`` the ``t`` of log entries (default:
    ``clock`` when one is given, else the wall clock). Without ``clock``, a ``time_scale`` other than 1
    builds a ``ScaledClock`` starting at the wall clock's present. ``time_scale`` must already be
    checked (finite, > 0).
    """

    def __init__(
        self,
        clock: Clock | None,
        wall_clock: Clock | None,
        time_scale: float,
        not_before_clock: NotBeforeClock,
    ) -> None:
        if clock is None:
            clock = time.time if time_scale == 1 else ScaledClock(time_scale)
            wall_clock = wall_clock or time.time
        self._clock = clock
        self._wall_clock = wall_clock or clock
        self.time_scale = float(time_scale)
        self._not_before_clock = not_before_clock
        # Where the two clocks meet, to render a simulated time in real time (not_before_clock "real").
        self._sim_origin = self._clock()
        self._wall_origin = self._sim_origin if self._wall_clock is self._clock else self._wall_clock()
        self._frozen: float | None = None

    def now(self) -> float:
        """The simulated present; inside ``frozen`` the reading taken when the block began."""
        return self._frozen if self._frozen is not None else self._clock()

    @contextmanager
    def frozen(self) -> Iterator[float]:
        """Read the clock once for the whole block, so that the changes it makes share one instant.

        Nested blocks keep the outer reading.
        """
        if self._frozen is not None:
            yield self._frozen
            return
        self._frozen = self._clock()
        try:
            yield self._frozen
        finally:
            self._frozen = None

    def stamp(self) -> tuple[float, float]:
        """``(wall, simulated)`` seconds for a log entry; one reading when both clocks are the same."""
        simulated = self.now()
        return (simulated if self._wall_clock is self._clock else self._wall_clock()), simulated

    def real_seconds(self, simulated: float) -> float:
        """How many real seconds ``simulated`` seconds of the model last."""
        return simulated / self.time_scale

    def served_not_before(self, not_before: int) -> int:
        """The NotBefore (epoch seconds) served for a simulated ``not_before``.

        ``not_before_clock`` "simulated" serves the simulated time itself; "real" serves the wall-clock
        time at which the simulated clock reaches it, rounded up to the second.
        """
        if self._not_before_clock == "simulated" or self.time_scale == 1:
            return not_before
        return math.ceil(self._wall_origin + (not_before - self._sim_origin) / self.time_scale)
