"""Replay: recorded documents served verbatim instead of the model, and timelines of control operations.

Recorded documents (``Replay``) replace the model: every VM is served the current document as it was
recorded, whatever the api-version; ``next`` moves on, and so does the clock every ``interval`` seconds
if it is > 0; the last document stays. Approvals are matched against the served document and change
nothing. A timeline (``Timeline``) holds control operations to run against the model at given times.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from azuresim.catalogue import STARTED
from azuresim.errors import InvalidRequest
from azuresim.log import Log
from azuresim.schema import TimelineStep, parse_timeline

__all__ = ["PendingStep", "Replay", "Timeline", "parse_replay"]


def parse_replay(text: str, name: str = "replay file") -> tuple[str, list[Any]]:
    """Read a replay file: ``("documents", [doc, ...])`` or ``("timeline", [step, ...])``.

    A ``*.sequence.json`` list of documents, a single document (one object with
    ``DocumentIncarnation`` or ``Events``) or a timeline: a JSON or YAML list of ``{"at": S, ...}``.
    Raises ``InvalidRequest`` naming what is wrong.
    """
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidRequest(f"{name} is neither JSON nor YAML: {exc}") from None
    if isinstance(data, dict) and ("DocumentIncarnation" in data or "Events" in data):
        return "documents", [data]
    if not isinstance(data, list) or not data:
        raise InvalidRequest(f"{name} must hold a document, a list of documents or a list of timeline steps")
    if all(isinstance(item, dict) and "at" in item for item in data):
        parse_timeline(data)
        return "timeline", data
    if any(isinstance(item, dict) and "at" in item for item in data):
        raise InvalidRequest(f"{name} mixes timeline steps and documents")
    return "documents", data


@dataclass
class _Recording:
    documents: list[Any]
    interval: float
    next_at: float | None
    index: int = 0
    approved: set[str] = field(default_factory=set)

    def view(self) -> dict[str, Any]:
        return {
            "active": True,
            "index": self.index,
            "count": len(self.documents),
            "interval": self.interval,
            "at_end": self.index == len(self.documents) - 1,
            "document": copy.deepcopy(self.documents[self.index]),
        }


class Replay:
    """The recorded documents being served, if any. Not locked: callers hold the group's lock."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._recording: _Recording | None = None

    @property
    def active(self) -> bool:
        return self._recording is not None

    def refuse_if_active(self) -> None:
        """Raise ``InvalidRequest``: events, rollouts and incarnation shifts are refused while replaying."""
        if self._recording is not None:
            raise InvalidRequest("the simulator is replaying recorded documents")

    def load(self, documents: Sequence[Any], interval: float, now: float) -> dict[str, Any]:
        """Serve copies of ``documents`` from now on; returns the replay's view."""
        self._recording = _Recording(
            documents=[copy.deepcopy(d) for d in documents],
            interval=interval,
            next_at=now + interval if interval > 0 else None,
        )
        self._record()
        return self._recording.view()

    def next(self, now: float) -> dict[str, Any]:
        """Serve the next document (no change at the last); returns the view. Raises ``InvalidRequest``."""
        recording = self._recording
        if recording is None:
            raise InvalidRequest("no replay loaded")
        if recording.index < len(recording.documents) - 1:
            recording.index += 1
            if recording.interval > 0:
                recording.next_at = now + recording.interval
            self._record()
        return recording.view()

    def view(self) -> dict[str, Any]:
        return self._recording.view() if self._recording is not None else {"active": False}

    def served(self) -> dict[str, Any]:
        """A copy of the document being served; only while ``active``."""
        assert self._recording is not None
        served: dict[str, Any] = copy.deepcopy(self._recording.documents[self._recording.index])
        return served

    def advance(self, now: float) -> None:
        """Move on by as many intervals as have passed."""
        recording = self._recording
        if recording is None:
            return
        while (
            recording.next_at is not None
            and recording.next_at <= now
            and recording.index < len(recording.documents) - 1
        ):
            recording.index += 1
            recording.next_at += recording.interval
            self._record()

    def approve(self, event_ids: Sequence[str]) -> dict[str, str]:
        """Match approvals against the served document; the results are those of ``SimulatedGroup.approve``."""
        assert self._recording is not None
        served = self._recording.documents[self._recording.index]
        statuses = {
            e["EventId"]: e.get("EventStatus")
            for e in (served.get("Events") if isinstance(served, dict) else None) or []
            if isinstance(e, dict) and isinstance(e.get("EventId"), str)
        }
        results: dict[str, str] = {}
        for event_id in event_ids:
            if event_id not in statuses:
                results[event_id] = "unknown"
            elif statuses[event_id] == STARTED:
                results[event_id] = "already_started"
            elif event_id in self._recording.approved:
                results[event_id] = "already_approved"
            else:
                self._recording.approved.add(event_id)
                results[event_id] = "approved"
        return results

    def _record(self) -> None:
        assert self._recording is not None
        served = self._recording.documents[self._recording.index]
        incarnation = served.get("DocumentIncarnation") if isinstance(served, dict) else None
        self._log.record("replay", index=self._recording.index, count=len(self._recording.documents),
                         incarnation=incarnation)


@dataclass(frozen=True)
class PendingStep:
    """A timeline step waiting for ``due`` (simulated epoch seconds); ``index`` is its place in its timeline."""

    due: float
    index: int
    step: TimelineStep

    @property
    def at(self) -> float:
        return self.step.at


class Timeline:
    """Steps to run when the simulated clock reaches them, in time order. Not locked: callers hold the group's lock."""

    def __init__(self) -> None:
        self._pending: list[PendingStep] = []

    def load(self, steps: Sequence[TimelineStep], now: float) -> int:
        """Add ``steps``, each due ``at`` seconds after ``now``; returns how many steps are pending."""
        self._pending.extend(PendingStep(now + step.at, index, step) for index, step in enumerate(steps))
        self._pending.sort(key=lambda p: (p.due, p.index))
        return len(self._pending)

    def pop_due(self, now: float) -> PendingStep | None:
        """The earliest step due at ``now``, removed from the timeline; None when none is due."""
        if self._pending and self._pending[0].due <= now:
            return self._pending.pop(0)
        return None
