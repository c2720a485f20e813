"""Regression tests for the breaks found in the shell around the decision after the poller, the watched
view, the pause and the maintenance windows landed (``docs/safety.md``, rows 21 to 32).

Same bench as ``test_safety_regressions``: real ``Agent`` objects with the real decision code, on the
ZooKeeper store over the fake ZooKeeper, a small IMDS group driven by the test, a fake clock and inline
actions. Each test fails on the code before the fix it names (``scripts/check_regressions.py`` proves it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from coordinator.config import ApprovalRule
from coordinator.decide import LocalState, Phase, Policy, Sighting, Snapshot, decide
from coordinator.errors import ImdsFenced, ImdsUnavailable
from coordinator.maintenance_windows import Window
from coordinator.models import Document, parse_document
from coordinator.poller import Reading
from coordinator.store.base import ClusterView, ConnectionState, EventRecord
from tests.unit.test_safety_regressions import AT_ONCE, E2, Bench, E, FakeImds

# --- 21. a restarted agent that cannot reach ZooKeeper, with absent_peer_grace_seconds ---------------


def test_a_restarted_agent_cut_off_from_zookeeper_counts_itself_cut_off_since_before_it_started(
    tmp_path: Path,
) -> None:
    """The leader times vm1's absence from before its reboot; vm1's new agent, which never reached
    ZooKeeper, must not time its own cut-off from its process start: it drains for an event naming it
    at once, so that the approval that no longer waits for it never finds it serving."""
    policy = Policy(drain_wait=10.0, return_wait=5.0, latest_start=120.0, absent_grace=120.0, session_timeout=30.0)
    bench = Bench(tmp_path, policy)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(3)
    bench.crash("vm1")  # the VM reboots: its session ends, the leader starts timing its absence
    bench.run(40)  # the reboot takes 40 s
    vm1 = bench.add("vm1")
    vm1.store.partition()  # the new agent cannot reach ZooKeeper (network, credentials, ACLs)
    bench.run(60)  # once any session of it has lapsed (and half a session more), it serves again
    assert vm1.probe.serving
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E), "the leader stops waiting for vm1 after the grace"
    bench.assert_drained_at_every_post(E, ["vm0", "vm1"])


# --- 22. a session that outlives the timeout the agent asked for ---------------------------------------


def test_a_cut_off_vm_serves_only_once_the_session_the_server_granted_has_lapsed(tmp_path: Path) -> None:
    """ZooKeeper granted 40 s (its minimum is two ticks) where the agent asked for 30: vm0, cut off with
    its ack standing on the server and no longer named, must not serve after 30 s (and the fence's half
    session), or the approver finds
    its ack still held by its live session when IMDS names it again, and approves while it serves."""
    bench = Bench(tmp_path, AT_ONCE)
    bench.cluster.granted_session = 40.0
    for name in ("vm2", "vm1", "vm0"):  # vm2 leads
        bench.add(name)
    bench.group.schedule(E, ["vm1", "vm0", "vmx"])  # vmx runs no agent: drained at once, nobody may approve
    bench.run(20)
    assert set(bench.cluster.events[E].acks) == {"vm0", "vm1"}
    vm0 = bench.vms["vm0"]
    vm0.store.suspend()  # cut off; its session (and ack) live on in the ensemble
    bench.group.events[E]["Resources"] = ["vm1", "vmx"]
    bench.run(47)  # past 30 s asked (and half a session of fence), short of 40 s granted plus a tick (and it)
    assert "vm0" in bench.cluster.events[E].acks
    bench.group.events[E]["Resources"] = ["vm1", "vm0"]  # named again, and approvable by vm1 at once
    bench.run(5, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm0", "vm1"])


def test_a_cut_off_vm_comes_back_once_the_granted_session_has_certainly_lapsed(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    bench.cluster.granted_session = 40.0
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    vm0 = bench.vms["vm0"]
    vm0.store.suspend()
    bench.group.remove(E)
    bench.run(41)  # 40 s granted plus a 2 s tick: not yet
    assert not vm0.probe.serving
    bench.run(15)  # nor before an approval fenced on its ack could have been sent (half a session more)
    assert not vm0.probe.serving
    bench.run(5)
    assert vm0.probe.serving


# --- 23. a reused EventId ---------------------------------------------------------------------------------


@pytest.mark.parametrize("moved", [False, True], ids=["record-reopened", "record-moved-to-the-history"])
def test_a_reused_event_id_is_approved_again_by_the_same_approver(tmp_path: Path, moved: bool) -> None:
    """Whether the record is still done in the events (reopened) or moved to the history already (published
    anew), the new maintenance is drained for and approved again."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"])
    bench.run(40, until=lambda: bool(bench.group.approved(E)))
    assert len(bench.group.approved(E)) == 1
    bench.group.remove(E)
    bench.run(20, until=lambda: E in bench.cluster.events and bench.cluster.events[E].record.done_at is not None)
    assert bench.cluster.events[E].record.done_at is not None
    if moved:
        bench.run(30, until=lambda: E not in bench.cluster.events)
        assert E in bench.cluster.history
    bench.group.schedule(E, ["vm0"])  # the same id, a new maintenance
    bench.run(60, until=lambda: len(bench.group.approved(E)) == 2)
    assert len(bench.group.approved(E)) == 2
    bench.assert_drained_at_every_post(E, ["vm0"])
    assert bench.vms["vm0"].agent.status()["approved_by_me"] == [E]


# --- 24 and 25. a pause, or the end of a maintenance window, during the POST's retries ----------------------


class RetryingImds:
    """An IMDS client whose POST fails ``failures`` times before it is accepted, retrying after ``backoff``
    seconds, with the fence asked before every attempt (as ``ImdsClient.approve`` does). ``between`` runs
    after each failed attempt: the world changes while the client backs off."""

    def __init__(self, inner: FakeImds, clock_advance: Callable[[float], None], *, failures: int,
                 backoff: float, between: Callable[[], None]) -> None:
        self.inner, self.advance = inner, clock_advance
        self.failures, self.backoff, self.between = failures, backoff, between
        self.attempts = 0

    def get_document(self) -> object:
        return self.inner.get_document()

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        for attempt in range(self.failures + 1):
            if fence is not None and not fence():
                raise ImdsFenced(f"approval not sent: the approval's fence closed (attempt {attempt + 1})")
            self.attempts += 1
            if attempt < self.failures:
                self.between()
                self.advance(self.backoff)
                continue
            self.inner.approve(event_ids)
            return
        raise ImdsUnavailable("IMDS kept failing", outcome="status")


def test_a_pause_made_while_the_approval_is_retried_stops_the_retries(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    vm0 = bench.add("vm0")
    bench.add("vm1")
    retrying = RetryingImds(vm0.imds, bench.clock.advance, failures=2, backoff=1.0,
                            between=lambda: bench.cluster.pause("disk firmware rollout", "ops", bench.clock.wall))
    vm0.rewire(posts=retrying)
    bench.group.schedule(E, ["vm0"])
    bench.run(40, until=lambda: retrying.attempts > 0)
    assert retrying.attempts == 1, "the first attempt failed; the pause came before the retry"
    bench.run(20)
    assert bench.group.posts == []


def test_a_maintenance_window_that_closes_while_the_approval_is_retried_stops_the_retries(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    opened = datetime.fromtimestamp(bench.clock.wall, UTC)
    closes = opened + timedelta(seconds=25)  # open when the event is approvable, closed 25 s on
    window = Window(days=frozenset({opened.weekday()}), start=(opened - timedelta(hours=1)).time(),
                    end=closes.time(), zone=ZoneInfo("UTC"))
    bench.policy = Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0,
                          session_timeout=30.0, windows=(window,))
    vm0 = bench.add("vm0")
    bench.add("vm1")
    retrying = RetryingImds(vm0.imds, bench.clock.advance, failures=3, backoff=4.0, between=lambda: None)
    vm0.rewire(posts=retrying)
    bench.group.schedule(E, ["vm0"])
    bench.run(40, until=lambda: retrying.attempts > 0)
    assert retrying.attempts >= 1
    assert bench.clock.wall + 4.0 * 3 > closes.timestamp(), "the retries would outlast the window"
    assert bench.group.posts == [], "no attempt after the window closed"


# --- 26. "gone" timed by when the answers arrived ------------------------------------------------------------


class ScriptedReadings:
    """A poller whose readings the test makes, each with the time its request was sent and answered."""

    def __init__(self, imds: FakeImds) -> None:
        self.imds = imds
        self.current = Reading(0, 0.0)

    def read(self, sent: float, answered: float, omit: set[str] | None = None) -> None:
        document = parse_document(self.imds.group.raw(omit or set()))
        self.current = Reading(self.current.seq + 1, answered, document=document, began=sent)

    def latest(self) -> Reading:
        return self.current

    def align(self, rank: int, members: int) -> None:
        return None

    def poll_soon(self) -> None:
        return None


def test_two_misses_whose_answers_came_late_do_not_make_an_event_gone(tmp_path: Path) -> None:
    """Reads sent 1 s apart miss the event; the second answer takes 4 s. The misses span 1 s of requests,
    not the 3 s gone window: vm0 keeps its ack and stays out while the event, listed again, names it."""
    bench = Bench(tmp_path, AT_ONCE)
    scripted: list[ScriptedReadings] = []

    def readings(imds: FakeImds) -> ScriptedReadings:
        scripted.append(ScriptedReadings(imds))
        return scripted[-1]

    vm0 = bench.add("vm0", readings=readings)
    reads = scripted[0]
    bench.add("vm1")
    bench.group.schedule(E, ["vm0", "vmx"])
    for _ in range(20):
        reads.read(bench.clock.mono - 0.01, bench.clock.mono)
        bench.step()
    assert "vm0" in bench.cluster.events[E].acks
    start = bench.clock.mono
    reads.read(start - 0.01, start)  # shows the event
    bench.step()
    reads.read(start + 1.0, start + 1.0, omit={E})  # a miss
    bench.step()
    for _ in range(4):
        bench.step()  # the next read, sent at start + 2, is answered only at start + 6
    reads.read(start + 2.0, bench.clock.mono, omit={E})
    bench.step(0.0)
    bench.step(0.5)  # a cycle woken by a watch, on the same reading
    reads.read(bench.clock.mono - 0.4, bench.clock.mono)  # listed again
    bench.run(5)
    assert "vm0" in bench.cluster.events[E].acks
    assert not any(serving for mono, serving in vm0.history if mono >= start - 20)


# --- 27. state files that spell event ids as IMDS did ----------------------------------------------------------


def test_a_state_file_spelling_an_event_id_otherwise_than_imds_now_does_still_holds_the_vm(tmp_path: Path) -> None:
    """The drained state is keyed by the upper-cased id, as the store is: a state file written with the
    id in lower case (as IMDS spelled it then) holds the VM for the event IMDS now spells in upper case."""
    bench = Bench(tmp_path, Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0,
                                   approval={"Reboot": ApprovalRule.NEVER}))
    for name in ("vm1", "vm2"):
        bench.add(name)
    state = tmp_path / "vm0.json"
    state.write_text(json.dumps({"phase": "drained", "draining_for": [E.lower()], "updated_at": bench.clock.wall}))
    bench.group.schedule(E, ["vm0"])  # a Reboot never approved early: drained just in time, not now
    vm0 = bench.add("vm0")
    bench.run(30)
    assert not any(serving for _, serving in vm0.history)
    bench.group.remove(E)
    bench.run(20)
    assert vm0.probe.serving



# --- 28. groups whose IMDS shows each VM only the events naming it ---------------------------------------------


class NamedOnlyImds(FakeImds):
    """IMDS of a group that delivers an event only to the VMs it names (one-fault-domain GPU scale sets)."""

    def get_document(self) -> Document:
        if self.failing:
            raise ImdsUnavailable("IMDS timed out", outcome="timeout")
        hidden = {eid for eid, e in self.group.events.items() if self.vm not in e.get("Resources", [])}
        return parse_document(self.group.raw(hidden | self.omit_once))


def test_a_group_whose_vms_see_only_their_own_events_still_approves_early(tmp_path: Path) -> None:
    """The leader (vm0) never sees vm1's or vm2's events: it admits them from their records, and marks a
    record done only once its VMs no longer hold it, not because its own documents never listed it."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        vm = bench.add(name)
        vm.imds = NamedOnlyImds(bench.group, name)
        vm.rewire(imds=vm.imds)
    bench.run(3)
    assert bench.cluster.leader is not None and bench.cluster.leader.vm == "vm0"
    bench.group.schedule(E, ["vm1"])
    bench.run(40, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E), "approved early, long before its NotBefore"
    bench.assert_drained_at_every_post(E, ["vm1"])
    bench.run(5)
    bench.group.remove(E)
    # vm1, the VM it names, closes its record once its own documents no longer show it, and recovers.
    bench.run(30, until=lambda: bench.cluster.events[E].record.done_at is not None and bench.vms["vm1"].probe.serving)
    assert bench.cluster.events[E].record.done_at is not None
    assert bench.vms["vm1"].probe.serving
    bench.run(20)  # vm1 back in rotation for the return wait: the budget frees
    bench.group.schedule(E2, ["vm2"])
    bench.run(40, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2)
    bench.assert_drained_at_every_post(E2, ["vm2"])


# --- 29. two agents configured with one vm_name ---------------------------------------------------------------


def test_a_second_agent_with_the_same_vm_name_stays_out_of_rotation_and_says_so(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    first = bench.add("vm0")
    bench.add("vm1")
    bench.run(20)
    assert first.probe.serving
    session = bench.cluster.members["vm0"].session
    second = bench.add("vm0")  # another process configured as vm0, with a session of its own
    second.history = []
    bench.vms["vm0-first"] = first  # keep cycling the first one too
    bench.run(30)
    assert bench.cluster.members["vm0"].session == session, "the first agent's member node is left alone"
    assert first.probe.serving
    assert not any(serving for _, serving in second.history), "the second one never serves"
    ready = second.agent.ready()
    assert not ready.ok and "another agent runs as vm0" in ready.detail
    assert second.agent.status()["duplicate"].startswith("another agent runs as vm0")
    gauge = second.agent._metrics.duplicate
    assert gauge._value.get() == 1.0
    bench.crash("vm0-first")  # the first one stops: its node goes with its session
    bench.run(30)
    assert bench.cluster.members["vm0"].session != session
    assert second.probe.serving and second.agent.ready().ok
    assert gauge._value.get() == 0.0


def test_a_serving_agent_that_finds_another_agent_in_its_place_leaves_rotation(tmp_path: Path) -> None:
    """vm0's agent is cut off long enough for its session to expire; meanwhile another agent configured as
    vm0 joins. Back, the first one finds a live member node of another session: it drains."""
    bench = Bench(tmp_path)
    first = bench.add("vm0")
    bench.add("vm1")
    bench.run(20)
    first.store.partition()
    bench.vms["vm0-first"] = first
    bench.add("vm0").history = []
    bench.run(20)
    first.store.heal()
    bench.run(20)
    assert not first.probe.serving
    assert "another agent runs as vm0" in first.agent.status()["stays_out"] + str(first.agent.status()["duplicate"])


def test_a_record_known_only_from_the_store_with_a_notbefore_at_the_calendars_end_is_weighed_not_a_crash() -> None:
    """Found by the model-based suite: a NotBefore clamped to the end of the calendar, in a record the
    leader's documents never listed, crashed every agent's cycle when it was turned back into a date."""

    end = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() + 3600  # "-01:00", clamped as it is
    record = EventRecord(event_id=E, event_type="Terminate", resources=("vm1",), not_before=end,
                         published_by="vm1", published_at=0.0)
    cluster = ClusterView(frozenset({"vm0", "vm1"}), "vm0", True, {E: record}, ConnectionState.CONNECTED)
    empty = parse_document('{"DocumentIncarnation": 1, "Events": []}')
    snapshot = Snapshot(me="vm0", now=1_700_000_000.0, mono=100.0, document=empty,
                        last_document=None, cluster=cluster, seen={E: Sighting(90.0, listed=False)})
    plan = decide(snapshot, LocalState(phase=Phase.SERVING), Policy())
    assert plan.admit == (E,)


def test_the_leader_admits_no_record_on_its_word_alone_while_its_own_documents_may_still_list_it(
    tmp_path: Path,
) -> None:
    """Where every VM sees every event, a record published a moment before the leader's next poll is not
    admitted from the store: the leader's own document, a poll later, says what the record cannot (here a
    User reboot, which the policy never approves early). An admission on the record would hold the budget
    for the whole notice."""
    bench = Bench(tmp_path, Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0,
                                   approval={"User": ApprovalRule.NEVER}))
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(15)  # every VM back in rotation
    bench.group.schedule(E, ["vm1"])
    bench.group.events[E]["EventSource"] = "User"
    bench.vms["vm0"].imds.omit_once = {E}  # the leader's poll came just before the event
    bench.step()
    bench.vms["vm0"].imds.omit_once = {E}  # and its next one too
    bench.run(20)
    assert E in bench.cluster.events
    assert bench.cluster.events[E].admitted is None
