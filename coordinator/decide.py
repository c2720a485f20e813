"""The decision function: what should be true, given what this cycle observed.

``decide(snapshot, local, policy) -> Plan`` is pure: no I/O, no clock reads, no randomness. The agent
loop builds the snapshot, calls it, and carries out the plan. Because every cycle recomputes the plan
from the current document and the current cluster view (level-triggered), a restart, a missed watch,
a duplicate document or a new leader need no special code. ``docs/safety.md`` lists the invariants
these rules keep, and the tests that try to break them.

The safety rules live here and nowhere else:

* An event is approved only by its approver, only while Scheduled in a document read *this* cycle,
  only when it is of a known type, names at least one VM, its rule allows it, the disruption budget
  admitted it, every VM it names has acknowledged (unless its rule is ``immediately``), and only while
  the ZooKeeper connection is CONNECTED. The store re-checks the acks, the admission and this agent's
  ownership of its member or leader node with a synced read right before the POST (``Store.approve``),
  and the POST is fenced by the time since that check (``Agent``).
* An acknowledgement means "drained for this event *now*": acks are ephemeral nodes of the VM's
  session, and a VM withdraws its ack of an event it no longer drains for, and leaves the drained
  state only once ZooKeeper shows no ack of it (or every session that could hold one has lapsed).
* A VM drains for an event that names it when the event is Started (it is being hit), when the
  budget admitted it, or at the latest ``latest_start`` before NotBefore, whatever the budget and
  ZooKeeper say. An event that can never be approved early drains just in time. Once draining for an
  event it stays drained until that event is *gone*: missing (or no longer naming the VM) from at
  least two fresh documents over ``gone_after`` seconds; a failed read changes nothing. A fresh
  process starts in ``UNKNOWN`` and fails the health probe until such a document clears it.
* A VM out of rotation says so in ``/out/{vm}`` until its load balancer routes to it again
  (``return_wait`` after its recovery finished); the budget counts every such VM.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from coordinator.config import ApprovalRule, ApproverMode, PeersPolicy
from coordinator.errors import InvalidName
from coordinator.maintenance_windows import in_windows
from coordinator.models import EventType, ScheduledEvent
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.snapshot import (
    ApprovalIntent,
    LocalState,
    PeerSeen,
    Phase,
    Plan,
    Policy,
    Sighting,
    Snapshot,
    approval_fence,
    is_gone,
    rule_for,
    session_lapses_after,
)
from coordinator.store.base import ClusterView, ConnectionState, EventRecord

__all__ = [
    "ApprovalIntent",
    "LocalState",
    "PeerSeen",
    "Phase",
    "Plan",
    "Policy",
    "Sighting",
    "Snapshot",
    "approval_fence",
    "choose_approver",
    "decide",
    "follows_group",
    "is_gone",
    "rule_for",
    "session_lapses_after",
]


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
    listed: int = 1  # how many entries of the document carry this event id
    # Known only from its record (``_from_store``): its NotBefore as the record holds it (epoch seconds).
    from_store: bool = False
    stored_not_before: float | None = None

    @property
    def held_as(self) -> str:
        """The key this VM holds the event under (``draining_for``, the state file, ``/out``): the id
        upper-cased, as the store keys it, even when it is not usable in ZooKeeper."""
        return self.key or self.event.event_id.upper()

    @property
    def not_before(self) -> float | None:
        if self.from_store:
            return self.stored_not_before
        return self.event.not_before.timestamp() if self.event.not_before is not None else None


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
    if event.not_before_error:
        problems.append(f"event {key or event.event_id[:40]!r}: {event.not_before_error}")
    return _Event(event, key, tuple(names), tuple(bad), rule_for(event, policy)), problems


def _record(ev: _Event, snap: Snapshot) -> EventRecord:
    assert ev.key is not None
    return EventRecord(
        event_id=ev.key,
        event_type=ev.event.event_type,
        resources=ev.resources,
        not_before=ev.not_before,
        published_by=snap.me,
        published_at=snap.now,
    )


def _approvable(ev: _Event, cluster: ClusterView | None, snap: Snapshot, policy: Policy) -> bool:
    """Whether the event could be approved early at all: a known type whose rule is ``after-drain``,
    a usable id and NotBefore, only valid names, inside a maintenance window, and nobody to wait for who
    cannot ever acknowledge (a VM without an agent). Unknown (no view): assume it could. An operator's
    pause is not checked here: it holds approvals only, and drains go on."""
    if ev.rule is not ApprovalRule.AFTER_DRAIN or ev.key is None or ev.bad_names or not ev.resources:
        return False
    if ev.not_before is None or not in_windows(policy.windows, snap.now):
        return False
    if cluster is None:
        return True
    return all(vm in cluster.members or not _waited_for(vm, cluster, policy, snap) for vm in ev.resources)


def _drains(ev: _Event, snap: Snapshot, local: LocalState, policy: Policy) -> bool:
    """Whether this VM, named by ``ev``, must be drained for it now."""
    event = ev.event
    if ev.held_as in local.draining_for:
        return True  # never put back while the event is present
    if ev.rule is ApprovalRule.IMMEDIATELY and ev.key is not None:
        return False  # a short impact approved at once: draining would cost more than it saves
    if not event.is_scheduled:
        return True  # being hit now
    not_before = ev.not_before
    if not_before is None:
        return True  # no time to drain just in time for: the safe side is now
    if snap.now >= not_before - policy.latest_start:
        return True  # no more waiting, whatever the budget or ZooKeeper say
    grace = policy.absent_grace
    if grace is not None and snap.cut_off_for >= max(grace - policy.wait_for(event), 0.0):
        # Cut off from ZooKeeper: the leader may soon count this VM as gone (absent_grace after its
        # session ends) and approve without it, so be drained by then. A process that never had a
        # session counts as cut off since before it started: the peers may have seen this VM gone
        # since before a reboot (``Snapshot.cut_off_for``).
        return True
    if not _approvable(ev, snap.cluster, snap, policy):
        return policy.unapprovable_at_once  # nothing to gain from an early drain: just in time
    if policy.budgeted:
        record = snap.cluster.records.get(ev.key or "") if snap.cluster else None
        if record is None or record.admitted_at is None or record.done_at is not None:
            return False  # not admitted (or unknown): drain late rather than break the budget
    if policy.lead_time is not None:
        return snap.now >= not_before - policy.lead_time
    return True


def _local(
    snap: Snapshot, local: LocalState, policy: Policy, holding: bool
) -> tuple[Phase | None, bool, bool, str]:
    """This VM's drain state machine: (next phase, start drain, start recover, why it stays out)."""
    phase = local.phase
    if holding:
        if phase in (Phase.UNKNOWN, Phase.SERVING, Phase.RECOVERING):
            return Phase.DRAINING, True, False, ""
        if phase is Phase.DRAINING and not local.job_running and not local.job_failed:
            return Phase.DRAINED, False, False, ""
        if phase is Phase.DRAINING and not local.job_running and snap.mono - local.phase_since >= policy.drain_retry:
            # A failed drain is tried again (a hook fixed meanwhile lets the VM ack and the event start
            # early); the VM stays out of rotation whatever the outcome, and acks only once it succeeds.
            return Phase.DRAINING, True, False, ""
        return None, False, False, ""
    if snap.document is None:
        return None, False, False, ""  # no fresh evidence that the VM is free: keep it as it is
    if phase in (Phase.UNKNOWN, Phase.DRAINING, Phase.DRAINED):
        why = _acks_outstanding(snap, policy)
        if why:
            return None, False, False, why
        return Phase.RECOVERING, False, True, ""
    if phase is Phase.RECOVERING and not local.job_running:
        if local.job_failed:
            if snap.mono - local.phase_since >= policy.recover_retry:
                return Phase.RECOVERING, False, True, ""
            return None, False, False, ""
        if snap.mono - local.job_done_at >= policy.back_after:
            return Phase.SERVING, False, False, ""  # the load balancer has had time to route to it again
        return None, False, False, ""
    return None, False, False, ""


def _acks_outstanding(snap: Snapshot, policy: Policy) -> str:
    """Why this VM may not serve yet although nothing holds it (empty: it may).

    It may serve once ZooKeeper, read this cycle over a CONNECTED session, shows no ack of it (its
    acks are withdrawn first), or once every session that could hold one has certainly lapsed and every
    approval one could have released is in IMDS's documents (``_acks_released_by``): this process has
    been cut off, and alive, for longer than the server may keep a session it no longer hears from
    (``session_lapses_after``: the granted timeout, at least two ticks, plus a tick) and half a session
    more, and the document of this decision was requested after that, since acks are ephemeral."""
    cluster = snap.cluster
    if cluster is not None and cluster.connection is ConnectionState.CONNECTED:
        mine = sorted(key for key, record in cluster.records.items() if snap.me in record.acks)
        if not mine:
            return ""
        return f"withdrawing its acknowledgement of {','.join(mine)}"
    if snap.read_sent >= _acks_released_by(snap, policy):
        return ""
    return "ZooKeeper unreachable: its acknowledgements may stand until its session lapses"


def _acks_released_by(snap: Snapshot, policy: Policy) -> float:
    """When (monotonic) the acks of a cut-off VM can no longer have released any approval that IMDS has
    not applied yet: every session of it has lapsed (``session_lapses_after``, counted from when it was
    last seen CONNECTED, or from this process's start if never), and an approver's POST fenced on one of
    its acks has been sent (the fence lets an attempt go up to half a session timeout after the final
    check). A VM serves again only on a document whose request was sent after that: an older one may not
    show an event approved on its standing ack, which has started by now."""
    since = snap.connected_at if snap.connected_at is not None else snap.started
    return since + session_lapses_after(policy, snap.granted_session) + policy.session_timeout / 2


def _out_vms(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, tuple[str, ...]]:
    """VMs out of rotation, each with the event keys it is out for (none: starting up, or back from a
    crash): by their own ``/out`` node, or because they acknowledge an event (drained now). One whose
    agent this agent has seen gone for ``recovery_grace`` no longer counts: it is not coming back soon,
    and serves nobody meanwhile."""
    out: dict[str, list[str]] = {}
    for vm, mark in cluster.out.items():
        out[vm] = [eid.upper() for eid in mark.events]
    for key, record in sorted(cluster.records.items()):
        for vm in record.acks:
            if key not in out.setdefault(vm, []):
                out[vm].append(key)
    for vm in _unconfirmed(cluster, snap, policy):
        out.setdefault(vm, [])
    return {vm: tuple(keys) for vm, keys in out.items()
            if vm in cluster.members or snap.absent_for.get(vm, 0.0) < policy.recovery_grace}


def _unconfirmed(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, str]:
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


def _in_flight(
    events: Mapping[str, _Event], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> dict[str, frozenset[str]]:
    """What holds the budget, as unit key -> VMs: present events that are admitted, Started, or have a
    VM out of rotation for them; and every other VM out of rotation (under the event it is out for, if
    any), until it is back in its load balancer's rotation."""
    out = _out_vms(cluster, snap, policy)
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
            # of them is being admitted or approved.
            for unit in keys or (f"vm:{vm}",):
                flight[unit] = flight.get(unit, frozenset()) | {vm}
    return flight


def _unit(key: str, events: Mapping[str, _Event], policy: Policy) -> str:
    """What the budget counts as one: an event, or a batch of Terminates sharing one NotBefore (Azure
    runs such a batch as one operation)."""
    ev = events.get(key)
    if (policy.terminate_together and ev is not None and ev.event.event_type == EventType.TERMINATE
            and ev.not_before is not None):
        return f"terminate@{ev.not_before:.0f}"
    return key


def _admissions(
    events: Mapping[str, _Event], cluster: ClusterView, snap: Snapshot, policy: Policy
) -> tuple[list[str], dict[str, str]]:
    """The leader's admissions and why the others wait.

    Candidates are Scheduled events with a record, not yet admitted, that could be approved early
    and are within the lead time. Those already holding their VMs (drained just in time, or
    acknowledged) come first, then first come (NotBefore, then id) first served; a Terminate batch is
    admitted as one. Nothing behind a waiting unit jumps ahead of it.
    """
    flight = _in_flight(events, cluster, snap, policy)
    candidates = [
        ev for key, ev in events.items()
        if ev.event.is_scheduled and key in cluster.records
        and (cluster.records[key].admitted_at is None or cluster.records[key].done_at is not None)
        and _approvable(ev, cluster, snap, policy)
        and (policy.lead_time is None or snap.now >= (ev.not_before or 0.0) - policy.lead_time)
    ]
    units: dict[str, list[_Event]] = {}
    for ev in candidates:
        units.setdefault(_unit(ev.key or "", events, policy), []).append(ev)
    order = sorted(units.items(), key=lambda item: (
        not any(ev.key in flight for ev in item[1]),
        min(ev.not_before if ev.not_before is not None else float("inf") for ev in item[1]),
        item[0],
    ))
    admit: list[str] = []
    why: dict[str, str] = {}
    for position, (_, members) in enumerate(order):
        keys = {ev.key or "" for ev in members}
        vms = frozenset().union(*(ev.resources for ev in members))
        reason = _over_budget(keys, vms, flight, events, cluster, snap, policy)
        if reason:
            for _, rest in order[position:]:
                for ev in rest:
                    why[ev.key or ""] = reason
            break
        admit.extend(sorted(keys))
        for ev in members:
            flight[ev.key or ""] = frozenset(ev.resources)
    return admit, why


def _over_budget(
    keys: set[str], vms: frozenset[str], flight: Mapping[str, frozenset[str]], events: Mapping[str, _Event],
    cluster: ClusterView, snap: Snapshot, policy: Policy,
) -> str:
    """Why taking ``vms`` out for the events ``keys`` would break the budget, given what else is in
    flight (empty: it would not). Used at admission, and again at approval: between the two, VMs may
    have gone out of rotation for other reasons (a forced drain, a restart, an event with no notice)."""
    others = {k: v for k, v in flight.items() if k not in keys}
    # Busy: every VM out of rotation but those the event itself is about to take; a VM filed under one
    # of ``keys`` without being named by it (out for an earlier instance of the id) is busy too.
    busy = frozenset().union(*flight.values()) - vms if flight else frozenset()
    # A VM out of rotation for no event (starting up, back from a crash) is not an event in
    # maintenance; it still counts against max_vms and keep_one_serving.
    # A unit already in flight that ``keys`` belong to (a Terminate of a batch seen after the others were
    # admitted) is the same operation, not another one: the batch is approved only together.
    in_maintenance = ({_unit(k, events, policy) for k in others if not k.startswith("vm:")}
                      - {_unit(k, events, policy) for k in keys})
    if policy.max_events is not None and len(in_maintenance) >= policy.max_events:
        return f"maintenance budget: {len(in_maintenance)} event(s) in maintenance ({', '.join(sorted(others))})"
    if policy.max_vms is not None and busy and len(busy | vms) > policy.max_vms:
        return f"maintenance budget: {len(busy)} VM(s) in maintenance, at most {policy.max_vms}"
    if policy.keep_one_serving and cluster.members and not (cluster.members - busy - vms):
        unconfirmed = _unconfirmed(cluster, snap, policy)
        if unconfirmed:
            seen = ", ".join(f"{vm}: {detail}" for vm, detail in unconfirmed.items())
            return f"it would leave no VM serving (not confirmed in rotation: {seen})"
        return "it would leave no VM serving"
    return ""


def follows_group(snap: Snapshot, local: LocalState) -> bool:
    """Whether this VM's decisions need the whole view of the group (``ClusterView.complete``), or only its
    own part of it (``coordinator.store.base.own_view``). They need the whole view when this VM leads (it
    admits events, approves those no live agent they name can, marks records done and absences), when an
    event of its documents or an open record names it (it drains, acks, and may be the approver), when it
    holds an ack or an event, has POSTed an approval, runs a job, or is not serving, and when another agent
    runs under its name. Any other VM approves nothing and admits nothing: it publishes the events it sees,
    and watches its own ack and ``/out`` mark, so that the acks and marks of the VMs an event names do not
    wake it. Without a view: the whole view, read next."""
    cluster = snap.cluster
    if cluster is None or cluster.i_am_leader or snap.duplicate:
        return True
    if local.phase is not Phase.SERVING or local.job_running or local.draining_for or local.posted or snap.named:
        return True
    me = snap.me
    for document in (snap.document, snap.last_document):
        if document is not None and any(event.names(me) for event in document.events):
            return True
    return any(me in record.acks or (record.done_at is None and me in record.resources)
               for record in cluster.records.values())


def decide(snap: Snapshot, local: LocalState, policy: Policy) -> Plan:
    if snap.cluster is not None and not snap.cluster.complete and follows_group(snap, local):
        # A view cut down to this VM's own part where its decisions weigh the group's (the agent reads the
        # whole view first): decided as without a view, on the safe side. It never admits or approves on
        # acks or budget marks it did not read.
        snap = replace(snap, cluster=None)
    doc = snap.document
    basis = doc if doc is not None else snap.last_document
    parsed: list[_Event] = []
    invalid: list[str] = []
    for event in basis.events if basis is not None else ():
        ev, problems = _parse(event, policy)
        parsed.append(ev)
        invalid.extend(problems)
    # An EventId listed more than once (IMDS never does so; the entries may name different VMs): approving
    # it would release every entry, so it is never approved early, and each entry drains the VMs it names.
    listed = Counter(ev.key for ev in parsed if ev.key is not None)
    for index, ev in enumerate(parsed):
        if ev.key is not None and listed[ev.key] > 1:
            parsed[index] = replace(ev, rule=ApprovalRule.NEVER, listed=listed[ev.key])
    invalid.extend(f"event {key!r} is listed {n} times in the document" for key, n in listed.items() if n > 1)
    by_key = {ev.key: ev for ev in parsed if ev.key is not None}

    # What holds this VM: events naming it that it must drain for, and every event it was drained
    # for that is not gone yet (still named by a recent document, or known only from before a restart).
    holding_events = [ev for ev in parsed if ev.event.names(snap.me) and _drains(ev, snap, local, policy)]
    holding = list(dict.fromkeys(ev.held_as for ev in holding_events))
    for key in sorted(local.draining_for):
        if key not in holding and not is_gone(snap.named.get(key), policy.gone_after):
            holding.append(key)
    # Another agent running as this VM: out of rotation until it is gone, whatever the events say. The
    # store never lets it take that agent's member node (which would let one's ack stand for the other).
    next_phase, start_drain, start_recover, waiting = _local(snap, local, policy, bool(holding) or bool(snap.duplicate))
    if snap.duplicate:
        invalid.append(snap.duplicate)
        waiting = waiting or "another agent runs as this VM"
    phase_after = next_phase or local.phase
    drain_started = snap.mono if start_drain else local.drain_started
    holding_keys = set(holding)
    posted = _still_posted(local.posted, set(by_key), snap, policy)

    cluster = snap.cluster
    publish: list[EventRecord] = []
    admit: list[str] = []
    ack: list[str] = []
    withdraw: list[str] = []
    mark_done: list[str] = []
    reopen: list[str] = []
    mark_absent: list[str] = []
    clear_absent: list[str] = []
    mark_out: tuple[str, ...] | None = None
    clear_out = False
    approvers: dict[str, str] = {}
    blocked: dict[str, tuple[str, ...]] = {}
    ready: dict[str, ApprovalIntent | None] = {}  # approvable events (None: approvable by someone else)
    # event key -> (seconds it must have been approvable, the VMs past the absent grace it names)
    unseen_drains: dict[str, tuple[float, tuple[str, ...]]] = {}

    if cluster is not None:
        # What the budget weighs: this VM's events, and those known only from records its documents never
        # listed (groups whose IMDS shows each VM only the events naming it).
        known = {**_from_store(cluster, snap, policy), **by_key} if policy.budgeted else by_key
        wait_slot: dict[str, str] = {}
        budget_view: dict[str, str] | None = None  # a member's own reckoning of the leader's admissions
        if doc is not None and policy.budgeted and cluster.i_am_leader:
            admit, wait_slot = _admissions(known, cluster, snap, policy)
        flight = _in_flight(known, cluster, snap, policy) if policy.budgeted and cluster.complete else {}
        for ev in holding_events:
            if ev.key is None or phase_after is not Phase.DRAINED:
                continue
            record = cluster.records.get(ev.key)
            if snap.mono - drain_started >= policy.wait_for(ev.event) and (
                record is None or snap.me not in record.acks
            ):
                ack.append(ev.key)
        for key, record in cluster.records.items():
            if snap.me in record.acks and key not in holding_keys:
                withdraw.append(key)  # an ack stands for a drain that holds now, never for one that did
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
            if not cluster.complete:
                continue  # neither named by it nor leading: its approver and the leader weigh it
            reasons = _approval_blockers(ev, record, ev.key in admit, ack, snap, cluster, policy)
            if _NOT_ADMITTED in reasons:
                if cluster.i_am_leader and ev.key in wait_slot:
                    why: str | None = wait_slot[ev.key]
                else:
                    if budget_view is None:
                        budget_view = _admissions(known, cluster, snap, policy)[1] if not cluster.i_am_leader else {}
                    why = _not_admitted_because(ev, reasons, budget_view, cluster, snap, policy)
                reasons = tuple(r for r in ((why if r == _NOT_ADMITTED else r) for r in reasons) if r is not None)
            if approver is None:
                reasons += ("no live agent named in Resources and no leader",)
            if not reasons and policy.budgeted:
                batch = {k for k in by_key if _unit(k, by_key, policy) == _unit(ev.key, by_key, policy)}
                over = _over_budget(batch, frozenset(ev.resources), flight, known, cluster, snap, policy)
                reasons = (f"at approval: {over}",) if over else ()
            if reasons:
                blocked[ev.key] = reasons
                continue
            mine = approver == snap.me and ev.key not in posted
            after_drain = ev.rule is ApprovalRule.AFTER_DRAIN
            required = tuple(vm for vm in ev.resources if _waited_for(vm, cluster, policy, snap)) if after_drain else ()
            intent = ApprovalIntent(ev.event.event_id, ev.key, required, as_leader, after_drain and policy.budgeted)
            ready[ev.key] = intent if mine else None
            if mine and after_drain:
                past_grace = tuple(vm for vm in ev.resources if vm in cluster.known and vm not in required)
                if past_grace:
                    unseen_drains[ev.key] = (policy.wait_for(ev.event) + policy.absent_notice, past_grace)
        if policy.terminate_together:
            _hold_terminate_batches(by_key, ready, blocked)
        if doc is not None and cluster.i_am_leader:
            for key, record in cluster.records.items():
                if key in by_key:
                    if record.done_at is not None:
                        reopen.append(key)  # back (a flap, or a reused EventId): nothing of before counts
                elif record.done_at is None and _over(key, record, cluster, snap, policy):
                    mark_done.append(key)
        if cluster.i_am_leader:
            mark_absent = sorted(cluster.known - cluster.members - set(cluster.absent_since))
            clear_absent = sorted(set(cluster.absent_since) & cluster.members)
        mine_out = cluster.out.get(snap.me)
        if phase_after is Phase.SERVING:
            clear_out = mine_out is not None
        else:
            # Events accumulate until the VM is back in rotation: a VM back from a reboot is still out
            # for the event that took it out, whatever its restarted agent holds now.
            earlier = tuple(mine_out.events) if mine_out is not None else ()
            out_for = {e.upper() for e in earlier}
            if mine_out is None or not set(holding) <= out_for:
                mark_out = earlier + tuple(e for e in holding if e not in out_for)

    approve, approvable_since, held = _fresh_for_approval(
        tuple(intent for intent in ready.values() if intent is not None), snap, local)
    if held:
        why = "approval waits for a document read after it became approvable"
        blocked = {**blocked, **{key: (why,) for key in held}}
    approve, settling = _absent_drained(approve, approvable_since, unseen_drains, snap)
    blocked = {**blocked, **settling}

    return Plan(
        next_phase=next_phase,
        start_drain=start_drain,
        start_recover=start_recover,
        publish=tuple(publish),
        admit=tuple(admit),
        ack=tuple(ack),
        withdraw=tuple(withdraw),
        approve=approve,
        mark_done=tuple(mark_done),
        reopen=tuple(reopen),
        mark_absent=tuple(mark_absent),
        clear_absent=tuple(clear_absent),
        mark_out=mark_out,
        clear_out=clear_out,
        purge_before=_purge_before(snap, cluster, policy),
        holding=tuple(holding),
        approvers=approvers,
        blocked=blocked,
        invalid=tuple(invalid),
        waiting=waiting,
        posted=posted,
        approvable_since=approvable_since,
        read_now=bool(held),
        unseen=" and ".join(what for what, missing in (("no fresh IMDS document", doc is None),
                                                       ("no ZooKeeper view", cluster is None)) if missing),
    )


def _fresh_for_approval(
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


def _absent_drained(
    approve: tuple[ApprovalIntent, ...], since: Mapping[str, float],
    unseen_drains: Mapping[str, tuple[float, tuple[str, ...]]], snap: Snapshot,
) -> tuple[tuple[ApprovalIntent, ...], dict[str, tuple[str, ...]]]:
    """An event that names VMs absent past ``absent_grace`` is approved without their acks, on the promise
    that a VM cut off from ZooKeeper drains itself for any event naming it (``_drains``). It can do so only
    once it sees the event: the approval waits until the event has been approvable for the drain wait
    plus ``absent_notice`` (the time a cut-off VM may take to see it after its approver). Without this, an
    event that appeared after the grace ran out was approved at once, while those VMs had just begun to
    drain. Returns the approvals that may go ahead and the reasons of those held."""
    go: list[ApprovalIntent] = []
    held: dict[str, tuple[str, ...]] = {}
    for intent in approve:
        wait, vms = unseen_drains.get(intent.key, (0.0, ()))
        left = since.get(intent.key, snap.cycle_started) + wait - snap.cycle_started
        if left > 0:
            held[intent.key] = (f"waits {left:.0f} s more for {','.join(vms)} (absent past the grace) to drain "
                                "for it on their own",)
        else:
            go.append(intent)
    return tuple(go), held


def _from_store(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, _Event]:
    """Open records of events this VM's documents have never listed, as events (status Scheduled): the
    leader admits them and the budget counts them. Where IMDS shows every VM every event of the group,
    this is a record a peer published a moment before this VM's next poll; where it shows each VM only
    the events naming it, it is how the leader learns of them at all. Approvals and drains still rest on
    each VM's own documents. A record counts so only once it has been known for ``gone_after`` without
    this VM's documents listing it."""
    found: dict[str, _Event] = {}
    for key, record in cluster.records.items():
        sighting = snap.seen.get(key)
        if record.done_at is not None or sighting is None or sighting.listed:
            continue
        if snap.mono - sighting.last < policy.gone_after:
            # Where every VM sees every event, this VM's own documents list it within a poll or two, with
            # what the record cannot say (its source, its duration): not admitted on the record meanwhile.
            continue
        # NotBefore stays in epoch seconds: a clamped one at the calendar's limits has no datetime.
        event = ScheduledEvent(event_id=key, event_type=record.event_type, event_status="Scheduled",
                               resources=record.resources)
        found[key] = _Event(event, key, tuple(record.resources), (), rule_for(event, policy), from_store=True,
                            stored_not_before=record.not_before)
    return found


def _over(key: str, record: EventRecord, cluster: ClusterView, snap: Snapshot, policy: Policy) -> bool:
    """Whether the leader takes an open record's event for over (its record is then marked done). One its
    documents listed is over once gone from them. One they never listed (IMDS shows it only to the VMs it
    names) is over once none of those VMs holds it (no ack, no ``/out`` node naming it) and it was
    approved or its NotBefore has passed: its VMs hold it from their drain until it is gone for them."""
    sighting = snap.seen.get(key)
    if sighting is None or sighting.listed:
        return is_gone(sighting, policy.gone_after)
    if record.acks or any(key in {e.upper() for e in mark.events} for mark in cluster.out.values()):
        return False
    return record.approval is not None or record.not_before is None or snap.now >= record.not_before


def _still_posted(posted: frozenset[str], listed: set[str], snap: Snapshot, policy: Policy) -> frozenset[str]:
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


def _waited_for(vm: str, cluster: ClusterView, policy: Policy, snap: Snapshot) -> bool:
    """Whether ``vm``'s ack is required: always, unless it has never run an agent and policy ignores
    such VMs, or this agent has itself seen its agent gone for ``absent_grace`` (measured on this
    agent's monotonic clock, never across machines). A cut-off agent drains itself before that
    (``_drains``), and a dead one took its probe endpoint with it. A live member is always waited for."""
    if vm in cluster.members:
        return True
    if policy.unknown_peers is PeersPolicy.IGNORE and vm not in cluster.known:
        return False
    if policy.absent_grace is None or vm not in cluster.known:
        return True
    return snap.absent_for.get(vm, 0.0) < policy.absent_grace


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
    if ev.listed > 1:
        return (f"its EventId is listed {ev.listed} times in the document: never approved early",)
    if not event.is_known_type:
        return (f"unknown event type {event.event_type!r} is never approved early",)
    if ev.rule is ApprovalRule.NEVER:
        return (f"policy: {event.event_type} events are never approved early",)
    if ev.bad_names:
        return ("Resources holds a name that is not a valid VM name",)
    if not ev.resources:
        return ("Resources is empty: nobody known to drain",)
    if ev.not_before is None:
        return ("NotBefore is missing or unreadable",)
    if record is None:
        return ("event record not published yet",)
    reasons: list[str] = []
    if cluster.paused is not None:
        reasons.append(f"approvals paused by {cluster.paused.by}: {cluster.paused.reason}")
    if not in_windows(policy.windows, snap.now):
        reasons.append("outside the maintenance windows")
    if record.done_at is not None:
        reasons.append("its record is marked done: reopened by the leader first")
    if ev.rule is ApprovalRule.AFTER_DRAIN:
        if policy.budgeted and record.admitted_at is None and not admitting_now:
            reasons.append(_NOT_ADMITTED)  # replaced by its cause (``_not_admitted_because``)
        acking = set(acking_now)
        for vm in ev.resources:
            acked = vm in record.acks or (vm == snap.me and ev.key in acking)
            if acked or not _waited_for(vm, cluster, policy, snap):
                continue  # an ack written this very cycle is re-checked by Store.approve before the POST
            reasons.append(f"{vm} runs no agent" if vm not in cluster.members else f"{vm} has not acknowledged")
    if cluster.connection is not ConnectionState.CONNECTED:
        reasons.append(f"ZooKeeper connection {cluster.connection.value}")
    return tuple(reasons)


_NOT_ADMITTED = "not admitted yet"


def _not_admitted_because(
    ev: _Event, reasons: tuple[str, ...], budget_view: Mapping[str, str], cluster: ClusterView, snap: Snapshot,
    policy: Policy,
) -> str | None:
    """Why the leader has not admitted ``ev`` into the budget, as far as this agent can tell (None: the
    other reasons already say it). The leader itself says why from its own admissions (the budget);
    another member reckons them from its own view: what it cannot see is whether the leader has read
    the event from IMDS yet."""
    others = [r for r in reasons if r != _NOT_ADMITTED]
    if not _approvable(ev, cluster, snap, policy):
        # Outside the maintenance windows, or a VM it names runs no agent: said by the other reasons.
        return None if others else "not admitted: it cannot be approved early now"
    lead = policy.lead_time
    if lead is not None and ev.not_before is not None and snap.now < ev.not_before - lead:
        return f"not admitted before {lead:g} s ahead of NotBefore (drain.lead_time_seconds)"
    if cluster.leader is None:
        return "not admitted: no leader to admit it"
    if cluster.i_am_leader:
        return _NOT_ADMITTED
    if ev.key is not None and ev.key in budget_view:
        return budget_view[ev.key]  # the budget is full: the leader's reason, as this agent reckons it
    return f"not admitted by the leader {cluster.leader} yet (the budget has room for it)"


def _hold_terminate_batches(
    events: Mapping[str, _Event], ready: dict[str, ApprovalIntent | None], blocked: dict[str, tuple[str, ...]]
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
                    blocked[key] = ("waiting for the other deletes that share its NotBefore",)


def _purge_before(snap: Snapshot, cluster: ClusterView | None, policy: Policy) -> float | None:
    """The leader purges records done before the retention cutoff, and only when its view shows one:
    an idle group costs ZooKeeper no periodic sweep of every record."""
    if cluster is None or not cluster.i_am_leader:
        return None
    cutoff = snap.now - policy.done_retention
    expired = any(r.done_at is not None and r.done_at < cutoff for r in cluster.records.values())
    return cutoff if expired else None
