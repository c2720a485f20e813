"""Test doubles the model-based suite wires into real ``Agent`` objects.

* ``ModelTime`` / ``VmClock``: one true clock advanced by the test; each VM's wall clock is the true
  time plus a per-VM skew; the monotonic clock is shared.
* ``ModelExecutor``: ``JobExecutor``'s interface (``submit(kind, fn)``, ``current`` with ``running`` and
  ``error``), running jobs one at a time in submission order, when the test says so: right after the
  agent's cycle (``deferred``), at submission (``eager``), or slowly (``held``: the job starts at once and
  waits in the recording action until released, a drain having failed the probe before it, a recovery,
  whose actions run in reverse, not having touched it yet; the jobs behind it wait too). Each job is
  stamped, on the harness's sequence of observations, when it is submitted; ``pending`` lists the jobs
  not finished.
* ``WatchedProbe``: the real ``ProbeState``, telling the harness of every change before it happens, so
  that "the load-balancer probe answers 200" is observed from outside the agent.
* ``RecordingAction``: a drain/recover action standing for the configured actions after the probe; it
  records whether the VM's actions are drained, fails when told to, and is where a slow job waits.
* ``ModelStore``: the ``Store`` protocol over the real ``ZooKeeperStore`` on the fake ZooKeeper of the
  group (``tests.fakezk_group.FakeGroup``); remembers under which session each cycle read its view,
  reports admissions, and injects one-shot session faults at chosen points of a cycle (an expiry after the
  store's check of an approval first pauses the process until the session lapses: the ensemble expires a
  session only once it has heard nothing from it for the timeout it granted, on a tick boundary up to one
  tick later). Connection faults cut the store's link to the ensemble, and the ensemble expires sessions;
  kazoo's client reports what follows. A store can also be unreachable from its start (no session).
* ``ModelReadings``: the IMDS poller; a read is answered at once, or (slow) only at the agent's next
  poll, at most ``SLOW_ANSWER`` seconds after its request was sent, showing IMDS as it was when the
  request was sent or when it was answered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from coordinator.actions import ActionContext, ProbeState
from coordinator.errors import ActionError, DuplicateMember, ImdsError, ImdsUnavailable
from coordinator.models import Document
from coordinator.poller import Reading
from coordinator.store.base import ApprovalResult, ClusterView, ConnectionState, EventRecord, Part, Pause, WriteResult
from coordinator.store.zookeeper import ZooKeeperStore
from tests.fakezk_group import FakeGroup

__all__ = [
    "STORE_FAULT_POINTS",
    "ModelExecutor",
    "ModelJob",
    "ModelStore",
    "ModelTime",
    "RecordingAction",
    "VmClock",
    "VmTruth",
    "WatchedProbe",
]

STORE_FAULT_POINTS = ("after_view", "before_approve", "after_approve")


class ModelTime:
    def __init__(self, start: float) -> None:
        self.now = start  # true epoch seconds
        self.mono = 10_000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


class VmClock:
    """The agent's ``Clock``: the true time plus this VM's skew; one shared monotonic clock."""

    def __init__(self, time: ModelTime, skew: float) -> None:
        self._time = time
        self.skew = skew

    def now(self) -> float:
        return self._time.now + self.skew

    def monotonic(self) -> float:
        return self._time.mono


class ModelJob:
    """One drain or recover job, run on its own thread so that a slow one can stop half-way (after the
    probe, inside the recording action) until the test releases it."""

    def __init__(self, kind: str, fn: Callable[[], None], stamp: int) -> None:
        self.kind = kind
        self.stamp = stamp  # when it was submitted, on the harness's sequence of observations
        self.behind_recovery = False  # a recovery was pending when it was submitted: it runs after that
        self._fn = fn
        self._error: BaseException | None = None
        self.finished = threading.Event()
        self.settled = threading.Event()  # finished, or parked at the checkpoint
        self.gate = threading.Event()  # opened to let a parked job go on
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    @property
    def error(self) -> BaseException | None:
        return self._error if self.finished.is_set() else None

    def _body(self) -> None:
        try:
            self._fn()
        except Exception as exc:  # kept on the job, as a future keeps it
            self._error = exc
        finally:
            self.finished.set()
            self.settled.set()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._body, name=f"model-{self.kind}", daemon=True)
        self.thread.start()
        if not self.settled.wait(JOB_TIMEOUT):
            raise RuntimeError(f"model {self.kind} job neither finished nor parked")


JOB_TIMEOUT = 10.0


class ModelExecutor:
    """``JobExecutor``'s interface; one job at a time, in submission order, as the real one.

    ``deferred``: queued jobs run to completion right after the agent's cycle (``pump``); ``eager``: at
    submission; ``held``: a job starts at submission and parks at the recording action's checkpoint until
    released (a drain has failed the probe by then, a recovery has not touched it yet); the jobs behind it
    wait.
    """

    MODES = ("deferred", "eager", "held")

    def __init__(self, mode: str, before_run: Callable[[], None], stamp: Callable[[], int]) -> None:
        self.mode = mode
        self._before_run = before_run
        self._stamp = stamp
        self.queue: list[ModelJob] = []
        self.current: ModelJob | None = None
        self.active: ModelJob | None = None  # the job started (or about to start) and not finished
        self.last_drain: ModelJob | None = None
        self.abandoned = False

    def submit(self, kind: str, fn: Callable[[], None]) -> ModelJob:
        job = ModelJob(kind, fn, self._stamp())
        job.behind_recovery = any(pending.kind == "recover" for pending in self.pending())
        if kind == "drain":
            self.last_drain = job
        self.queue.append(job)
        self.current = job
        if self.mode in ("eager", "held"):
            self.pump()
        return job

    def pump(self, limit: int | None = None) -> int:
        """Run what may run now (at most ``limit`` jobs finishing); returns how many finished."""
        done = 0
        while not self.abandoned and (limit is None or done < limit):
            if self.active is not None:
                if self.mode == "held" and limit is None:
                    break
                self._release()
                done += 1
                continue
            if not self.queue:
                break
            job = self.queue.pop(0)
            self.active = job  # pending from the observation below until it has finished
            self._before_run()
            job.start()
            if job.finished.is_set():
                self.active = None
                done += 1
        return done

    def pending(self) -> list[ModelJob]:
        """The jobs not finished yet: the one started and parked, then the queued ones, in order."""
        return ([self.active] if self.active is not None else []) + list(self.queue)

    def _release(self) -> None:
        job = self.active
        assert job is not None and job.thread is not None
        job.gate.set()
        job.thread.join(JOB_TIMEOUT)
        if job.thread.is_alive():
            raise RuntimeError(f"model {job.kind} job did not finish once released")
        self.active = None

    def checkpoint(self) -> None:
        """Called by the recording action on the job's thread: park here while jobs are held."""
        job = self.active
        if job is None or self.mode != "held" or self.abandoned:
            return
        job.settled.set()
        job.gate.wait()
        if self.abandoned:
            raise ActionError("the agent process died")

    def abandon(self) -> None:
        """The process died: the parked job dies where it is, queued jobs never run."""
        self.abandoned = True
        self.queue.clear()
        if self.active is not None:
            self._release()


class WatchedProbe(ProbeState):
    def __init__(self, on_change: Callable[[bool], None], serving: bool = False) -> None:
        super().__init__(serving)
        self._on_change = on_change

    def set(self, serving: bool) -> None:
        if serving != self.serving:
            self._on_change(serving)
        super().set(serving)


class VmTruth:
    """What the harness knows of one VM from outside its agent."""

    def __init__(self, vm: str) -> None:
        self.vm = vm
        self.actions_drained = False  # the actions after the probe are drained
        self.fail_drains = 0  # the next so many drains fail
        self.fail_recovers = 0  # the next so many recoveries fail
        self.drain_failed = False  # the last drain failed (an injected failure)


class RecordingAction:
    name = "record"
    always_recover = False

    def __init__(self, truth: VmTruth, checkpoint: Callable[[], None]) -> None:
        self._truth = truth
        self._checkpoint = checkpoint

    def drain(self, ctx: ActionContext) -> None:
        self._checkpoint()
        if self._truth.fail_drains > 0:
            self._truth.fail_drains -= 1
            self._truth.drain_failed = True
            raise ActionError("injected drain failure")
        self._truth.actions_drained = True
        self._truth.drain_failed = False

    def recover(self, ctx: ActionContext) -> None:
        self._checkpoint()
        if self._truth.fail_recovers > 0:
            self._truth.fail_recovers -= 1
            raise ActionError("injected recover failure")
        self._truth.actions_drained = False


class ModelStore:
    """``Store`` over a ``ZooKeeperStore`` on the group's fake ZooKeeper, with observation and
    fault-injection points.

    Connection faults go through it, so that it knows since when the client has been cut off: the
    ensemble expires a session once it has heard nothing from it for a session timeout (``lapse_if_due``,
    called as the model's time passes), while a cut link alone would keep it until then."""

    def __init__(
        self, inner: ZooKeeperStore, group: FakeGroup, on_admit: Callable[[str], None], pause: Callable[[], None],
        now: Callable[[], float], on_admit_drain: Callable[[str], None] = lambda vm: None,
    ) -> None:
        self.inner = inner
        self._group = group
        self._link = group.link(inner)
        self._on_admit = on_admit
        self._on_admit_drain = on_admit_drain
        self._pause = pause
        self._now = now
        self.view_session: int | None = None  # the session under which this cycle's view was read
        self.armed: dict[str, str] = {}  # point -> "expire" | "suspend"
        self.suspended_at_start = False
        self.unreachable_at_start = False  # no server reachable: the first session is made only on reconnect
        # When the ensemble last heard from this client, as far as the agent can know: its last view read.
        # A real loop runs every second and its client notices a lost connection only after a read
        # timeout, so the agent sees CONNECTED until after the ensemble last heard from it; here a
        # connection is found lost at once, and the loop may not have run for a while: the ensemble is
        # taken to have last heard from the process when its loop last read the view.
        self.heard_at: float | None = None
        self.suspended_since: float | None = None  # cut off, its session still alive on the ensemble
        self.cut_off = False  # cut off, its session expired by the ensemble

    # -- connection faults ---------------------------------------------------------------------------

    def suspend(self) -> None:
        """The connection is lost, the session lives on (for a session timeout at most)."""
        if self.cut_off:
            return  # no session to keep: cut off already (or never reached a server)
        self._link.cut()
        if self.suspended_since is None:
            now = self._now()
            self.suspended_since = min(now, self.heard_at) if self.heard_at is not None else now

    def partition(self) -> None:
        """Cut off while the ensemble expires the session."""
        self._link.cut()
        self._group.expire(self.inner)
        self.cut_off = True
        self.suspended_since = None

    def reconnect(self) -> None:
        """Reachable again: back to the same session if it lived on, else LOST and a new session (kazoo
        reconnects by itself; a store whose first start failed starts again on the agent's next cycle). A
        store not started yet reaches a server when it starts."""
        self._link.restore()
        self.cut_off = False
        self.suspended_since = None
        self.unreachable_at_start = self.suspended_at_start = False

    def expire_session(self) -> None:
        """The ensemble ends the session: the client, connected, reconnects with a new one."""
        self._group.expire(self.inner)

    def lapse_if_due(self, lapses_after: float) -> None:
        """The ensemble expires a session it has not heard from for ``lapses_after`` seconds (the timeout it
        granted, plus up to a tick)."""
        if self.suspended_since is not None and self._now() - self.suspended_since >= lapses_after:
            self.partition()

    def _fire(self, point: str) -> None:
        fault = self.armed.pop(point, None)
        if fault is None or self.inner.connection_state is not ConnectionState.CONNECTED:
            return  # not connected: nothing to expire or suspend
        if fault == "expire":
            if point == "after_approve":
                # The store's check has just been heard by the ensemble: the session can lapse only once
                # the ensemble has heard nothing from this process for a session timeout (see the
                # assumptions of docs/safety.md). The process is paused for that long, then expired.
                self._pause()
            self.expire_session()
        elif fault == "suspend":
            self.suspend()

    # -- delegated ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.unreachable_at_start:  # cut off before it ever reached a server: no session at all
            self.unreachable_at_start = False
            self.partition()
        self.inner.start()
        if self.suspended_at_start:  # connected to nothing yet: the first session is suspended at once
            self.suspended_at_start = False
            self.suspend()

    def stop(self) -> None:
        self.inner.stop()

    @property
    def connection_state(self) -> ConnectionState:
        return self.inner.connection_state

    @property
    def duplicate(self) -> DuplicateMember | None:
        return self.inner.duplicate

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self.inner.set_wakeup(callback)

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        return self.inner.join(vm, info)

    def campaign(self, vm: str) -> bool:
        return self.inner.campaign(vm)

    def read_pause(self) -> Pause | None:
        return self.inner.read_pause()

    @property
    def granted_session_timeout(self) -> float | None:
        return self.inner.granted_session_timeout

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        view = self.inner.read_view(vm, part=part)
        self.view_session = self.inner.session_id
        self.heard_at = self._now()
        self._fire("after_view")
        return view

    def publish_event(self, record: EventRecord) -> WriteResult:
        return self.inner.publish_event(record)

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        return self.inner.acknowledge(event_id, vm, at)

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        return self.inner.withdraw_ack(event_id, vm)

    def approve(self, event_id: str, vm: str, required: Collection[str], **kwargs: Any) -> ApprovalResult:
        self._fire("before_approve")
        result = self.inner.approve(event_id, vm, required, **kwargs)
        self._fire("after_approve")
        return result

    def admit(self, event_id: str, vm: str, at: float, **kwargs: Any) -> WriteResult:
        result = self.inner.admit(event_id, vm, at, **kwargs)
        if result is WriteResult.DONE:
            self._on_admit(event_id)
        return result

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        result = self.inner.admit_drain(vm, asked, by, at)
        if result is WriteResult.DONE:
            self._on_admit_drain(vm)
        return result

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        return self.inner.mark_absent(vm, at)

    def clear_absent(self, vm: str) -> WriteResult:
        return self.inner.clear_absent(vm)

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        return self.inner.mark_done(event_id, at, started_at=started_at)

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        return self.inner.archive_done(event_ids, older_than)

    def purge_done(self, older_than: float) -> int:
        return self.inner.purge_done(older_than)

    def __getattr__(self, name: str) -> Any:  # anything else the contract grows
        return getattr(self.inner, name)


SLOW_ANSWER = 5.0  # seconds: the latest a slow answer arrives after its request was sent


class ModelReadings:
    """The IMDS poller as the model drives it (``coordinator.poller.Readings``): ``poll`` reads the
    agent's IMDS once; cycles in between, woken by the store or a job, see the same reading; a request
    for an early read (``poll_soon``) is noted and served when the model chooses.

    ``slow``: each answer arrives only at the next poll (at most ``SLOW_ANSWER`` seconds after its
    request was sent; the poller sends the next request then), showing IMDS as it was at one instant in
    between, chosen adversarially: when the request was sent (``"sent"``), or when it was answered
    (``"answered"``; an answer that would come later than ``SLOW_ANSWER`` is the client's timeout).
    ``""``: answered at once. ``shown``: told each document as its answer reaches the agent."""

    def __init__(self, read: Callable[[], Document], monotonic: Callable[[], float],
                 shown: Callable[[Document], None] = lambda document: None) -> None:
        self._read = read
        self._monotonic = monotonic
        self._shown = shown
        self.reading = Reading(0, monotonic())
        self.asked = False
        self.slow = ""
        self.pending: tuple[float, Document | None, ImdsError | None] | None = None  # sent, what it shows

    def _answer(self) -> tuple[Document | None, ImdsError | None]:
        try:
            return self._read(), None
        except ImdsError as exc:
            return None, exc

    def poll(self) -> None:
        now = self._monotonic()
        seq = self.reading.seq + 1
        if self.pending is not None:
            sent, document, error = self.pending
            self.pending = None
            answered = min(now, sent + SLOW_ANSWER)
            if document is None and error is None:  # shows IMDS as it is when the answer leaves it
                if answered == now:
                    document, error = self._answer()
                else:  # not answered within the client's timeout
                    error = ImdsUnavailable("model: no answer within the timeout", outcome="timeout")
            self.reading = Reading(seq, answered, document=document, error=error, began=sent)
            seq += 1
            if document is not None:
                self._shown(document)
        elif not self.slow:
            document, error = self._answer()
            self.reading = Reading(seq, now, document=document, error=error, began=now)
            if document is not None:
                self._shown(document)
        if self.slow:
            if self.slow == "sent":
                self.pending = (now, *self._answer())
            else:
                self.pending = (now, None, None)  # read when answered
        self.asked = False

    def latest(self) -> Reading:
        return self.reading

    def align(self, rank: int, members: int) -> None:
        return None

    def poll_soon(self) -> None:
        self.asked = True
