"""The group's records, kept by the leader: which events are over (their records marked done) or back
(reopened), which VMs are absent or back, and when done records are purged."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.decide.events import _Event, _in_own_documents, shows_every_event
from coordinator.snapshot import Policy, Snapshot, is_gone
from coordinator.store.base import ClusterView, EventRecord

__all__ = ["_absences", "_closing", "_over", "_purge_before"]


def _closing(
    by_key: Mapping[str, _Event], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> tuple[list[str], list[str]]:
    """The leader's changes to records on a fresh document: (records to reopen, records to mark done)."""
    reopen: list[str] = []
    mark_done: list[str] = []
    every_event = shows_every_event(cluster)
    for key, record in cluster.records.items():
        if key in by_key:
            if record.done_at is not None:
                reopen.append(key)  # back (a flap, or a reused EventId): nothing of before counts
        elif record.done_at is None and _over(key, record, cluster, snap, policy, every_event):
            mark_done.append(key)
    return reopen, mark_done


def _absences(cluster: ClusterView) -> tuple[list[str], list[str]]:
    """The leader's ``/absent`` marks: (registered VMs newly seen without an agent, those back)."""
    return (sorted(cluster.known - cluster.members - set(cluster.absent_since)),
            sorted(set(cluster.absent_since) & cluster.members))


def _over(
    key: str, record: EventRecord, cluster: ClusterView, snap: Snapshot, policy: Policy, every_event_shown: bool,
) -> bool:
    """Whether the leader takes an open record's event for over (its record is then marked done). One its
    documents listed, or would list while it is present (it names the leader, or the group shows every VM
    every event: ``_in_own_documents``), is over once gone from them, whatever the leader saw of it before.
    One they would never list (IMDS shows it only to the VMs it names) is over once none of those VMs
    holds it (no ack, no ``/out`` node naming it) and it was approved or its NotBefore has passed: its VMs
    hold it from their drain until it is gone for them."""
    sighting = snap.seen.get(key)
    if sighting is None or sighting.listed or _in_own_documents(record, snap, every_event_shown):
        return is_gone(sighting, policy.gone_after)
    if record.acks or any(key in {e.upper() for e in mark.events} for mark in cluster.out.values()):
        return False
    return record.approval is not None or record.not_before is None or snap.now >= record.not_before


def _purge_before(snap: Snapshot, cluster: ClusterView | None, policy: Policy) -> float | None:
    """The leader purges records done before the retention cutoff, and only when its view shows one:
    an idle group costs ZooKeeper no periodic sweep of every record."""
    if cluster is None or not cluster.i_am_leader:
        return None
    cutoff = snap.now - policy.done_retention
    expired = any(r.done_at is not None and r.done_at < cutoff for r in cluster.records.values())
    return cutoff if expired else None
