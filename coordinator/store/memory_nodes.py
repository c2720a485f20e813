"""The nodes of the in-memory store's "ensemble" (``coordinator.store.memory``): a member, the leader, and an
event record with its acks, approval and admission, each held by the session that made it where ZooKeeper
makes it ephemeral."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.store.base import Approval, EventRecord

__all__ = ["_Event", "_Leader", "_Member"]


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
