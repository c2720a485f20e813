"""Maintenance windows: the times of the week in which events may be approved early.

Outside every window an event is neither admitted nor approved early: its VMs drain just in time
(``drain.latest_start_seconds`` before NotBefore) and it starts at NotBefore, as it would without this
product. With no window configured, every moment is inside one.

A window is a set of weekdays and a time span in one time zone; a span whose end is not after its
start runs past midnight into the next day (``22:00``-``04:00`` on Friday ends on Saturday at 04:00).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from zoneinfo import ZoneInfo

__all__ = ["WEEKDAYS", "Weekday", "Window", "in_windows", "next_opening"]

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class Window:
    days: frozenset[int]  # 0 = Monday, as ``datetime.weekday()``: the days on which the window opens
    start: dt.time
    end: dt.time  # not after ``start``: the window ends on the next day
    zone: ZoneInfo

    def contains(self, when: float) -> bool:
        local = dt.datetime.fromtimestamp(when, self.zone)
        for opened in (local.date(), local.date() - dt.timedelta(days=1)):
            begin, finish = self._span(opened)
            if opened.weekday() in self.days and begin <= local < finish:
                return True
        return False

    def next_start(self, when: float) -> float | None:
        """The first opening at or after ``when`` (within the next eight days)."""
        local = dt.datetime.fromtimestamp(when, self.zone)
        for offset in range(9):
            day = local.date() + dt.timedelta(days=offset)
            if day.weekday() in self.days:
                begin, _ = self._span(day)
                if begin >= local:
                    return begin.timestamp()
        return None

    def _span(self, day: dt.date) -> tuple[dt.datetime, dt.datetime]:
        begin = dt.datetime.combine(day, self.start, tzinfo=self.zone)
        end_day = day if self.end > self.start else day + dt.timedelta(days=1)
        return begin, dt.datetime.combine(end_day, self.end, tzinfo=self.zone)


def in_windows(windows: Iterable[Window], when: float) -> bool:
    """Whether ``when`` (epoch seconds) lies in one of ``windows``; True when there are none."""
    windows = tuple(windows)
    return not windows or any(w.contains(when) for w in windows)


def next_opening(windows: Iterable[Window], when: float) -> float | None:
    """The next moment after ``when`` that a window opens (None with no windows)."""
    starts = [s for s in (w.next_start(when) for w in windows) if s is not None]
    return min(starts) if starts else None
