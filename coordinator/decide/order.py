"""A plan's operations, in the order the shell carries them out: the order safety rests on, written here once.

1. An early read of IMDS, if asked: it never waits, and the next cycle may run on it.
2. The state file's write-ahead, before the drain job starts: a crash in between never leaves "serving"
   behind for a VM that began to drain.
3. The drain or recovery job.
4. With a view of the group, the store's writes: ``/out/{me}`` first (the budget must see this VM out before
   anything else it does), then records, reopenings and admissions (of events, then of drains by hand), acks
   and withdrawals, done marks, absences, the ``/out`` marks of VMs an approval goes ahead without, ``/out``
   cleared (back in rotation: after everything that rests on this VM being out), the leader's moves of
   finished records to the history and its purges, and last the approval, which rests on every write before
   it (``execute.carry_out``: once a store operation fails, the rest of them, the approval included, wait
   for the next cycle).
5. The state file, as the cycle leaves this VM.
6. The peers' probes, followed or stopped, for the next cycle; and, when an approval waits for its peers to be
   asked again, the next cycle at once (it asks them before it decides).
"""

from __future__ import annotations

from coordinator.operations import (
    Acknowledge,
    Admit,
    AdmitDrain,
    Approve,
    Archive,
    ClearAbsent,
    ClearOut,
    ConfirmPeers,
    ForgetAdmission,
    MarkAbsent,
    MarkDone,
    MarkOtherOut,
    MarkOut,
    Operation,
    ProbePeers,
    PublishEvent,
    Purge,
    ReadImdsNow,
    Reopen,
    SaveState,
    StartDrain,
    StartRecover,
    WithdrawAck,
)
from coordinator.snapshot import Plan, Snapshot

__all__ = ["in_order"]


def in_order(plan: Plan, snap: Snapshot) -> tuple[Operation, ...]:
    """The operations that carry out ``plan``, decided on ``snap``, in the order they are carried out."""
    ops: list[Operation] = []
    if plan.read_now:
        ops.append(ReadImdsNow())
    if plan.save_first is not None:
        ops.append(SaveState(plan.save_first, ahead=True))
    if plan.start_drain:
        document = snap.last_document
        ops.append(StartDrain(tuple(e for e in (document.events if document else ()) if e.names(snap.me))))
    if plan.start_recover:
        ops.append(StartRecover(every_action=plan.recover_all))
    cluster = snap.cluster
    if cluster is not None:
        now = snap.now
        if plan.mark_out is not None:
            ops.append(MarkOut(plan.mark_out, now))
        ops.extend(PublishEvent(record) for record in plan.publish)
        ops.extend(Reopen(key) for key in plan.reopen)
        ops.extend(Admit(key, now) for key in plan.admit)
        ops.extend(AdmitDrain(vm, asked, now) for vm, asked in sorted(plan.admit_drains.items()))
        ops.extend(ForgetAdmission(vm) for vm in plan.forget_admissions)
        drain_started = plan.local.drain_started
        ops.extend(Acknowledge(key, now, drain_started, snap.mono - drain_started) for key in plan.ack)
        ops.extend(WithdrawAck(key) for key in plan.withdraw)
        ops.extend(MarkDone(key, now, snap.started_seen.get(key)) for key in plan.mark_done)
        ops.extend(MarkAbsent(vm, now) for vm in plan.mark_absent)
        ops.extend(ClearAbsent(vm) for vm in plan.clear_absent)
        ops.extend(MarkOtherOut(vm, events, now) for vm, events in sorted(plan.mark_out_for.items()))
        if plan.clear_out:
            ops.append(ClearOut())
        if plan.archive:
            ops.append(Archive(plan.archive, plan.history_from))
        if plan.purge_before is not None:
            ops.append(Purge(plan.purge_before))
        if plan.approve:
            ops.append(Approve(plan.approve, now, snap.peers_confirmed_at))
    if plan.save is not None:
        ops.append(SaveState(plan.save))
    if cluster is not None and plan.probe_peers is not None:
        ops.append(ProbePeers(cluster.members, plan.probe_peers))
    if plan.local.confirm_peers:
        ops.append(ConfirmPeers())
    return tuple(ops)
