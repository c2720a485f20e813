"""The group's records, kept by the leader and by each record's closer: which events are over (their records
marked done) or back (reopened), which VMs are absent or back, and when done records are purged."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.decide.events import ParsedEvent, first_live, in_own_documents
from coordinator.models import EventType
from coordinator.snapshot import Policy, Snapshot, is_gone
from coordinator.store.base import ClusterView, EventRecord

__all__ = ["absences", "closing", "deleted_by", "purge_cutoff", "record_over", "to_archive"]


def closing(
    by_key: Mapping[str, ParsedEvent], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> tuple[list[str], list[str]]:
    """This VM's changes to records on a fresh document: (records to reopen, records to mark done). The
    leader judges every record; the first live member a record names (its closer, ``first_live``) judges
    that one too, since its documents list the event while it is present whatever the delivery. Both may write
    the same change: marking done and reopening are idempotent."""
    reopen: list[str] = []
    mark_done: list[str] = []
    for key, record in cluster.records.items():
        closer = first_live(record.resources, cluster)
        if not cluster.i_am_leader and closer != snap.me:
            continue
        if key in by_key:
            # Back (a flap, or a reused EventId): nothing of before counts. Only on a reading requested after
            # this VM learnt of the done mark: one older than that may still list an event another VM's newer
            # reading no longer does, and the two would undo each other's write on every cycle.
            if record.done_at is not None and snap.read_sent >= snap.done_seen.get(key, float("-inf")):
                reopen.append(key)
        elif record.done_at is None and record_over(key, record, cluster, snap, policy, closer):
            mark_done.append(key)
    return reopen, mark_done


def absences(cluster: ClusterView) -> tuple[list[str], list[str]]:
    """The leader's ``/absent`` marks: (registered VMs newly seen without an agent, those back)."""
    return (sorted(cluster.known - cluster.members - set(cluster.absent_since)),
            sorted(set(cluster.absent_since) & cluster.members))


def record_over(
    key: str, record: EventRecord, cluster: ClusterView, snap: Snapshot, policy: Policy, closer: str | None,
) -> bool:
    """Whether this VM takes an open record's event for over (its record is then marked done).

    One this VM's documents list while it is present (it names this VM, or IMDS shows this VM every event
    of the event's unit: ``in_own_documents``), or listed once, is over once gone from them, whatever this
    VM saw of it before. Any other is left to its closer, the first live member it names, whose documents
    do list it. With no live agent among the VMs it names, it is over once none of them holds it (no ack,
    no ``/out`` node naming it but that of a VM its Terminate deleted: ``deleted_by``) and it was approved
    or its NotBefore has passed."""
    sighting = snap.seen.get(key)
    if sighting is None or sighting.listed or in_own_documents(record, snap, policy):
        return is_gone(sighting, policy.gone_after)
    if closer is not None:
        return False
    if record.acks:
        return False
    if any(key in {e.upper() for e in mark.events} and not deleted_by(record, vm, cluster, snap)
           for vm, mark in cluster.out.items()):
        return False
    return _released(record, snap)


def _released(record: EventRecord, snap: Snapshot) -> bool:
    """Whether the record's event has been released: approved, or its NotBefore has passed (or it has none)."""
    return record.approval is not None or record.not_before is None or snap.now >= record.not_before


def deleted_by(record: EventRecord, vm: str, cluster: ClusterView, snap: Snapshot) -> bool:
    """Whether ``vm`` was deleted by the record's event: a Terminate naming it, released, and the VM runs no
    agent. Its ``/out`` node then has nobody left to delete it, and holds the record no longer."""
    return (record.event_type == EventType.TERMINATE and vm in record.resources and vm not in cluster.members
            and _released(record, snap))


def to_archive(snap: Snapshot, cluster: ClusterView | None, policy: Policy) -> tuple[str, ...]:
    """The done records the leader moves out of ``/events`` into the history (``Store.archive_done``), so
    that the records the VMs an event names read are the open ones and those just done, not every record
    of ``done_retention``. A record goes once nothing holds it: ``archive_after`` after its done mark
    (``recovery_grace`` when none of the VMs it names runs an agent, whose unit's documents may list a
    finished event a while: the VM that published it might publish it again), and no VM that the budget
    counts, or would count without the record, is out of rotation for it or acknowledges it: a member, or
    a VM whose agent has been gone less than ``recovery_grace`` (a VM its Terminate deleted among them,
    which the budget leaves out only while the record says so)."""
    if cluster is None or not cluster.i_am_leader or not cluster.weighs_group:
        return ()

    def counted(vm: str) -> bool:
        return vm in cluster.members or snap.absent_for.get(vm, 0.0) < policy.recovery_grace

    held = {key for vm, mark in cluster.out.items() if counted(vm) for key in (e.upper() for e in mark.events)}
    found = []
    for key, record in sorted(cluster.records.items()):
        if record.done_at is None or key in held or any(counted(vm) for vm in record.acks):
            continue
        after = policy.archive_after if first_live(record.resources, cluster) is not None else policy.recovery_grace
        if snap.now - record.done_at >= after:
            found.append(key)
    return tuple(found)


def purge_cutoff(snap: Snapshot, cluster: ClusterView | None, policy: Policy) -> float | None:
    """The leader purges records done before the retention cutoff, and only when its view shows one:
    an idle group costs ZooKeeper no periodic sweep of every record."""
    if cluster is None or not cluster.i_am_leader:
        return None
    cutoff = snap.now - policy.done_retention
    expired = any(r.done_at is not None and r.done_at < cutoff for r in cluster.records.values())
    return cutoff if expired else None
