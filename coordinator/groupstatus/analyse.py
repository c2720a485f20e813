"""From one read of the group to the ``GroupStatus`` model: who approves each event and what blocks it,
worked out by the agents' own decision function, and what looks stuck.

Blockers: for each event not done, ``coordinator.decide.decide`` is run from its approver's perspective
(the approver chosen by ``choose_approver``, as every agent does), on a snapshot rebuilt from what
ZooKeeper holds: a document made of the records not done (type, Resources, NotBefore; the status as the
agents' last documents report it, else Scheduled until NotBefore and Started after), the cluster view as
read, the approver's leadership, the absences (their ages from ``absent/{vm}``), and, when every member's
agent answered, what each says its phase is (standing in for the probes of ``confirm_peers_by_probe``:
"serving" is in rotation). The approver's own local state is taken as serving, so that the reasons come
from ZooKeeper's state alone and never from an acknowledgement the approver is about to write. The
reasons are the blockers the agents log and show in their ``/status`` (``coordinator.blockers``: a kind,
the VM it is about, and the words: "vm1 has not acknowledged", "maintenance budget: 1 event(s) in
maintenance (E1)", ...); what is worked out here reads their kinds, never their words. When the approver
is not the leader, the admission reason it reckons is replaced by the leader's: ``decide`` from the
leader's perspective says why it does not admit the event (the budget, a lead time), or that it admits it
now. The deciding agent has the last word: the leader's own admission reason and the approver's own "at
approval: ..." hold, as their ``/status`` gives them (its ``blockers``), stand in for what is worked out
here (they weigh their own probes of the peers).

The status of an event is the one the agents' last documents show; an event that could have started
(approved, or NotBefore passed) and that the fresh document of an agent that would list it no longer
lists is gone from IMDS: shown done (status None) until the leader marks its record done.

What ZooKeeper does not hold, and is therefore assumed: the event's ``EventSource`` and
``DurationInSeconds`` (a ``User`` rule or ``freeze_immediately_below_seconds`` cannot be applied), the
approver's own IMDS reading and its clocks. The policy is the one of the configuration given with
``--config`` (the group shares one), else the defaults.

Should ``decide`` fail (a bug), the blockers fall back to a plain derivation from the records: missing
acks, no admission, no approver, NotBefore.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from coordinator.blockers import NO_APPROVER, NOT_ADMITTED_YET, Hold, waiting_for_ack
from coordinator.blockers import Blocker as Held
from coordinator.config import ApprovalRule
from coordinator.decide import (
    LocalState,
    PeerSeen,
    Phase,
    Plan,
    Policy,
    Sighting,
    Snapshot,
    choose_approver,
    decide,
)
from coordinator.delivery import Delivery
from coordinator.groupstatus.by_hand import drained_by_hand
from coordinator.groupstatus.model import (
    Absent,
    Ack,
    AgentReport,
    Approval,
    Attention,
    Blocker,
    EventState,
    EventStatus,
    GroupStatus,
    Leader,
    Member,
    OutOfRotation,
    Paused,
    Placement,
    Vouched,
    utc,
)
from coordinator.groupstatus.read import AgentAnswer, GroupRead
from coordinator.models import Document
from coordinator.store.base import BY_HAND, ClusterView, EventRecord

__all__ = ["NOT_ADMITTED", "STUCK_AFTER", "build_status", "event_statuses"]

log = logging.getLogger(__name__)

NOT_ADMITTED = str(NOT_ADMITTED_YET)
#: An event still not done this long after it could start (approved, or NotBefore passed), an ack standing
#: this long after its event was done, a VM out of rotation for ``OUT_LONG``: shown as needing attention.
STUCK_AFTER = 1800.0
OUT_LONG = 1800.0
# What holds a blocked event back, by kind: by design (the policy, an operator's pause, the maintenance
# windows: it starts at NotBefore as asked, nothing to attend to, as for the alert
# CoordinatorEventBlockedNearNotBefore), or for good (nothing clears it by itself; so does a blocker that
# says it is ``lasting``: the budget on its own, a peer whose probe does not answer).
_BY_DESIGN = frozenset({Hold.POLICY.value, Hold.PAUSED.value, Hold.OUTSIDE_WINDOW.value})
_FOR_GOOD = frozenset({Hold.NO_AGENT.value, Hold.NO_APPROVER.value, Hold.INVALID_EVENT.value})
_BUDGETED = frozenset({Hold.BUDGET.value, Hold.NOT_ADMITTED.value, Hold.LEAD_TIME.value})


def build_status(read: GroupRead, policy: Policy, policy_source: str) -> GroupStatus:
    """The model of one read."""
    view, now = read.view, read.read_at
    reports = {vm: _report(answer) for vm, answer in read.agents.items()}
    members = [_member(vm, read, reports) for vm in sorted(view.members)]
    out = [OutOfRotation(vm=vm, since=utc(mark.since), events=[e.upper() for e in mark.events],
                         member=vm in view.members) for vm, mark in sorted(view.out.items())]
    absent = [Absent(vm=vm, since=utc(since)) for vm, since in sorted(view.absent_since.items())]
    by_hand = drained_by_hand(read, reports)
    events = event_statuses(read, policy)
    active = sorted((e for e in events if e.done_at is None),
                    key=lambda e: (e.not_before is None, e.not_before or e.published_at, e.event_id))
    done = sorted((e for e in events if e.done_at is not None), key=lambda e: e.done_at or e.published_at,
                  reverse=True)
    paused: Paused | None = None
    if read.paused is not None:
        paused = Paused(reason=read.paused.reason, by=read.paused.by, at=utc(read.paused.at))
    elif read.paused_unreadable is not None:
        at = utc(read.pause_ctime) if read.pause_ctime is not None else None
        paused = Paused(reason=f"(pause node unreadable: {read.paused_unreadable})", by="?", at=at)
    leader = None
    if view.leader is not None:
        leader = Leader(vm=view.leader, since=utc(read.leader_since) if read.leader_since is not None else None)
    status = GroupStatus(
        cluster=read.cluster, base_path=read.base_path, zookeeper=read.hosts, read_at=utc(now),
        read_only_server=read.read_only_server, policy=policy_source, paused=paused, leader=leader,
        members=members, registered=sorted(view.known), out_of_rotation=out, drained_by_hand=by_hand, absent=absent,
        events=active, done=done, attention=[],
    )
    return status.model_copy(update={"attention": _attention(status, read, policy)})


# -- members ------------------------------------------------------------------------------------------


def _text(value: object) -> str | None:
    if value is None or value == "":
        return None
    return str(value)


def _report(answer: AgentAnswer) -> AgentReport:
    body = answer.body
    if body is None:
        return AgentReport(reachable=False, url=answer.url, error=answer.error)
    cluster = body.get("cluster")
    cycles = body.get("cycles")
    return AgentReport(
        reachable=True, url=answer.url,
        phase=_text(body.get("phase")),
        cycles=cycles if isinstance(cycles, int) and not isinstance(cycles, bool) else None,
        last_cycle=_text(body.get("last_cycle")),
        connection=_text(cluster.get("connection")) if isinstance(cluster, dict) else "unavailable",
        action_error=_text(body.get("action_error")),
        action_fallback=_text(body.get("action_fallback")),
        stays_out=_text(body.get("stays_out")),
    )


def _member(vm: str, read: GroupRead, reports: Mapping[str, AgentReport]) -> Member:
    info = read.member_info.get(vm, {})
    started = info.get("started_at")
    return Member(
        vm=vm,
        leader=vm == read.view.leader,
        version=_text(info.get("version")),
        started_at=utc(started) if isinstance(started, int | float) and not isinstance(started, bool) else None,
        placement=Placement(
            fault_domain=_text(info.get("fault_domain")), update_domain=_text(info.get("update_domain")),
            zone=_text(info.get("zone")), scale_set=_text(info.get("scale_set")),
            unit=_text(info.get("unit")), delivery=_text(info.get("delivery")),
        ),
        probe=_text(info.get("probe")),
        admin=_text(info.get("admin")),
        agent=reports.get(vm) or AgentReport(reachable=False, url=None, error="not asked"),
    )


# -- events -------------------------------------------------------------------------------------------


def _reported(read: GroupRead) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Event key -> (VM, the event as that VM's agent reports it), from every answer."""
    found: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for vm, answer in sorted(read.agents.items()):
        events = answer.body.get("events") if answer.body is not None else None
        for event in events if isinstance(events, list) else ():
            if isinstance(event, dict) and isinstance(event.get("event_id"), str):
                found.setdefault(event["event_id"].upper(), (vm, event))
    return found


def _event_from_agent(read: GroupRead, vm: str | None, key: str) -> Mapping[str, Any] | None:
    answer = read.agents.get(vm or "")
    events = answer.body.get("events") if answer is not None and answer.body is not None else None
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict) and str(event.get("event_id", "")).upper() == key:
            return event
    return None


def _status_of(record: EventRecord, read: GroupRead, reported: Mapping[str, tuple[str, Mapping[str, Any]]],
               approver: str | None) -> tuple[str | None, str | None]:
    """(status, who reported it): the approver's report first, then any agent's; None when the event is gone
    from IMDS, by the agent whose document shows so (``_gone_per``); else assumed."""
    own = _event_from_agent(read, approver, record.event_id)
    if own is not None and isinstance(own.get("status"), str):
        return own["status"], approver
    if record.event_id in reported:
        vm, event = reported[record.event_id]
        if isinstance(event.get("status"), str):
            return event["status"], vm
    gone = _gone_per(record, read)
    if gone is not None:
        return None, gone
    if record.not_before is not None and read.read_at >= record.not_before:
        return "Started", None
    return "Scheduled", None


def _gone_per(record: EventRecord, read: GroupRead) -> str | None:
    """The first agent whose last document (read fresh) no longer lists the record's event although its
    documents list the event while it is present: it names that VM, that VM published or approved it, or
    its agent runs with ``imds.delivery: unit`` in the record's unit (``coordinator.delivery``). None when no
    such agent answered. Only for an event that could have started (approved, or NotBefore passed): by then
    every agent has read it, whereas a new event may not have reached every agent's document yet."""
    if record.approval is None and (record.not_before is None or read.read_at < record.not_before):
        return None
    showing = {*record.resources, record.published_by, *([record.approval.by] if record.approval else [])}
    for vm, answer in sorted(read.agents.items()):
        body = answer.body or {}
        imds, events = body.get("imds"), body.get("events")
        if not (vm in showing or _unit_wide_in(vm, record, read)) or not isinstance(imds, dict) \
                or imds.get("fresh") is not True or not isinstance(events, list):
            continue
        if not any(isinstance(e, dict) and str(e.get("event_id", "")).upper() == record.event_id for e in events):
            return vm
    return None


def _unit_wide_in(vm: str, record: EventRecord, read: GroupRead) -> bool:
    """Whether ``vm``'s member node says IMDS shows it every event of the record's unit (``Delivery.covers``,
    for an agent configured so: what ``auto`` observed is not published)."""
    delivery = Delivery.published(read.member_info.get(vm, {}))
    return delivery is not None and delivery.covers(record, seen_unnamed=False)


def event_statuses(read: GroupRead, policy: Policy) -> list[EventStatus]:
    """Every record of the view as an ``EventStatus``, blockers worked out (see the module docstring)."""
    view = read.view
    reported = _reported(read)
    approvers = {key: choose_approver(tuple(r.resources), view, policy.approver)
                 for key, r in view.records.items() if r.done_at is None}
    statuses = {key: _status_of(view.records[key], read, reported, approver)
                for key, (approver, _) in approvers.items()}
    plans: dict[str, Plan] = {}
    failure: str | None = None
    try:
        plans = _plans(read, policy, approvers, {k: s for k, (s, _) in statuses.items() if s is not None})
    except Exception as exc:  # a bug in the decision function must not take the status view down
        log.warning("cannot work out blockers with the decision function: %r", exc, exc_info=True)
        failure = f"{type(exc).__name__}: {exc}"
    result = []
    for key, record in sorted(view.records.items()):
        approver, as_leader = approvers.get(key, (None, None))
        status, reported_by = statuses.get(key, (None, None))
        result.append(_event(record, read, policy, approver, as_leader, status, reported_by, plans, failure))
    return result


def _plans(read: GroupRead, policy: Policy, approvers: Mapping[str, tuple[str | None, bool]],
           statuses: Mapping[str, str]) -> dict[str, Plan]:
    """``decide`` from each approver's perspective, and from the leader's: perspective -> plan."""
    view = read.view
    document = Document.model_validate({
        "DocumentIncarnation": 1,
        "Events": [
            {"EventId": key, "EventType": record.event_type, "EventStatus": statuses[key],
             "Resources": list(record.resources),
             "NotBefore": utc(record.not_before) if record.not_before is not None else ""}
            for key, record in sorted(view.records.items()) if key in statuses
        ],
    })
    peers = _peers(read)
    perspectives = {approver for approver, _ in approvers.values() if approver is not None}
    if view.leader is not None:
        perspectives.add(view.leader)
    plans: dict[str, Plan] = {}
    for me in sorted(perspectives):
        cluster = dataclasses.replace(view, i_am_leader=me == view.leader)
        snapshot = Snapshot(
            me=me, now=read.read_at, mono=read.mono, document=document, last_document=document,
            cluster=cluster,
            seen={key: Sighting(read.mono) for key in view.records},
            absent_for={vm: max(read.read_at - since, 0.0) for vm, since in view.absent_since.items()},
            connected_at=read.mono, peers=peers,
        )
        plans[me] = decide(snapshot, LocalState(phase=Phase.SERVING, phase_since=read.mono), policy)
    return plans


def _peers(read: GroupRead) -> dict[str, PeerSeen] | None:
    """The members' phases as their probes would tell them, if every member's agent answered; else None
    (the budget then counts a member in rotation unless ZooKeeper shows it out, as without probes)."""
    members = read.view.members
    if not members or any(read.agents.get(vm) is None or read.agents[vm].body is None for vm in members):
        return None
    seen: dict[str, PeerSeen] = {}
    for vm in members:
        body = read.agents[vm].body or {}
        phase = str(body.get("phase"))
        seen[vm] = PeerSeen(in_rotation=phase == Phase.SERVING.value, at=read.mono,
                            detail=phase if phase == Phase.SERVING.value else f"503 {phase}")
    return seen


def _event(record: EventRecord, read: GroupRead, policy: Policy, approver: str | None, as_leader: bool | None,
           status: str | None, reported_by: str | None, plans: Mapping[str, Plan], failure: str | None) -> EventStatus:
    now = read.read_at
    key = record.event_id
    resources = list(record.resources)
    approval = record.approval
    # Marked done, or gone from IMDS (status None): over, although its record says so only once the leader
    # marks it done. Started (as IMDS shows it, or assumed past NotBefore) wins over approved: once approved,
    # an event stays approved, and what the operator needs to see is that it runs.
    done = record.done_at is not None or status is None
    state: EventState
    reasons: list[Held] = []
    if done:
        state = "done"
    elif status != "Scheduled":
        state = "started"
    elif approval is not None:
        state = "approved"
    else:
        reasons = _reasons(record, read, policy, approver, plans, failure)
        state = "blocked" if reasons else "approvable"
    blockers = [Blocker(kind=r.kind.value, vm=r.vm, reason=str(r), lasting=r.lasting) for r in reasons]
    own = _event_from_agent(read, approver, key) if not done else None
    waiting = own.get("waiting_for") if own is not None else None
    return EventStatus(
        event_id=key,
        type=record.event_type,
        status=None if done else status,
        status_reported_by=None if record.done_at is not None else reported_by,
        resources=resources,
        published_by=record.published_by,
        published_at=utc(record.published_at),
        not_before=utc(record.not_before) if record.not_before is not None else None,
        not_before_in_seconds=round(record.not_before - now, 3) if record.not_before is not None else None,
        acks=[Ack(vm=vm, at=utc(at)) for vm, at in sorted(
            ((vm, at) for vm, at in record.acks.items() if at is not None), key=lambda item: (item[1], item[0]))],
        missing_acks=[vm for vm in resources if vm not in record.acks],
        admitted_at=utc(record.admitted_at) if record.admitted_at is not None else None,
        approval=Approval(by=approval.by, at=utc(approval.at), as_leader=approval.as_leader) if approval else None,
        vouched=Vouched(by=record.vouched.by, at=utc(record.vouched.at), reason=record.vouched.reason,
                        vms=list(record.vouched.vms)) if record.vouched is not None else None,
        done_at=utc(record.done_at) if record.done_at is not None else None,
        approver=None if done else approver,
        approver_as_leader=None if done or approver is None else as_leader,
        state=state,
        blockers=blockers,
        approver_reports=[str(r) for r in waiting] if isinstance(waiting, list) else None,
    )


def _reasons(record: EventRecord, read: GroupRead, policy: Policy, approver: str | None,
             plans: Mapping[str, Plan], failure: str | None) -> list[Held]:
    """Why a Scheduled event is not approved yet, from its approver's plan (see the module docstring)."""
    view, key = read.view, record.event_id
    plan = plans.get(approver) if approver is not None else None
    if plan is None:
        plan = plans.get(view.leader) if view.leader is not None else None
    if plan is None:
        reasons = _derived(record, view, policy, approver, failure)
    else:
        reasons = list(plan.blocked.get(key, ()))
        leader_plan = plans.get(view.leader) if view.leader is not None else None
        index = next((i for i, r in enumerate(reasons) if r.about_admission), None)
        # The deciding agent's own reason, when its /status gives one, comes before what is worked out here:
        # it weighs what ZooKeeper does not hold (its probes of the peers, its own IMDS reading).
        admission = (_own_reason(read, view.leader, key, lambda r: r.about_admission)
                     if record.admitted_at is None else None)
        approving = _own_reason(read, approver, key, lambda r: r.at_approval)
        if admission is not None:
            if admission not in reasons:
                _put(reasons, index, admission)
            reasons = [r for r in reasons if not r.at_approval]  # not admitted: nothing to approve
        elif index is not None and leader_plan is not None and leader_plan is not plan:
            # The approver reckons the leader's admissions; the leader's own plan says it for sure.
            if key in leader_plan.admit:
                reasons[index] = Held(Hold.NOT_ADMITTED,
                                      f"not admitted yet (the leader {view.leader} admits it on its next cycle)")
            else:
                why = [r for r in leader_plan.blocked.get(key, ()) if r.about_admission]
                if why and why[0] not in reasons:
                    reasons[index] = why[0]
        at = next((i for i, r in enumerate(reasons) if r.at_approval), None)
        if approving is not None and admission is None and (at is not None or not reasons):
            _put(reasons, at, approving)
        if approver is None and not reasons:
            reasons.append(NO_APPROVER)
    not_before = record.not_before
    lead = policy.lead_time
    if (reasons and lead is not None and not_before is not None and record.admitted_at is None
            and read.read_at < not_before - lead and not any(r.kind is Hold.LEAD_TIME for r in reasons)):
        reasons.append(Held(Hold.LEAD_TIME,
                            f"drains no earlier than {lead:g} s before NotBefore (drain.lead_time_seconds)"))
    if reasons and not_before is not None and _never_early(reasons, policy, record):
        reasons.append(Held(Hold.NOT_BEFORE, "waiting for NotBefore: it starts then without an approval"))
    return reasons


def _put(reasons: list[Held], index: int | None, reason: Held) -> None:
    """``reason`` in place of ``reasons[index]``, or first when ``index`` is None."""
    if index is None:
        reasons.insert(0, reason)
    else:
        reasons[index] = reason


def _own_reason(read: GroupRead, vm: str | None, key: str, which: Callable[[Held], bool]) -> Held | None:
    """The first blocker of the kind ``which`` picks that ``vm``'s agent gives for the event ``key`` in its
    ``/status`` (None: it did not answer, does not list the event, or gives no such blocker)."""
    event = _event_from_agent(read, vm, key)
    given = event.get("blockers") if event is not None else None
    for value in given if isinstance(given, list) else ():
        blocker = Held.from_json(value)
        if blocker is not None and which(blocker):
            return blocker
    return None


def _never_early(reasons: list[Held], policy: Policy, record: EventRecord) -> bool:
    """Whether the event is never approved early: by its rule, its type, or its record (``invalid_event``)."""
    rule = policy.approval.get(record.event_type, ApprovalRule.AFTER_DRAIN)
    return rule is ApprovalRule.NEVER or any(r.kind in (Hold.POLICY, Hold.INVALID_EVENT) for r in reasons)


def _derived(record: EventRecord, view: ClusterView, policy: Policy, approver: str | None,
             failure: str | None) -> list[Held]:
    """The blockers that can be read off the record alone (when ``decide`` could not be used)."""
    reasons: list[Held] = []
    if failure is not None:
        reasons.append(Held(Hold.UNDECIDED, f"(decision function failed: {failure}; reasons derived from the records)"))
    if approver is None:
        reasons.append(NO_APPROVER)
    elif approver not in view.members:
        reasons.append(Held(Hold.NO_APPROVER, f"approver {approver} is not a live member", approver))
    if policy.budgeted and record.admitted_at is None:
        reasons.append(NOT_ADMITTED_YET)
    for vm in record.resources:
        if vm not in record.acks:
            reasons.append(waiting_for_ack(vm, vm in view.members))
    if record.not_before is not None and reasons:
        reasons.append(Held(Hold.NOT_BEFORE,
                            "waiting for NotBefore: it starts then without an approval, unless the above clears"))
    return reasons


# -- what needs attention ------------------------------------------------------------------------------


def _loopback(url: str | None) -> bool:
    return url is None or any(host in url for host in ("//127.", "//localhost", "//[::1]"))


def _attention(status: GroupStatus, read: GroupRead, policy: Policy) -> list[Attention]:
    found: list[Attention] = []
    read_at = status.read_at.timestamp()
    if status.leader is None:
        found.append(Attention(message="no leader: nobody admits events, marks them done or tracks absent VMs"))
    if status.read_only_server:
        found.append(Attention(message="the ZooKeeper server that answered is read-only (cut off from its "
                                       "quorum): what is shown may be out of date"))
    for member in status.members:
        agent = member.agent
        if not agent.reachable and not _loopback(agent.url):
            found.append(Attention(vm=member.vm, message=f"{member.vm}: its agent does not answer ({agent.error})"))
        for problem in (agent.action_error, agent.action_fallback):
            if problem:
                found.append(Attention(vm=member.vm, message=f"{member.vm}: {problem}"))
        if agent.connection not in (None, "connected"):
            found.append(Attention(vm=member.vm,
                                   message=f"{member.vm}: its ZooKeeper connection is {agent.connection}"))
    for event in status.events:
        not_before = event.not_before.timestamp() if event.not_before else None
        # When it could start: its approval, or NotBefore, whichever came first.
        began = [t for t in (not_before, event.approval.at.timestamp() if event.approval else None)
                 if t is not None and t <= read_at]
        if began and read_at - min(began) > STUCK_AFTER:
            found.append(Attention(event_id=event.event_id, message=(
                f"{event.type} {event.event_id} could start {_minutes(read_at - min(began))} ago and is not done "
                "(the leader marks it done once IMDS no longer shows it)")))
        elif event.state == "blocked" and not_before is not None and not_before > read_at:
            late = _will_not_make_it(event, status, read, policy, not_before - read_at)
            if late is not None:
                found.append(Attention(event_id=event.event_id, message=(
                    f"{event.type} {event.event_id} starts in {_span(not_before - read_at)}{late}")))
        for vm in event.resources:
            if vm not in read.view.members:
                never = "" if vm in read.view.known else " (never seen in this group)"
                found.append(Attention(vm=vm, event_id=event.event_id,
                                       message=f"{vm} is named by {event.event_id} but runs no agent{never}"))
    for mark in status.out_of_rotation:
        if mark.events == [BY_HAND] and mark.vm in read.view.drains:
            continue  # an operator's drain by hand: as long as it is asked for (its section says since when)
        if read_at - mark.since.timestamp() > OUT_LONG:
            why = f" for {', '.join(mark.events)}" if mark.events else ""
            found.append(Attention(vm=mark.vm, message=(
                f"{mark.vm} has been out of rotation{why} for {_minutes(read_at - mark.since.timestamp())}")))
    for event in status.done:
        done_at = event.done_at.timestamp() if event.done_at else read_at
        for ack in event.acks:
            if read_at - done_at > STUCK_AFTER:
                found.append(Attention(vm=ack.vm, event_id=event.event_id, message=(
                    f"{ack.vm} still acknowledges {event.event_id}, done {_minutes(read_at - done_at)} ago "
                    "(its agent is still drained for it)")))
    return found


def _will_not_make_it(event: EventStatus, status: GroupStatus, read: GroupRead, policy: Policy,
                      left: float) -> str | None:
    """How the blocked ``event``, ``left`` seconds before its NotBefore, cannot be approved before it (the end
    of its attention line, after "starts in N"); None while what holds it may still clear in time. It
    cannot when something holds it that does not clear by itself (a VM it names runs no agent, nobody can
    approve it, its record is invalid, the budget can never admit it, a peer's probe does not answer its
    approver, a VM it names that has not acknowledged reports a failed drain), or when the drain still
    needs longer than ``left`` (``_drain_left``). Reasons by design (the policy, a pause, the maintenance
    windows) never make it need attention: it then starts at NotBefore as configured."""
    for blocker in event.blockers:
        if blocker.kind in _FOR_GOOD or blocker.lasting:
            return f" without an approval unless unblocked ({blocker.reason})"
    if status.paused is not None or any(b.kind in _BY_DESIGN for b in event.blockers):
        return None
    failed = {m.vm: m.agent.action_error for m in status.members if m.agent.action_error}
    for vm in event.missing_acks:
        if vm in failed:
            return f" without an approval unless unblocked ({vm} has not acknowledged: {failed[vm]})"
    behind = _behind_a_failing_drain(event, status, failed)
    if behind is not None:
        return f" without an approval unless unblocked ({behind}; fix or cancel that drain)"
    needed = _drain_left(event, read, policy)
    if needed is not None and needed[0] > left:
        seconds, vm = needed
        return (f", before it can be approved: {vm} needs {_span(seconds)} more to drain before it can "
                f"acknowledge (drain.wait_seconds for a {event.type}: "
                f"{policy.drain_wait_by_type.get(event.type, policy.drain_wait):g} s)")
    return None


def _behind_a_failing_drain(event: EventStatus, status: GroupStatus, failed: dict[str, str]) -> str | None:
    """The chain that holds ``event`` for good in the budget: it waits to be admitted (or for the budget at
    approval) while an admitted, unapproved event holds the budget and a VM of that one keeps failing its
    drain, so that one is never acknowledged and never frees the budget. None when no such event holds it."""
    if not any(b.kind in _BUDGETED for b in event.blockers):
        return None
    for other in status.events:
        if other.event_id == event.event_id or other.admitted_at is None or other.approval is not None:
            continue
        for vm in other.missing_acks:
            if vm in failed:
                return (f"held by the budget behind {other.type} {other.event_id}, whose drain on {vm} fails: "
                        f"{failed[vm]}")
    return None


def _drain_left(event: EventStatus, read: GroupRead, policy: Policy) -> tuple[float, str] | None:
    """(seconds, VM): the longest a VM named by ``event`` with an agent and without an acknowledgement still
    needs to drain, at least: its drain wait (``drain.wait_seconds`` of the event's type) counted from when
    it went out of rotation (its ``out`` node), in full if it has not. The drain actions' own time comes on
    top. None when every such VM has acknowledged."""
    wait = policy.drain_wait_by_type.get(event.type, policy.drain_wait)
    longest: tuple[float, str] | None = None
    for vm in event.missing_acks:
        if vm not in read.view.members:
            continue  # runs no agent: a blocker for good, said as such
        mark = read.view.out.get(vm)
        needs = wait if mark is None else max(mark.since + wait - read.read_at, 0.0)
        if longest is None or needs > longest[0]:
            longest = (needs, vm)
    return longest


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else _minutes(seconds)


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
