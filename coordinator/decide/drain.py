"""Drain and recovery: whether this VM must be drained for an event, what holds it, its drain state
machine, its acknowledgements, when it may serve again, and its ``/out`` mark."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.config import ApprovalRule
from coordinator.decide.events import ParsedEvent, approvable
from coordinator.snapshot import LocalState, Phase, Policy, Snapshot, is_gone, session_lapses_after
from coordinator.store.base import BY_HAND, ClusterView, ConnectionState, OutMark

__all__ = ["acks_due", "acks_outstanding", "acks_released_by", "by_hand_holds", "drain_step", "drains_for",
           "events_holding", "mark_naming", "out_mark_change"]


def drains_for(ev: ParsedEvent, snap: Snapshot, local: LocalState, policy: Policy) -> bool:
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
    if not approvable(ev, snap.cluster, snap, policy):
        return policy.unapprovable_at_once  # nothing to gain from an early drain: just in time
    if policy.budgeted:
        record = snap.cluster.records.get(ev.key or "") if snap.cluster else None
        if record is None or record.admitted_at is None or record.done_at is not None:
            return False  # not admitted (or unknown): drain late rather than break the budget
    if policy.lead_time is not None:
        return snap.now >= not_before - policy.lead_time
    return True


def events_holding(
    parsed: Sequence[ParsedEvent], snap: Snapshot, local: LocalState, policy: Policy
) -> tuple[list[ParsedEvent], list[str]]:
    """What holds this VM: the events of the document naming it that it must drain for, and every event it
    was drained for that is not gone yet (still named by a recent document, or known only from before a
    restart), and an operator's drain by hand (``by_hand_holds``). Returns those events of the document, and the
    keys of everything that holds it."""
    holding_events = [ev for ev in parsed if ev.event.names(snap.me) and drains_for(ev, snap, local, policy)]
    holding = list(dict.fromkeys(ev.held_as for ev in holding_events))
    for key in sorted(local.draining_for - {BY_HAND}):
        if key not in holding and not is_gone(snap.named.get(key), policy.gone_after):
            holding.append(key)
    if by_hand_holds(snap, local, policy):
        holding.append(BY_HAND)
    return holding_events, holding


def by_hand_holds(snap: Snapshot, local: LocalState, policy: Policy) -> bool:
    """Whether an operator's drain by hand (``coordinator drain``) holds this VM: once the leader admitted
    it into the budget (at once without a budget), and from then on for as long as the view shows it.
    Without a view it holds as it did: only a view without it puts the VM back (``coordinator undrain``)."""
    if snap.cluster is None:
        return BY_HAND in local.draining_for
    drain = snap.cluster.drains.get(snap.me)
    if drain is None:
        return False
    return BY_HAND in local.draining_for or drain.admitted_at is not None or not policy.budgeted


def drain_step(
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
        why = acks_outstanding(snap, policy)
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


def acks_outstanding(snap: Snapshot, policy: Policy) -> str:
    """Why this VM may not serve yet although nothing holds it (empty: it may).

    It may serve once ZooKeeper, read this cycle over a CONNECTED session, shows no ack of it (its
    acks are withdrawn first), or once every session that could hold one has certainly lapsed and every
    approval one could have released is in IMDS's documents (``acks_released_by``): this process has
    been cut off, and alive, for longer than the server may keep a session it no longer hears from
    (``session_lapses_after``: the granted timeout, at least two ticks, plus a tick) and half a session
    more, and the document of this decision was requested after that, since acks are ephemeral."""
    cluster = snap.cluster
    if cluster is not None and cluster.connection is ConnectionState.CONNECTED:
        mine = sorted(key for key, record in cluster.records.items() if snap.me in record.acks)
        if not mine:
            return ""
        return f"withdrawing its acknowledgement of {','.join(mine)}"
    if snap.read_sent >= acks_released_by(snap, policy):
        return ""
    return "ZooKeeper unreachable: its acknowledgements may stand until its session lapses"


def acks_released_by(snap: Snapshot, policy: Policy) -> float:
    """When (monotonic) the acks of a cut-off VM can no longer have released any approval that IMDS has
    not applied yet: every session of it has lapsed (``session_lapses_after``, counted from when it was
    last seen CONNECTED, or from this process's start if never), and an approver's POST fenced on one of
    its acks has been sent (the fence lets an attempt go up to half a session timeout after the final
    check). A VM serves again only on a document whose request was sent after that: an older one may not
    show an event approved on its standing ack, which has started by now."""
    since = snap.connected_at if snap.connected_at is not None else snap.started
    return since + session_lapses_after(policy, snap.granted_session) + policy.session_timeout / 2


def acks_due(
    holding_events: Sequence[ParsedEvent], phase_after: Phase, drain_started: float, cluster: ClusterView,
    snap: Snapshot, policy: Policy,
) -> list[str]:
    """The events this VM acknowledges now: those of the document that hold it, once it is drained and
    has been for the drain wait of the event's type, and that ZooKeeper does not show acknowledged yet."""
    ack: list[str] = []
    for ev in holding_events:
        if ev.key is None or phase_after is not Phase.DRAINED:
            continue
        record = cluster.records.get(ev.key)
        if snap.mono - drain_started >= policy.wait_for(ev.event) and (
            record is None or snap.me not in record.acks
        ):
            ack.append(ev.key)
    return ack


def out_mark_change(
    cluster: ClusterView, holding: Sequence[str], phase_after: Phase, snap: Snapshot
) -> tuple[tuple[str, ...] | None, bool]:
    """This VM's ``/out`` node: the events to write it with (None: leave it as it is), and whether to
    delete it (the VM serves again)."""
    mine_out = cluster.out.get(snap.me)
    if phase_after is Phase.SERVING:
        return None, mine_out is not None
    # Events accumulate until the VM is back in rotation: a VM back from a reboot is still out for the
    # event that took it out, whatever its restarted agent holds now.
    return mark_naming(mine_out, holding), False


def mark_naming(mark: OutMark | None, keys: Sequence[str]) -> tuple[str, ...] | None:
    """The events to write an ``/out`` node with so that it names ``keys`` (event keys) too: those it names
    already first, then the others; None when it exists and names them all already."""
    earlier = tuple(mark.events) if mark is not None else ()
    named = {e.upper() for e in earlier}
    if mark is not None and set(keys) <= named:
        return None
    return earlier + tuple(key for key in keys if key not in named)
