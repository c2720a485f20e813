"""Polling with a deadline, for the demo and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (used by the demo and tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
