"""From Resource Graph's events and the groups' statuses to the ``FleetStatus``: pure, no I/O.

Each VM an event names is looked up, case-insensitively, among the groups' live members (its agent runs
there), else among the VMs registered in a group (its agent ran there once). A scale-set instance is named
``{scaleSetName}_{instanceId}`` in ``Resources`` as in an agent's VM name, so the names compare as they are.
Each group's record of the event (same EventId, case-insensitively) comes with what ``coordinator status``
works out (``coordinator.groupstatus.analyse.build_status``): state, approver, acks, admission, approval and
the reasons it is held. A pending event none of whose VMs runs an agent goes to ``uncoordinated``: no
group holds it, it starts at NotBefore (or when Azure decides, for a Started one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.azure_graph import GraphEvent
from coordinator.fleet.model import FleetEvent, FleetGroup, FleetStatus, FleetVm, GroupRecord, UnlistedRecord
from coordinator.groupstatus.model import EventStatus, GroupStatus, utc

__all__ = ["ClusterRead", "build_fleet"]


@dataclass(frozen=True)
class ClusterRead:
    """One cluster under the root: its status, or why it could not be read."""

    cluster: str
    status: GroupStatus | None = None
    error: str | None = None


def build_fleet(events: Sequence[GraphEvent], groups: Sequence[ClusterRead], *, read_at: float,
                subscriptions: Sequence[str], zookeeper: str, root: str, finished_hours: float, policy: str,
                skipped_rows: Sequence[str] = ()) -> FleetStatus:
    live: dict[str, str] = {}
    registered: dict[str, str] = {}
    records: dict[str, list[tuple[str, EventStatus]]] = {}
    for group in groups:
        if group.status is None:
            continue
        for member in group.status.members:
            live.setdefault(member.vm.lower(), group.cluster)
        for vm in group.status.registered:
            registered.setdefault(vm.lower(), group.cluster)
        for record in [*group.status.events, *group.status.done]:
            records.setdefault(record.event_id.upper(), []).append((group.cluster, record))

    def fleet_event(event: GraphEvent) -> FleetEvent:
        vms = []
        for name in event.resources:
            key = name.lower()
            vms.append(FleetVm(vm=name, group=live.get(key) or registered.get(key), agent=key in live))
        held = [_record(cluster, record) for cluster, record in records.get(event.event_id.upper(), [])]
        return FleetEvent(
            event_id=event.event_id, type=event.event_type, status=event.status,
            not_before=utc(event.not_before) if event.not_before is not None else None,
            not_before_in_seconds=event.not_before - read_at if event.not_before is not None else None,
            updated_at=utc(event.updated_at) if event.updated_at is not None else None,
            unit=event.unit, subscription=event.subscription, resource_group=event.resource_group,
            description=event.description, source=event.source, vms=vms, records=held)

    shown = [fleet_event(e) for e in events]
    pending = sorted((e for e in shown if e.status in ("Scheduled", "Started")), key=_soonest)
    finished = sorted((e for e in shown if e.status not in ("Scheduled", "Started")),
                      key=lambda e: (e.updated_at is None, -(e.updated_at.timestamp() if e.updated_at else 0.0),
                                     e.event_id))
    listed = {e.event_id.upper() for e in events}
    unlisted = [
        UnlistedRecord(cluster=group.cluster, event_id=record.event_id, type=record.type,
                       resources=list(record.resources), state=record.state, not_before=record.not_before)
        for group in groups if group.status is not None
        for record in group.status.events if record.event_id.upper() not in listed
    ]
    return FleetStatus(
        read_at=utc(read_at), subscriptions=list(subscriptions), zookeeper=zookeeper, root=root,
        finished_hours=finished_hours, policy=policy, groups=[_group(g) for g in groups],
        events=[e for e in pending if any(vm.agent for vm in e.vms)],
        uncoordinated=[e for e in pending if not any(vm.agent for vm in e.vms)],
        finished=finished, unlisted=unlisted, skipped_rows=list(skipped_rows))


def _soonest(event: FleetEvent) -> tuple[int, float, str]:
    """Started first, then by NotBefore."""
    if event.status == "Started" or event.not_before is None:
        return 0, 0.0, event.event_id
    return 1, event.not_before.timestamp(), event.event_id


def _record(cluster: str, record: EventStatus) -> GroupRecord:
    return GroupRecord(cluster=cluster, state=record.state, approver=record.approver,
                       acks=[ack.vm for ack in record.acks], missing_acks=list(record.missing_acks),
                       admitted_at=record.admitted_at, approval=record.approval, done_at=record.done_at,
                       blockers=list(record.blockers))


def _group(group: ClusterRead) -> FleetGroup:
    status = group.status
    if status is None:
        return FleetGroup(cluster=group.cluster, members=[], registered=[], leader=None, paused=None,
                          error=group.error or "not read")
    paused = None
    if status.paused is not None:
        paused = f"by {status.paused.by}: {status.paused.reason}"
    return FleetGroup(cluster=group.cluster, members=[m.vm for m in status.members], registered=list(status.registered),
                      leader=status.leader.vm if status.leader is not None else None, paused=paused, error=None)
