"""The agent loop: one thread, one cycle at a time, never waiting on IMDS.

Each cycle:
1. observe: take the latest IMDS reading (``coordinator.poller``: a poller thread reads IMDS at its own
   steady rate) and the cluster view (join, campaign, read: served from a watched cache when nothing
   changed), each failure-bounded;
2. decide: ``coordinator.decide.decide`` (pure): a plan, and its operations in the order they are carried out;
3. act: hand each operation to the executor (``coordinator.execute``: jobs on the job thread, writes to the
   store, approvals through the store's last check and the fenced POST; ``coordinator.dryrun``: a dry run's,
   which carries out nothing and says what it would do) and fold each result into the local state;
4. describe the cycle in one log line (INFO when it did something or its blockers changed).

A cycle runs when something changed: a new reading, a ZooKeeper watch, a job that ended; and at least
every ``idle_cycle`` seconds as a safety net. Each run recomputes everything from the latest reading and
view (level-triggered), so a missed wake-up costs time, never correctness. Other threads (the poller,
ZooKeeper watches, connection listeners, signal handlers) only call ``wake``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coordinator import __version__
from coordinator.actions.base import Action
from coordinator.decide import (
    LocalState,
    Phase,
    Plan,
    Policy,
    Sighting,
    Snapshot,
    decide,
    reported,
    view_needed,
)
from coordinator.errors import (
    DuplicateMember,
    InvalidName,
    StoreError,
)
from coordinator.evidence import Evidence, Restart, observed
from coordinator.execute import Clock, Executor, Imds, LiveExecutor, Peers, SystemClock, carry_out
from coordinator.executor import JobExecutor
from coordinator.logsetup import log_context
from coordinator.metrics import Metrics
from coordinator.models import Document
from coordinator.poller import ReadEachCycle, Reading, Readings
from coordinator.quiet import QuietCycles
from coordinator.state import StateFile
from coordinator.store.base import BY_HAND, ClusterView, ConnectionState, Part, Store
from coordinator.telemetry import Health, Telemetry, status_dict

if TYPE_CHECKING:
    from coordinator.dryrun import DryRunStore

__all__ = ["Agent", "Clock", "Imds", "LoopState", "Peers", "Shown", "SystemClock"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shown:
    """The last cycle, as ``/status`` shows it: its plan, snapshot and one-line description, and how many
    cycles have run."""

    plan: Plan | None = None
    snapshot: Snapshot | None = None
    description: str = "starting"
    cycles: int = 0


@dataclass(frozen=True)
class LoopState:
    """What the loop carries from one cycle to the next, as one value: replaced whole, never changed in place,
    so that a reader on another thread (``status``) sees one cycle's state, never parts of two. The part of it
    that must survive a restart is what ``local`` saves to the state file (``LocalState.saved``).

    ``local``: what the decision reads and returns. ``evidence``: what the snapshot needs beyond one cycle
    (``coordinator.evidence``), on this process's monotonic clock. ``restart``: what a restart could not read
    from its state file, until an observation says it. ``part``: how much of the group the next cycle reads
    (``decide.view_needed`` of the last one). ``reading``: the last reading looked at; ``last_document``: the
    last valid document read. ``job``: what the last job that ended said, and ``shown``: the last cycle as
    ``/status`` shows it."""

    local: LocalState
    evidence: Evidence
    restart: Restart
    part: Part
    reading: Reading
    last_document: Document | None = None
    job: dict[str, str | bool | None] = field(default_factory=lambda: {
        "action_error": None, "action_fallback": None, "action_error_outside_vm": False})
    shown: Shown = field(default_factory=Shown)


@dataclass(frozen=True)
class _Pace:
    """When the loop runs a cycle. ``polled``: readings arrive on their own (a poller), not read by the cycle;
    ``min_gap``: the shortest time between two cycles; ``idle_cycle``: the longest, with nothing to wake the
    loop; ``document_fresh``: how old a reading may be and still count as fresh evidence."""

    polled: bool
    min_gap: float
    idle_cycle: float
    document_fresh: float


class Agent:
    # A burst of wake-ups is coalesced into at most one cycle per gap. A loop that reads IMDS itself
    # (no poller) keeps 0.2 s, so that wake-ups never drive IMDS beyond 5 reads a second.
    MIN_CYCLE_GAP = 0.01
    MIN_CYCLE_GAP_READING = 0.2

    def __init__(
        self,
        *,
        vm: str,
        imds: Imds,
        store: Store,
        actions: Sequence[Action],
        policy: Policy,
        metrics: Metrics,
        poll_interval: float = 1.0,
        clock: Clock | None = None,
        jobs: JobExecutor | None = None,
        member_info: dict[str, object] | None = None,
        state_file: StateFile | None = None,
        peers: Peers | None = None,
        readings: Readings | None = None,
        idle_cycle: float | None = None,
        live_after: float | None = None,
        dry_run: bool = False,
    ) -> None:
        """``readings``: where documents come from; by default ``imds`` is read once per cycle, on the
        loop's thread (``ReadEachCycle``). With a poller, a cycle runs on each of its readings, and
        a reading serves cycles woken by other changes (a watch, a job) while it is at most
        1.5 poll intervals old: no approval, publication or recovery rests on an older one.
        ``idle_cycle``: the longest time between two cycles with nothing to wake the loop (default
        the poll interval). ``live_after``: ``live`` fails once no cycle has completed for this long
        (default 3 idle cycles, at least 30 s). ``jobs``: the thread drain and recover jobs run on.
        ``dry_run``: observe only (``coordinator.dryrun``): the same decisions, carried out by an executor that
        changes nothing and says what it would do; the store is only read."""
        self.vm = vm
        dry: DryRunStore | None = None
        if dry_run:  # read only: imported only then (``coordinator run`` loads no dry-run code otherwise)
            from coordinator.dryrun import DryRunStore

            store = dry = store if isinstance(store, DryRunStore) else DryRunStore(store)
        self._store = store
        self._wake = threading.Event()
        self._policy = policy
        self._metrics = metrics
        self._clock = clock or SystemClock()
        self._readings: Readings = readings or ReadEachCycle(imds.get_document, self._clock.monotonic)
        self._pace = pace = _Pace(
            polled=readings is not None,
            min_gap=self.MIN_CYCLE_GAP if readings is not None else self.MIN_CYCLE_GAP_READING,
            idle_cycle=idle_cycle if idle_cycle is not None else poll_interval,
            document_fresh=1.5 * poll_interval,
        )
        self._member_info = {"vm": vm, "version": __version__, **(member_info or {})}
        state_file = state_file or StateFile(None)
        self._peers = peers
        saved = state_file.load()
        self._started = self._clock.monotonic()
        live_after = live_after if live_after is not None else max(30.0, 3 * pace.idle_cycle)
        self._telemetry = Telemetry(metrics, vm, policy, started=self._started, live_after=live_after)
        self._live = LiveExecutor(vm=vm, store=store, imds=imds, actions=actions,
                                  jobs=jobs or JobExecutor(on_done=self.wake), state_file=state_file, policy=policy,
                                  metrics=metrics, telemetry=self._telemetry, clock=self._clock,
                                  readings=self._readings, peers=peers, wake=self.wake)
        # A dry run hands the operations to an executor that changes nothing; the live one it reads through is
        # built on the read-only store too, so nothing anywhere writes.
        self._executor: Executor = self._live if dry is None else dry.executor(self._live)
        # An unreadable file: maybe drained for anything, so everything naming this VM in the first
        # fresh document holds it, and a drain by hand until a view of the group says there is none. A
        # missing one: the VM's own /out node, if ZooKeeper has one, says what it was out for.
        restart = Restart(assume_worst=state_file.unreadable, from_store=saved is None and not state_file.unreadable)
        held = frozenset(e.upper() for e in saved.draining_for) if saved else frozenset()
        # After a restart: still drained for what it was drained for, and a full recovery (every action's
        # recover) unless it was serving when it stopped.
        local = LocalState(
            phase=Phase.UNKNOWN,
            phase_since=self._started,
            draining_for=held | {BY_HAND} if state_file.unreadable else held,
            recover_all_at_start=saved is None or not saved.was_serving,
            saved=saved,
        )
        if saved is not None and not saved.was_serving:
            log.info("restarted while %s for %s: staying drained until IMDS no longer names this VM (vm=%s)",
                     saved.phase, ",".join(sorted(saved.draining_for)) or "-", vm)
        # Until a view of the group says otherwise, it reads the whole of it.
        self._state = LoopState(local=local, restart=restart, part=Part.WHOLE,
                                evidence=Evidence(named={key: Sighting(self._started) for key in local.draining_for}),
                                reading=Reading(0, self._clock.monotonic()))
        # A quiet group costs one cycle per idle_cycle, not one per reading (``coordinator.quiet``).
        self._woken_by_other = True
        self._quiet = QuietCycles(pace.idle_cycle)
        store.set_wakeup(self.wake)

    # -- threads other than the loop call only these -------------------------------------------

    def wake(self) -> None:
        self._woken_by_other = True
        self._wake.set()

    def reading_arrived(self) -> None:
        """The poller's wake-up: a new reading. Told apart from other wake-ups (``wake``) so that a reading
        that repeats a quiet document can skip its cycle (``coordinator.quiet``)."""
        self._wake.set()

    def phase(self) -> str:
        """This VM's phase, as its health probe tells the peers (``coordinator.peers``)."""
        return self._state.local.phase.value

    def live(self) -> Health:
        """Whether the loop completes cycles (``/livez``)."""
        return self._telemetry.live(self._clock.monotonic())

    def since_last_cycle(self) -> float:
        """Seconds since the loop last completed a cycle (since start, before the first): read by the
        application health signal (``coordinator.apphealth``)."""
        return self._telemetry.since_cycle(self._clock.monotonic())

    def ready(self) -> Health:
        """Whether a cycle has completed with a ZooKeeper view and a valid IMDS document, and what holds now
        (``/readyz``)."""
        return self._telemetry.ready(self._clock.monotonic())

    def status(self) -> dict[str, Any]:
        state = self._state  # one value: the last cycle's, never parts of two
        shown = state.shown
        status = status_dict(self.vm, state.local, shown.plan, shown.snapshot, shown.description, shown.cycles)
        status.update(state.job)
        status["cluster_unavailable"] = self._telemetry.view_outage(self._clock.monotonic())
        if "imds" in status:
            reading = state.reading
            status["imds"]["reading_age_seconds"] = round(self._clock.monotonic() - reading.at, 2)
            status["imds"]["last_error"] = str(reading.error) if reading.error is not None else None
        return status

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run cycles until ``stop`` is set. Never raises: a bug in a cycle is logged and counted."""
        self._member_info["started_at"] = self._clock.now()
        while not stop.is_set():
            # Cleared before the cycle, not after: a wake-up during the cycle makes the next one.
            self._wake.clear()
            started = self._clock.monotonic()
            # Only a poller's readings are looked at here: ``latest`` of a loop that reads IMDS itself reads it.
            latest = self._readings.latest() if self._pace.polled and not self._woken_by_other else None
            if latest is not None and self._quiet.skips(latest, self._state.reading.seq, started):
                self._metrics.document_age.set(started - latest.at)
                self._wake.wait(max(self._pace.idle_cycle - (started - (self._quiet.since or started)), 0))
                continue
            self._woken_by_other = False
            try:
                self.cycle()
            except Exception:
                self._metrics.errors.labels("bug").inc()
                log.exception("cycle failed unexpectedly; the VM stays as it is (vm=%s)", self.vm)
            self._metrics.cycle_seconds.observe(self._clock.monotonic() - started)
            stop.wait(max(self._pace.min_gap - (self._clock.monotonic() - started), 0))
            remaining = self._pace.idle_cycle - (self._clock.monotonic() - started)
            if remaining > 0 and not stop.is_set():
                self._wake.wait(remaining)

    def cycle(self) -> Plan:
        """One observe-decide-act cycle. Returns the plan it carried out."""
        with log_context(vm=self.vm, phase=self.phase):
            plan = self._cycle()
        self._telemetry.completed(self._clock.monotonic(), self._clock.now())
        return plan

    def _cycle(self) -> Plan:
        started = self._clock.monotonic()
        snap = self._observe(started)
        self._job_status()
        local = self._state.local
        needed = view_needed(snap, local, self._policy)
        if snap.cluster is not None and not snap.cluster.part.holds(needed):
            # An event names this VM now, or it leads: that part of the view, before deciding.
            self._state = replace(self._state, part=needed)
            snap = self._observe_group(started, None, snap.document, join=False)
            local = self._state.local
        if local.confirm_peers and self._peers is not None:
            # The last cycle would have approved: what the budget counts as serving is asked again, now,
            # and this cycle decides on those answers (``decide.approval.confirmed_peers``).
            asked_at = self._clock.monotonic()
            snap = replace(snap, peers_confirmed_at=asked_at, peers=self._peers.confirm())
        plan = decide(snap, local, self._policy)
        decided = self._clock.monotonic()
        with log_context(phase=(plan.next_phase or local.phase).value):  # what this plan makes of the VM
            local = self._act(snap, plan)
        self._state = replace(self._state, local=local, part=view_needed(snap, local, self._policy))
        self._quiet.note(snap, local, plan, holding_named=bool(self._state.evidence.named))
        self._report(snap, plan)
        log.debug("cycle took %.1f ms: observe %.1f, decide %.1f, act %.1f (vm=%s)",
                  (self._clock.monotonic() - started) * 1e3, (snap.mono - started) * 1e3,
                  (decided - snap.mono) * 1e3, (self._clock.monotonic() - decided) * 1e3, self.vm)
        if snap.cluster is not None:
            members = sorted(snap.cluster.members)
            if self.vm in members:
                self._readings.align(members.index(self.vm), len(members))
        return plan

    # -- observe -----------------------------------------------------------------------------------

    def _observe(self, started: float) -> Snapshot:
        reading = self._readings.latest()
        new = reading.seq != self._state.reading.seq
        self._state = replace(self._state, reading=reading)
        if new and reading.error is not None:
            self._telemetry.imds_error(reading.error)
        if new and reading.document is not None:
            self._state = replace(self._state, last_document=reading.document)
            self._metrics.document_incarnation.set(reading.document.document_incarnation)
            self._metrics.set_events(Counter((e.event_type, e.event_status) for e in reading.document.events))
        # A reading is fresh evidence while it is recent, for the cycle it arrives in and for cycles
        # woken by something else; the sightings below count each reading once.
        age = self._clock.monotonic() - reading.at
        document = reading.document if age <= self._pace.document_fresh else None
        self._metrics.document_age.set(age if reading.seq else float("nan"))
        return self._observe_group(started, reading if new and document is not None else None, document)

    def _observe_group(self, started: float, fresh: Reading | None, document: Document | None, *,
                       join: bool = True) -> Snapshot:
        """The cluster view (after joining and campaigning, unless ``join`` is False: done already this
        cycle) and the snapshot. ``fresh``: a new fresh reading, for the evidence."""
        cluster: ClusterView | None = None
        duplicate: str | None = None
        try:
            if join:
                if self._store.connection_state is ConnectionState.LOST:
                    # Level-triggered like the rest: (re)connect when there is no connection. A no-op
                    # while the client reconnects by itself; a new attempt after a failed first start.
                    self._store.start()
                self._store.join(self.vm, self._member_info)
                self._store.campaign(self.vm)
            cluster = self._store.read_view(self.vm, part=self._state.part)
        except DuplicateMember as exc:
            duplicate = str(exc)  # said once by the decision (``Plan.invalid``), not every cycle
        except (StoreError, InvalidName) as exc:
            self._metrics.errors.labels("store").inc()
            self._telemetry.view_unavailable(exc, self._clock.monotonic())  # logged once, then reminded
        connection = self._store.connection_state
        self._metrics.set_connection(connection)
        if cluster is not None:
            self._metrics.is_leader.set(1 if cluster.i_am_leader else 0)
            self._metrics.members.set(len(cluster.members))
        else:
            self._metrics.is_leader.set(0)
        mono = self._clock.monotonic()
        self._track(fresh, cluster, connection, mono)
        state = self._state
        evidence = state.evidence
        return Snapshot(
            me=self.vm,
            now=self._clock.now(),
            mono=mono,
            document=document,
            last_document=state.last_document,
            cluster=cluster,
            named=evidence.named,
            seen=evidence.seen,
            absent_for={vm: mono - since for vm, since in evidence.absent_since.items()},
            connected_at=evidence.connected_at,
            started=self._started,
            granted_session=self._store.granted_session_timeout,
            cycle_started=started,
            read_sent=state.reading.sent,
            duplicate=duplicate,
            peers=self._peers.seen() if self._peers is not None else None,
            seen_unnamed=evidence.seen_unnamed,
            done_seen=evidence.done_seen,
            started_seen=evidence.started_seen,
        )

    def _track(self, reading: Reading | None, cluster: ClusterView | None, connection: ConnectionState,
               mono: float) -> None:
        """Feed this cycle's observations to the evidence (``evidence.observed``, pure); what a restart could
        not read from its state file holds this VM from the first observation that says it."""
        document = reading.document if reading is not None else None
        sent, answered = (reading.sent, reading.at) if reading is not None else (mono, mono)
        arrived = self._clock.now() - max(0.0, mono - answered)  # the answer's arrival, on the wall clock
        state = self._state
        evidence, restart, held, why = observed(
            state.evidence, state.restart, state.local.draining_for, me=self.vm, document=document, sent=sent,
            answered=answered, arrived=arrived, cluster=cluster, connection=connection, mono=mono,
            gone_after=self._policy.gone_after)
        for line in why:
            log.warning("%s (vm=%s)", line, self.vm)
        local = replace(state.local, draining_for=state.local.draining_for | held) if held else state.local
        self._state = replace(state, evidence=evidence, restart=restart, local=local)

    def _job_status(self) -> None:
        """Fold the end of the last job into the state: its outcome, and what ``/status`` says of it."""
        local = self._state.local
        live = self._live
        job = live.jobs.current
        if not local.job_running or job is None or job.running:
            return
        if job.kind == "drain" and live.drain_began is not None:
            local = replace(local, drain_started=max(local.drain_started, live.drain_began))
        error = job.error  # shown until the next job ends, with the fallbacks a job that succeeded holds by
        # ``action_error_outside_vm``: the error lies outside this VM (``ActionError.outside_vm``).
        said = {"action_error": None if error is None else f"{job.kind} failed: {error}",
                "action_fallback": ("; ".join(live.fallbacks) or None) if error is None else None,
                "action_error_outside_vm": bool(getattr(error, "outside_vm", False))}
        if error is not None:
            self._metrics.errors.labels("action").inc()
            # One line a failure, saying what comes next: a retry, not a verdict on the event.
            if job.kind == "drain":
                retry = max(0.0, self._policy.drain_retry - (self._clock.monotonic() - local.phase_since))
                then = (f"the VM stays out of rotation, unacknowledged; tried again in {retry:.0f} s (an event "
                        "that no drain clears in time starts at NotBefore, unapproved)")
            else:
                then = f"the VM stays out of rotation; tried again in {self._policy.recover_retry:.0f} s"
            log.error("%s failed (vm=%s): %s; %s", job.kind, self.vm, error, then)
        local = replace(local, job_running=False, job_failed=error is not None, job_done_at=self._clock.monotonic())
        self._state = replace(self._state, local=local, job=said)

    # -- act ---------------------------------------------------------------------------------------

    def _act(self, snap: Snapshot, plan: Plan) -> LocalState:
        """Carry out the plan's operations in their order; returns the plan's local state with each result on
        top (``decide.local.reported``)."""
        if plan.next_phase is not None:
            self._metrics.set_phase(plan.next_phase)
        local = plan.local
        for op, done in carry_out(self._executor, plan, snap):
            local = reported(local, op, done)
        return local

    # -- report ------------------------------------------------------------------------------------

    def _report(self, snap: Snapshot, plan: Plan) -> None:
        description = self._telemetry.report(snap, plan, self._state.local, self._store.connection_state,
                                             getattr(self._store, "session_id", None))
        shown = Shown(plan=plan, snapshot=snap, description=description, cycles=self._state.shown.cycles + 1)
        self._state = replace(self._state, shown=shown)
