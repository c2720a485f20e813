"""The disruption budget: which VMs are out of rotation and for what, what holds a slot, the leader's
admissions in order, and why taking more VMs out would break the budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.blockers import Blocker, Hold
from coordinator.decide.events import ParsedEvent, approvable, events_from_store
from coordinator.models import EventType
from coordinator.snapshot import Policy, Snapshot
from coordinator.store.base import BY_HAND, ClusterView

__all__ = ["Budget", "admissions", "budget_unit", "drain_admissions", "in_flight", "out_vms", "over_budget",
           "unconfirmed_peers", "weigh_budget"]


@dataclass(frozen=True)
class Budget:
    """What the budget weighs this cycle."""

    known: Mapping[str, ParsedEvent]  # this VM's events, and (budgeted) those known only from their records
    admit: list[str]  # the leader's admissions
    wait_slot: Mapping[str, Blocker]  # the leader's reason for each event it does not admit
    flight: Mapping[str, frozenset[str]]  # what holds the budget, as unit key -> VMs (complete views only)
    admit_drains: list[str] = field(default_factory=list)  # the leader's admissions of drains by hand
    drain_waits: Mapping[str, str] = field(default_factory=dict)  # its reason for each drain it does not admit


def weigh_budget(by_key: Mapping[str, ParsedEvent], cluster: ClusterView, snap: Snapshot, policy: Policy) -> Budget:
    """The budget of this cycle: what it weighs (this VM's events, and those known only from records its
    documents never listed: groups whose IMDS shows each VM only the events naming it), what the leader
    admits on a fresh document (events first, then drains by hand), and what is in flight."""
    known = {**events_from_store(cluster, snap, policy), **by_key} if policy.budgeted else by_key
    admit: list[str] = []
    wait_slot: dict[str, Blocker] = {}
    admit_drains: list[str] = []
    drain_waits: dict[str, str] = {}
    if snap.document is not None and policy.budgeted and cluster.i_am_leader:
        admit, wait_slot = admissions(known, cluster, snap, policy)
        admit_drains, drain_waits = drain_admissions(admit, known, cluster, snap, policy)
    flight = in_flight(known, cluster, snap, policy) if policy.budgeted and cluster.weighs_group else {}
    return Budget(known, admit, wait_slot, flight, admit_drains, drain_waits)


def out_vms(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, tuple[str, ...]]:
    """VMs out of rotation, each with the event keys it is out for (none: starting up, or back from a
    crash): by their own ``/out`` node, or because they acknowledge an event (drained now). One whose
    agent this agent has seen gone for ``recovery_grace`` no longer counts: it is not coming back soon,
    and serves nobody meanwhile. Nor does one without an agent that is out only for Terminates that are
    over: it was deleted (a scale-in), and its ``/out`` node has nobody left to delete it."""
    out: dict[str, list[str]] = {}
    for vm, mark in cluster.out.items():
        out[vm] = [eid.upper() for eid in mark.events]
    for key, record in sorted(cluster.records.items()):
        for vm in record.acks:
            if key not in out.setdefault(vm, []):
                out[vm].append(key)
    for vm in unconfirmed_peers(cluster, snap, policy):
        out.setdefault(vm, [])
    return {vm: tuple(keys) for vm, keys in out.items()
            if vm in cluster.members or (snap.absent_for.get(vm, 0.0) < policy.recovery_grace
                                         and not _deleted(keys, cluster))}


def _deleted(keys: list[str], cluster: ClusterView) -> bool:
    """Whether a VM out for ``keys`` (and without an agent) was deleted: every event it is out for is a
    Terminate that is over (its record marked done)."""
    records = [cluster.records.get(key) for key in keys]
    return bool(records) and all(r is not None and r.done_at is not None and r.event_type == EventType.TERMINATE
                                 for r in records)


def unconfirmed_peers(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, str]:
    """Live members (this VM aside) that this agent cannot confirm in their load balancer's rotation,
    with what their probe showed: when peers are probed, a member counts as serving only on a recent
    answer of 200 from an agent saying "serving". A member whose agent died a moment ago keeps its
    session for up to the session timeout, but its probe died with the agent."""
    if snap.peers is None or policy.peer_fresh is None:
        return {}
    found: dict[str, str] = {}
    for vm in sorted(cluster.members - {snap.me}):
        seen = snap.peers.get(vm)
        if seen is None:
            found[vm] = "not probed yet"
        elif not seen.in_rotation:
            found[vm] = seen.detail
        elif snap.mono - seen.at > policy.peer_fresh:
            found[vm] = f"last answer {snap.mono - seen.at:.1f} s old"
    return found


def in_flight(
    events: Mapping[str, ParsedEvent], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> dict[str, frozenset[str]]:
    """What holds the budget, as unit key -> VMs: present events that are admitted, Started, or have a
    VM out of rotation for them; and every other VM out of rotation (under the event it is out for, if
    any), until it is back in its load balancer's rotation."""
    out = out_vms(cluster, snap, policy)
    flight: dict[str, frozenset[str]] = {}
    for key, ev in events.items():
        record = cluster.records.get(key)
        admitted = record is not None and record.admitted_at is not None and record.done_at is None
        if admitted or not ev.event.is_scheduled or any(key in out.get(vm, ()) for vm in ev.resources):
            flight[key] = frozenset(ev.resources)
    covered = frozenset().union(*flight.values()) if flight else frozenset()
    for vm, keys in out.items():
        if vm not in covered:
            # Out for events that no longer name it (Resources changed, or an EventId came back): under
            # every one of them, so that each counts as in maintenance and the VM stays busy whichever
            # of them is being admitted or approved. Out by hand: a VM out, not an event in maintenance.
            for unit in [_unit_out_for(key, vm, events) for key in keys] or [f"vm:{vm}"]:
                flight[unit] = flight.get(unit, frozenset()) | {vm}
    for vm, drain in cluster.drains.items():
        # Admitted by hand: the VM's slot is taken from the admission on, as an admitted event's are, while
        # its agent drains it (or until it is gone past the grace, as a VM out of rotation is).
        if drain.admitted_at is not None and (vm in cluster.members
                                              or snap.absent_for.get(vm, 0.0) < policy.recovery_grace):
            flight[f"vm:{vm}"] = flight.get(f"vm:{vm}", frozenset()) | {vm}
    return flight


def _unit_out_for(key: str, vm: str, events: Mapping[str, ParsedEvent]) -> str:
    """The unit under which a VM out of rotation for ``key`` counts, when no event in flight names it: by
    hand, the VM itself; for a present event that does not name it (an EventId that came back for other
    VMs, or Resources that dropped it), an earlier instance of that event, in maintenance while the VM is
    out, and an event apart from the present one, so that admitting or approving the present one counts it
    against ``max_events``."""
    if key == BY_HAND:
        return f"vm:{vm}"
    present = events.get(key)
    if present is not None and vm not in present.resources:
        return f"{key} (an earlier instance)"
    return key


def budget_unit(key: str, events: Mapping[str, ParsedEvent], policy: Policy) -> str:
    """What the budget counts as one: an event, or a batch of Terminates sharing one NotBefore (Azure
    runs such a batch as one operation)."""
    ev = events.get(key)
    if (policy.terminate_together and ev is not None and ev.event.event_type == EventType.TERMINATE
            and ev.not_before is not None):
        return f"terminate@{ev.not_before:.0f}"
    return key


def admissions(
    events: Mapping[str, ParsedEvent], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> tuple[list[str], dict[str, Blocker]]:
    """The leader's admissions and why the others wait.

    Candidates are Scheduled events with a record, not yet admitted, that could be approved early
    and are within the lead time. Those already holding their VMs (drained just in time, or
    acknowledged) come first, then first come (NotBefore, then id) first served; a Terminate batch is
    admitted as one. Nothing behind a waiting unit jumps ahead of it, unless that unit could not be
    admitted even with nothing else in maintenance (a Reboot of every VM of the group under
    ``keep_one_serving``): it waits for its NotBefore, and holding the queue behind it would make every
    event behind it wait as long.
    """
    flight = in_flight(events, cluster, snap, policy)
    candidates = [
        ev for key, ev in events.items()
        if ev.event.is_scheduled and key in cluster.records
        and (cluster.records[key].admitted_at is None or cluster.records[key].done_at is not None)
        and approvable(ev, cluster, snap, policy)
        and (policy.lead_time is None or snap.now >= (ev.not_before or 0.0) - policy.lead_time)
    ]
    units: dict[str, list[ParsedEvent]] = {}
    for ev in candidates:
        units.setdefault(budget_unit(ev.key or "", events, policy), []).append(ev)
    order = sorted(units.items(), key=lambda item: (
        not any(ev.key in flight for ev in item[1]),
        min(ev.not_before if ev.not_before is not None else float("inf") for ev in item[1]),
        item[0],
    ))
    admit: list[str] = []
    why: dict[str, Blocker] = {}
    for position, (_, members) in enumerate(order):
        keys = {ev.key or "" for ev in members}
        vms = frozenset().union(*(ev.resources for ev in members))
        alone = over_budget(keys, vms, {}, events, cluster, snap, policy)
        if alone is not None:
            for ev in members:
                why[ev.key or ""] = _alone(alone)
            continue
        reason = over_budget(keys, vms, flight, events, cluster, snap, policy)
        if reason is not None:
            for _, rest in order[position:]:
                for ev in rest:
                    why[ev.key or ""] = reason
            break
        admit.extend(sorted(keys))
        for ev in members:
            flight[ev.key or ""] = frozenset(ev.resources)
    return admit, why


def drain_admissions(
    admitted: list[str], events: Mapping[str, ParsedEvent], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> tuple[list[str], dict[str, str]]:
    """The leader's admissions of drains by hand, after this cycle's admissions of events (an event has a
    NotBefore it starts at anyway, a drain by hand has no deadline): first asked, first admitted, each while
    taking its VM out keeps the budget (``max_vms``, ``keep_one_serving``; a VM out by hand is not an event
    in maintenance, so ``max_events`` does not count it). One waits for its VM's agent, and for those asked
    before it. Returns the VMs admitted, and why each of the others waits."""
    flight = dict(in_flight(events, cluster, snap, policy))
    for key in admitted:
        if key in events:
            flight[key] = frozenset(events[key].resources)
    admit: list[str] = []
    why: dict[str, str] = {}
    waiting = sorted((drain.at, vm) for vm, drain in cluster.drains.items() if drain.admitted_at is None)
    for position, (_, vm) in enumerate(waiting):
        if vm not in cluster.members:
            why[vm] = f"{vm} runs no agent: its drain is admitted once its agent runs"
            continue
        alone = over_budget(set(), frozenset({vm}), {}, events, cluster, snap, policy, an_event=False)
        reason = (_alone(alone) if alone is not None
                  else over_budget(set(), frozenset({vm}), flight, events, cluster, snap, policy, an_event=False))
        if reason is not None:
            for _, rest in waiting[position:]:
                why.setdefault(rest, str(reason))
            break
        admit.append(vm)
        flight[f"vm:{vm}"] = frozenset({vm})
    return admit, why


def over_budget(
    keys: set[str], vms: frozenset[str], flight: Mapping[str, frozenset[str]], events: Mapping[str, ParsedEvent],
    cluster: ClusterView, snap: Snapshot, policy: Policy, *, an_event: bool = True,
) -> Blocker | None:
    """Why taking ``vms`` out for the events ``keys`` would break the budget, given what else is in
    flight (None: it would not). Used at admission, and again at approval: between the two, VMs may
    have gone out of rotation for other reasons (a forced drain, a restart, an event with no notice).
    ``an_event``: False for a drain by hand, which takes a VM and no event slot."""
    others = {k: v for k, v in flight.items() if k not in keys}
    # Busy: every VM out of rotation but those the event itself is about to take; a VM out for an
    # earlier instance of one of ``keys`` is filed under that instance, and busy too.
    busy = frozenset().union(*flight.values()) - vms if flight else frozenset()
    # A VM out of rotation for no event (starting up, back from a crash) is not an event in
    # maintenance; it still counts against max_vms and keep_one_serving.
    # A unit already in flight that ``keys`` belong to (a Terminate of a batch seen after the others were
    # admitted) is the same operation, not another one: the batch is approved only together.
    in_maintenance = ({budget_unit(k, events, policy) for k in others if not k.startswith("vm:")}
                      - {budget_unit(k, events, policy) for k in keys})
    if an_event and policy.max_events is not None and len(in_maintenance) >= policy.max_events:
        return Blocker(Hold.BUDGET, f"maintenance budget: {len(in_maintenance)} event(s) in maintenance "
                                    f"({', '.join(sorted(others))})")
    if policy.max_vms is not None and busy and len(busy | vms) > policy.max_vms:
        return Blocker(Hold.BUDGET, f"maintenance budget: {len(busy)} VM(s) in maintenance, at most {policy.max_vms}")
    if policy.keep_one_serving and cluster.members and not (cluster.members - busy - vms):
        unconfirmed = unconfirmed_peers(cluster, snap, policy)
        if unconfirmed:
            seen = ", ".join(f"{vm}: {detail}" for vm, detail in unconfirmed.items())
            # A peer whose probe does not answer the deciding agent at all is not coming back by itself.
            unanswered = snap.peers is not None and any(
                vm in snap.peers and not snap.peers[vm].answered for vm in unconfirmed)
            return Blocker(Hold.PEER_NOT_SERVING, f"it would leave no VM serving (not confirmed in rotation: {seen})",
                           lasting=unanswered)
        return Blocker(Hold.BUDGET, "it would leave no VM serving")
    return None


def _alone(reason: Blocker) -> Blocker:
    """``reason`` for a unit that the budget could not admit even with nothing else in maintenance: it waits
    for its NotBefore (or, a drain by hand, for the policy to change)."""
    return Blocker(reason.kind, f"{reason.words} even with nothing else in maintenance", reason.vm, lasting=True)
