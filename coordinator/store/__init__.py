"""Coordination store: the contract (``base``) and its ZooKeeper implementation (``zookeeper``)."""

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
