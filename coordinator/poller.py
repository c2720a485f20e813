"""The IMDS poller: the one thread that reads the Scheduled Events document, so the loop never waits on IMDS.

Why a thread of its own: the first Scheduled Events request may take two minutes, an IMDS outage makes
every request time out, and IMDS allows 5 requests per second per VM for every IMDS user on the VM
together. Reading inside the coordination loop made this agent's ZooKeeper duties (approving as first in
``Resources``, admissions and absence marks as leader) wait on IMDS, and made watch bursts read IMDS at
the loop's rate. Here:

* one read per poll, one attempt per read: a failed read is retried by the next poll, never inside it;
* polls follow a steady schedule of ``interval`` seconds, whatever happens in ZooKeeper; after
  consecutive failures the schedule backs off (full jitter, capped at ``backoff_max``), and the first
  success restores it;
* polls of one group can be spread over the interval (``align``): the agent of the k-th of n live
  members polls at offset k/n of each interval, on the wall clock the VMs share, so the group as a
  whole samples IMDS n times per interval;
* every answer, document or error, is a ``Reading`` with a sequence number; the loop takes the latest
  one when it runs (``latest``) and is woken by ``on_reading``;
* ``poll_soon`` asks for one read now, outside the schedule: the agent does so when a peer has published
  an event its own latest document does not show, so the first agent of a staggered group to see an
  event brings the others to their own documents within milliseconds, and an approver reads once more
  before it approves. Early reads never move the schedule, come at least ``EARLY_GAP`` seconds after
  any read, and number at most ``EARLY_PER_INTERVAL`` in any interval (a request beyond that waits, it
  is not dropped); the client's rate limiter still caps everything the process sends.

The approval POST does not go through this thread (it must follow the decision at once), but it goes
through the same ``ImdsClient``, whose rate limiter counts every request of the process.

``ReadEachCycle`` is the same interface read synchronously on the caller's thread, one read per call:
what deterministic tests drive.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from coordinator.errors import ImdsError
from coordinator.models import Document

__all__ = ["ImdsPoller", "ReadEachCycle", "Reading", "Readings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """One answer of IMDS: a document, or the error that stood in for it. ``seq`` 0 is "nothing read
    yet"; ``at`` is when the answer arrived and ``began`` when its request was sent, on the reader's
    monotonic clock (``began`` defaults to ``at``)."""

    seq: int
    at: float
    document: Document | None = None
    error: ImdsError | None = None
    began: float | None = None

    @property
    def sent(self) -> float:
        return self.at if self.began is None else self.began


class Readings(Protocol):
    def latest(self) -> Reading:
        """The newest reading (seq 0 if there is none yet). Never blocks on IMDS for a poller."""

    def align(self, rank: int, members: int) -> None:
        """Spread the group's polls: this agent is number ``rank`` (0-based) of ``members``."""

    def poll_soon(self) -> None:
        """Read once more as soon as allowed, outside the schedule (a peer saw something new)."""


class ReadEachCycle:
    """Reads the document on the caller's thread each time ``latest`` is called."""

    def __init__(self, read: Callable[[], Document], clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._clock = clock
        self._seq = 0

    def latest(self) -> Reading:
        self._seq += 1
        began = self._clock()
        try:
            document = self._read()
        except ImdsError as exc:
            return Reading(self._seq, self._clock(), error=exc, began=began)
        return Reading(self._seq, self._clock(), document=document, began=began)

    def align(self, rank: int, members: int) -> None:
        return None  # read when asked: nothing to spread

    def poll_soon(self) -> None:
        return None  # the next cycle reads anyway


class ImdsPoller:
    """Polls IMDS on its own thread. ``read`` does one attempt (``ImdsClient.get_document`` with
    ``attempts=1``); ``on_reading`` is called after every answer, from the poller's thread, and must not
    block (the agent's ``wake``). Times: ``clock`` schedules and stamps readings, ``wall`` places the
    group's staggered polls on a grid the VMs share."""

    EARLY_GAP = 0.02  # seconds: the least time between any read and a read asked for by ``poll_soon``
    EARLY_PER_INTERVAL = 2  # early reads in any one interval, at most

    def __init__(
        self,
        read: Callable[[], Document],
        *,
        interval: float = 1.0,
        backoff_max: float = 8.0,
        on_reading: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        if not (backoff_max >= interval and math.isfinite(backoff_max)):
            raise ValueError(f"backoff_max must be at least the interval, got {backoff_max!r}")
        self._read = read
        self._interval = float(interval)
        self._backoff_max = float(backoff_max)
        self._on_reading = on_reading
        self._clock = clock
        self._wall = wall
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._latest = Reading(0, clock())
        self._offset: float | None = None  # seconds into each interval, once aligned
        self._failures = 0
        self._stop = threading.Event()
        self._soon = threading.Event()
        self._last_began = float("-inf")
        self._early: list[float] = []  # when the early reads of the last interval began
        self._thread: threading.Thread | None = None

    # -- the loop's side ---------------------------------------------------------------------------------

    def latest(self) -> Reading:
        with self._lock:
            return self._latest

    def align(self, rank: int, members: int) -> None:
        offset = (rank % members) / members * self._interval if members > 0 and rank >= 0 else None
        with self._lock:
            self._offset = offset

    def poll_soon(self) -> None:
        self._soon.set()

    @property
    def failures(self) -> int:
        """Consecutive failed reads (0 after a success)."""
        with self._lock:
            return self._failures

    # -- life cycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="imds-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling. A read in flight is left to finish (bounded by the client's timeout); the
        thread is a daemon, so it never holds the process."""
        self._stop.set()
        self._soon.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the poller's thread -----------------------------------------------------------------------------

    def poll_once(self) -> Reading:
        """Read once, publish the reading, and tell the loop. Public for tests; the thread calls it."""
        document: Document | None = None
        error: ImdsError | None = None
        began = self._clock()
        try:
            document = self._read()
        except ImdsError as exc:
            error = exc
        except Exception as exc:  # a bug in a reader must not end polling: counted as a failed read
            log.exception("IMDS read failed unexpectedly")
            error = ImdsError(f"unexpected {type(exc).__name__}: {exc}")
        with self._lock:
            self._failures = 0 if error is None else self._failures + 1
            self._latest = Reading(self._latest.seq + 1, self._clock(), document, error, began)
            reading = self._latest
        if self._on_reading is not None:
            try:
                self._on_reading()
            except Exception:
                log.exception("IMDS reading callback failed")
        return reading

    def next_delay(self, began: float) -> float:
        """Seconds from now until the next poll, for a poll that began at ``began`` (``clock``)."""
        with self._lock:
            failures, offset = self._failures, self._offset
        now = self._clock()
        if failures:
            # Full jitter over a doubling window, never sooner than the steady schedule.
            window = min(self._backoff_max, self._interval * 2.0 ** min(failures - 1, 32))
            return max(self._interval - (now - began), self._rng.uniform(self._interval, max(window, self._interval)))
        if offset is None:
            return max(0.0, self._interval - (now - began))
        # The next point of this agent's grid on the shared wall clock, about an interval after the poll
        # that just began at the earliest: a change of rank never makes polls closer than that (the
        # 1 % slack keeps float rounding from skipping the slot the schedule is already on).
        wall = self._wall()
        earliest = wall + max(0.0, 0.99 * self._interval - (now - began))
        slot = math.ceil((earliest - offset) / self._interval) * self._interval + offset
        return max(0.0, slot - wall)

    def _run(self) -> None:
        while not self._stop.is_set():
            pause = self._last_began + self.EARLY_GAP - self._clock()
            if pause > 0 and self._stop.wait(pause):  # just read early: the scheduled poll waits a little
                break
            began = self._last_began = self._clock()
            self.poll_once()
            due = self._clock() + self.next_delay(began)
            while not self._stop.is_set() and (remaining := due - self._clock()) > 0:
                if not self._soon.wait(remaining) or self._stop.is_set():
                    break
                self._soon.clear()
                now = self._clock()
                self._early = [t for t in self._early if now - t < self._interval]
                allowed_at = self._last_began + self.EARLY_GAP
                if len(self._early) >= self.EARLY_PER_INTERVAL:
                    allowed_at = max(allowed_at, self._early[0] + self._interval)
                if allowed_at >= due:
                    continue  # the scheduled poll comes first: it answers this request
                if allowed_at > now and self._stop.wait(allowed_at - now):
                    break
                self._last_began = self._clock()
                self._early.append(self._last_began)
                self.poll_once()  # an extra read: the schedule stays as it was
