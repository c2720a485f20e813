"""``decide``: one cycle's plan, step by step, from what the cycle observed; and which view of the group
those steps need (``view_needed``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from coordinator.blockers import Blocker, Hold
from coordinator.config.policy import ApproverMode
from coordinator.decide.approval import (
    Approvals,
    absent_drained,
    confirmed_peers,
    fresh_for_approval,
    still_posted,
    weigh_approvals,
)
from coordinator.decide.budget import weigh_budget
from coordinator.decide.drain import acks_due, drain_step, events_holding, out_mark_change
from coordinator.decide.events import ParsedEvent, first_live, parse_events
from coordinator.decide.local import local_plan
from coordinator.decide.order import in_order
from coordinator.decide.records import absences, closing, purge_cutoff, to_archive
from coordinator.snapshot import LocalState, Phase, Plan, Policy, Snapshot
from coordinator.store.base import ClusterView, OutMark, Part

__all__ = ["decide", "view_needed"]


def view_needed(snap: Snapshot, local: LocalState, policy: Policy) -> Part:
    """How much of the group this VM's decisions need (``coordinator.store.base.Part``).

    * WHOLE when it approves or closes an event of its documents or an open record naming it (it is the
      first live member the event names: ``first_live``), when it leads and may approve (the ``leader``
      approver mode, an event or open record none of whose VMs runs a live agent, a VM out of rotation for
      no event its mark names), when it has POSTed an approval, has just started (its state is unknown), or
      another agent runs under its name, when its documents show an event none of whose VMs runs a live
      agent (it may have to publish its record), and without a view (the whole view is read next).
    * LEAD when it leads and approves nothing: it admits events and drains, weighs the budget, marks records
      done and absences, on every ``/out`` mark; the other VMs' acks, which only an approver weighs, cost it
      nothing.
    * NAMED when an event of its documents or an open record names it, it holds an ack, an event holds it,
      it runs a job or it is not serving: it publishes, drains, acks, withdraws and marks itself out, on
      every record with its own ack only. Another VM's ack or ``/out`` mark, which only the approver and the
      leader weigh, costs it nothing.
    * OWN otherwise: it publishes, approves and admits nothing, reads no record and watches only its own
      ``/out`` mark: another VM's event costs it nothing.
    """
    cluster = snap.cluster
    if cluster is None or snap.duplicate or local.posted or local.phase is Phase.UNKNOWN:
        return Part.WHOLE
    if cluster.i_am_leader and (policy.approver is ApproverMode.LEADER
                                or any(not mark.events for mark in cluster.out.values())):
        return Part.WHOLE
    me = snap.me
    involved = local.phase is not Phase.SERVING or local.job_running or bool(local.draining_for)
    for document in (snap.document, snap.last_document):
        if document is None:
            continue
        for event in document.events:
            # Members are canonical (lower-case) names: a name of Resources is one of them as ``names`` says.
            first = first_live([raw.lower() for raw in event.resources], cluster)
            if first is None:
                # No VM it names runs a live agent: any VM that sees it publishes its record
                # (``decide.approval._publishes``), and the leader approves it.
                return Part.WHOLE
            if event.names(me):
                if first == me:
                    return Part.WHOLE  # its approver (first-resource) and its closer (every mode)
                involved = True
    for record in cluster.records.values():
        if me in record.acks:
            involved = True
        if record.done_at is None and (me in record.resources or cluster.i_am_leader):
            first = first_live(record.resources, cluster)
            if first == me or first is None:
                return Part.WHOLE  # the record's closer, or the leader approving and closing what no agent can
            involved = True
    if cluster.i_am_leader:
        return Part.LEAD
    return Part.NAMED if involved else Part.OWN


def decide(snap: Snapshot, local: LocalState, policy: Policy) -> Plan:
    if snap.cluster is not None and not snap.cluster.part.holds(view_needed(snap, local, policy)):
        # A view cut down to less than this VM's decisions need (the agent reads the part they need first):
        # decided as without a view, on the safe side. It never admits or approves on acks or budget marks
        # it did not read.
        snap = replace(snap, cluster=None)
    doc = snap.document
    parsed, invalid = parse_events(doc if doc is not None else snap.last_document, policy)
    by_key = {ev.key: ev for ev in parsed if ev.key is not None}
    holding_events, holding = events_holding(parsed, snap, local, policy)
    # Another agent running as this VM: out of rotation until it is gone, whatever the events say. The
    # store never lets it take that agent's member node (which would let one's ack stand for the other).
    kept_out = bool(holding) or bool(snap.duplicate)
    next_phase, start_drain, start_recover, waiting = drain_step(snap, local, policy, kept_out)
    if snap.duplicate:
        invalid.append(snap.duplicate)
        waiting = waiting or "another agent runs as this VM"
    phase_after = next_phase or local.phase
    drain_started = snap.mono if start_drain else local.drain_started
    posted = still_posted(local.posted, set(by_key), snap, policy)

    group = _GroupPlan()
    if snap.cluster is not None:
        group = _with_the_group(snap.cluster, parsed, by_key, holding_events, holding, phase_after, drain_started,
                                posted, snap, policy)

    approve, approvable_since, held = fresh_for_approval(
        tuple(intent for intent in group.approvals.ready.values() if intent is not None), snap, local)
    blocked = group.approvals.blocked
    if held:
        why = Blocker(Hold.STALE_DOCUMENT, "approval waits for a document read after it became approvable")
        blocked = {**blocked, **{key: (why,) for key in held}}
    approve, settling = absent_drained(approve, approvable_since, group.approvals.unseen_drains, snap)
    blocked = {**blocked, **settling}
    approve, confirm_peers = confirmed_peers(approve, snap, policy)
    purge_before = purge_cutoff(snap, snap.cluster, policy)
    own = local_plan(snap, local, next_phase=next_phase, start_drain=start_drain, start_recover=start_recover,
                     holding=tuple(holding), posted=posted, approvable_since=approvable_since,
                     approving=snap.me in group.approvals.approvers.values() if doc is not None else None,
                     purge_due=purge_before is not None, confirm_peers=confirm_peers)

    plan = Plan(
        next_phase=next_phase,
        start_drain=start_drain,
        start_recover=start_recover,
        publish=tuple(group.approvals.publish),
        admit=tuple(group.admit),
        ack=tuple(group.ack),
        withdraw=tuple(group.withdraw),
        approve=approve,
        mark_done=tuple(group.mark_done),
        reopen=tuple(group.reopen),
        mark_absent=tuple(group.mark_absent),
        clear_absent=tuple(group.clear_absent),
        mark_out=group.mark_out,
        clear_out=group.clear_out,
        mark_out_for=group.approvals.mark_out_for,
        admit_drains={vm: snap.cluster.drains[vm].asked for vm in group.admit_drains} if snap.cluster else {},
        forget_admissions=tuple(sorted(snap.cluster.stale_admissions))
        if snap.cluster is not None and snap.cluster.i_am_leader and snap.cluster.weighs_group else (),
        drain_waits=group.drain_waits,
        purge_before=purge_before if own.purge else None,
        archive=to_archive(snap, snap.cluster, policy),
        history_from=snap.now - policy.done_retention,
        holding=tuple(holding),
        approvers=group.approvals.approvers,
        blocked=blocked,
        invalid=tuple(invalid),
        waiting=waiting,
        read_now=bool(held) or own.read_now,
        unseen=" and ".join(what for what, missing in (("no fresh IMDS document", doc is None),
                                                       ("no ZooKeeper view", snap.cluster is None)) if missing),
        local=own.after,
        recover_all=own.recover_all,
        save_first=own.save_first,
        save=own.save,
        probe_peers=own.probe_peers,
    )
    return replace(plan, operations=in_order(plan, snap))


@dataclass
class _GroupPlan:
    """The part of a plan that needs a view of the group (empty without one)."""

    admit: list[str] = field(default_factory=list)
    admit_drains: list[str] = field(default_factory=list)
    drain_waits: dict[str, str] = field(default_factory=dict)
    ack: list[str] = field(default_factory=list)
    withdraw: list[str] = field(default_factory=list)
    approvals: Approvals = field(default_factory=Approvals)
    reopen: list[str] = field(default_factory=list)
    mark_done: list[str] = field(default_factory=list)
    mark_absent: list[str] = field(default_factory=list)
    clear_absent: list[str] = field(default_factory=list)
    mark_out: tuple[str, ...] | None = None
    clear_out: bool = False


def _with_the_group(
    cluster: ClusterView, parsed: list[ParsedEvent], by_key: dict[str, ParsedEvent], holding_events: list[ParsedEvent],
    holding: list[str], phase_after: Phase, drain_started: float, posted: frozenset[str], snap: Snapshot,
    policy: Policy,
) -> _GroupPlan:
    """What this cycle does in the group, in the order it weighs it: the budget and the leader's admissions,
    this VM's acks and withdrawals, each event's approval, the leader's upkeep of records and absences, and
    this VM's ``/out`` mark."""
    mark_out, clear_out = out_mark_change(cluster, holding, phase_after, snap)
    # The budget weighs this VM as its own writes of this cycle leave it: out of rotation while it drains,
    # is drained or recovers, whether or not the view (read before this cycle's writes, or while ZooKeeper
    # was unreachable and it drained on its own evidence) holds its mark yet.
    counted = cluster if mark_out is None else replace(
        cluster, out={**cluster.out, snap.me: OutMark(snap.now, mark_out)})
    budget = weigh_budget(by_key, counted, snap, policy)
    ack = acks_due(holding_events, phase_after, drain_started, cluster, snap, policy)
    holding_keys = set(holding)
    # An ack stands for a drain that holds now, never for one that did.
    withdraw = [key for key, record in cluster.records.items() if snap.me in record.acks and key not in holding_keys]
    group = _GroupPlan(admit=budget.admit, admit_drains=budget.admit_drains, drain_waits=dict(budget.drain_waits),
                       ack=ack, withdraw=withdraw,
                       approvals=weigh_approvals(parsed, by_key, budget, ack, posted, counted, snap, policy))
    if snap.document is not None:
        group.reopen, group.mark_done = closing(by_key, cluster, snap, policy)
    if cluster.i_am_leader:
        group.mark_absent, group.clear_absent = absences(cluster)
    group.mark_out, group.clear_out = mark_out, clear_out
    return group
