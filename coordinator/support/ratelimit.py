"""A sliding-window rate limiter: at most ``limit`` sends in any window of ``window`` seconds.

The IMDS client waits for its turn (``reserve``); the simulator answers 429 at once when a VM is over
its budget (``admit``). Both keep the same book of send times, so both keep the same guarantee.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """At most ``limit`` sends in any window of ``window`` seconds of ``clock``; ``limit`` 0 disables it.

    The book holds the times of the last ``limit`` sends, booked or admitted. Two ways to book:

    * ``reserve()`` books the earliest time at which one more send keeps the guarantee and returns it;
      the caller waits until then. Bookings are handed out in call order, later than every earlier
      booking, so concurrent callers never overtake each other and nothing spins, even with a clock
      that stands still.
    * ``admit()`` books the present if a send now keeps the guarantee and returns True; otherwise it
      books nothing and returns False, so a refused attempt never counts against the caller.

    Thread-safe. Times are those of ``clock`` (default ``time.monotonic``).
    """

    def __init__(self, limit: int, window: float = 1.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if not (window > 0 and math.isfinite(window)):
            raise ValueError("window must be a finite number of seconds > 0")
        self._limit = limit
        self._window = float(window)
        self._clock = clock
        self._booked: deque[float] = deque(maxlen=limit or None)
        self._lock = threading.Lock()

    @classmethod
    def per_second(cls, rate: float, *, clock: Callable[[], float] = time.monotonic) -> RateLimiter:
        """A limiter for ``rate`` sends per second (``rate`` > 0).

        An integer rate r gives exactly "at most r in any one-second window"; a fractional rate is
        rounded down (2.5/s allows 2 per second), and a rate below 1/s allows one send per ``1/rate``
        seconds.
        """
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError("rate must be a finite number > 0")
        limit = max(1, math.floor(rate))
        return cls(limit, max(1.0, limit / rate), clock=clock)

    def reserve(self) -> float:
        """Book the next send and return its time (on ``clock``): the present, or later if the book is full."""
        with self._lock:
            now = self._clock()
            at = self._earliest(now)
            if self._limit:
                self._booked.append(at)
            return at

    def admit(self) -> bool:
        """Book a send now if that keeps the guarantee; return whether it was booked."""
        with self._lock:
            now = self._clock()
            if self._earliest(now) > now:
                return False
            if self._limit:
                self._booked.append(now)
            return True

    def _earliest(self, now: float) -> float:
        if not self._limit or not self._booked:
            return now
        at = max(now, self._booked[-1])
        if len(self._booked) == self._limit:
            # The send `limit` places back must have left the window.
            at = max(at, self._booked[0] + self._window)
        return at
