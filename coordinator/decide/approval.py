"""Approval: why each Scheduled event may not be approved now, who approves the others, and the last
holds on an approval (a fresh reading, VMs absent past the grace, a Terminate batch, a POST already made)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.blockers import NO_APPROVER, NOT_ADMITTED_YET, Blocker, Hold, waiting_for_ack
from coordinator.config import ApprovalRule
from coordinator.decide.budget import Budget, admissions, budget_unit, over_budget
from coordinator.decide.drain import mark_naming
from coordinator.decide.events import ParsedEvent, approvable, choose_approver, first_live, new_record, waited_for
from coordinator.models import EventType
from coordinator.snapshot import ApprovalIntent, LocalState, Policy, Snapshot, is_gone, pause_holds, window_holds
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, Part

__all__ = ["Approvals", "absent_drained", "approval_blockers", "confirmed_peers", "fresh_for_approval", "still_posted",
           "weigh_approvals"]


@dataclass
class Approvals:
    """What this cycle found for the events of its document, given the group's view."""

    publish: list[EventRecord] = field(default_factory=list)  # records to write: events seen first here
    approvers: dict[str, str] = field(default_factory=dict)  # event key -> approver ("" if none)
    blocked: dict[str, tuple[Blocker, ...]] = field(default_factory=dict)  # event key -> why not approvable
    ready: dict[str, ApprovalIntent | None] = field(default_factory=dict)  # None: approvable by someone else
    # event key -> (seconds it must have been approvable, the VMs past the absent grace it names)
    unseen_drains: dict[str, tuple[float, tuple[str, ...]]] = field(default_factory=dict)
    # VMs past the absent grace to mark out (their ``/out`` node) before an approval goes ahead without them
    mark_out_for: dict[str, tuple[str, ...]] = field(default_factory=dict)


def weigh_approvals(
    parsed: Sequence[ParsedEvent], by_key: Mapping[str, ParsedEvent], budget: Budget, ack: Sequence[str],
    posted: frozenset[str], cluster: ClusterView, snap: Snapshot, policy: Policy,
) -> Approvals:
    """For each event of the document: its record to publish if it has none, and, for each Scheduled one
    on a fresh document, its approver and either why it may not be approved now or its approval intent
    (this VM's to carry out, or someone else's)."""
    found = Approvals()
    budget_view: dict[str, Blocker] | None = None  # a member's own reckoning of the leader's admissions
    for ev in parsed:
        if ev.key is None:
            continue
        record = cluster.records.get(ev.key)
        if record is None and snap.document is not None and _publishes(ev, cluster, snap):
            found.publish.append(new_record(ev, snap, policy))
        if snap.document is None or not ev.event.is_scheduled:
            continue
        approver, as_leader = choose_approver(ev.resources, cluster, policy.approver)
        found.approvers[ev.key] = approver or ""
        if not cluster.complete:
            continue  # neither named by it nor leading: its approver and the leader weigh it
        reasons = approval_blockers(ev, record, ev.key in budget.admit, ack, snap, cluster, policy)
        if NOT_ADMITTED_YET in reasons:
            if cluster.i_am_leader and ev.key in budget.wait_slot:
                why: Blocker | None = budget.wait_slot[ev.key]
            else:
                if budget_view is None:
                    budget_view = (admissions(budget.known, cluster, snap, policy)[1]
                                   if not cluster.i_am_leader else {})
                why = _not_admitted_because(ev, reasons, budget_view, cluster, snap, policy)
            reasons = tuple(r for r in ((why if r == NOT_ADMITTED_YET else r) for r in reasons) if r is not None)
        if approver is None:
            reasons += (NO_APPROVER,)
        if not reasons and policy.budgeted:
            batch = {k for k in by_key if budget_unit(k, by_key, policy) == budget_unit(ev.key, by_key, policy)}
            over = over_budget(batch, frozenset(ev.resources), budget.flight, budget.known, cluster, snap, policy)
            reasons = (over.weighed_at_approval(),) if over is not None else ()
        if reasons:
            found.blocked[ev.key] = reasons
            continue
        mine = approver == snap.me and ev.key not in posted
        after_drain = ev.rule is ApprovalRule.AFTER_DRAIN
        record = cluster.records.get(ev.key)
        required = tuple(vm for vm in ev.resources if waited_for(vm, cluster, policy, snap, record)) if after_drain \
            else ()
        past_grace = tuple(vm for vm in ev.resources if vm in cluster.known and vm not in required)
        if mine and after_drain and past_grace:
            unmarked = _unmarked(ev.key, past_grace, cluster)
            if unmarked:
                # Their agents, cut off, cannot say they are out: the budget would forget them once the event
                # is over, while they are still down or not yet back in rotation.
                found.mark_out_for.update(unmarked)
                found.blocked[ev.key] = (Blocker(
                    Hold.ABSENT_PAST_GRACE, f"marks {','.join(unmarked)} (absent past the grace) out of rotation "
                    "before it approves without them"),)
                continue
            found.unseen_drains[ev.key] = (policy.wait_for(ev.event) + policy.absent_notice, past_grace)
        intent = ApprovalIntent(ev.event.event_id, ev.key, required, as_leader, after_drain and policy.budgeted)
        found.ready[ev.key] = intent if mine else None
    if policy.terminate_together:
        _hold_terminate_batches(by_key, found.ready, found.blocked)
    return found


def _publishes(ev: ParsedEvent, cluster: ClusterView, snap: Snapshot) -> bool:
    """Whether this VM publishes the record of an event of its documents that has none: a VM it names (IMDS
    shows a VM every event naming it, in every delivery mode), or any VM that sees it when none of the VMs
    it names runs a live agent. A VM it does not name leaves it to them: an event costs the VMs it names,
    not the group. Only on a view that holds every record (``view_needed``): a VM's own part holds none."""
    if not cluster.part.holds(Part.NAMED):
        return False
    return snap.me in ev.resources or first_live(ev.resources, cluster) is None


def _unmarked(key: str, vms: Sequence[str], cluster: ClusterView) -> dict[str, tuple[str, ...]]:
    """The VMs of ``vms`` whose ``/out`` node does not name the event ``key``, each with the events to write
    it with: those it names already, and ``key``."""
    found: dict[str, tuple[str, ...]] = {}
    for vm in vms:
        events = mark_naming(cluster.out.get(vm), (key,))
        if events is not None:
            found[vm] = events
    return found


def approval_blockers(
    ev: ParsedEvent,
    record: EventRecord | None,
    admitting_now: bool,
    acking_now: Iterable[str],
    snap: Snapshot,
    cluster: ClusterView,
    policy: Policy,
) -> tuple[Blocker, ...]:
    """Why this Scheduled event may not be approved now (empty: it may, by its approver)."""
    event = ev.event
    if ev.listed > 1:
        return (Blocker(Hold.INVALID_EVENT,
                        f"its EventId is listed {ev.listed} times in the document: never approved early"),)
    if not event.is_known_type:
        return (Blocker(Hold.POLICY, f"unknown event type {event.event_type!r} is never approved early"),)
    if ev.rule is ApprovalRule.NEVER:
        return (Blocker(Hold.POLICY, f"policy: {event.event_type} events are never approved early"),)
    if ev.bad_names:
        return (Blocker(Hold.INVALID_EVENT, "Resources holds a name that is not a valid VM name"),)
    if not ev.resources:
        return (Blocker(Hold.INVALID_EVENT, "Resources is empty: nobody known to drain"),)
    if ev.not_before is None:
        return (Blocker(Hold.INVALID_EVENT, "NotBefore is missing or unreadable"),)
    if record is None:
        return (Blocker(Hold.NOT_PUBLISHED, "event record not published yet"),)
    reasons: list[Blocker] = []
    reasons.extend(held for held in (pause_holds(cluster.paused), window_holds(policy, snap.now)) if held)
    if record.done_at is not None:
        reasons.append(Blocker(Hold.RECORD_DONE,
                               "its record is marked done: reopened by the leader or its closer first"))
    if ev.rule is ApprovalRule.AFTER_DRAIN:
        if policy.budgeted and record.admitted_at is None and not admitting_now:
            reasons.append(NOT_ADMITTED_YET)  # replaced by its cause (``_not_admitted_because``)
        acking = set(acking_now)
        for vm in ev.resources:
            acked = vm in record.acks or (vm == snap.me and ev.key in acking)
            if acked or not waited_for(vm, cluster, policy, snap, record):
                continue  # an ack written this very cycle is re-checked by Store.approve before the POST
            reasons.append(waiting_for_ack(vm, vm in cluster.members))
    if cluster.connection is not ConnectionState.CONNECTED:
        reasons.append(Blocker(Hold.ZOOKEEPER, f"ZooKeeper connection {cluster.connection.value}"))
    return tuple(reasons)


def _not_admitted_because(
    ev: ParsedEvent, reasons: tuple[Blocker, ...], budget_view: Mapping[str, Blocker], cluster: ClusterView,
    snap: Snapshot, policy: Policy,
) -> Blocker | None:
    """Why the leader has not admitted ``ev`` into the budget, as far as this agent can tell (None: the
    other reasons already say it). The leader itself says why from its own admissions (the budget);
    another member reckons them from its own view: what it cannot see is whether the leader has read
    the event from IMDS yet."""
    others = [r for r in reasons if r != NOT_ADMITTED_YET]
    if not approvable(ev, cluster, snap, policy):
        # Outside the maintenance windows, or a VM it names runs no agent: said by the other reasons.
        return None if others else Blocker(Hold.NOT_ADMITTED, "not admitted: it cannot be approved early now")
    lead = policy.lead_time
    if lead is not None and ev.not_before is not None and snap.now < ev.not_before - lead:
        return Blocker(Hold.LEAD_TIME, f"not admitted before {lead:g} s ahead of NotBefore (drain.lead_time_seconds)")
    if cluster.leader is None:
        return Blocker(Hold.NOT_ADMITTED, "not admitted: no leader to admit it")
    if cluster.i_am_leader:
        return NOT_ADMITTED_YET
    if ev.key is not None and ev.key in budget_view:
        return budget_view[ev.key]  # the budget is full: the leader's reason, as this agent reckons it
    return Blocker(Hold.NOT_ADMITTED, f"not admitted by the leader {cluster.leader} yet (the budget has room for it)")


def _hold_terminate_batches(
    events: Mapping[str, ParsedEvent], ready: dict[str, ApprovalIntent | None], blocked: dict[str, tuple[Blocker, ...]]
) -> None:
    """Deletes sharing one NotBefore proceed together in Azure: approve none until all may be approved."""
    batches: dict[float, list[str]] = {}
    for key, ev in events.items():
        if ev.event.event_type == EventType.TERMINATE and ev.event.is_scheduled and ev.not_before is not None:
            batches.setdefault(ev.not_before, []).append(key)
    for keys in batches.values():
        if len(keys) > 1 and not all(k in ready for k in keys):
            for key in keys:
                if key in ready:
                    del ready[key]
                    blocked[key] = (Blocker(Hold.TERMINATE_BATCH,
                                            "waiting for the other deletes that share its NotBefore"),)


def fresh_for_approval(
    approve: tuple[ApprovalIntent, ...], snap: Snapshot, local: LocalState
) -> tuple[tuple[ApprovalIntent, ...], dict[str, float], list[str]]:
    """An approval rests on a document whose request was sent no earlier than the cycle that first found
    the event approvable: IMDS may have changed the event (its Resources, a reused id) since an older
    reading. Returns the approvals that may go ahead, when each approvable event first was, and the keys
    held: the agent then reads IMDS now, and the next cycle approves on that reading (a loop that reads
    IMDS each cycle always has one)."""
    since = {i.key: local.approvable_since.get(i.key, snap.cycle_started) for i in approve}
    held = [i.key for i in approve if snap.read_sent < since[i.key]]
    return tuple(i for i in approve if i.key not in held), since, held


def absent_drained(
    approve: tuple[ApprovalIntent, ...], since: Mapping[str, float],
    unseen_drains: Mapping[str, tuple[float, tuple[str, ...]]], snap: Snapshot,
) -> tuple[tuple[ApprovalIntent, ...], dict[str, tuple[Blocker, ...]]]:
    """An event that names VMs absent past ``absent_grace`` is approved without their acks, on the promise
    that a VM cut off from ZooKeeper drains itself for any event naming it (``drains_for``). It can do so only
    once it sees the event: the approval waits until the event has been approvable for the drain wait
    plus ``absent_notice`` (the time a cut-off VM may take to see it after its approver). Without this, an
    event that appeared after the grace ran out was approved at once, while those VMs had just begun to
    drain. Returns the approvals that may go ahead and the reasons of those held."""
    go: list[ApprovalIntent] = []
    held: dict[str, tuple[Blocker, ...]] = {}
    for intent in approve:
        wait, vms = unseen_drains.get(intent.key, (0.0, ()))
        left = since.get(intent.key, snap.cycle_started) + wait - snap.cycle_started
        if left > 0:
            held[intent.key] = (Blocker(Hold.ABSENT_PAST_GRACE, f"waits {left:.0f} s more for {','.join(vms)} "
                                        "(absent past the grace) to drain for it on their own"),)
        else:
            go.append(intent)
    return tuple(go), held


def confirmed_peers(
    approve: tuple[ApprovalIntent, ...], snap: Snapshot, policy: Policy
) -> tuple[tuple[ApprovalIntent, ...], bool]:
    """When peers are probed, the budget counts a peer as serving on its probe's answers
    (``budget.unconfirmed_peers``), and an approval counts it so only on answers asked for in the cycle that
    approves, before it decided: the last background round may be a second old, and a peer killed since
    would count as serving (found by the chaos oracle: the approver approved while the load balancer had
    taken the just-killed leader out). A cycle whose peers were not asked again approves nothing: the next
    cycle, run at once, asks them before it decides (``LocalState.confirm_peers``), and approves on what they
    answer. Returns the approvals that may go ahead, and whether the next cycle asks the peers again."""
    if not approve or snap.peers is None or policy.peer_fresh is None:
        return approve, False
    if snap.peers_confirmed_at is not None and snap.peers_confirmed_at >= snap.cycle_started:
        return approve, False
    return (), True


def still_posted(posted: frozenset[str], listed: set[str], snap: Snapshot, policy: Policy) -> frozenset[str]:
    """The events this agent POSTed whose instance is still the one it approved. An instance ends when
    this VM saw the event gone, or the view shows its record done, purged, or without the approval (the
    leader reopened it: a reused EventId). An approver that kept the key forever would never approve a
    reused EventId, while every other agent deferred to it."""
    cluster = snap.cluster
    kept = set()
    for key in posted:
        if key not in listed and is_gone(snap.seen.get(key), policy.gone_after):
            continue
        record = cluster.records.get(key) if cluster is not None else None
        if cluster is not None and (record is None or record.done_at is not None or record.approval is None):
            continue
        kept.add(key)
    return frozenset(kept)
