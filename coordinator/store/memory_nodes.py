"""The nodes of the in-memory store's "ensemble" (``coordinator.store.memory``): a member, the leader, and an
event record with its acks, approval and admission, each held by the session that made it where ZooKeeper
makes it ephemeral."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from coordinator.store.base import Approval, EventRecord

__all__ = ["_Event", "_Leader", "_Member", "archive", "purge"]


@dataclass
class _Member:
    session: int
    info: dict[str, object]
    since: float | None = None  # when the node was created (by the store's clock)


@dataclass
class _Leader:
    vm: str
    session: int
    since: float


@dataclass
class _Event:
    record: EventRecord  # without acks, approval and admission
    acks: dict[str, tuple[float, int]] = field(default_factory=dict)  # vm -> (at, owning session)
    approval: Approval | None = None
    admitted: tuple[str, float] | None = None  # (by, at)


def archive(events: dict[str, _Event], history: dict[str, EventRecord], event_ids: Collection[str],
            older_than: float) -> int:
    """Move the done records of ``event_ids`` from ``events`` to ``history`` and drop the history's records
    done before ``older_than`` (``Store.archive_done``). Returns how many records were moved."""
    moved = [key for key in (e.upper() for e in event_ids) if key in events and events[key].record.done_at]
    history.update((key, events.pop(key).record) for key in moved)
    for key in [key for key, record in history.items() if (record.done_at or 0.0) < older_than]:
        del history[key]
    return len(moved)


def purge(events: dict[str, _Event], older_than: float) -> int:
    """Delete the records done before ``older_than`` (``Store.purge_done``). Returns how many."""
    doomed = [key for key, event in events.items()
              if event.record.done_at is not None and event.record.done_at < older_than]
    for key in doomed:
        del events[key]
    return len(doomed)
