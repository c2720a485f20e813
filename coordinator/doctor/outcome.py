"""The outcome of a ``coordinator doctor`` check: its ``Status``, its ``Verdict``, and how the worst of
them makes the exit status. Every verdict module builds on these; nothing here does I/O.

SKIP is for a check that did not run (``--skip``, a prerequisite that failed, or a check that needs
what is not built yet); it never changes the exit status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Status", "Verdict", "exit_status", "worst"]


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


_RANK = {Status.SKIP: 0, Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: ``summary`` says what was found, ``fix`` (one line, empty for PASS and SKIP)
    what to do; ``details`` are the observed values, for ``--json``."""

    status: Status
    summary: str
    fix: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


def worst(statuses: Iterable[Status]) -> Status:
    """The worst of ``statuses`` (PASS when there are none or all were skipped)."""
    found = Status.PASS
    for status in statuses:
        if _RANK[status] > _RANK[found]:
            found = status
    return found


def exit_status(statuses: Iterable[Status]) -> int:
    """0 when every check passed (or was skipped), 1 when the worst is a WARN, 2 when one FAILed."""
    return _RANK[worst(statuses)]
