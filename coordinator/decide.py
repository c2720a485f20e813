"""The decision function: what should be true, given what this cycle observed.

``decide(snapshot, local, policy) -> Plan`` is pure: no I/O, no clock reads, no randomness. The agent
loop builds the snapshot, calls it, and carries out the plan. Because every cycle recomputes the plan
from the current document and the current cluster view (level-triggered), a restart, a missed watch,
a duplicate document or a new leader need no special code.

The safety rules live here and nowhere else:

* An event is approved only by its approver, only while Scheduled in a document read *this* cycle,
  only when it is of a known type, names at least one VM, its rule allows it, the disruption budget
  admitted it, every VM it names has acknowledged (unless its rule is ``immediately``), and only while
  the ZooKeeper connection is CONNECTED. The store re-checks the acks and this agent's ownership of its
  member or leader node with a synced read right before the POST (see ``Store.approve``).
* A VM drains for an event that names it when the event is Started (it is being hit), when the
  budget admitted it (or there is no budget), or at the latest ``latest_start`` before NotBefore,
  whatever the budget and ZooKeeper say. Once draining for an event it stays drained until that event
  is gone from a document read this cycle; a failed read changes nothing. A fresh process starts in
  ``UNKNOWN`` and fails the health probe until such a document clears it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.config import ApprovalRule, ApproverMode, PeersPolicy
from coordinator.errors import InvalidName
from coordinator.models import Document, EventSource, EventType, ScheduledEvent
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import ClusterView, ConnectionState, EventRecord

__all__ = [
    "ApprovalIntent",
    "LocalState",
    "Phase",
    "Plan",
    "Policy",
    "Snapshot",
    "choose_approver",
    "decide",
    "rule_for",
]


class Phase(StrEnum):
    """This VM's own drain state. Only SERVING answers the health probe with 200."""

    UNKNOWN = "unknown"  # just started: no document read yet that clears the VM
    SERVING = "serving"
    DRAINING = "draining"  # drain actions running
    DRAINED = "drained"  # drain actions done; acks follow once each event's drain wait is over
    RECOVERING = "recovering"  # recover actions running


@dataclass(frozen=True)
class LocalState:
    phase: Phase = Phase.UNKNOWN
    phase_since: float = 0.0  # monotonic time the phase began
    drain_started: float = 0.0  # monotonic time the current drain began
    job_running: bool = False  # the executor is still running this phase's actions
    job_failed: bool = False  # the last drain/recover job of this phase failed
    draining_for: frozenset[str] = frozenset()  # ids of the events this VM is drained for
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
    approval: Mapping[str, ApprovalRule] = field(default_factory=dict)
    freeze_immediately_below: float | None = None
    unknown_peers: PeersPolicy = PeersPolicy.BLOCK
    absent_grace: float | None = None
    drain_wait: float = 35.0
    drain_wait_by_type: Mapping[str, float] = field(default_factory=dict)
    latest_start: float = 120.0
    lead_time: float | None = None
    max_events: int | None = 1
    max_vms: int | None = None
    keep_one_serving: bool = True
    recovery_grace: float = 600.0
    terminate_together: bool = True
    recover_retry: float = 5.0
    done_retention: float = 7 * 24 * 3600.0

    @property
    def budgeted(self) -> bool:
        return self.max_events is not None or self.max_vms is not None

    def wait_for(self, event: ScheduledEvent) -> float:
        return self.drain_wait_by_type.get(event.event_type, self.drain_wait)


def rule_for(event: ScheduledEvent, policy: Policy) -> ApprovalRule:
    """The approval rule of an event: ``User`` wins over the type; unknown types are never approved."""
    if not event.is_known_type:
        return ApprovalRule.NEVER
    if event.event_source == EventSource.USER and "User" in policy.approval:
        return policy.approval["User"]
    duration = event.duration_in_seconds
    if (
        event.event_type == EventType.FREEZE
        and policy.freeze_immediately_below is not None
        and duration is not None
        and 0 <= duration < policy.freeze_immediately_below
    ):
        return ApprovalRule.IMMEDIATELY
    return policy.approval.get(event.event_type, ApprovalRule.AFTER_DRAIN)


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
    admit: tuple[str, ...] = ()
    ack: tuple[str, ...] = ()
    withdraw: tuple[str, ...] = ()
    approve: tuple[ApprovalIntent, ...] = ()
    mark_done: tuple[str, ...] = ()
    mark_absent: tuple[str, ...] = ()
    clear_absent: tuple[str, ...] = ()
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
            or self.admit
            or self.ack
            or self.withdraw
            or self.approve
            or self.mark_done
            or self.mark_absent
            or self.clear_absent
        )

    def describe(self) -> str:
        parts: list[str] = []
        if self.start_drain:
            parts.append(f"drain for {','.join(self.holding)}")
        if self.start_recover:
            parts.append("recover")
        if self.next_phase and not (self.start_drain or self.start_recover):
            parts.append(f"-> {self.next_phase.value}")
        for label, items in (("publish", [r.event_id for r in self.publish]), ("admit", self.admit),
                             ("ack", self.ack), ("withdraw ack", self.withdraw),
                             ("approve", [i.event_id for i in self.approve]), ("done", self.mark_done),
                             ("absent", self.mark_absent), ("back", self.clear_absent)):
            if items:
                parts.append(f"{label} {','.join(items)}")
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


@dataclass(frozen=True)
class _Event:
    """One event of the document with everything derived from it once."""

    event: ScheduledEvent
    key: str | None  # None: the id is not safe to use in ZooKeeper
    resources: tuple[str, ...]  # valid names, normalized, in document order
    bad_names: tuple[str, ...]
    rule: ApprovalRule


def _parse(event: ScheduledEvent, policy: Policy) -> tuple[_Event, list[str]]:
    problems: list[str] = []
    try:
        key: str | None = normalize_event_id(event.event_id)
    except InvalidName as exc:
        key = None
        problems.append(str(exc))
    names: list[str] = []
    bad: list[str] = []
    for raw in event.resources:
        try:
            name = normalize_vm_name(raw)
        except InvalidName as exc:
            bad.append(raw)
            problems.append(f"event {key or event.event_id[:40]!r}: {exc}")
            continue
        if name not in names:
            names.append(name)
    return _Event(event, key, tuple(names), tuple(bad), rule_for(event, policy)), problems


def _record(ev: _Event, snap: Snapshot) -> EventRecord:
    assert ev.key is not None
    return EventRecord(
        event_id=ev.key,
        event_type=ev.event.event_type,
        resources=ev.resources,
        not_before=ev.event.not_before.timestamp() if ev.event.not_before else None,
        published_by=snap.me,
        published_at=snap.now,
    )


def _drains(ev: _Event, snap: Snapshot, local: LocalState, policy: Policy) -> bool:
    """Whether this VM, named by ``ev``, must be drained for it now."""
    event = ev.event
    if event.event_id in local.draining_for:
        return True  # never put back while the event is present
    if ev.rule is ApprovalRule.IMMEDIATELY and ev.key is not None:
        return False  # a short impact approved at once: draining would cost more than it saves
    if not event.is_scheduled or ev.key is None or event.not_before is None:
        return True  # being hit now, or cannot be coordinated: the safe side
    not_before = event.not_before.timestamp()
    if snap.now >= not_before - policy.latest_start:
        return True  # no more waiting, whatever the budget or ZooKeeper say
    if policy.budgeted:
        record = snap.cluster.records.get(ev.key) if snap.cluster else None
        if record is None or record.admitted_at is None:
            return False  # not admitted (or unknown): drain late rather than break the budget
    if policy.lead_time is not None:
        return snap.now >= not_before - policy.lead_time
    return True


def _local(snap: Snapshot, local: LocalState, policy: Policy, holding: bool) -> tuple[Phase | None, bool, bool]:
    """This VM's drain state machine: (next phase, start drain, start recover)."""
    phase = local.phase
    if holding:
        if phase in (Phase.UNKNOWN, Phase.SERVING, Phase.RECOVERING):
            return Phase.DRAINING, True, False
        if phase is Phase.DRAINING and not local.job_running and not local.job_failed:
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


def _in_flight(
    events: Mapping[str, _Event], cluster: ClusterView, now: float, policy: Policy
) -> dict[str, frozenset[str]]:
    """Events that hold budget, with their VMs: admitted, Started or drained-for and still present, or
    gone but with VMs that have not recovered yet (an ack whose agent is down counts only for
    ``recovery_grace`` after the event ended: it may be rebooting, or may never come back)."""
    flight: dict[str, frozenset[str]] = {}
    # A VM that goes from a finished event straight into the next one counts once, with the event
    # that holds it now: its ack of the finished one stays until it serves again.
    named_now = frozenset().union(*(ev.resources for ev in events.values()))
    for key, record in cluster.records.items():
        ev = events.get(key)
        if ev is not None:
            if record.admitted_at is not None or not ev.event.is_scheduled or record.acks:
                flight[key] = frozenset(ev.resources)
            continue
        pending = {
            vm for vm in record.acks
            if vm not in named_now
            and (vm in cluster.members or (record.done_at is not None and now - record.done_at < policy.recovery_grace))
        }
        if pending:
            flight[key] = frozenset(pending)
    return flight


def _unit(key: str, events: Mapping[str, _Event], policy: Policy) -> str:
    """What the budget counts as one: an event, or a batch of Terminates sharing one NotBefore (Azure
    runs such a batch as one operation)."""
    ev = events.get(key)
    if (policy.terminate_together and ev is not None and ev.event.event_type == EventType.TERMINATE
            and ev.event.not_before is not None):
        return f"terminate@{ev.event.not_before.timestamp():.0f}"
    return key


def _admissions(
    events: Mapping[str, _Event], cluster: ClusterView, now: float, policy: Policy
) -> tuple[list[str], dict[str, str]]:
    """The leader's admissions and why the others wait.

    Candidates are Scheduled events with a record, not yet admitted, that need a drain. Those already
    holding their VMs (drained just in time, or acknowledged) come first, then first come (NotBefore,
    then id) first served; a Terminate batch is admitted as one. Nothing behind a waiting unit jumps
    ahead of it.
    """
    flight = _in_flight(events, cluster, now, policy)
    candidates = [ev for key, ev in events.items()
                  if ev.event.is_scheduled and ev.rule is not ApprovalRule.IMMEDIATELY and ev.resources
                  and key in cluster.records and cluster.records[key].admitted_at is None]
    units: dict[str, list[_Event]] = {}
    for ev in candidates:
        units.setdefault(_unit(ev.key or "", events, policy), []).append(ev)
    order = sorted(units.items(), key=lambda item: (
        not any(ev.key in flight for ev in item[1]),
        min(ev.event.not_before.timestamp() if ev.event.not_before else float("inf") for ev in item[1]),
        item[0],
    ))
    admit: list[str] = []
    why: dict[str, str] = {}
    for position, (_, members) in enumerate(order):
        keys = {ev.key or "" for ev in members}
        vms = frozenset().union(*(ev.resources for ev in members))
        others = {k: v for k, v in flight.items() if k not in keys}
        busy = frozenset().union(*others.values()) if others else frozenset()
        in_maintenance = {_unit(k, events, policy) for k in others}
        reason = ""
        if policy.max_events is not None and len(in_maintenance) >= policy.max_events:
            reason = f"maintenance budget: {len(in_maintenance)} event(s) in maintenance ({', '.join(sorted(others))})"
        elif policy.max_vms is not None and others and len(busy | vms) > policy.max_vms:
            reason = f"maintenance budget: {len(busy)} VM(s) in maintenance, at most {policy.max_vms}"
        elif policy.keep_one_serving and cluster.members and not (cluster.members - busy - vms):
            reason = "it would leave no VM serving"
        if reason:
            for _, rest in order[position:]:
                for ev in rest:
                    why[ev.key or ""] = reason
            break
        admit.extend(sorted(keys))
        for ev in members:
            flight[ev.key or ""] = frozenset(ev.resources)
    return admit, why


def decide(snap: Snapshot, local: LocalState, policy: Policy) -> Plan:
    doc = snap.document
    basis = doc if doc is not None else snap.last_document
    parsed: list[_Event] = []
    invalid: list[str] = []
    for event in basis.events if basis is not None else ():
        ev, problems = _parse(event, policy)
        parsed.append(ev)
        invalid.extend(problems)
    by_key = {ev.key: ev for ev in parsed if ev.key is not None}

    holding = [ev for ev in parsed if ev.event.names(snap.me) and _drains(ev, snap, local, policy)]
    next_phase, start_drain, start_recover = _local(snap, local, policy, bool(holding))
    phase_after = next_phase or local.phase
    drain_started = snap.mono if start_drain else local.drain_started

    cluster = snap.cluster
    publish: list[EventRecord] = []
    admit: list[str] = []
    ack: list[str] = []
    withdraw: list[str] = []
    mark_done: list[str] = []
    mark_absent: list[str] = []
    clear_absent: list[str] = []
    approvers: dict[str, str] = {}
    blocked: dict[str, tuple[str, ...]] = {}
    ready: dict[str, ApprovalIntent | None] = {}  # approvable events (None: approvable by someone else)

    if cluster is not None:
        wait_slot: dict[str, str] = {}
        if doc is not None and policy.budgeted and cluster.i_am_leader:
            admit, wait_slot = _admissions(by_key, cluster, snap.now, policy)
        for ev in holding:
            if ev.key is None or phase_after is not Phase.DRAINED:
                continue
            record = cluster.records.get(ev.key)
            if snap.mono - drain_started >= policy.wait_for(ev.event) and (
                record is None or snap.me not in record.acks
            ):
                ack.append(ev.key)
        for ev in parsed:
            if ev.key is None:
                continue
            record = cluster.records.get(ev.key)
            if record is None and doc is not None:
                publish.append(_record(ev, snap))
            if doc is None or not ev.event.is_scheduled:
                continue
            approver, as_leader = choose_approver(ev.resources, cluster, policy.approver)
            approvers[ev.key] = approver or ""
            reasons = _approval_blockers(ev, record, ev.key in admit, ack, snap, cluster, policy)
            if ev.key in wait_slot and reasons:
                reasons = (wait_slot[ev.key], *[r for r in reasons if not r.startswith("not admitted")])
            if approver is None:
                reasons += ("no live agent named in Resources and no leader",)
            if reasons:
                blocked[ev.key] = reasons
                continue
            mine = approver == snap.me and ev.event.event_id not in local.posted
            required = ev.resources if ev.rule is ApprovalRule.AFTER_DRAIN else ()
            required = tuple(vm for vm in required if _waited_for(vm, cluster, policy, snap.now))
            ready[ev.key] = ApprovalIntent(ev.event.event_id, ev.key, required, as_leader) if mine else None
        if policy.terminate_together:
            _hold_terminate_batches(by_key, ready, blocked)
        if doc is not None:
            for key, record in cluster.records.items():
                if key in by_key:
                    continue
                if snap.me in record.acks and phase_after is Phase.SERVING:
                    withdraw.append(key)  # recovered and serving: the budget slot is free again
                if cluster.i_am_leader and record.done_at is None:
                    mark_done.append(key)
        if cluster.i_am_leader:
            mark_absent = sorted(cluster.known - cluster.members - set(cluster.absent_since))
            clear_absent = sorted(set(cluster.absent_since) & cluster.members)

    return Plan(
        next_phase=next_phase,
        start_drain=start_drain,
        start_recover=start_recover,
        publish=tuple(publish),
        admit=tuple(admit),
        ack=tuple(ack),
        withdraw=tuple(withdraw),
        approve=tuple(intent for intent in ready.values() if intent is not None),
        mark_done=tuple(mark_done),
        mark_absent=tuple(mark_absent),
        clear_absent=tuple(clear_absent),
        purge_before=(snap.now - policy.done_retention) if cluster and cluster.i_am_leader else None,
        holding=tuple(ev.event.event_id for ev in holding),
        approvers=approvers,
        blocked=blocked,
        invalid=tuple(invalid),
    )


def _waited_for(vm: str, cluster: ClusterView, policy: Policy, now: float) -> bool:
    """Whether ``vm``'s ack is required: always, unless it has never run an agent and policy ignores
    such VMs, or its agent has been gone longer than ``absent_grace`` (its probe endpoint went with it,
    so the load balancer no longer sends it traffic). A live member is always waited for."""
    if vm in cluster.members:
        return True
    if policy.unknown_peers is PeersPolicy.IGNORE and vm not in cluster.known:
        return False
    since = cluster.absent_since.get(vm)
    return policy.absent_grace is None or since is None or now - since < policy.absent_grace


def _approval_blockers(
    ev: _Event,
    record: EventRecord | None,
    admitting_now: bool,
    acking_now: Iterable[str],
    snap: Snapshot,
    cluster: ClusterView,
    policy: Policy,
) -> tuple[str, ...]:
    """Why this Scheduled event may not be approved now (empty: it may, by its approver)."""
    event = ev.event
    if not event.is_known_type:
        return (f"unknown event type {event.event_type!r} is never approved early",)
    if ev.rule is ApprovalRule.NEVER:
        return (f"policy: {event.event_type} events are never approved early",)
    if ev.bad_names:
        return ("Resources holds a name that is not a valid VM name",)
    if not ev.resources:
        return ("Resources is empty: nobody known to drain",)
    if record is None:
        return ("event record not published yet",)
    reasons: list[str] = []
    if ev.rule is ApprovalRule.AFTER_DRAIN:
        if policy.budgeted and record.admitted_at is None and not admitting_now:
            reasons.append("not admitted by the maintenance budget yet")
        acking = set(acking_now)
        for vm in ev.resources:
            acked = vm in record.acks or (vm == snap.me and ev.key in acking)
            if acked or not _waited_for(vm, cluster, policy, snap.now):
                continue  # an ack written this very cycle is re-checked by Store.approve before the POST
            reasons.append(f"{vm} runs no agent" if vm not in cluster.members else f"{vm} has not acknowledged")
    if cluster.connection is not ConnectionState.CONNECTED:
        reasons.append(f"ZooKeeper connection {cluster.connection.value}")
    return tuple(reasons)


def _hold_terminate_batches(
    events: Mapping[str, _Event], ready: dict[str, ApprovalIntent | None], blocked: dict[str, tuple[str, ...]]
) -> None:
    """Deletes sharing one NotBefore proceed together in Azure: approve none until all may be approved."""
    batches: dict[float, list[str]] = {}
    for key, ev in events.items():
        if ev.event.event_type == EventType.TERMINATE and ev.event.is_scheduled and ev.event.not_before:
            batches.setdefault(ev.event.not_before.timestamp(), []).append(key)
    for keys in batches.values():
        if len(keys) > 1 and not all(k in ready for k in keys):
            for key in keys:
                if key in ready:
                    del ready[key]
                    blocked[key] = ("waiting for the other deletes that share its NotBefore",)
