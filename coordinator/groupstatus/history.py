"""From one read of the group to its history (``coordinator status --history``): every record marked done
that the store still keeps, newest first, each with its timeline in the group's own words.

Everything comes from the record itself (``EventRecord``), as the agents left it: announced
(``published_at``, ``published_by``), gone (``done_at``), and what ``mark_done`` kept in the same rewrite
for the history: the admission and the approval it deleted, with the acks the approval was released on
(``EventRecord.closed``), and when the closing agent first saw the event Started in its own documents
(``started_at``). A record marked done by an agent of an earlier version keeps none of these: they are
shown as not recorded, never as absent.

A finished record is kept until the leader purges it, ``done_retention_seconds`` after it was done: the
history is as long as that, and no longer.
"""

from __future__ import annotations

from coordinator.decide import Policy
from coordinator.groupstatus.model import GroupHistory, HistoryAdmission, HistoryApproval, HistoryEntry, utc
from coordinator.groupstatus.read import GroupRead
from coordinator.store.base import EventRecord

__all__ = ["build_history", "history_entry"]


def build_history(read: GroupRead, policy: Policy, policy_source: str) -> GroupHistory:
    """The history of one read: the records marked done, latest done first."""
    done = [record for record in read.view.records.values() if record.done_at is not None]
    done.sort(key=lambda r: (r.done_at or 0.0, r.event_id), reverse=True)
    return GroupHistory(
        cluster=read.cluster, base_path=read.base_path, zookeeper=read.hosts, read_at=utc(read.read_at),
        read_only_server=read.read_only_server, policy=policy_source, budgeted=policy.budgeted,
        kept_for_seconds=policy.done_retention, events=[history_entry(record) for record in done],
    )


def history_entry(record: EventRecord) -> HistoryEntry:
    """One record marked done as a history entry."""
    assert record.done_at is not None
    closed = record.closed
    admitted = approval = None
    if closed is not None and closed.admitted_at is not None:
        admitted = HistoryAdmission(at=utc(closed.admitted_at), by=closed.admitted_by)
    if closed is not None and closed.approval is not None:
        given = closed.approval
        unknown = given.by == "?" and given.at == 0.0  # an approval node that did not parse (``ApprovalNode.unknown``)
        acked_at = {vm: utc(t) for vm, t in sorted(given.acked_at.items())} if given.acked_at is not None else None
        approval = HistoryApproval(by=given.by, at=None if unknown else utc(given.at), as_leader=given.as_leader,
                                   acks=list(given.acks) if given.acks is not None else None, acked_at=acked_at,
                                   vouched=list(given.vouched) if given.vouched is not None else None,
                                   reason=given.reason, vouched_by=given.vouched_by)
    return HistoryEntry(
        event_id=record.event_id,
        type=record.event_type,
        resources=list(record.resources),
        not_before=utc(record.not_before) if record.not_before is not None else None,
        published_by=record.published_by,
        published_at=utc(record.published_at),
        recorded=closed is not None,
        admitted=admitted,
        approval=approval,
        started_at=utc(record.started_at) if record.started_at is not None else None,
        done_at=utc(record.done_at),
    )
