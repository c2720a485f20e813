"""This VM's own state once a cycle's plan is carried out, and the choices the loop used to make beside the
decision: which recover actions run, what the state file is told and when, whether the peers are probed,
whether IMDS is read now for an event a peer published, whether the leader purges old records.

Each is a function of the cycle's snapshot, the local state before it and the plan's decisions, and goes
into the plan; the loop carries it out and reports its results (a POST accepted, a save that failed) into
the next cycle's state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coordinator.operations import Approve, Done, Operation, SaveState, StartDrain, StartRecover
from coordinator.snapshot import LocalState, Phase, Snapshot
from coordinator.state import PersistedState

__all__ = ["PURGE_EVERY", "LocalPlan", "local_plan", "reported"]

#: Seconds between two purges of old done records by the leader.
PURGE_EVERY = 300.0


@dataclass(frozen=True)
class LocalPlan:
    """The part of a plan about this VM itself."""

    after: LocalState  # the local state once the plan is carried out (before its results are known)
    recover_all: bool  # a recovery runs every action's recover (False: only those that always recover)
    save_first: PersistedState | None  # written before the drain job starts (write-ahead)
    save: PersistedState | None  # written once the cycle's writes are done
    probe_peers: bool | None  # probe the peers (an approver; the leader while anything waits); None: as it was
    read_now: bool  # read IMDS now: a peer published an event this VM's documents do not show yet
    purge: bool  # the leader purges old done records this cycle


def local_plan(
    snap: Snapshot, local: LocalState, *, next_phase: Phase | None, start_drain: bool, start_recover: bool,
    holding: tuple[str, ...], posted: frozenset[str], approvable_since: dict[str, float], approving: bool | None,
    purge_due: bool, confirm_peers: bool = False,
) -> LocalPlan:
    """``approving``: whether this VM approves an event of a fresh document (None without one: as the last
    fresh document said). ``purge_due``: the leader's view shows records past their retention.
    ``confirm_peers``: an approval waits for the peers to be asked again, by the next cycle."""
    approving = local.approving if approving is None else approving
    after = local
    if next_phase is not None:
        after = replace(after, phase=next_phase, phase_since=snap.mono,
                        drain_started=snap.mono if start_drain else local.drain_started,
                        job_running=start_drain or start_recover, job_failed=False)
    purge = purge_due and snap.mono - local.last_purge >= PURGE_EVERY
    read_now, asked = _peers_published(snap, local)
    # Drained for an event means drained until it is gone: remembered across cycles, whatever the budget or
    # ZooKeeper say later.
    after = replace(after, draining_for=frozenset(holding), posted=posted, approvable_since=approvable_since,
                    approving=approving, asked=asked, last_purge=snap.mono if purge else local.last_purge,
                    confirm_peers=confirm_peers)
    # Write-ahead: on disk before the first drain action runs, so that a crash in between never leaves
    # "serving" behind for a VM that began to drain.
    save_first = PersistedState(Phase.DRAINING.value, frozenset(holding), snap.now) if start_drain else None
    return LocalPlan(
        after=after,
        # After a restart a full recovery (every action's recover) unless the VM was serving when it stopped.
        recover_all=local.phase is not Phase.UNKNOWN or local.recover_all_at_start,
        save_first=save_first,
        save=_save(after, save_first or local.saved, snap.now),
        probe_peers=_probes_peers(snap, approving),
        read_now=read_now,
        purge=purge,
    )


def _save(after: LocalState, saved: PersistedState | None, now: float) -> PersistedState | None:
    """What the state file is told once the cycle is carried out (None: nothing new, or nothing learned yet:
    the previous run's state stands). A recovery whose every action has run is saved as serving: no full
    recovery again after a restart, even while the load balancer's return wait still runs."""
    if after.phase is Phase.UNKNOWN:
        return None
    phase = after.phase
    if phase is Phase.RECOVERING and not after.job_running and not after.job_failed:
        phase = Phase.SERVING
    if saved is not None and saved.phase == phase.value and saved.draining_for == after.draining_for:
        return None
    return PersistedState(phase.value, after.draining_for, now)


def _probes_peers(snap: Snapshot, approving: bool) -> bool | None:
    """Whether this VM probes its peers: the approver of an event (its first live VM, by the last fresh
    plan), and the leader while any event is known or a drain by hand waits; not every VM an event names,
    which would cost a group of N agents (VMs named + 1) x N probes a second. An idle group probes
    nothing; the first round starts at once when an event appears. None when peers are not probed at all, or
    without a view (as it was)."""
    cluster = snap.cluster
    if cluster is None or snap.peers is None:
        return None
    busy = bool(snap.last_document and snap.last_document.events) or any(
        record.done_at is None for record in cluster.records.values()) or any(
        drain.admitted_at is None for drain in cluster.drains.values())
    return approving or (cluster.i_am_leader and busy)


def _peers_published(snap: Snapshot, local: LocalState) -> tuple[bool, frozenset[str]]:
    """A peer published an event this VM's latest document does not show: read IMDS now rather than at
    this agent's next poll (staggered polls: the first agent to see an event brings the others to it).
    Every decision still rests on this VM's own document. Asked once per record: returns whether to read
    now, and the records asked for so far."""
    if snap.cluster is None:
        return False, local.asked
    records = snap.cluster.records
    shown = {e.event_id.upper() for e in snap.last_document.events} if snap.last_document else set()
    new = {key for key, record in records.items() if record.done_at is None and key not in shown} - local.asked
    return bool(new), frozenset((local.asked & set(records)) | new)


def reported(local: LocalState, op: Operation, done: Done) -> LocalState:
    """``local`` with the result of one operation on top: what the state file now holds (a save that failed
    removed it, so that a restart assumes the worst), the approvals IMDS accepted, a job that finished at
    once."""
    if isinstance(op, SaveState):
        return replace(local, saved=op.state if done.ok else None)
    if isinstance(op, Approve) and done.posted:
        return replace(local, posted=local.posted | done.posted)
    if isinstance(op, StartDrain | StartRecover) and done.finished_at is not None:
        return replace(local, job_running=False, job_failed=not done.ok, job_done_at=done.finished_at)
    return local
