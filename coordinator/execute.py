"""Carrying out a plan's operations: one executor, one operation at a time, in the order the decision gave.

``carry_out`` hands each operation of ``Plan.operations`` (``coordinator.operations``, put in order by
``decide.order.in_order``) to an executor and returns each result, which the loop folds into its local state
(``decide.local.reported``). Once a store operation fails, the rest of the cycle's store operations, the
approval included, are not sent: the next cycle decides again from what the store then shows, so nothing is
half-remembered. Operations outside the store (the state file, the peers' probes) are carried out whatever
the store did.

``LiveExecutor`` carries them out for real: jobs on the job thread, writes to the store, the approval through
the store's last check and the fenced POST, the state file, the poller and the peers' probes. The dry run's
executor (``coordinator.dryrun.DryRunExecutor``) carries out nothing that changes anything, and says what it
would do, from the same operations.

An approval (``Approve``): for each intent, ``Store.approve`` checks again, in one transaction on this agent's
own session, what the decision rested on (connected, admitted, not done, every required ack) and records the
approval. Only the events it confirmed are POSTed, all in one ``StartRequests``, and only while the session is
still connected. Before every attempt of the POST, retries included, ``snapshot.approval_fence`` is asked
again with what is true then: the time since the store's check against the session timeout asked for and
granted, the connection, the operator's pause read from the ensemble now, the maintenance window and how long
ago the peers were confirmed in rotation. A closed fence sends nothing; the next cycle decides again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from coordinator.actions.base import Action, ActionContext, run_drain, run_recover
from coordinator.errors import ImdsError, ImdsFenced, InvalidName, StoreError
from coordinator.executor import JobExecutor
from coordinator.logsetup import log_context
from coordinator.metrics import Metrics
from coordinator.models import Document
from coordinator.operations import (
    DONE,
    FAILED,
    Acknowledge,
    Admit,
    AdmitDrain,
    Approve,
    Archive,
    ClearAbsent,
    ClearOut,
    ConfirmPeers,
    Done,
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
from coordinator.poller import Readings
from coordinator.snapshot import PeerSeen, Phase, Plan, Policy, Snapshot, approval_fence
from coordinator.state import StateFile
from coordinator.store.base import ApprovalOutcome, ConnectionState, Pause, Store, WriteResult
from coordinator.telemetry import Telemetry

__all__ = ["Clock", "Executor", "Imds", "LiveExecutor", "Peers", "SystemClock", "carry_out"]

# Logged as the agent: these lines are what the agent did (operators filter on this logger).
log = logging.getLogger("coordinator.agent")


class Peers(Protocol):
    """What the agent needs of its peers' probes (``coordinator.peers.PeerProbes``)."""

    def seen(self) -> dict[str, PeerSeen]: ...

    def confirm(self) -> dict[str, PeerSeen]: ...

    def follow(self, store: Store, members: Collection[str], me: str, wanted: bool) -> None: ...


class Imds(Protocol):
    def get_document(self) -> Document: ...

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        """POST the approval. ``fence`` is called right before every attempt is sent; when it returns
        False nothing more is sent and ``ImdsFenced`` is raised."""


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class Executor(Protocol):
    """Carries out one operation of a plan decided on ``snap`` and says how it went."""

    def planned(self, plan: Plan, snap: Snapshot) -> None:
        """A new plan, before its first operation."""

    def carry(self, op: Operation, snap: Snapshot) -> Done: ...


def carry_out(executor: Executor, plan: Plan, snap: Snapshot) -> list[tuple[Operation, Done]]:
    """Carry out ``plan.operations`` in order; returns each operation carried out with its result. A store
    operation that fails stops the store operations after it (the approval among them)."""
    executor.planned(plan, snap)
    results: list[tuple[Operation, Done]] = []
    store_failed = False
    for op in plan.operations:
        if op.in_store and store_failed:
            continue
        done = executor.carry(op, snap)
        results.append((op, done))
        store_failed = store_failed or (op.in_store and not done.ok)
    return results


class LiveExecutor:
    """Carries out operations for real. Also what the loop reads back of the jobs: the job thread
    (``jobs``), when the last drain job began (``drain_began``) and the fallbacks the last job held by."""

    def __init__(self, *, vm: str, store: Store, imds: Imds, actions: Sequence[Action], jobs: JobExecutor,
                 state_file: StateFile, policy: Policy, metrics: Metrics, telemetry: Telemetry, clock: Clock,
                 readings: Readings, peers: Peers | None, wake: Callable[[], None]) -> None:
        self.vm = vm
        self.actions = list(actions)
        self.jobs = jobs
        self.drain_began: float | None = None  # when the last drain job began on the job thread
        self.fallbacks: tuple[str, ...] = ()  # what the last job that ended held by (``run_drain``)
        self._store = store
        self._imds = imds
        self._state_file = state_file
        self._policy = policy
        self._metrics = metrics
        self._telemetry = telemetry
        self._clock = clock
        self._readings = readings
        self._peers = peers
        self._wake = wake

    def planned(self, plan: Plan, snap: Snapshot) -> None:
        return None

    def carry(self, op: Operation, snap: Snapshot) -> Done:
        if isinstance(op, ReadImdsNow):
            self._readings.poll_soon()
        elif isinstance(op, SaveState):
            return self._save(op)
        elif isinstance(op, StartDrain):
            self._start_drain(op)
        elif isinstance(op, StartRecover):
            self._start_recover(op)
        elif isinstance(op, ConfirmPeers):
            self._wake()  # the next cycle asks the peers again before it decides
        elif isinstance(op, ProbePeers):
            if self._peers is not None:
                # An approver new to the role waits for the first round (its peers count as unconfirmed until
                # then), and every approval probes all of them again right before its POST (``confirm``).
                self._peers.follow(self._store, op.members, self.vm, op.wanted)
        elif isinstance(op, Approve):
            return self._approve(op, snap)
        else:
            try:
                self._write(op)
            except (StoreError, InvalidName) as exc:
                self._metrics.errors.labels("store").inc()
                log.warning("store write failed, retried next cycle (vm=%s): %s", self.vm, exc)
                return FAILED
        return DONE

    # -- this VM ----------------------------------------------------------------------------------------

    def _save(self, op: SaveState) -> Done:
        """Write the state file; a write that fails removes the file, so that a restart assumes the worst."""
        try:
            self._state_file.save(op.state)
        except OSError as exc:
            self._metrics.errors.labels("state").inc()
            log.error("cannot save the drain state to %s (vm=%s): %s; removing it so that a restart assumes "
                      "the worst", self._state_file.path, self.vm, exc)
            try:
                self._state_file.discard()
            except OSError as again:
                log.error("cannot remove %s either (vm=%s): %s", self._state_file.path, self.vm, again)
            return FAILED
        return DONE

    def _start_drain(self, op: StartDrain) -> None:
        ctx = ActionContext(self.vm, op.events)

        def drain() -> None:
            """Jobs run one after the other: a drain queued behind a recovery still running begins, and fails
            the probe, only once that recovery is over. The drain wait is counted from here, not from the
            cycle that decided it."""
            self.drain_began = self._clock.monotonic()
            with log_context(vm=self.vm, phase=Phase.DRAINING.value, event_id=ctx.event_ids if ctx.events else None):
                self.fallbacks = run_drain(self.actions, ctx, timings=self._metrics, clock=self._clock.monotonic)

        self.jobs.submit("drain", drain)
        log.info("draining (vm=%s events=%s)", self.vm, ctx.event_ids,
                 extra={"event_id": ctx.event_ids if ctx.events else None})

    def _start_recover(self, op: StartRecover) -> None:
        ctx = ActionContext(self.vm, ())
        actions = self.recover_actions(op)

        def recover() -> None:
            with log_context(vm=self.vm, phase=Phase.RECOVERING.value):
                self.fallbacks = run_recover(actions, ctx, timings=self._metrics, clock=self._clock.monotonic)

        self.jobs.submit("recover", recover)
        log.info("recovering (vm=%s actions=%s)", self.vm, ",".join(a.name for a in actions) or "-")

    def recover_actions(self, op: StartRecover) -> list[Action]:
        """The actions a recovery runs: all, or only those that always recover."""
        return self.actions if op.every_action else [a for a in self.actions if a.always_recover]

    # -- the store --------------------------------------------------------------------------------------

    def _write(self, op: Operation) -> None:
        store, vm = self._store, self.vm
        if isinstance(op, MarkOut):
            store.mark_out(vm, op.events, op.at)
        elif isinstance(op, PublishEvent):
            store.publish_event(op.record)
        elif isinstance(op, Reopen):
            if store.reopen(op.key) is WriteResult.DONE:
                log.info("event back after it was marked done: reopened (vm=%s event=%s)", vm, op.key,
                         extra={"event_id": op.key})
        elif isinstance(op, Admit):
            if store.admit(op.key, vm, op.at) is WriteResult.DONE:
                log.info("admitted into the maintenance budget (vm=%s event=%s)", vm, op.key,
                         extra={"event_id": op.key})
        elif isinstance(op, AdmitDrain):
            if store.admit_drain(op.vm, op.asked, vm, op.at) is WriteResult.DONE:
                log.info("admitted the drain by hand of %s into the maintenance budget (vm=%s)", op.vm, vm)
        elif isinstance(op, ForgetAdmission):
            store.forget_drain_admission(op.vm)
        elif isinstance(op, Acknowledge):
            if store.acknowledge(op.key, vm, op.at) is WriteResult.DONE:
                self._metrics.acknowledged(op.drain_started, op.drained_for)
                log.info("acknowledged (vm=%s event=%s)", vm, op.key, extra={"event_id": op.key})
        elif isinstance(op, WithdrawAck):
            store.withdraw_ack(op.key, vm)
            log.info("acknowledgement withdrawn (vm=%s event=%s)", vm, op.key, extra={"event_id": op.key})
            self._wake()  # the next cycle sees the ack gone and may recover
        elif isinstance(op, MarkDone):
            store.mark_done(op.key, op.at, started_at=op.started_at)
        elif isinstance(op, MarkAbsent):
            store.mark_absent(op.vm, op.at)
        elif isinstance(op, ClearAbsent):
            store.clear_absent(op.vm)
        elif isinstance(op, MarkOtherOut):
            if store.mark_out(op.vm, op.events, op.at) is WriteResult.DONE:
                log.info("marked %s out of rotation for %s: its agent is absent past the grace, and the "
                         "approval goes ahead without it (vm=%s)", op.vm, ",".join(op.events), vm)
        elif isinstance(op, ClearOut):
            store.clear_out(vm)
            log.info("back in the load balancer's rotation (vm=%s)", vm)
        elif isinstance(op, Archive):
            moved = store.archive_done(op.keys, op.history_from)
            if moved:
                log.info("moved %d finished event records to the history (vm=%s)", moved, vm)
        elif isinstance(op, Purge):
            purged = store.purge_done(op.before)
            if purged:
                log.info("purged %d finished event records (vm=%s)", purged, vm)
        else:  # pragma: no cover - every operation is handled above
            raise TypeError(f"not a store operation: {op!r}")

    # -- the approval -----------------------------------------------------------------------------------

    def _approve(self, op: Approve, snap: Snapshot) -> Done:
        """Confirm the intents in the store and POST what it confirmed. ``Done.posted``: the keys of the
        events whose POST was accepted; anything else is retried by the next cycle's decision. Not ``ok``
        when the store could not be asked at all."""
        store, vm, mono = self._store, self.vm, self._clock.monotonic
        confirmed: list[str] = []
        checked_at: float | None = None
        for intent in op.intents:
            if store.connection_state is not ConnectionState.CONNECTED:
                break
            started = mono()
            try:
                result = store.approve(intent.key, vm, intent.required, as_leader=intent.as_leader, at=op.at,
                                       admission=intent.admission)
            except StoreError as exc:
                self._metrics.approvals.labels("unknown").inc()
                log.warning("approval not confirmed (vm=%s event=%s): %s", vm, intent.event_id, exc,
                            extra={"event_id": intent.event_id})
                continue
            if result.outcome is ApprovalOutcome.REFUSED:
                self._metrics.approvals.labels("refused").inc()
                log.info("approval refused by re-check (vm=%s event=%s): %s", vm, intent.event_id, result.reason,
                         extra={"event_id": intent.event_id})
                continue
            confirmed.append(intent.event_id)
            checked_at = started if checked_at is None else checked_at
        # The last gate: a session that was lost while confirming never POSTs, and neither does one that
        # may have lapsed since (the process paused, or the POST retried, past the fence).
        if not confirmed or checked_at is None or store.connection_state is not ConnectionState.CONNECTED:
            return DONE
        fenced_at = checked_at
        closed: list[str] = []

        def fence() -> bool:
            """The evidence for ``approval_fence``, gathered right before an attempt of the POST: the
            operator's pause is read from the ensemble (a pause made during the retries stops them)."""
            paused: Pause | str | None = None
            if store.connection_state is ConnectionState.CONNECTED:
                try:
                    paused = store.read_pause()
                except (StoreError, InvalidName) as exc:
                    paused = str(exc)
            why = approval_fence(self._policy, mono=mono(), now=self._clock.now(), checked_at=fenced_at,
                                 granted=store.granted_session_timeout, connection=store.connection_state,
                                 paused=paused, peers_confirmed_at=op.peers_confirmed_at)
            closed.append(why)
            return not why

        events = ",".join(confirmed)
        try:
            self._imds.approve(confirmed, fence=fence)
        except ImdsFenced as exc:
            self._metrics.approvals.labels("fenced").inc()
            log.warning("approval not sent (vm=%s events=%s): %s: %s; re-checked next cycle", vm, confirmed, exc,
                        closed[-1] if closed else "", extra={"event_id": events})
            return DONE
        except ImdsError as exc:
            self._metrics.approvals.labels("failed").inc()
            self._metrics.errors.labels("imds").inc()
            log.warning("approval POST failed, retried next cycle (vm=%s events=%s): %s", vm, confirmed, exc,
                        extra={"event_id": events})
            return DONE
        posted_at = self._clock.now()
        for intent in op.intents:
            if intent.event_id in confirmed:
                self._metrics.approvals.labels("posted").inc()
                self._telemetry.approved(snap.document.event(intent.event_id) if snap.document else None, posted_at)
                record = snap.cluster.records.get(intent.key) if snap.cluster else None
                if record is not None:
                    self._metrics.approval_latency.observe(max(op.at - record.published_at, 0.0))
        log.info("approved (vm=%s events=%s)", vm, events, extra={"event_id": events})
        return Done(posted=frozenset(intent.key for intent in op.intents if intent.event_id in confirmed))
