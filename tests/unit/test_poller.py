"""The IMDS poller and the loop that never waits on it (``coordinator.poller``, ``coordinator.agent``).

Schedules are checked with fake clocks; the two tests about threads run the real poller and the real
loop for about two seconds each."""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.decide import Policy
from coordinator.errors import ImdsUnavailable
from coordinator.imds import ImdsClient
from coordinator.metrics import Metrics
from coordinator.models import Document, parse_document
from coordinator.poller import ImdsPoller, Reading
from tests.fakezk_group import FakeGroup
from tests.unit.test_safety_regressions import E2, POLICY, Bench, E, FakeImds

EMPTY = parse_document({"DocumentIncarnation": 1, "Events": []})


class Top(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


class Ticks:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_000.37

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def test_a_poll_is_one_attempt_its_retry_is_the_next_poll() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    with ImdsClient(transport=httpx.MockTransport(handler), sleep=lambda s: None) as client:
        poller = ImdsPoller(lambda: client.get_document(attempts=1))
        reading = poller.poll_once()
    assert len(sent) == 1
    assert isinstance(reading.error, ImdsUnavailable) and reading.document is None
    assert reading.seq == 1 and poller.failures == 1


def test_failures_back_off_across_polls_and_a_success_restores_the_interval() -> None:
    ticks = Ticks()
    failing = [True]

    def read() -> Document:
        if failing[0]:
            raise ImdsUnavailable("IMDS timed out", outcome="timeout")
        return EMPTY

    poller = ImdsPoller(read, interval=1.0, backoff_max=8.0, clock=lambda: ticks.mono, rng=Top())
    delays = []
    for _ in range(6):
        began = ticks.mono
        poller.poll_once()
        ticks.advance(0.25)  # the read itself took a quarter of a second
        delays.append(poller.next_delay(began))
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # doubling from the interval, capped
    failing[0] = False
    began = ticks.mono
    assert poller.poll_once().document is EMPTY
    ticks.advance(0.25)
    assert poller.next_delay(began) == pytest.approx(0.75)  # the steady schedule, counted from the poll


def test_a_slow_failing_read_still_waits_an_interval_before_the_next() -> None:
    ticks = Ticks()

    def read() -> Document:
        raise ImdsUnavailable("IMDS timed out", outcome="timeout")

    poller = ImdsPoller(read, interval=1.0, clock=lambda: ticks.mono, rng=random.Random(7))
    for _ in range(20):
        began = ticks.mono
        poller.poll_once()
        ticks.advance(3.0)
        assert poller.next_delay(began) >= 1.0  # never two reads in a row, whatever the jitter


def test_staggered_polls_land_on_each_ranks_offset_of_the_shared_grid() -> None:
    ticks = Ticks()  # wall clock at .37 of a second
    poller = ImdsPoller(lambda: EMPTY, interval=1.0, clock=lambda: ticks.mono, wall=lambda: ticks.wall)
    poller.align(2, 4)  # offset 0.5 s
    began = ticks.mono
    poller.poll_once()
    delay = poller.next_delay(began)
    assert delay == pytest.approx(1.13)  # 1000.37 -> 1001.50: an interval at least, then the grid
    ticks.advance(delay)
    for _ in range(5):
        began = ticks.mono
        poller.poll_once()
        ticks.advance(0.05)
        assert poller.next_delay(began) == pytest.approx(0.95)  # steady: once a second at .50
        ticks.advance(0.95)
    assert ticks.wall % 1.0 == pytest.approx(0.5)
    poller.align(0, 4)  # the group changed: offset 0; still no two polls less than ~an interval apart
    began = ticks.mono
    poller.poll_once()
    assert poller.next_delay(began) == pytest.approx(1.5)


def test_poll_soon_reads_at_once_without_moving_the_schedule_and_is_bounded() -> None:
    reads: list[float] = []

    def read() -> Document:
        reads.append(time.monotonic())
        return EMPTY

    poller = ImdsPoller(read, interval=1.0)
    poller.start()
    try:
        time.sleep(0.3)
        asked = time.monotonic()
        poller.poll_soon()
        time.sleep(0.05)
        assert len(reads) == 2 and reads[1] - asked < 0.05  # read at once
        storm_end = time.monotonic() + 0.5
        while time.monotonic() < storm_end:  # a flood of requests for early reads
            poller.poll_soon()
            time.sleep(0.001)
        time.sleep(0.3)  # past the first scheduled poll (1.0 s after the first)
    finally:
        poller.stop(5)
    gaps = [b - a for a, b in itertools.pairwise(reads)]
    assert min(gaps) >= ImdsPoller.EARLY_GAP - 0.005
    # From the first poll to the second scheduled one: the two polls and at most two early reads.
    assert len([t for t in reads if t < reads[0] + 1.0 - 0.01]) <= 1 + ImdsPoller.EARLY_PER_INTERVAL
    assert any(abs(t - (reads[0] + 1.0)) < 0.05 for t in reads), "the scheduled poll moved"


def test_a_peers_record_the_document_does_not_show_asks_for_one_early_read(tmp_path: Path) -> None:
    bench, vm0 = _two_vms(tmp_path)
    vm0.refresh()  # vm0's latest reading: no event
    bench.step()
    bench.group.schedule(E, ["vm0", "vm1"], in_s=100)
    bench.vms["vm1"].agent.cycle()  # vm1 polls first and publishes the record
    assert E in bench.cluster.events
    bench.vms["vm0"].agent.cycle()  # woken by the record's watch
    assert vm0.asked == 1
    bench.vms["vm0"].agent.cycle()
    assert vm0.asked == 1  # once per record
    vm0.refresh()
    bench.vms["vm0"].agent.cycle()
    assert vm0.asked == 1  # its own document shows the event now: nothing more to ask


def test_wake_ups_never_drive_imds_beyond_the_poll_rate(tmp_path: Path) -> None:
    """A storm of wake-ups (ZooKeeper watches) makes cycles, not reads: the poller reads at its rate."""
    reads: list[float] = []

    def read() -> Document:
        reads.append(time.monotonic())
        return EMPTY

    agent, stop, thread, poller = _running_agent(tmp_path, read, interval=0.5)
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            agent.wake()
            time.sleep(0.001)
    finally:
        stop.set()
        agent.wake()
        thread.join(5)
        poller.stop(5)
    span = reads[-1] - reads[0]
    assert agent.status()["cycles"] > 3 * len(reads)  # the storm did make cycles
    # at most one read per interval; 50 ms for the timers' jitter over the whole span
    assert len(reads) <= (span + 0.05) / 0.5 + 1
    assert min(b - a for a, b in itertools.pairwise(reads)) >= 0.45


def test_the_loop_serves_the_group_while_imds_hangs(tmp_path: Path) -> None:
    """IMDS never answers (a first call can take two minutes): the agent still joins, leads and marks
    absent peers, duties the others depend on."""
    release = threading.Event()

    def read() -> Document:
        release.wait(30)
        return EMPTY

    cluster = FakeGroup(time.time)
    gone = cluster.store(time.time)  # a VM that once joined and whose agent is gone
    gone.start()
    gone.join("vm9", {})
    gone.stop()
    assert "vm9" in cluster.registry and "vm9" not in cluster.members
    agent, stop, thread, poller = _running_agent(tmp_path, read, interval=1.0, cluster=cluster)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and agent.status().get("cluster") is None:
            time.sleep(0.05)
        status = agent.status()
        assert status["cluster"] is not None, status
        assert status["cluster"]["i_am_leader"] and status["cluster"]["members"] == ["vm0"]
        assert status["imds"]["fresh"] is False and poller.latest().seq == 0  # still no answer
        assert status["phase"] == "unknown"  # and the VM stays out of rotation meanwhile
        while time.monotonic() < deadline and "vm9" not in cluster.absent:
            time.sleep(0.05)
        assert "vm9" in cluster.absent  # the leader's absence mark, written without any document
    finally:
        release.set()
        stop.set()
        agent.wake()
        thread.join(5)
        poller.stop(5)


AT_ONCE = replace(POLICY, return_wait=0.0)  # serving as soon as the start-up recovery is done


def test_a_quiet_group_runs_one_cycle_per_idle_cycle_not_one_per_reading(tmp_path: Path) -> None:
    """Readings that repeat an empty document, with nothing else changing, skip their cycles: an idle
    agent costs one cycle per ``idle_cycle`` (and one read per poll)."""
    reads: list[float] = []

    def read() -> Document:
        reads.append(time.monotonic())
        return EMPTY

    agent, stop, thread, poller = _running_agent(tmp_path, read, interval=0.1, idle_cycle=1.0, policy=AT_ONCE)
    try:
        time.sleep(0.5)  # joined, leading, serving: quiet from here
        cycles0, reads0, t0 = agent.status()["cycles"], len(reads), time.monotonic()
        # Count by readings, not by the clock: a loaded machine slows the poller, and the claim is about
        # how many of the readings ran a cycle.
        deadline = t0 + 20.0
        while len(reads) - reads0 < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        cycles, n_reads = agent.status()["cycles"] - cycles0, len(reads) - reads0
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        agent.wake()
        thread.join(5)
        poller.stop(5)
    assert agent.status()["phase"] == "serving"
    assert n_reads >= 20  # the poller went on reading...
    # ...and the loop ran on the idle cycle (1 s), not on each of the 20 readings.
    assert 1 <= cycles <= elapsed / 1.0 + 2, (cycles, n_reads, elapsed)
    assert cycles <= n_reads // 3, (cycles, n_reads, elapsed)


def test_a_reading_with_an_event_runs_its_cycle_at_once_in_a_quiet_group(tmp_path: Path) -> None:
    named = parse_document({"DocumentIncarnation": 2, "Events": [{
        "EventId": E, "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["vm0"],
        "EventStatus": "Started", "NotBefore": "", "Description": "", "EventSource": "Platform"}]})
    document = [EMPTY]
    agent, stop, thread, poller = _running_agent(tmp_path, lambda: document[0], interval=0.1, idle_cycle=5.0,
                                                 policy=AT_ONCE)
    try:
        time.sleep(0.5)
        assert agent.status()["phase"] == "serving"
        document[0] = named  # the idle cycle is 5 s away: only the reading itself can run the cycle
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and agent.status()["phase"] == "serving":
            time.sleep(0.02)
        phase = agent.status()["phase"]
    finally:
        stop.set()
        agent.wake()
        thread.join(5)
        poller.stop(5)
    assert phase in ("draining", "drained")


def _running_agent(tmp_path: Path, read: object, *, interval: float, cluster: FakeGroup | None = None,
                   idle_cycle: float = 5.0,
                   policy: Policy = POLICY) -> tuple[Agent, threading.Event, threading.Thread, ImdsPoller]:
    agent_ref: list[Agent] = []
    poller = ImdsPoller(read, interval=interval,  # type: ignore[arg-type]
                        on_reading=lambda: agent_ref[0].reading_arrived() if agent_ref else None)
    store = (cluster or FakeGroup(time.time)).store(time.time)
    agent = Agent(vm="vm0", imds=FakeImds.__new__(FakeImds), store=store, actions=[ProbeAction(ProbeState())],
                  policy=policy, metrics=Metrics(CollectorRegistry()), poll_interval=interval, readings=poller,
                  idle_cycle=idle_cycle)
    agent_ref.append(agent)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    poller.start()
    return agent, stop, thread, poller


# -- readings serve the cycles woken by other changes, while recent --------------------------------------


class HeldReadings:
    """A poller the test drives: ``refresh`` reads IMDS once; cycles in between see the same reading."""

    def __init__(self, imds: FakeImds, bench: Bench) -> None:
        self.imds, self.bench = imds, bench
        self.reading = Reading(0, bench.clock.mono)
        self.asked = 0

    def refresh(self) -> None:
        self.reading = Reading(self.reading.seq + 1, self.bench.clock.mono, document=self.imds.get_document())

    def refresh_if_asked(self) -> None:
        if self.asked:
            self.asked = 0
            self.refresh()

    def latest(self) -> Reading:
        return self.reading

    def align(self, rank: int, members: int) -> None:
        return None

    def poll_soon(self) -> None:
        self.asked += 1


def _two_vms(tmp_path: Path, policy: Policy = POLICY) -> tuple[Bench, HeldReadings]:
    bench = Bench(tmp_path, policy)
    held: list[HeldReadings] = []

    def readings(imds: FakeImds) -> HeldReadings:
        held.append(HeldReadings(imds, bench))
        return held[-1]

    bench.add("vm0", readings=readings)
    bench.add("vm1")
    bench.add("vm2")  # serves while the others are in maintenance
    return bench, held[0]


def _acked_on_a_second_old_reading(tmp_path: Path) -> tuple[Bench, HeldReadings]:
    bench, vm0 = _two_vms(tmp_path)
    bench.group.schedule(E, ["vm0", "vm1"], in_s=100)
    for _ in range(15):  # both drain for the drain wait (10 s) and acknowledge
        vm0.refresh()
        bench.step()
        if E in bench.cluster.events and bench.cluster.events[E].acks.keys() >= {"vm0", "vm1"}:
            break
    assert not bench.group.approved(E)
    # vm0 ran on its latest reading before vm1 acknowledged; now, a second later and before its next
    # poll, vm1's ack wakes it.
    assert vm0.reading.at == bench.clock.mono - 1.0
    return bench, vm0


def test_an_ack_woken_cycle_asks_for_one_read_and_approves_on_it(tmp_path: Path) -> None:
    bench, vm0 = _acked_on_a_second_old_reading(tmp_path)
    bench.vms["vm0"].agent.cycle()
    assert not bench.group.approved(E) and vm0.asked == 1  # not on a document from before the acks
    assert "read after it became approvable" in str(bench.vms["vm0"].agent.status()["events"])
    vm0.refresh_if_asked()  # the poller's early read, which wakes the loop
    bench.vms["vm0"].agent.cycle()
    assert bench.group.approved(E), "approval waited for the next poll"


def test_resources_changed_since_the_last_reading_are_seen_before_approving(tmp_path: Path) -> None:
    """IMDS added vm2 to the event after vm0's last poll: an approval on that reading would release
    maintenance on vm2, which never drained."""
    bench, vm0 = _acked_on_a_second_old_reading(tmp_path)
    bench.group.events[E]["Resources"] = ["vm0", "vm1", "vm2"]
    bench.group.incarnation += 1
    bench.vms["vm0"].agent.cycle()
    vm0.refresh_if_asked()
    bench.vms["vm0"].agent.cycle()
    assert not bench.group.approved(E)
    assert "vm2" in str(bench.vms["vm0"].agent.status()["events"])


def test_no_approval_rests_on_a_reading_older_than_one_and_a_half_polls(tmp_path: Path) -> None:
    bench, vm0 = _two_vms(tmp_path)
    bench.group.schedule(E, ["vm0", "vm1"], in_s=100)
    for _ in range(15):
        vm0.refresh()
        bench.step()
        if E in bench.cluster.events and bench.cluster.events[E].acks.keys() >= {"vm0", "vm1"}:
            break
    vm0.refresh()
    bench.clock.advance(1.6)  # the poller stalled: the last reading is 1.6 poll intervals old
    bench.vms["vm0"].agent.cycle()
    assert not bench.group.approved(E)
    assert bench.vms["vm0"].agent.status()["imds"]["fresh"] is False
    vm0.refresh()
    bench.vms["vm0"].agent.cycle()
    assert bench.group.approved(E)


def test_a_reading_counts_once_towards_an_event_being_gone(tmp_path: Path) -> None:
    """Gone needs two fresh documents without the event: cycles woken between polls reuse one reading
    and must not count it again (else one flapped read would put the VM back)."""
    policy = Policy(drain_wait=1.0, return_wait=0.5, gone_after=1.0, latest_start=120.0, session_timeout=30.0)
    bench, vm0 = _two_vms(tmp_path, policy)
    bench.group.schedule(E, ["vm0"], in_s=100)
    for _ in range(4):
        vm0.refresh()
        bench.step()
    assert not bench.vms["vm0"].probe.serving
    bench.vms["vm0"].imds.omit_once = {E}  # one read misses the event
    vm0.refresh()
    for _ in range(14):  # 1.4 s of cycles woken by other changes, on that one reading
        bench.clock.advance(0.1)
        bench.vms["vm0"].agent.cycle()
    assert not bench.vms["vm0"].probe.serving, "one flapped read put the VM back"
    assert "C7061BAC" in str(bench.vms["vm0"].agent.status()["drained_for"]).upper()


def test_a_record_published_since_the_leaders_last_poll_is_not_taken_for_one_gone(tmp_path: Path) -> None:
    """The leader marks a record done once its own documents have missed the event; a record a peer
    published after the leader's last poll has not been missed by any of them yet."""
    bench, vm0 = _two_vms(tmp_path)
    bench.run(3)  # vm0 leads
    vm0.refresh()
    bench.vms["vm0"].agent.cycle()  # its latest poll: no event
    bench.group.schedule(E, ["vm1", "vm2"], in_s=100)
    bench.vms["vm1"].agent.cycle()  # vm1 polls first and publishes
    assert E in bench.cluster.events
    bench.clock.advance(0.3)
    bench.vms["vm0"].agent.cycle()  # the leader, woken by the record, on its reading from before
    assert bench.cluster.events[E].record.done_at is None


def test_peers_asked_again_do_not_release_an_approval_held_for_a_fresh_read(tmp_path: Path) -> None:
    """Before approving, the agent asks its peers again and decides on their answers in the next cycle; that
    cycle must hold back, as the one before it did, an event that became approvable after the reading was
    sent."""
    bench = Bench(tmp_path, replace(POLICY, max_events=None, peer_fresh=3.0), probe_peers=True)
    held: list[HeldReadings] = []

    def readings(imds: FakeImds) -> HeldReadings:
        held.append(HeldReadings(imds, bench))
        return held[-1]

    bench.add("vm0", readings=readings)
    for name in ("vm1", "vm2", "vm3"):
        bench.add(name)
    vm0 = held[0]
    bench.group.schedule(E, ["vm0", "vm1"], in_s=100)
    bench.group.schedule(E2, ["vm0", "vm2"], in_s=100)

    def others(*names: str) -> None:
        for name in names:
            bench.vms[name].agent.cycle()

    for _ in range(15):  # vm2 stays away: E becomes approvable, E2 waits for vm2's ack
        vm0.refresh()
        bench.vms["vm0"].agent.cycle()
        others("vm1", "vm3")
        bench.clock.advance(0.1)
        bench.vms["vm0"].agent.cycle()  # woken by what vm1 and vm3 wrote
        if vm0.asked:
            break
        bench.clock.advance(0.9)
    assert vm0.asked and not bench.group.posts  # E held for a fresh read
    for _ in range(12):  # meanwhile vm2 drains and acknowledges E2; vm0 waits for its read
        others("vm1", "vm2", "vm3")
        bench.clock.advance(1.0)
    assert "vm2" in bench.cluster.events[E2].acks
    vm0.refresh()  # the read vm0 asked for, sent before E2 was ever approvable at vm0
    bench.clock.advance(0.01)
    bench.vms["vm0"].agent.cycle()  # the cycle that reading wakes: it would approve, and asks the peers first
    assert bench.group.posts == []
    bench.clock.advance(0.01)
    bench.vms["vm0"].agent.cycle()  # run at once: it asks the peers again, then decides on their answers
    assert [ids for _, ids, _ in bench.group.posts] == [(E,)]  # E2 waits for a read of its own
