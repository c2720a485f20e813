"""Coordination store: the contract (``base``), ZooKeeper (``zookeeper``) and in-memory (``memory``)."""

from coordinator.store.base import (
    Approval,
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    Store,
    WriteResult,
)

__all__ = [
    "Approval",
    "ApprovalOutcome",
    "ApprovalResult",
    "ClusterView",
    "ConnectionState",
    "EventRecord",
    "Store",
    "WriteResult",
]
