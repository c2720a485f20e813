"""Agent bugs found by the model-based suite, each kept as a minimal deterministic regression, with the
fix that closed it (``scripts/check_regressions.py`` undoes each fix and expects its test here to fail).

The budget files a VM out of rotation under an event key
----------------------------------------------------------
``decide.budget.in_flight`` files a VM that is out of rotation (it has an ``/out`` node or an ack) and that no
event in flight names under the first event key it is out for (``keys[0]``: its ``/out`` node, then its
acks). ``decide.budget.over_budget`` then leaves out of ``others`` every unit of the event being admitted or
approved. When that first key is the key of the event being admitted or approved, which happens when an
EventId is reused or when an event's Resources no longer name the VM, the out-of-rotation VM is neither
"busy" nor one of the event's VMs: ``keep_one_serving`` (and ``max_vms``) count it as serving, and
``max_events`` does not count the other events it is still out for. docs/safety.md S4 promises that the
budget counts every VM with an ``/out`` node or an ack until it is back in rotation, and that with
``keep_one_serving`` nothing is admitted or approved unless a live member stays in rotation.

Fixed: ``in_flight`` files such a VM under every key it is out for, and ``over_budget`` counts as busy
every VM out of rotation but those the event itself takes. Later, the same suite found that filing it under
the key itself was not enough: a VM out for an earlier instance of a reused EventId counted under the new
instance, which ``over_budget`` leaves out of the events in maintenance, so with a budget of one event the
new instance was admitted and approved beside the earlier one. Fixed: such a VM is filed under the earlier
instance, an event of its own (``decide.budget._unit_out_for``).

The drain wait is counted from the decision to drain
----------------------------------------------------
``decide`` acknowledges once ``snap.mono - drain_started`` reaches the drain wait, and ``drain_started`` is
the cycle that decided the drain (``Agent._act``), not the moment the drain job ran. Jobs run one at a
time in submission order: a drain decided while a recovery is still running (a slow webhook or HAProxy
call) runs after it, so the recovery first puts the probe back to 200, then the drain fails it, and the
VM acknowledges as soon as that drain is done, however little of the drain wait has passed since. S1
(docs/safety.md) approves only VMs drained for the event now, the probe failing for the drain wait.

Fixed: the agent counts the drain wait from the moment the drain job began on the executor's thread
(the drain job of ``execute.LiveExecutor``).

A cut-off VM served on a reading sent before an approval made on its standing ack
--------------------------------------------------------------------------------
vm0 acknowledges event E and is cut off from ZooKeeper; its session, and the ack, live on in the ensemble
up to the granted timeout. E stops naming vm0 (vm0 no longer holds it once it is gone, but stays out of
rotation while its ack may stand), then names vm0 again, and vm2 approves E on vm0's ack, which still
stands: vm0 is drained at that moment (S1 holds). vm0's next cycle runs on a slow reading whose request
was sent just before the approval: it shows E Scheduled, and cut off, vm0 cannot see E's admission, so
it does not drain for E (``decide.drain.drains_for``: not admitted as far as it knows, drain just in time); its
cut-off has passed ``session_lapses_after``, so ``acks_outstanding`` lets it recover. vm0 answers 200
while E, approved on its ack, has started (S2: a VM out of rotation while an event held its ack stays out
until the event is gone). A reading whose request was sent after the approval shows E Started and keeps
vm0 out; the gap is the reading's age. Found by the model-based suite (slow IMDS answers, default run).
Fixed: a cut-off VM leaves the drained state only on a document requested after every session that could
hold its acks has lapsed and an approver's POST fenced on one of them has been sent
(``decide.drain.acks_released_by``).

The oracle held a VM out for an ack that had lapsed unused
----------------------------------------------------------
The same composite step, with the event shown only to the VMs it names or with a session granted longer
than asked: a VM that acked and was cut off stays out while the ack may stand, then serves on a document
showing the event still Scheduled, after the ack had lapsed with nobody approving on it. The model held
the VM out until the event was gone, whatever became of the ack, and called that an S2 break. Nothing can
release an event on an ack that no longer exists (an approval needs the ack at its final check, S1): the
oracle now holds the VM out while its ack stands, and for good once the event is released. The agent was
right; the two sequences stay as tests of the rule that does hold (``session_lapses_after`` with the
granted timeout).

An event that appeared after the absent grace ran out was approved before its cut-off VMs had drained
-------------------------------------------------------------------------------------------------------
vm1's agent restarts unable to reach ZooKeeper; vm0 reboots and comes back cut off too. Both have been
absent past ``absent_peer_grace_seconds`` when a Reboot of vm0 and vm1 appears: the approver counts them as
gone and approves within a cycle. Alive, each drains itself for any event naming it, but only once it
sees it: vm1 had been out of rotation for 5 s of its 10 s drain wait (S1). Found by the model-based suite
(default run), once its oracle stopped holding a VM to draining for an event before the event existed.
Fixed: an event naming VMs absent past the grace is approved only once it has been approvable for their
drain wait plus ``Policy.absent_notice`` (``decide.approval.absent_drained``).

The oracle took a slow answer for one the agent had read
--------------------------------------------------------
A recovery that the agent decided before it was shown its event Started may still put the probe back to
200 before the drain queued behind it runs: the VM is not drained for the event until that drain is done
(docs/safety.md, "drained for E now"). The oracle stamped "shown" when IMDS answered. A slow answer shows
IMDS as it was when the request was sent and reaches the agent a poll later, so a recovery decided in
between, on the reading before, was held against the agent as an S2 break. The agent was right; the oracle
now stamps "shown" when the answer arrives.

The oracle kept an agent cut off after every fault had healed
-------------------------------------------------------------
Its quiet time (``quiesce``) heals every fault, then expects the leader or a live agent an event named to
close the event's record once the event has left the group. An agent started again unable to reach any
ZooKeeper server, healed before its first cycle, was cut off anew by that first cycle's start, and stayed
so: the heal had ended the count of cycles that brings it back. The record waited for it, and the oracle
called that a liveness miss. A store healed before it starts now reaches a server when it starts, and an
agent the process manager starts during the quiet time reaches one at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions import Action, ActionContext, ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide
from coordinator.errors import ActionError
from coordinator.executor import JobExecutor
from coordinator.metrics import Metrics
from coordinator.models import parse_document
from coordinator.state import StateFile
from coordinator.store.base import BY_HAND, ClusterView, ConnectionState, EventRecord, OutMark
from tests.fakezk_group import FakeGroup
from tests.model.imds_model import FakeImds, ImdsGroup, ModelEvent, rfc_not_before

pytestmark = pytest.mark.model

NOW = 1_700_000_000.0
MONO = 10_000.0
K = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
OTHER = "A626E37F-793E-44E1-89B5-99AE0B96044C"
MEMBERS = frozenset({"vm0", "vm1", "vm2"})
POLICY = Policy(drain_wait=10.0)  # the default budget: one event in maintenance, keep one serving
SERVING = LocalState(phase=Phase.SERVING, phase_since=0.0)
DRAINED = LocalState(phase=Phase.DRAINED, phase_since=0.0, drain_started=0.0, draining_for=frozenset({K}))

def _snapshot(me: str, *, resources: list[str], out_for: tuple[str, ...], admitted: bool, acks: tuple[str, ...],
              members: frozenset[str] = MEMBERS) -> Snapshot:
    """``members`` run agents, vm0 leads; event K (a Reboot 10 minutes away) names ``resources``; vm2 is out
    of rotation with an ``/out`` node for the events ``out_for``, and nothing in the document names it."""
    not_before = NOW + 600
    document = parse_document({"DocumentIncarnation": 3, "Events": [{
        "EventId": K, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
        "Resources": resources, "NotBefore": rfc_not_before(not_before),
    }]})
    record = EventRecord(
        event_id=K, event_type="Reboot", resources=tuple(resources), not_before=not_before, published_by="vm0",
        published_at=NOW - 60, acks={vm: NOW - 20 for vm in acks}, admitted_at=NOW - 30 if admitted else None,
    )
    cluster = ClusterView(
        members=members, leader="vm0", i_am_leader=me == "vm0", records={K: record},
        connection=ConnectionState.CONNECTED, known=members,
        out={"vm2": OutMark(since=NOW - 120, events=out_for),
             **{vm: OutMark(since=NOW - 40, events=(K,)) for vm in acks}},
    )
    return Snapshot(me=me, now=NOW, mono=MONO, document=document, last_document=document, cluster=cluster)


def test_control_an_out_of_rotation_vm_filed_under_another_event_blocks_the_admission() -> None:
    """The intended behaviour, and the contrast that locates the bug: vm2, still out of rotation for an
    event that has ended, is counted (as an event in maintenance, and as a VM out of rotation), so K (vm0,
    vm1) is not admitted."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(OTHER,), admitted=False, acks=())
    plan = decide(snap, SERVING, POLICY)
    assert plan.admit == ()
    assert any("no VM serving" in reason or "maintenance budget" in reason for reason in plan.reasons(K))


def test_a_reused_event_id_is_admitted_while_the_only_other_vm_is_out_for_its_earlier_instance() -> None:
    """vm2 is still out of rotation for the earlier instance of K (its recovery, or the return wait, is not
    over); K comes back (a reused EventId) for vm0 and vm1. Admitting it leaves no VM in rotation."""
    plan = decide(_snapshot("vm0", resources=["vm0", "vm1"], out_for=(K,), admitted=False, acks=()), SERVING, POLICY)
    assert K not in plan.admit


def test_control_a_vm_still_out_for_an_ended_event_counts_as_an_event_in_maintenance() -> None:
    """The intended behaviour: vm2 is still out of rotation for OTHER, which has ended; vm3 serves. With a
    budget of one event, K is not admitted while OTHER is still in maintenance."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(OTHER,), admitted=False, acks=(),
                     members=MEMBERS | {"vm3"})
    plan = decide(snap, SERVING, POLICY)
    assert plan.admit == ()
    assert any("maintenance budget: 1 event" in reason for reason in plan.reasons(K))


def test_a_vm_out_for_another_event_is_not_counted_when_it_was_out_for_the_reused_id_first() -> None:
    """As above, but vm2 was first out for an earlier instance of K, then also for OTHER (still out for
    both): K comes back for vm0 and vm1 and is admitted while OTHER is still in maintenance."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(K, OTHER), admitted=False, acks=(),
                     members=MEMBERS | {"vm3"})
    plan = decide(snap, SERVING, POLICY)
    assert K not in plan.admit


def test_a_reused_event_id_is_admitted_beside_its_earlier_instance_that_still_holds_a_vm_out() -> None:
    """vm2 is still out of rotation for the earlier instance of K, an event in maintenance while it is;
    vm3 serves. K comes back for vm0 and vm1: with a budget of one event, it is not admitted beside its
    earlier instance (found by the model-based suite: the new instance was admitted and approved while
    vm2 was out for the earlier one, two events in maintenance)."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(K,), admitted=False, acks=(),
                     members=MEMBERS | {"vm3"})
    plan = decide(snap, SERVING, POLICY)
    assert K not in plan.admit
    assert any("maintenance budget: 1 event" in reason and "an earlier instance" in reason
               for reason in plan.reasons(K))


def test_a_reused_event_id_is_not_approved_beside_its_earlier_instance_that_still_holds_a_vm_out() -> None:
    """As above, with the new instance admitted (the admission made before vm2's ``/out`` node showed) and
    vm0 and vm1 acknowledged: vm0, the approver, holds the approval while vm2 is out for the earlier
    instance."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(K,), admitted=True, acks=("vm0", "vm1"),
                     members=MEMBERS | {"vm3"})
    plan = decide(snap, DRAINED, POLICY)
    assert plan.approve == ()
    assert any("an earlier instance" in reason for reason in plan.reasons(K))


def test_a_vm_drained_by_hand_still_acked_for_an_event_that_dropped_it_counts_that_event_in_maintenance() -> None:
    """vm2 is drained by hand (its ``/out`` node) and still holds its ack of OTHER, whose Resources no longer
    name it: OTHER is in maintenance while vm2 is out for it, though vm2 is filed first as a VM out by hand,
    which is no event. With a budget of one event, K (vm0, vm1) is not admitted beside OTHER."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(BY_HAND,), admitted=False, acks=(),
                     members=MEMBERS | {"vm3"})
    other = EventRecord(event_id=OTHER, event_type="Reboot", resources=("vm3",), not_before=NOW + 900,
                        published_by="vm3", published_at=NOW - 100, acks={"vm2": NOW - 50})
    assert snap.cluster is not None
    cluster = replace(snap.cluster, records={**snap.cluster.records, OTHER: other})
    plan = decide(replace(snap, cluster=cluster), SERVING, POLICY)
    assert K not in plan.admit
    assert any("maintenance budget: 1 event" in reason and OTHER in reason for reason in plan.reasons(K))


def test_an_event_whose_resources_dropped_a_vm_is_approved_while_that_vm_is_still_out() -> None:
    """K was admitted for vm2 and vm1; its Resources then became vm0 and vm1. vm2 is still out of rotation
    for K (recovering); vm0 and vm1 have drained and acknowledged. vm0, the approver, approves: no VM is in
    rotation when K starts."""
    snap = _snapshot("vm0", resources=["vm0", "vm1"], out_for=(K,), admitted=True, acks=("vm0", "vm1"))
    plan = decide(snap, DRAINED, POLICY)
    assert plan.approve == ()


# -- the same bug end to end: real agents, an approval POST while no VM answers its probe ------------------


@dataclass
class _Job:
    kind: str
    error: BaseException | None
    running: bool = False


class _InlineExecutor:
    """Runs each job at once, on the loop's thread."""

    def __init__(self) -> None:
        self.current: _Job | None = None

    def submit(self, kind: str, fn: Callable[[], None]) -> _Job:
        error: BaseException | None = None
        try:
            fn()
        except Exception as exc:
            error = exc
        self.current = _Job(kind, error)
        return self.current


class _FailingRecovery:
    """An action after the probe whose recoveries fail while ``failing`` (retried every few seconds); its
    recover runs before the probe's (recoveries run in reverse), so the probe keeps failing meanwhile."""

    name = "slow"
    always_recover = False

    def __init__(self) -> None:
        self.failing = False

    def drain(self, ctx: ActionContext) -> None:
        pass

    def recover(self, ctx: ActionContext) -> None:
        if self.failing:
            raise ActionError("load balancer API unavailable")


class _Clock:
    def __init__(self) -> None:
        self.wall = NOW
        self.mono = MONO

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def _run(clock: _Clock, group: ImdsGroup, agents: Mapping[str, Agent], seconds: int) -> None:
    """``seconds`` seconds pass, one at a time: the group moves on, then every agent cycles once."""
    for _ in range(seconds):
        clock.wall += 1
        clock.mono += 1
        group.tick()
        for agent in agents.values():
            agent.cycle()


def test_end_to_end_a_reused_event_id_is_approved_while_no_vm_answers_its_probe(tmp_path: Path) -> None:
    """Real agents on the ZooKeeper store over the fake ZooKeeper, against the model of IMDS:

    1. vm0, vm1 and vm2 run agents (the default budget) and are back in rotation after their start.
    2. A Reboot K for vm2 alone is scheduled 10 minutes away: admitted, drained, acknowledged, approved by
       vm2; it starts, and leaves the document a minute later.
    3. vm2's recovery fails from then on (an action after the probe, retried every few seconds): vm2 stays
       out of rotation, its ``/out`` node saying it is out for K.
    4. IMDS reuses the EventId K for a Reboot of vm0 and vm1, 10 minutes away.
    Nothing may be admitted or approved now: it would leave no VM in rotation. The leader admits K, vm0
    and vm1 drain and acknowledge, and vm0 POSTs the approval while all three VMs answer 503."""
    clock = _Clock()
    group = ImdsGroup(lambda: clock.wall)
    cluster = FakeGroup(lambda: clock.wall, session_timeout=POLICY.session_timeout)
    probes: dict[str, ProbeState] = {}
    agents: dict[str, Agent] = {}
    slow = _FailingRecovery()
    serving_at_posts: list[dict[str, bool]] = []

    def on_post(fake: FakeImds, ids: list[str]) -> None:
        serving_at_posts.append({vm: probe.serving for vm, probe in probes.items()})

    for vm in ("vm0", "vm1", "vm2"):
        probes[vm] = ProbeState()
        actions: list[Action] = [ProbeAction(probes[vm])]
        if vm == "vm2":
            actions.append(slow)
        agents[vm] = Agent(
            vm=vm, imds=FakeImds(group, vm, on_post), store=cluster.store(clock.now),
            actions=actions, policy=POLICY, metrics=Metrics(CollectorRegistry()), clock=clock,
            jobs=cast(JobExecutor, _InlineExecutor()), state_file=StateFile(tmp_path / vm / "state.json"),
        )

    def run(seconds: int) -> None:
        _run(clock, group, agents, seconds)

    def schedule(resources: tuple[str, ...]) -> ModelEvent:
        return group.add(ModelEvent(
            serial=group.next_serial(), event_id=K, event_type="Reboot", source="Platform", resources=resources,
            start_at=clock.wall + 600, not_before_raw=rfc_not_before(clock.wall + 600), impact=60,
        ))

    run(15)
    assert all(probe.serving for probe in probes.values())
    first = schedule(("vm2",))
    run(30)
    assert first.early and len(serving_at_posts) == 1  # approved by vm2 once drained, as it should be
    slow.failing = True
    run(60)
    assert first.serial in group.ended
    assert not probes["vm2"].serving  # its recovery keeps failing: out of rotation
    assert cluster.out["vm2"].events == (K,)
    assert cluster.events[K].record.done_at is not None
    schedule(("vm0", "vm1"))
    run(40)
    assert not probes["vm2"].serving
    # docs/safety.md S4: with keep_one_serving nothing is approved unless a live member stays in rotation.
    assert all(any(seen.values()) for seen in serving_at_posts), serving_at_posts


# -- the drain wait is counted from the decision, not from when the probe began failing ---------------------


class _QueuedExecutor:
    """``JobExecutor`` in submission order, one job at a time, run only when the test releases them: a
    slow job (a recovery whose webhook takes long) as the real executor's worker thread would run it."""

    def __init__(self) -> None:
        self.current: _Job | None = None
        self._queue: list[tuple[_Job, Callable[[], None]]] = []

    def submit(self, kind: str, fn: Callable[[], None]) -> _Job:
        self.current = _Job(kind, None, running=True)
        self._queue.append((self.current, fn))
        return self.current

    def release(self) -> None:
        while self._queue:
            job, fn = self._queue.pop(0)
            try:
                fn()
            except Exception as exc:
                job.error = exc
            job.running = False


class _RecordedProbe(ProbeState):
    """The probe, with the time of its last change to failing."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(False)
        self._clock = clock
        self.failing_since: float | None = clock.mono

    def set(self, serving: bool) -> None:
        if not serving and self.serving:
            self.failing_since = self._clock.mono
        elif serving:
            self.failing_since = None
        super().set(serving)


def test_a_drain_queued_behind_a_slow_recovery_is_acknowledged_before_the_drain_wait(tmp_path: Path) -> None:
    """Real agents on the ZooKeeper store over the fake ZooKeeper, against the model of IMDS (drain wait 10 s):

    1. vm0, vm1 and vm2 start; vm1's start-up recovery is slow (its jobs wait in the executor), so vm1
       stays out of rotation; vm0 and vm2 serve.
    2. A Freeze for vm0 and vm1 is scheduled 10 minutes away; the leader admits it (vm2 keeps serving).
       vm0 drains and acknowledges 10 s later. vm1 decides to drain: its drain job queues behind the
       recovery.
    3. 30 s later vm1's jobs run, in order: the recovery puts its probe back to 200, then the drain fails it.
    4. On its next cycle vm1 is DRAINED and acknowledges at once (30 s since it decided to drain), and vm0
       approves: the Freeze is released 2 s after vm1's probe began failing, while the load balancer may
       still route to vm1 (docs/safety.md S1: drained for the event, the probe failing for the drain
       wait)."""
    clock = _Clock()
    group = ImdsGroup(lambda: clock.wall)
    cluster = FakeGroup(lambda: clock.wall, session_timeout=POLICY.session_timeout)
    probes = {vm: _RecordedProbe(clock) for vm in ("vm0", "vm1", "vm2")}
    agents: dict[str, Agent] = {}
    slow = _QueuedExecutor()
    failing_at_posts: list[dict[str, float | None]] = []

    def on_post(fake: FakeImds, ids: list[str]) -> None:
        failing_at_posts.append({vm: (clock.mono - p.failing_since) if p.failing_since is not None else None
                                 for vm, p in probes.items()})

    for vm in ("vm0", "vm1", "vm2"):
        executor = slow if vm == "vm1" else _InlineExecutor()
        agents[vm] = Agent(
            vm=vm, imds=FakeImds(group, vm, on_post), store=cluster.store(clock.now),
            actions=[ProbeAction(probes[vm])], policy=POLICY, metrics=Metrics(CollectorRegistry()), clock=clock,
            jobs=cast(JobExecutor, executor), state_file=StateFile(tmp_path / vm / "state.json"),
        )

    def run(seconds: int) -> None:
        _run(clock, group, agents, seconds)

    run(15)
    assert probes["vm0"].serving and probes["vm2"].serving and not probes["vm1"].serving
    serial = group.next_serial()
    event = group.add(ModelEvent(
        serial=serial, event_id=K, event_type="Freeze", source="Platform", resources=("vm0", "vm1"),
        start_at=clock.wall + 600, not_before_raw=rfc_not_before(clock.wall + 600), impact=60, duration=60,
    ))
    run(30)
    assert not event.early and set(cluster.events[K].acks) == {"vm0"}
    slow.release()
    run(15)
    assert event.early, "the Freeze is released once vm1 has acknowledged"
    wait = POLICY.drain_wait
    for failing in failing_at_posts:
        assert all(failing[vm] is not None and failing[vm] >= wait for vm in ("vm0", "vm1")), failing_at_posts


def test_a_cut_off_vm_does_not_serve_on_a_reading_sent_before_an_approval_made_on_its_standing_ack() -> None:
    """The model-based suite's minimal sequence (default run), replayed on ``CoordinatorModel``: vm0's IMDS
    answers late, showing the events as they were when each request was sent."""
    from tests.model.test_safety_model import CoordinatorModel

    state = CoordinatorModel()
    try:
        state.setup(vm3="agent", leader_mode=False, windows=False, skews=[30.0, -4.0, -4.0, 0.0],
                    absent_grace=60.0, named_only=False, lapse_lag=1.0, granted=None)
        state.cycle(vm="vm0")
        state.slow_imds(slow="sent", vm="vm0")
        state.ack_outlives_cut_off(index=4, seconds=25, vm="vm0")  # vm2 approves E on vm0's ack at t+70s
        assert not state.violations["S1"], state.violations["S1"]
        assert not state.violations["S2"], state.violations["S2"]
    finally:
        state.teardown()


def test_a_cut_off_vm_serves_again_once_its_ack_lapsed_unused_though_its_event_names_it_again() -> None:
    """Found by the model-based suite, a break of its oracle, not of the agent. Each VM's IMDS shows only
    the events naming it. vm2 acknowledges a Reboot of vm1 and vm2 while a pause holds approvals and is
    cut off from ZooKeeper at once (its session, granted 40 s, and its ack live on); the event stops
    naming vm2 for 25 s and names it again while the ack stands, so vm2 must stay out while an approval
    could be made on that ack. Its session lapses 40 s after the ack with nobody having approved; vm2
    waits for the longest session it may have been granted plus a tick and half a session (57 s) and
    then serves on a document that shows the event still Scheduled: nothing can release the event on an
    ack that no longer exists. The oracle held the VM out until the event was gone; it now holds it out
    while the ack stands or once the event is released."""
    from tests.model.test_safety_model import CoordinatorModel

    state = CoordinatorModel()
    try:
        state.setup(leader_mode=True, skews=[-4.0, -30.0, 0.0, 30.0], windows=False, granted=40.0, lapse_lag=0.0,
                    vm3="agent", absent_grace=120.0, named_only=True)
        state.schedule_odd(event_type="Redeploy", not_before="calendar-min", notice=30, resources=["vm2", "vm9"],
                           shape="no-resources")
        state.schedule_odd(event_type="Redeploy", not_before="year-9999", notice=900, resources=["vm9"], shape="as-is")
        state.calm_minute()
        state.heal(vm="vm2")
        state.ack_outlives_cut_off(index=4, seconds=25, vm="vm2")
        state.calm_minute()
        state.s2_drained_until_gone()
    finally:
        state.teardown()


def test_a_vm_cut_off_after_acking_stays_out_while_a_longer_granted_session_may_hold_its_ack() -> None:
    """The server grants 60 s where 30 s were asked; vm1 acknowledges a Reboot of vm0 and vm1 while a pause
    holds approvals and is cut off; the event stops naming vm1 for 55 s and names it again, 55 s after
    the ack, while the ack still stands (the session lapses 60 s after it). vm1 must stay out until
    the granted session, not the asked one, has certainly lapsed (``session_lapses_after``); it serves
    only after that, on a document showing the event still Scheduled."""
    from tests.model.test_safety_model import CoordinatorModel

    state = CoordinatorModel()
    try:
        state.setup(vm3="dry-run", granted=60.0, lapse_lag=1.0, windows=True, skews=[0.0, 0.0, 0.0, 0.0],
                    absent_grace=None, leader_mode=True, named_only=False)
        state.hold_jobs(cycles=10, vm="vm0")
        state.operator_pause(paused=False)
        state.calm_minute()
        state.operator_pause(paused=True)
        state.post_fault(fault="lost", vm="vm1")
        state.expire_leader()
        state.settle(vm="vm0")
        state.operate(order=["vm1", "vm0", "vm3", "vm2"], seconds=10)
        state.restart(failing_reads=3, state_file="keep", store_down=3, unreachable=False, vm="vm2")
        state.restart(failing_reads=2, state_file="corrupt", store_down=3, unreachable=True, vm="vm2")
        state.restart(failing_reads=2, state_file="corrupt", store_down=0, unreachable=False, vm="vm3")
        state.post_fault(fault="lost", vm="vm3")
        state.post_fault(fault="lost", vm="vm0")
        state.executor_mode(eager=True, vm="vm3")
        state.ack_outlives_cut_off(index=2, seconds=55, vm="vm1")
        state.operator_pause(paused=False)
        state.operate(order=["vm2", "vm0", "vm3", "vm1"], seconds=30)
        state.s2_drained_until_gone()
    finally:
        state.teardown()


def test_an_event_appearing_after_the_absent_grace_waits_for_its_cut_off_vms_to_drain() -> None:
    """The model-based suite's minimal sequence (default run), replayed on ``CoordinatorModel``."""
    from tests.model.test_safety_model import CoordinatorModel

    state = CoordinatorModel()
    try:
        state.setup(windows=True, skews=[-30.0, 3.0, 30.0, 30.0], vm3="agent", named_only=False, lapse_lag=2.0,
                    leader_mode=False, granted=40.0, absent_grace=120.0)
        state.advance(seconds=300)
        state.operator_pause(paused=True)
        state.schedule_odd(event_type="Preempt", not_before="wrong-weekday", notice=900,
                           resources=["vm2", "vm1", "VM2"], shape="empty-resources")
        state.woken(seconds=1, serve_early=False, vm="vm2")
        state.operator_pause(paused=False)
        state.cycle(vm="vm1")
        state.incarnation(by=3, reset=False, vm="vm3")
        state.change_resources(index=4, resources=["vm0", "vm2"])
        state.calm_minute()
        state.operate(order=["vm0", "vm2", "vm3", "vm1"], seconds=60)
        state.heal(vm="vm1")
        state.cycle(vm="vm0")
        state.arm_store_fault(fault="suspend", point="after_approve", vm="vm0")
        state.clock_ticks()
        state.read_faults(faults=["bad-request", "bad-request", "410"], vm="vm0")
        state.arm_store_fault(fault="suspend", point="after_view", vm="vm1")
        state.hold_jobs(cycles=3, vm="vm3")
        state.calm_minute()
        state.operator_pause(paused=False)
        state.restart(failing_reads=2, state_file="corrupt", store_down=60, unreachable=True, vm="vm1")
        state.arm_store_fault(fault="expire", point="before_approve", vm="vm0")
        state.slow_imds(slow="sent", vm="vm3")
        state.read_faults(faults=["429", "429"], vm="vm2")
        state.incarnation(by=2, reset=False, vm="vm1")
        state.reboot_cut_off(down_for=90, first=True, uptime=45, vm="vm0")  # vm2 released the Reboot at t+631s
        assert not state.violations["S1"], state.violations["S1"]
        assert not state.violations["S2"], state.violations["S2"]
    finally:
        state.teardown()


def test_the_oracle_counts_a_slow_answer_as_shown_when_it_reaches_the_agent() -> None:
    """Found by the model-based suite, a break of its oracle, not of the agent. vm1, drained for a Freeze,
    decides to recover once the Freeze is gone, on a reading that shows a Redeploy naming it still
    Scheduled; its recovery waits behind a slow job. The Redeploy starts just then, and vm1's next request
    is answered slowly, showing it Started: the answer reaches the agent a poll later, which queues a
    drain behind the running recovery. The recovery puts the probe back to 200 for a moment, then the drain
    fails it. The oracle excuses a recovery decided before the agent was shown the event Started, but
    counted the agent as shown when IMDS answered, before the answer reached it, and called the moment an
    S2 break. It now counts it when the answer arrives (``FakeImds(shown_later=True)``, ``ModelReadings``)."""
    from tests.model.harness import ModelReadings

    clock = _Clock()
    group = ImdsGroup(clock.now)
    group.add(ModelEvent(serial=group.next_serial(), event_id="E", event_type="Redeploy", source="Platform",
                         resources=("vm1",), start_at=clock.wall, not_before_raw=None, impact=30, status="Started"))
    shown: list[list[str]] = []
    imds = FakeImds(group, "vm1", lambda fake, ids: None, lambda events: shown.append([e.event_id for e in events]),
                    shown_later=True)
    readings = ModelReadings(imds.get_document, clock.monotonic, imds.shown)
    readings.slow = "sent"
    readings.poll()  # the request is sent, and answered as IMDS is now; the answer is on its way
    assert shown == []
    assert readings.latest().document is None
    clock.mono += 1.0
    readings.poll()  # it arrives: the agent is shown the event now
    document = readings.latest().document
    assert document is not None and [e.event_id for e in document.events] == ["E"]
    assert shown == [["E"]]


def test_the_oracle_lets_a_store_healed_before_it_starts_reach_a_server() -> None:
    """See "The oracle kept an agent cut off after every fault had healed" above."""
    from coordinator.store.base import ConnectionState
    from tests.model.harness import ModelStore

    clock = _Clock()
    cluster = FakeGroup(lambda: clock.wall, session_timeout=POLICY.session_timeout)
    store = ModelStore(cluster.store(clock.now), cluster, on_admit=lambda key: None, pause=lambda: None,
                       now=lambda: clock.wall)
    store.unreachable_at_start = True  # started again cut off from every server...
    store.reconnect()  # ...and healed before its first cycle
    store.start()
    assert not store.cut_off
    assert store.inner.connection_state is ConnectionState.CONNECTED
