"""The per-VM rate limit of IMDS: at most ``limit`` requests in any window of ``window`` seconds.

IMDS answers 429 at once to a VM over its budget; a refused request does not count against it. The
simulator keeps its own limiter, not the agent's client-side one: what it checks must not share the code
that the agent paces itself with.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """At most ``limit`` admissions in any window of ``window`` seconds of ``clock``; ``limit`` 0 disables it.

    The book holds the times of the last ``limit`` admissions. Thread-safe. Times are those of ``clock``
    (default ``time.monotonic``).
    """

    def __init__(self, limit: int, window: float = 1.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if not (window > 0 and math.isfinite(window)):
            raise ValueError("window must be a finite number of seconds > 0")
        self._limit = limit
        self._window = float(window)
        self._clock = clock
        self._admitted: deque[float] = deque(maxlen=limit or None)
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Count a request now if that keeps the limit and return True; otherwise count nothing, return False."""
        with self._lock:
            now = self._clock()
            if not self._limit:
                return True
            if self._admitted:
                earliest = self._admitted[-1]  # never before an earlier admission, even if the clock went back
                if len(self._admitted) == self._limit:  # the admission `limit` places back must have left the window
                    earliest = max(earliest, self._admitted[0] + self._window)
                if earliest > now:
                    return False
            self._admitted.append(now)
            return True
