"""The decision function: what should be true, given what this cycle observed.

``decide(snapshot, local, policy) -> Plan`` is pure: no I/O, no clock reads, no randomness. The agent
loop builds the snapshot, calls it, and carries out the plan. Because every cycle recomputes the plan
from the current document and the current cluster view (level-triggered), a restart, a missed watch,
a duplicate document or a new leader need no special code.

The safety rules live here and nowhere else:

* An event is approved only by its approver, only while Scheduled in a document read *this* cycle,
  only when it is of a known type, names at least one VM, and every VM it names has acknowledged, and
  only while the ZooKeeper connection is CONNECTED. The store re-checks the acks and this agent's
  ownership of its member or leader node with a synced read right before the POST (see
  ``Store.approve``).
* A VM named by any event in the document (any status, any type, valid id or not) is drained. A VM is
  put back only when a document read *this* cycle names it in no event; a failed read keeps it as it
  is. A fresh process starts in ``UNKNOWN`` and fails the health probe until such a document is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.config import ApproverMode
from coordinator.errors import InvalidName
from coordinator.models import Document, ScheduledEvent
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import ClusterView, ConnectionState, EventRecord

__all__ = ["ApprovalIntent", "LocalState", "Phase", "Plan", "Policy", "Snapshot", "choose_approver", "decide"]


class Phase(StrEnum):
    """This VM's own drain state. Only SERVING answers the health probe with 200."""

    UNKNOWN = "unknown"  # just started: no document read yet that clears the VM
    SERVING = "serving"
    DRAINING = "draining"  # drain actions running, or waiting out drain.wait_seconds
    DRAINED = "drained"  # drained and waited: acknowledgements may be written
    RECOVERING = "recovering"  # recover actions running


@dataclass(frozen=True)
class LocalState:
    phase: Phase = Phase.UNKNOWN
    phase_since: float = 0.0  # monotonic time the phase began
    job_running: bool = False  # the executor is still running this phase's actions
    job_failed: bool = False  # the last drain/recover job of this phase failed
    posted: frozenset[str] = frozenset()  # event ids this process has POSTed successfully


@dataclass(frozen=True)
class Snapshot:
    me: str
    now: float  # wall clock, epoch seconds
    mono: float  # monotonic clock
    document: Document | None  # read this cycle; None if the read failed
    last_document: Document | None  # the last document that parsed, possibly this one
    cluster: ClusterView | None  # None if the store could not be read this cycle


@dataclass(frozen=True)
class Policy:
    approver: ApproverMode = ApproverMode.FIRST_RESOURCE
    drain_wait: float = 35.0
    recover_retry: float = 5.0
    done_retention: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class ApprovalIntent:
    event_id: str  # exactly as IMDS spelled it: it goes back in the POST
    key: str  # normalized id: the store key
    required: tuple[str, ...]  # VMs whose acks the store must see right before the POST
    as_leader: bool


@dataclass(frozen=True)
class Plan:
    next_phase: Phase | None = None
    start_drain: bool = False
    start_recover: bool = False
    publish: tuple[EventRecord, ...] = ()
    ack: tuple[str, ...] = ()
    withdraw: tuple[str, ...] = ()
    approve: tuple[ApprovalIntent, ...] = ()
    mark_done: tuple[str, ...] = ()
    purge_before: float | None = None
    holding: tuple[str, ...] = ()  # ids of the events that hold this VM drained
    approvers: Mapping[str, str] = field(default_factory=dict)  # event key -> approver (or "")
    blocked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # event key -> reasons
    invalid: tuple[str, ...] = ()  # why some events cannot be coordinated

    @property
    def acts(self) -> bool:
        """True if carrying out the plan changes anything (the cycle is then logged at INFO)."""
        return bool(
            self.next_phase
            or self.start_drain
            or self.start_recover
            or self.publish
            or self.ack
            or self.withdraw
            or self.approve
            or self.mark_done
        )

    def describe(self) -> str:
        parts: list[str] = []
        if self.start_drain:
            parts.append(f"drain for {','.join(self.holding)}")
        if self.start_recover:
            parts.append("recover")
        if self.next_phase and not (self.start_drain or self.start_recover):
            parts.append(f"-> {self.next_phase.value}")
        if self.publish:
            parts.append("publish " + ",".join(r.event_id for r in self.publish))
        if self.ack:
            parts.append("ack " + ",".join(self.ack))
        if self.withdraw:
            parts.append("withdraw ack " + ",".join(self.withdraw))
        if self.approve:
            parts.append("approve " + ",".join(i.event_id for i in self.approve))
        if self.mark_done:
            parts.append("done " + ",".join(self.mark_done))
        for key, reasons in sorted(self.blocked.items()):
            parts.append(f"{key} waits: {'; '.join(reasons)}")
        return "; ".join(parts) if parts else "nothing to do"


def choose_approver(
    resources: tuple[str, ...], cluster: ClusterView, mode: ApproverMode
) -> tuple[str | None, bool]:
    """The approver of an event and whether it approves as leader.

    first-resource: the first VM of ``Resources`` (document order) that is a live member; if none
    is, the leader. leader: always the leader. ``None`` when the approver is the leader and there is
    no leader.
    """
    if mode is ApproverMode.FIRST_RESOURCE:
        for vm in resources:
            if vm in cluster.members:
                return vm, False
    return cluster.leader, True


def _resources(event: ScheduledEvent) -> tuple[tuple[str, ...], list[str]]:
    names: list[str] = []
    problems: list[str] = []
    for raw in event.resources:
        try:
            name = normalize_vm_name(raw)
        except InvalidName as exc:
            problems.append(str(exc))
            continue
        if name not in names:
            names.append(name)
    return tuple(names), problems


def _record(event: ScheduledEvent, key: str, resources: tuple[str, ...], snap: Snapshot) -> EventRecord:
    return EventRecord(
        event_id=key,
        event_type=event.event_type,
        resources=resources,
        not_before=event.not_before.timestamp() if event.not_before else None,
        published_by=snap.me,
        published_at=snap.now,
    )


def _local(snap: Snapshot, local: LocalState, policy: Policy, holding: bool) -> tuple[Phase | None, bool, bool]:
    """This VM's drain state machine: (next phase, start drain, start recover)."""
    phase = local.phase
    if holding:
        if phase in (Phase.UNKNOWN, Phase.SERVING, Phase.RECOVERING):
            return Phase.DRAINING, True, False
        waited = snap.mono - local.phase_since >= policy.drain_wait
        if phase is Phase.DRAINING and not local.job_running and not local.job_failed and waited:
            return Phase.DRAINED, False, False
        return None, False, False
    if snap.document is None:
        return None, False, False  # no fresh evidence that the VM is free: keep it as it is
    if phase in (Phase.UNKNOWN, Phase.DRAINING, Phase.DRAINED):
        return Phase.RECOVERING, False, True
    if phase is Phase.RECOVERING and not local.job_running:
        if local.job_failed:
            if snap.mono - local.phase_since >= policy.recover_retry:
                return Phase.RECOVERING, False, True
            return None, False, False
        return Phase.SERVING, False, False
    return None, False, False


def decide(snap: Snapshot, local: LocalState, policy: Policy) -> Plan:
    doc = snap.document
    basis = doc if doc is not None else snap.last_document
    events = basis.events if basis is not None else ()
    holding_events = [e for e in events if e.names(snap.me)]
    next_phase, start_drain, start_recover = _local(snap, local, policy, bool(holding_events))
    phase_after = next_phase or local.phase

    cluster = snap.cluster
    publish: list[EventRecord] = []
    ack: list[str] = []
    withdraw: list[str] = []
    approve: list[ApprovalIntent] = []
    mark_done: list[str] = []
    approvers: dict[str, str] = {}
    blocked: dict[str, tuple[str, ...]] = {}
    invalid: list[str] = []
    present: set[str] = set()

    for event in events:
        try:
            key = normalize_event_id(event.event_id)
        except InvalidName as exc:
            invalid.append(str(exc))
            continue
        present.add(key)
        resources, bad_names = _resources(event)
        if bad_names:
            invalid.extend(f"event {key}: {p}" for p in bad_names)
        if cluster is None:
            continue
        record = cluster.records.get(key)
        published_now = False
        if record is None and doc is not None:
            publish.append(_record(event, key, resources, snap))
            published_now = True
        mine = event.names(snap.me)
        if mine and phase_after is Phase.DRAINED and (published_now or (record and snap.me not in record.acks)):
            ack.append(key)
        if doc is None or not event.is_scheduled:
            continue
        approver, as_leader = choose_approver(resources, cluster, policy.approver)
        approvers[key] = approver or ""
        reasons = _approval_blockers(event, resources, bad_names, record, published_now, ack, snap, cluster)
        if approver is None:
            reasons += ("no live agent named in Resources and no leader",)
        if approver != snap.me or event.event_id in local.posted:
            if reasons:
                blocked[key] = reasons
            continue
        if reasons:
            blocked[key] = reasons
            continue
        approve.append(ApprovalIntent(event.event_id, key, resources, as_leader))

    if cluster is not None and doc is not None:
        for key, record in cluster.records.items():
            if key in present:
                continue
            if snap.me in record.acks:
                withdraw.append(key)
            if cluster.i_am_leader and record.done_at is None:
                mark_done.append(key)

    return Plan(
        next_phase=next_phase,
        start_drain=start_drain,
        start_recover=start_recover,
        publish=tuple(publish),
        ack=tuple(ack),
        withdraw=tuple(withdraw),
        approve=tuple(approve),
        mark_done=tuple(mark_done),
        purge_before=(snap.now - policy.done_retention) if cluster and cluster.i_am_leader else None,
        holding=tuple(e.event_id for e in holding_events),
        approvers=approvers,
        blocked=blocked,
        invalid=tuple(invalid),
    )


def _approval_blockers(
    event: ScheduledEvent,
    resources: tuple[str, ...],
    bad_names: list[str],
    record: EventRecord | None,
    published_now: bool,
    acking_now: list[str],
    snap: Snapshot,
    cluster: ClusterView,
) -> tuple[str, ...]:
    """Why an approver may not approve this Scheduled event now (empty: it may)."""
    if not event.is_known_type:
        return (f"unknown event type {event.event_type!r} is never approved early",)
    if bad_names:
        return ("Resources holds a name that is not a valid VM name",)
    if not resources:
        return ("Resources is empty: nobody known to drain",)
    if record is None and not published_now:
        return ("event record not readable",)
    acks = record.acks if record is not None else {}
    reasons = []
    for vm in resources:
        if vm in acks:
            continue
        if vm == snap.me and normalize_event_id(event.event_id) in acking_now:
            continue  # acknowledged in this very cycle; Store.approve re-checks before the POST
        reasons.append(f"{vm} runs no agent" if vm not in cluster.members else f"{vm} has not drained")
    if cluster.connection is not ConnectionState.CONNECTED:
        reasons.append(f"ZooKeeper connection {cluster.connection.value}")
    return tuple(reasons)
