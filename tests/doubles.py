"""Test doubles an agent is built with when a test drives its cycles by hand: a clock the test moves,
and an executor that runs each drain or recover job at once, on the loop's thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Clock", "InlineExecutor", "InlineJob"]


class Clock:
    """Wall and monotonic time, both moved only by ``advance``."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1_000.0) -> None:
        self.wall = wall
        self.mono = mono

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@dataclass
class InlineJob:
    kind: str
    error: BaseException | None
    running: bool = False


class InlineExecutor:
    """Runs each drain or recover job at once, on the loop's thread."""

    def __init__(self) -> None:
        self.current: InlineJob | None = None

    def submit(self, kind: str, fn: Callable[[], None]) -> InlineJob:
        error: BaseException | None = None
        try:
            fn()
        except Exception as exc:
            error = exc
        self.current = InlineJob(kind, error)
        return self.current
