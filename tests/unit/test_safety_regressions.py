"""One regression test per class of safety break listed in ``docs/safety.md`` ("Breaks found and closed").

Real ``Agent`` objects with the real decision code, on the ZooKeeper store over the fake ZooKeeper
(``tests.fakezk_group``), against a small IMDS group
driven by the test, with a fake clock and actions that run inline. Every assertion is about what can be
seen from outside an agent: its probe's answers over time, the POSTs the IMDS group received, the nodes
in the store and the state file on disk. Each test fails on the code before the fix it names.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions.base import ActionContext
from coordinator.actions.probe import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.config import ApprovalRule
from coordinator.decide import PeerSeen, Phase, Policy
from coordinator.dryrun import DryRunStore
from coordinator.errors import ImdsFenced, ImdsUnavailable, StoreUnknownOutcome
from coordinator.imds import ImdsClient
from coordinator.metrics import Metrics
from coordinator.models import Document, format_not_before, parse_document
from coordinator.poller import ReadEachCycle
from coordinator.state import PersistedState, StateFile
from coordinator.store.base import ApprovalResult
from tests.doubles import Clock, InlineExecutor
from tests.fakezk_group import FakeGroup, GroupStore

E = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
E2 = "A626E37F-793E-44E1-89B5-99AE0B96044C"
POLICY = Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0, session_timeout=30.0)
# Events naming a VM without an agent (vmx) drain at once with this one, so that acks exist while
# nobody may approve: the shape of the breaks below.
AT_ONCE = Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0, session_timeout=30.0,
                 unapprovable_at_once=True)


@dataclass
class Group:
    """The IMDS side: events by id (IMDS fields), what each VM is shown, and every POST received."""

    clock: Clock
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    posts: list[tuple[str, tuple[str, ...], float]] = field(default_factory=list)  # (vm, ids, mono)
    incarnation: int = 1

    def schedule(self, eid: str, resources: list[str], *, etype: str = "Reboot", in_s: float | None = 900.0,
                 status: str = "Scheduled", not_before: str | None = None) -> None:
        at = datetime.fromtimestamp(self.clock.wall + in_s, UTC) if in_s is not None else None
        self.events[eid] = {"EventId": eid, "EventType": etype, "EventStatus": status, "Resources": resources,
                            "NotBefore": not_before if not_before is not None else format_not_before(at) if at else "",
                            "EventSource": "Platform"}
        self.incarnation += 1

    def remove(self, eid: str) -> None:
        self.events.pop(eid, None)
        self.incarnation += 1

    def raw(self, omit: Collection[str] = ()) -> str:
        return json.dumps({"DocumentIncarnation": self.incarnation,
                           "Events": [e for k, e in self.events.items() if k not in omit]})

    def approved(self, eid: str) -> list[float]:
        return [at for _, ids, at in self.posts if eid in ids]


class FakeImds:
    """One VM's IMDS: parses the raw body as the real client does, can fail or hide events for a read."""

    def __init__(self, group: Group, vm: str) -> None:
        self.group, self.vm = group, vm
        self.failing = False
        self.omit_once: set[str] = set()

    def get_document(self) -> Document:
        if self.failing:
            raise ImdsUnavailable("IMDS timed out", outcome="timeout")
        omit, self.omit_once = self.omit_once, set()
        return parse_document(self.group.raw(omit))

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        if fence is not None and not fence():
            raise ImdsFenced("fence closed")
        self.group.posts.append((self.vm, tuple(event_ids), self.group.clock.mono))
        for eid in event_ids:
            if eid in self.group.events:
                self.group.events[eid]["EventStatus"] = "Started"
                self.group.events[eid]["NotBefore"] = ""


class StateProbe:
    """A drain action that records what the state file said when the drain began."""

    name = "state-probe"
    always_recover = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[str] = []

    def drain(self, ctx: ActionContext) -> None:
        self.seen.append(self.path.read_text() if self.path.exists() else "<missing>")

    def recover(self, ctx: ActionContext) -> None:
        return None


@dataclass
class Vm:
    name: str
    agent: Agent
    probe: ProbeState
    store: GroupStore
    imds: FakeImds
    state: Path
    history: list[tuple[float, bool]] = field(default_factory=list)  # (mono, probe answers 200)
    running: bool = True

    def rewire(self, *, store: Any = None, imds: Any = None, readings: Any = None, posts: Any = None) -> None:
        """Put another store or IMDS (a double that misbehaves), or another source of readings, under the
        running agent: where its loop reads, and where its executor writes and POSTs. ``posts``: an IMDS
        that only the approval's POST goes to (the readings stay as they are)."""
        if store is not None:
            self.agent._store = self.agent._live._store = store
        if posts is not None:
            self.agent._live._imds = posts
        if imds is not None:
            self.agent._live._imds = imds
            if readings is None:
                readings = ReadEachCycle(imds.get_document, self.agent._clock.monotonic)
        if readings is not None:
            self.agent._readings = self.agent._live._readings = readings


class BenchPeers:
    """The peers' probes as the load balancer would see them now: a VM is in rotation while its agent
    runs, its probe answers 200 and its agent says "serving"; a VM whose agent is down does not answer."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.lagging: set[str] = set()  # VMs the last background round saw serving, just before they died
        self.confirmed = 0
        self.probing: set[str] = set()  # the VMs whose agents asked to probe their peers at least once

    def seen(self) -> dict[str, PeerSeen]:
        found = self.now()
        for name in self.lagging:
            found[name] = PeerSeen(True, self.bench.clock.mono - 0.5, "serving")
        return found

    def now(self) -> dict[str, PeerSeen]:
        found: dict[str, PeerSeen] = {}
        for name, vm in self.bench.vms.items():
            if not vm.running:
                found[name] = PeerSeen(False, self.bench.clock.mono, "no answer: ConnectError", answered=False)
            else:
                phase = vm.agent.phase()
                found[name] = PeerSeen(vm.probe.serving and phase == "serving", self.bench.clock.mono,
                                       f"{200 if vm.probe.serving else 503} {phase}")
        return found

    def confirm(self) -> dict[str, PeerSeen]:
        self.confirmed += 1
        return self.now()

    def follow(self, store: Any, members: Any, me: str, wanted: bool) -> None:
        if wanted:
            self.probing.add(me)


class Bench:
    def __init__(self, tmp_path: Path, policy: Policy = POLICY, *, probe_peers: bool = False) -> None:
        self.tmp = tmp_path
        self.clock = Clock()
        self.group = Group(self.clock)
        self.cluster = FakeGroup(self.clock.now, session_timeout=policy.session_timeout)
        self.policy = policy
        self.vms: dict[str, Vm] = {}
        self.peers = BenchPeers(self) if probe_peers else None

    def add(self, name: str, *, extra: Sequence[Any] = (), dry_run: bool = False,
            readings: Callable[[FakeImds], Any] | None = None, policy: Policy | None = None) -> Vm:
        old = self.vms.get(name)
        store = self.cluster.store(self.clock.now)
        imds = old.imds if old else FakeImds(self.group, name)
        state = self.tmp / f"{name}.json"
        # A dry run's probe is served by no listener (``coordinator.runtime``), and its actions never move it.
        probe = ProbeState(serving=False) if dry_run else ProbeState()
        actions: list[Any] = [ProbeAction(probe), *extra]
        agent = Agent(vm=name, imds=imds, store=store, actions=actions,
                      policy=policy if policy is not None else self.policy,
                      metrics=Metrics(CollectorRegistry()), clock=self.clock,
                      jobs=InlineExecutor(),  # type: ignore[arg-type]
                      state_file=StateFile(state), peers=self.peers,
                      readings=readings(imds) if readings is not None else None,
                      dry_run=dry_run)  # as ``coordinator run --dry-run`` wires it
        vm = Vm(name, agent, probe, store, imds, state, old.history if old else [])
        self.vms[name] = vm
        return vm

    def kill(self, name: str) -> None:
        """The agent's process dies, and its session lives on until the ensemble expires it."""
        self.vms[name].running = False

    def crash(self, name: str) -> None:
        """The agent's process dies: its session ends with it (the ensemble expires it)."""
        vm = self.vms[name]
        vm.running = False
        vm.store.stop()

    def step(self, seconds: float = 1.0) -> None:
        for vm in self.vms.values():
            if vm.running:
                vm.agent.cycle()
            vm.history.append((self.clock.mono, vm.probe.serving and vm.running))
        self.clock.advance(seconds)

    def run(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        end = self.clock.mono + seconds
        while self.clock.mono < end:
            self.step()
            if until is not None and until():
                return

    def drained_since(self, name: str, at: float) -> float | None:
        """How long before ``at`` the VM's probe had been failing without a break (None: serving at ``at``)."""
        since: float | None = None
        for mono, serving in self.vms[name].history:
            if mono > at:
                break
            since = None if serving else (since if since is not None else mono)
        return None if since is None else at - since

    def assert_drained_at_every_post(self, eid: str, vms: Sequence[str]) -> None:
        for at in self.group.approved(eid):
            for name in vms:
                drained = self.drained_since(name, at)
                assert drained is not None and drained >= self.policy.drain_wait, (
                    f"{eid} approved at {at} while {name} was drained for {drained} s")


# --- 1. an acknowledgement outlives the drain it stands for ------------------------------------------

def test_ack_is_withdrawn_before_the_vm_serves_when_resources_shrink(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vm1", "vmx"])  # vmx runs no agent: nobody may approve yet
    bench.run(30)
    assert set(bench.cluster.events[E].acks) == {"vm0", "vm1"}
    bench.group.events[E]["Resources"] = ["vm1", "vmx"]  # vm0 no longer named: it goes back
    bench.run(20)
    assert bench.vms["vm0"].probe.serving
    assert "vm0" not in bench.cluster.events[E].acks
    bench.group.events[E]["Resources"] = ["vm0", "vm1"]  # back, and approvable: vm0 must drain anew
    bench.run(40, until=lambda: bool(bench.group.posts))
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm0", "vm1"])


def test_a_one_read_flap_never_puts_a_drained_vm_back(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(3)  # draining, not acknowledged yet (the drain wait is 10 s): nothing but the document holds it
    assert not bench.vms["vm0"].probe.serving
    bench.vms["vm0"].imds.omit_once = {E}  # the event is missing from one document
    bench.run(10)
    assert all(not serving for _, serving in bench.vms["vm0"].history[1:])


def test_a_vm_whose_ack_may_still_stand_does_not_serve(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    assert "vm0" in bench.cluster.events[E].acks
    bench.vms["vm0"].store.suspend()  # its withdrawal cannot reach ZooKeeper: the ack stands there
    bench.group.remove(E)
    bench.run(20)
    assert "vm0" in bench.cluster.events[E].acks
    assert not any(serving for _, serving in bench.vms["vm0"].history[-20:])
    bench.vms["vm0"].store.resume()
    bench.run(20)
    # Withdrawn (the record may have left the events for the history since: nothing holds it any more).
    assert E not in bench.cluster.events or "vm0" not in bench.cluster.events[E].acks
    assert bench.vms["vm0"].probe.serving


@pytest.mark.parametrize("moved", [False, True], ids=["record-done", "record-moved-to-the-history"])
def test_a_reused_event_id_inherits_no_admission(tmp_path: Path, moved: bool) -> None:
    """Whether its record is still done in the events (reopened) or moved to the history (published anew)."""
    bench = Bench(tmp_path, POLICY if moved else replace(POLICY, archive_after=600.0))
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"])
    bench.run(40, until=lambda: bool(bench.group.approved(E)))
    bench.group.remove(E)  # done
    bench.run(20)
    if moved:
        assert E not in bench.cluster.events and bench.cluster.history[E].done_at is not None
    else:
        assert bench.cluster.events[E].record.done_at is not None
    bench.group.schedule(E2, ["vm1"], in_s=600)  # admitted first: its NotBefore is earlier
    bench.run(3)
    bench.group.schedule(E, ["vm2"], in_s=900)  # the same id again, for another VM
    bench.run(20)
    assert bench.group.approved(E) == [bench.group.approved(E)[0]]  # not approved again meanwhile
    assert bench.vms["vm2"].probe.serving  # not drained: the budget is E2's
    assert bench.cluster.events[E].admitted is None


# --- 2. a restart with failed first reads forgets the state file ------------------------------------

def test_restart_with_imds_and_zookeeper_down_stays_drained(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    assert json.loads(bench.vms["vm0"].state.read_text())["draining_for"] == [E]
    bench.crash("vm0")
    vm0 = bench.add("vm0")
    vm0.imds.failing = True
    vm0.store.partition()
    bench.run(60)
    assert not vm0.probe.serving
    assert json.loads(vm0.state.read_text())["draining_for"] == [E]
    vm0.imds.failing = False  # the event is still there, ZooKeeper still unreachable
    bench.run(60)
    assert not any(serving for _, serving in vm0.history[-120:])


class WithdrawTimesOut:
    """A store whose ack withdrawals time out (outcome unknown), everything else working."""

    def __init__(self, inner: GroupStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def withdraw_ack(self, event_id: str, vm: str) -> Any:
        raise StoreUnknownOutcome("delete timed out")


def test_a_vm_whose_withdrawal_fails_stays_out_while_zookeeper_shows_its_ack(tmp_path: Path) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    vm0 = bench.vms["vm0"]
    vm0.rewire(store=WithdrawTimesOut(vm0.store))
    bench.group.remove(E)
    bench.run(20)
    assert "vm0" in bench.cluster.events[E].acks
    assert not any(serving for _, serving in vm0.history[-20:])
    vm0.rewire(store=vm0.store)
    bench.run(20)
    assert vm0.probe.serving


class FailingDrain:
    name = "failing"
    always_recover = False

    def drain(self, ctx: ActionContext) -> None:
        raise RuntimeError("checkpoint failed")

    def recover(self, ctx: ActionContext) -> None:
        return None


class FailsFirst(FailingDrain):
    """A drain hook that fails until an operator fixes it (after ``failures`` attempts)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0

    def drain(self, ctx: ActionContext) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise RuntimeError("checkpoint failed")


def test_a_failed_drain_is_tried_again_and_the_event_starts_early_once_it_succeeds(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    hook = FailsFirst(failures=2)
    bench.add("vm0")
    vm1 = bench.add("vm1", extra=[hook])
    bench.add("vm2")
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(20)
    assert hook.attempts == 1 and "vm1" not in bench.cluster.events[E].acks
    assert not bench.group.approved(E) and not vm1.probe.serving
    bench.run(120, until=lambda: bool(bench.group.approved(E)))
    assert hook.attempts == 3  # tried again every POLICY.drain_retry seconds until it succeeded
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm0", "vm1"])
    out = next(i for i, (_, serving) in enumerate(vm1.history) if not serving)
    assert not any(serving for _, serving in vm1.history[out:])  # out of rotation from its first attempt on


def test_a_failed_drain_says_so_once_and_when_it_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """One ERROR line a failed attempt, saying when the next one comes; not a verdict that the event will
    start at NotBefore, which the next attempt may prevent."""
    caplog.set_level(logging.INFO)
    bench = Bench(tmp_path)
    hook = FailsFirst(failures=2)
    bench.add("vm0")
    bench.add("vm1", extra=[hook])
    bench.add("vm2")
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(120, until=lambda: bool(bench.group.approved(E)))
    assert hook.attempts == 3 and bench.group.approved(E)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "coordinator.agent"]
    assert len(errors) == hook.failures == 2, errors
    for line in errors:
        assert line.startswith("drain failed (vm=vm1): ") and "checkpoint failed" in line, line
        assert "tried again in 30 s" in line or "tried again in 29 s" in line, line
        assert "will start at NotBefore" not in line


def test_unreadable_state_file_holds_every_event_naming_the_vm(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    bench.add("vm0")
    bench.add("vm1", extra=[FailingDrain()])  # never acknowledges: the event stays Scheduled
    bench.add("vm2")
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(20)
    assert bench.cluster.events[E].admitted is not None and not bench.vms["vm0"].probe.serving
    bench.crash("vm0")
    bench.vms["vm0"].state.write_text("{not json")
    vm0 = bench.add("vm0")
    vm0.store.partition()  # and the restarted agent cannot see the admission
    bench.run(60)
    assert not any(serving for _, serving in vm0.history[-60:])
    # Held by the event its first document names (a drain by hand it cannot rule out holds it too).
    assert E.upper() in vm0.agent.status()["drained_for"]
    vm0.store.heal()
    bench.group.remove(E)
    bench.run(30)
    assert vm0.probe.serving  # put back once the event is gone


# --- 3. the budget forgets a VM that has not come back ----------------------------------------------

def test_budget_counts_a_rebooting_vm_until_it_is_back(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], status="Started", in_s=None)
    bench.run(5)
    bench.crash("vm0")  # rebooting
    bench.group.remove(E)
    bench.group.schedule(E2, ["vm1"])
    bench.run(60)
    assert bench.cluster.events[E2].admitted is None
    assert bench.vms["vm1"].probe.serving
    bench.add("vm0")  # back: recovers, and the budget frees once the load balancer routes to it again
    bench.run(60, until=lambda: bench.cluster.events[E2].admitted is not None)
    assert bench.cluster.events[E2].admitted is not None
    back = next(mono for mono, serving in reversed(bench.vms["vm0"].history) if not serving)
    assert bench.cluster.events[E2].admitted >= bench.clock.wall - (bench.clock.mono - back) + POLICY.back_after - 1


# --- 4. absent_peer_grace_seconds and a VM cut off but serving --------------------------------------

def test_a_vm_cut_off_from_zookeeper_drains_itself_before_its_peers_stop_waiting(tmp_path: Path) -> None:
    policy = Policy(drain_wait=10.0, return_wait=5.0, latest_start=120.0, absent_grace=60.0, session_timeout=30.0)
    bench = Bench(tmp_path, policy)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(3)
    bench.vms["vm1"].store.partition()  # cut off, still serving its clients
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(120, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm0", "vm1"])


# --- 5. one NotBefore stalls every agent -------------------------------------------------------------

@pytest.mark.parametrize("not_before", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "soon", "7"])
def test_odd_not_before_neither_crashes_a_cycle_nor_hides_the_event(tmp_path: Path, not_before: str) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], not_before=not_before)
    bench.run(30)  # cycle() raises nothing
    assert bench.vms["vm1"].probe.serving
    if not_before[0].isdigit() and "-" in not_before:
        # A time at the ends of the calendar is a time: coordinated as any other, drained before approved.
        assert bench.group.approved(E)
        bench.assert_drained_at_every_post(E, ["vm0"])
    else:
        assert not bench.vms["vm0"].probe.serving  # no readable time: drained at once
        assert not bench.group.posts  # and never approved early


# --- 6. drains the budget cannot see -----------------------------------------------------------------

def test_a_drain_for_an_event_without_not_before_counts_in_the_budget(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], in_s=None)  # Scheduled, but no NotBefore: vm0 drains at once
    bench.run(10)
    bench.group.schedule(E2, ["vm1"])
    bench.run(60)
    assert not bench.vms["vm0"].probe.serving
    assert bench.vms["vm1"].probe.serving  # never the last serving VM
    assert not bench.group.approved(E2)


def test_keep_one_serving_holds_without_a_budget(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Policy(drain_wait=10.0, return_wait=5.0, max_events=None, keep_one_serving=True))
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"])
    bench.group.schedule(E2, ["vm1"])
    bench.run(60)
    assert any(bench.vms[n].probe.serving for n in ("vm0", "vm1"))
    assert len([eid for eid in (E, E2) if bench.group.approved(eid)]) == 1


def test_no_approval_that_would_leave_no_vm_in_rotation_even_after_admission(tmp_path: Path) -> None:
    # Found by the chaos oracle: admitted while every VM served, then the only other VM went out of
    # rotation (its agent restarted) before the acks came in; approving then left nobody serving.
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(10)  # every VM back in rotation after its start
    bench.group.schedule(E, ["vm1", "vm2"])
    bench.run(3)
    assert bench.cluster.events[E].admitted is not None
    bench.crash("vm0")
    vm0 = bench.add("vm0")
    vm0.imds.failing = True  # restarted, not yet cleared: out of rotation
    bench.run(30)
    assert set(bench.cluster.events[E].acks) == {"vm1", "vm2"}
    assert not bench.group.posts
    vm0.imds.failing = False
    bench.run(30, until=lambda: bool(bench.group.posts))
    for at in bench.group.approved(E):
        assert bench.drained_since("vm0", at) is None  # vm0 was back before the approval


def _admitted_with_the_only_other_agent_killed(tmp_path: Path) -> Bench:
    """Three VMs whose agents probe their peers; E on [vm1, vm2] admitted; then vm0's agent killed, its
    session left to live on."""
    bench = Bench(tmp_path, replace(POLICY, peer_fresh=3.0), probe_peers=True)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(10)
    bench.group.schedule(E, ["vm1", "vm2"])
    bench.run(3)
    assert bench.cluster.events[E].admitted is not None
    bench.kill("vm0")
    return bench


def test_a_peer_whose_agent_just_died_does_not_count_as_serving(tmp_path: Path) -> None:
    # Found by the chaos oracle: the only VM outside the event had its agent killed; its ZooKeeper
    # session lived on (no /out node, still a member), so the approver counted it as serving and
    # approved, while the load balancer had already taken it out (its probe died with the agent).
    bench = _admitted_with_the_only_other_agent_killed(tmp_path)
    bench.run(25)  # within the session timeout: vm0 is still a member
    assert "vm0" in bench.cluster.members
    assert set(bench.cluster.events[E].acks) == {"vm1", "vm2"}
    assert not bench.group.posts
    waits = bench.vms["vm1"].agent.status()["events"][0]["waiting_for"]
    assert any("not confirmed in rotation: vm0: no answer" in reason for reason in waits), waits
    # As a value: the budget at approval, held by a peer whose probe does not answer (it does not clear by itself).
    [held] = bench.vms["vm1"].agent.status()["events"][0]["blockers"]
    assert (held["kind"], held["at_approval"], held["lasting"]) == ("peer_not_serving", True, True)
    peers = bench.vms["vm1"].agent.status()["peers"]
    assert peers["vm0"]["in_rotation"] is False and peers["vm2"]["seen"] == "503 drained"
    bench.crash("vm0")
    bench.add("vm0")
    bench.run(40, until=lambda: bool(bench.group.posts))
    assert bench.group.approved(E)
    for at in bench.group.approved(E):
        assert bench.drained_since("vm0", at) is None  # vm0 was back before the approval
        assert bench.vms["vm0"].agent.phase() == "serving"


def test_an_approval_asks_the_peers_again_instead_of_trusting_the_last_round(tmp_path: Path) -> None:
    # Found by the chaos oracle after the fix above: the leader was killed just after the approver's last
    # probing round; the approver decided on that round's answer, still fresh, and approved while the
    # load balancer had taken the leader out.
    bench = _admitted_with_the_only_other_agent_killed(tmp_path)
    assert bench.peers is not None
    bench.peers.lagging = {"vm0"}  # every background round still shows vm0 serving a moment ago
    bench.run(25)
    assert set(bench.cluster.events[E].acks) == {"vm1", "vm2"}
    assert bench.peers.confirmed > 0  # the approver was about to approve, and asked again
    assert not bench.group.posts


# --- 7. the state is saved only after the drain started ----------------------------------------------

def test_the_drain_state_is_on_disk_before_the_first_drain_action_runs(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    recorder = StateProbe(tmp_path / "vm0.json")
    bench.add("vm0", extra=[recorder])
    bench.add("vm1")
    bench.group.schedule(E, ["vm0"], status="Started", in_s=None)
    bench.run(3)
    assert recorder.seen and json.loads(recorder.seen[0]) == {**json.loads(recorder.seen[0]), "phase": "draining",
                                                              "draining_for": [E]}


class RecoverHook:
    """A recover hook that counts its runs (it does not always recover: a restart found serving skips it)."""

    name = "hook"
    always_recover = False

    def __init__(self) -> None:
        self.recovered = 0

    def drain(self, ctx: ActionContext) -> None:
        return None

    def recover(self, ctx: ActionContext) -> None:
        self.recovered += 1


def test_a_restart_that_finds_the_vm_serving_runs_only_the_recovers_that_always_run(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    hook = RecoverHook()
    bench.add("vm0", extra=[hook])
    bench.add("vm1")
    bench.run(3)
    assert bench.vms["vm0"].probe.serving and hook.recovered == 1  # a first start, no state file: everything
    bench.crash("vm0")
    hook = RecoverHook()
    bench.add("vm0", extra=[hook])  # the state file says serving
    bench.run(3)
    assert bench.vms["vm0"].probe.serving and hook.recovered == 0  # the probe's recover only
    bench.group.schedule(E, ["vm0"], status="Started", in_s=None)
    bench.run(3)
    bench.group.remove(E)
    bench.run(10, until=lambda: hook.recovered > 0)
    assert hook.recovered == 1  # back from a drain: every recover


# --- 8. a stale POST after a pause -------------------------------------------------------------------

class PausesAfterTheCheck:
    """A store whose final check succeeds, after which the process is paused past its session."""

    def __init__(self, inner: GroupStore, clock: Clock, pause: float) -> None:
        self.inner, self.clock, self.pause = inner, clock, pause

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def approve(self, *args: Any, **kwargs: Any) -> ApprovalResult:
        result = self.inner.approve(*args, **kwargs)
        self.clock.advance(self.pause)
        return result


def test_no_post_once_the_session_may_have_lapsed(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    vm0 = bench.add("vm0")
    bench.add("vm1")
    vm0.rewire(store=PausesAfterTheCheck(vm0.store, bench.clock, pause=POLICY.session_timeout))
    bench.group.schedule(E, ["vm0"])
    bench.run(40)
    assert bench.group.posts == []
    vm0.rewire(store=vm0.store)
    bench.run(5)
    assert bench.group.approved(E)


def test_imds_client_sends_no_retry_of_an_approval_once_its_fence_closed() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(503)

    open_ = [True]
    client = ImdsClient(base_url="http://imds.test", transport=httpx.MockTransport(handler), sleep=lambda _: None,
                        max_attempts=3)
    with pytest.raises(ImdsFenced):
        def fence() -> bool:
            answer = open_[0]
            open_[0] = False  # closes after the first attempt (a pause, or a lapse, meanwhile)
            return answer
        client.approve([E], fence=fence)
    assert len(sent) == 1


# --- 9. hand-off at recovery -------------------------------------------------------------------------

def test_a_recovered_vm_counts_as_serving_only_after_the_return_wait(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Policy(drain_wait=10.0, return_wait=20.0, gone_after=3.0))
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], status="Started", in_s=None)
    bench.run(15)
    bench.group.remove(E)
    bench.group.schedule(E2, ["vm1"])
    bench.run(60, until=lambda: bench.vms["vm0"].probe.serving)
    back = bench.clock.mono
    bench.run(60, until=lambda: bench.cluster.events[E2].admitted is not None)
    assert bench.vms["vm0"].agent.status()["phase"] == Phase.SERVING.value
    assert bench.clock.mono - back >= 20.0 - 1.0  # admitted only after vm0's return wait
    assert "vm0" not in bench.cluster.out


# --- 10. events that can never be approved early --------------------------------------------------

def test_an_unapprovable_event_drains_just_in_time_and_holds_no_budget(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"], in_s=600)  # vmx runs no agent: it can never be approved early
    bench.group.schedule(E2, ["vm1"], in_s=900)
    bench.run(40, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2)  # not held behind E
    assert bench.vms["vm0"].probe.serving  # E drains only latest_start before its NotBefore
    assert bench.cluster.events[E].admitted is None


def test_lead_time_admits_no_far_future_event(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Policy(drain_wait=10.0, return_wait=5.0, lead_time=3600.0, latest_start=120.0))
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], in_s=3 * 86400)
    bench.group.schedule(E2, ["vm1"], in_s=1800)
    bench.run(40, until=lambda: bool(bench.group.approved(E2)))
    assert bench.group.approved(E2)
    assert bench.cluster.events[E].admitted is None


def test_rule_never_drains_just_in_time(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Policy(drain_wait=10.0, approval={"Reboot": ApprovalRule.NEVER}))
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"], in_s=600)
    bench.run(30)
    assert bench.vms["vm0"].probe.serving
    bench.clock.advance(600 - 120 - 30 + 1)
    bench.run(5)
    assert not bench.vms["vm0"].probe.serving
    assert not bench.group.posts


# --- 11. dry run writes nothing and moves nobody -----------------------------------------------------

def test_dry_run_writes_no_state_and_no_node_and_moves_no_probe(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    bench.add("vm1")
    StateFile(tmp_path / "vm0.json").save(PersistedState("drained", frozenset({E}), 0.0))
    before = (tmp_path / "vm0.json").read_text()
    vm0 = bench.add("vm0", dry_run=True)
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(30)
    bench.group.remove(E)
    bench.run(30)  # a real agent would recover now: the dry run only says so
    assert (tmp_path / "vm0.json").read_text() == before
    assert "vm0" not in bench.cluster.out and "vm0" not in bench.cluster.members
    assert E not in bench.cluster.events or "vm0" not in bench.cluster.events[E].acks
    assert not bench.group.posts
    assert not vm0.probe.serving  # its actions only log: the probe (served by no listener) never moved


def test_a_dry_run_decides_from_the_group_as_it_is_and_says_what_holds_its_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The dry run reads what a real agent reads: the members as they are (not counting itself: it never
    joins), the operator's pause and the ``/out`` marks, and says what holds each of its events. Before, its
    view was rebuilt without the pause and the marks and with itself as a member: it said it would approve
    a paused event, and named itself approver on a VM whose agent is stopped."""
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    bench = Bench(tmp_path, AT_ONCE)
    bench.add("vm1")
    bench.add("vm2")
    bench.add("vm0", dry_run=True)  # vm0 runs no agent of its own
    bench.group.schedule(E, ["vm0"], in_s=100)
    bench.run(30)
    said = [r.getMessage() for r in caplog.records if r.name == "coordinator.dryrun"]
    assert f"dry-run: event {E} held: vm0 runs no agent" in said
    assert said.count(f"dry-run: event {E} held: vm0 runs no agent") == 1  # once, not every cycle
    assert not any("would approve" in line for line in said)
    # Beside a real agent, in a paused group with a VM out of rotation (vm3, starting): the view it decides
    # from is the one the real agent reads.
    bench.cluster.pause("change freeze", "operator", bench.clock.now())
    bench.add("vm3")
    bench.run(5)
    inner = bench.cluster.store(bench.clock.now)
    inner.start()
    dry = DryRunStore(bench.cluster.store(bench.clock.now))
    dry.start()
    seen, real = dry.read_view("vm3"), inner.read_view("vm3")
    assert seen.paused == real.paused and seen.paused is not None
    assert seen.out == real.out and "vm3" in seen.out
    assert seen.members == real.members and "vm0" not in seen.members
    assert seen.leader == real.leader and not seen.i_am_leader


# --- 17. hostile documents -------------------------------------------------------------------------------

def test_an_event_id_listed_twice_is_never_approved_early(tmp_path: Path) -> None:
    """Two entries with one EventId (in two spellings), naming different VMs: approving the id releases
    both, so the drain of the first entry's VMs must not be enough. Before the fix the second entry's
    blockers were overwritten by the first's approval."""
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1"):
        bench.add(name)
    bench.group.schedule(E, ["vm0"])
    twin = {**bench.group.events[E], "EventId": E.lower(), "EventType": "Hibernate", "Resources": ["vm1"]}
    bench.group.raw = lambda omit=(): json.dumps(  # type: ignore[method-assign]
        {"DocumentIncarnation": 2, "Events": [bench.group.events[E], twin]})
    bench.run(60)
    assert not bench.group.posts
    assert bench.vms["vm1"].probe.serving  # its entry has not made it drain yet: nothing may be approved
    blocked = bench.vms["vm0"].agent.status()
    assert "listed 2 times" in json.dumps(blocked)


def test_only_an_events_approver_and_the_leader_probe_their_peers(tmp_path: Path) -> None:
    """Every VM an event names probing every peer costs a group of N agents (named + 1) x N probes a
    second; the approver (its first live VM) and the leader are the ones whose decisions weigh them."""
    bench = Bench(tmp_path, replace(POLICY, peer_fresh=3.0), probe_peers=True)
    for name in ("vm0", "vm1", "vm2", "vm3", "vm4"):
        bench.add(name)
    bench.run(3)
    leader = next(name for name, vm in bench.vms.items() if vm.store.read_view(name).i_am_leader)
    bench.group.schedule(E, ["vm1", "vm2", "vm3"])
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.assert_drained_at_every_post(E, ["vm1", "vm2", "vm3"])
    assert bench.peers is not None
    assert bench.peers.probing == {"vm1", leader}
    assert bench.peers.confirmed >= 1  # the approver probed every peer again right before its POST


# --- a VM approved for without its ack (absent past the grace) is counted until it is back -------------------

def test_a_vm_released_without_its_ack_counts_in_the_budget_until_it_is_back(tmp_path: Path) -> None:
    """Found by the model-based suite. vm1 is cut off from ZooKeeper past ``absent_peer_grace_seconds``: its
    event is approved without its ack (it drained itself), so it never wrote its own ``/out`` node. Its
    agent then goes down (the maintenance reboots it) and the event ends: nothing in ZooKeeper said vm1
    was out, and the leader admitted the next event while vm1 was still down. The approver now writes
    vm1's ``/out`` node before it approves without it; vm1 clears it once back in rotation."""
    policy = Policy(drain_wait=10.0, return_wait=5.0, latest_start=120.0, absent_grace=60.0, session_timeout=30.0)
    bench = Bench(tmp_path, policy)
    for name in ("vm0", "vm1", "vm2", "vm3"):
        bench.add(name)
    bench.run(15)
    bench.vms["vm1"].store.partition()
    bench.group.schedule(E, ["vm0", "vm1"])
    bench.run(240, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E) and "vm1" not in bench.cluster.events[E].acks
    assert E in bench.cluster.out["vm1"].events
    bench.group.events[E]["EventStatus"] = "Started"
    bench.crash("vm1")  # rebooted by the maintenance
    bench.run(5)
    bench.group.remove(E)
    bench.run(20)
    assert bench.cluster.events[E].record.done_at is not None
    bench.group.schedule(E2, ["vm2"], etype="Freeze")
    bench.run(60)
    assert bench.cluster.events[E2].admitted is None, "vm1 is still out for E: the budget of one event is full"
    bench.add("vm1")  # back: it serves again after its return wait and deletes its /out node
    bench.run(60, until=lambda: bench.cluster.events[E2].admitted is not None)
    assert bench.cluster.events[E2].admitted is not None
    assert bench.vms["vm1"].probe.serving and "vm1" not in bench.cluster.out
