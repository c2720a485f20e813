"""Test doubles an agent is built with when a test drives its cycles by hand: a clock the test moves,
and an executor that runs each drain or recover job at once, on the loop's thread; an IMDS that always
answers one document (``StaticImds``); a monotonic clock moved only by sleeping (``SleepClock``, for
clients that retry); and the member info of agent processes other than the test's own
(``member_identity``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from coordinator.models import Document
from coordinator.support.hostos import agent_identity, process_start

__all__ = ["Clock", "InlineExecutor", "InlineJob", "SleepClock", "StaticImds", "gone_process", "member_identity"]


def gone_process() -> tuple[int, str | None]:
    """The pid and start time (``process_start``) of a process of this host that has ended (started and
    reaped here: should its pid be reused meanwhile, the start time tells the new process apart)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(child.pid)  # read before it is reaped: a zombie keeps its /proc entry
    child.wait()
    return child.pid, start


def member_identity(started_at: float, *, process: str = "this", **overrides: object) -> dict[str, object]:
    """Member info naming an agent process of this host (``agent_identity``) that started at
    ``started_at``: this very process (``process="this"``), or one that has ended (``"gone"``: the pid
    of a reaped child). ``overrides`` replace fields (``host``, ``boot_id``...). Skips the test where the
    host has no boot id (the proof of a predecessor needs one)."""
    identity = agent_identity()
    if identity["boot_id"] is None:
        pytest.skip("no boot id on this system: a previous agent process cannot be told from another agent")
    if process == "gone":
        pid, start = gone_process()
        identity.update(pid=pid, pid_start=start)
    return {**identity, "started_at": started_at, **overrides}


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


class SleepClock:
    """A monotonic clock that only moves when something sleeps (or the test advances it); every sleep is
    recorded. Call it for the time; pass ``sleep`` where the code under test sleeps."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StaticImds:
    """IMDS as an agent reads it, always answering ``document``; an approval raises unless the test
    allows it (``approvals`` then lists each one's event ids)."""

    def __init__(self, document: Document, *, approvals_allowed: bool = False) -> None:
        self.document = document
        self.approvals_allowed = approvals_allowed
        self.approvals: list[tuple[str, ...]] = []

    def get_document(self) -> Document:
        return self.document

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        if not self.approvals_allowed:
            raise AssertionError(f"nothing to approve here: {list(event_ids)}")
        self.approvals.append(tuple(event_ids))
