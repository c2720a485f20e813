"""Model-based safety suite: real agents, a model of IMDS, and invariants checked after every step.

What runs
---------
A ``hypothesis.stateful.RuleBasedStateMachine`` drives three or four REAL ``coordinator.agent.Agent``
objects (the real decision code, state file, ``ProbeAction`` and ``ProbeState``) on the real
``ZooKeeperStore``, one per agent process, each with its kazoo session, over one in-process fake ZooKeeper
(``tests.fakezk``, the group's tree read by ``tests.fakezk_group.FakeGroup``), against
``tests.model.imds_model.ImdsGroup``, a model of the Scheduled Events service of the group written here.
Each VM has its own ``FakeImds`` (the agent's ``Imds`` protocol; documents go through the real
``parse_document``, approvals are recorded by the model), its own wall clock (true time plus a per-VM
skew; the monotonic clock is shared), a controllable executor and a recording action after the probe
(``tests.model.harness``). vm0-vm2 always run agents; vm3 runs one, an observe-only one (``Agent(dry_run=True)``,
as ``--dry-run`` wires it: the dry run's executor and read-only store; with no health probe, the load
balancer sees it as a VM that answers nothing) or none; vm9 never runs one. The policy is the
default one (budget of one event, keep one serving) with a drain wait of 10 s to keep examples short. Drawn per
example: the approver mode; ``absent_peer_grace_seconds`` (none, 60 s or 120 s); the session timeout the ensemble
grants (the 30 s asked for, or 20, 40 or 60 s, which agents read through ``Store.granted_session_timeout``)
and when, within a tick of it, the ensemble expires a session it no longer hears from; per-VM delivery
(IMDS shows each VM only the events naming it, as the simulator's ``deliver_to_named_only``); a group of two
delivery units (vm0, vm1 | vm2, vm3, vm9: each VM shown the events of its own unit, an event's unit that of
the first VM it names); maintenance windows (the first 40 minutes of every hour).

Model of the group (ground truth): an approval POST of a Scheduled event starts it at once (an approved
Terminate waits for the other Terminates still Scheduled); a Scheduled event starts by itself at its
NotBefore (at the drawn notice when its NotBefore is odd); a Started event leaves the group once its
impact is over. An event names the VMs of ``Resources`` as served (none while the field is left out).
Every change raises the incarnation; each VM may be served an offset of it. Agents read IMDS through a
``Readings`` object (the poller): answered at once, or late (``slow_imds``).

Rules (those acting on an agent do nothing on a VM without a running one; IMDS faults queued for a VM
wait for its next agent)
----------------------------------------------------------------------------------------------------
* events: ``schedule`` (every type, an unknown one too, Platform/User/no source; Resources mostly agent
  VMs, sometimes vm9, ``VM2`` or ``bad/name``), ``schedule_odd`` (NotBefore at the calendar's limits,
  epoch 0, a wrong weekday, garbage or missing; Resources missing or empty; optional fields missing),
  ``hardware_failure`` (appears Started), ``change_resources``, ``cancel``, ``reuse_event_id`` (an ended
  event's id, whether or not the leader saw it gone), ``reuse_approved_event_id`` (the id of an event
  approved early, once its record is marked done, for the same VMs: see liveness);
* IMDS faults: ``flap`` (an event left out of one read of one VM), ``incarnation`` (reset, skip),
  ``read_faults`` (ImdsUnavailable, ImdsBadRequest, MalformedDocument, a body the parser refuses),
  ``post_fault`` (lost, refused, applied with the answer lost), ``post_retry`` (the next POST loses 1 to 3
  attempts and is retried; between attempts an operator pauses approvals, or the client backs off and a
  maintenance window may close), ``slow_imds`` (each answer arrives at the agent's next poll, up to 5 s
  after its request, showing IMDS as it was when the request was sent, or when it was answered; an
  answer later than that is the client's timeout);
* time: ``advance`` (1 s to 1 h, nobody cycles), ``advance_to_next_change`` (to the next NotBefore or end
  of impact), ``to_window_edge`` (to just before a maintenance window ends);
* operator: ``operator_pause`` (``coordinator pause`` / ``resume``);
* agents: ``clock_ticks`` (5 s pass, every agent cycles), ``calm_minute`` (12 of them), ``cycle`` (one
  agent), ``cycle_all`` (all, in a drawn order), ``operate`` (all, every 5 s, for a while); ``restart``,
  ``stop`` (back after a while, or by ``start``; the leader times its absence meanwhile), ``start``: state
  file kept, deleted or corrupted, first IMDS reads failing, store cut off at first (a first session
  suspended at once, or no server reachable at all: an agent that never connects, back after ``stop``
  too); ``executor_mode`` (jobs done right after the cycle or at
  submission), ``hold_jobs`` (slow jobs: a job starts, so a drain fails the probe at once, then waits in
  the recording action for some cycles; the jobs behind it wait too) and ``release_jobs``;
  ``action_failures``;
* composite: ``reboot_cut_off`` (a VM's agent down while the others run, back unable to reach any
  ZooKeeper server, then maintenance for it and a peer), ``ack_outlives_cut_off`` (a pause holds an event while
  a VM acknowledges it; the VM is cut off with its session alive, the event names it no more for a while,
  then names it again and the pause is lifted);
* store: ``partition`` (suspended and back to the same session, or cut off while the ensemble expires
  the session; as in ZooKeeper, a session suspended for the timeout the ensemble granted, plus up to a
  tick, of the model's time expires: the agent is only promised it has lapsed after
  ``session_lapses_after``),
  ``heal``, ``expire`` (session loss), ``expire_leader`` (leader change),
  ``arm_store_fault`` (expire or suspend the session inside the agent's next cycle: after it read the
  view, before or after the store's last check of an approval; a session can only lapse after that
  check once the ensemble has heard nothing for the granted timeout, so the process is first paused that
  long, as in the assumptions of ``docs/safety.md``);
* liveness: ``settle`` heals one VM (its IMDS feed, executor and actions, not its store) and, when no
  event names it and its documents parse, requires it to answer 200 within 30 cycles over 60 s (twice
  ``session_lapses_after`` when that is longer); ``reuse_approved_event_id`` requires a reused id that
  is approvable early in a calm group to be approved again before its NotBefore (not checked when IMDS
  shows each VM only its own events: early approval is known not to work there yet); ``quiesce`` heals
  every fault and requires every record whose event has left the group to be closed within 30 s, whoever
  leads (docs/safety.md L2; where IMDS shows each VM only its own events, only records naming the leader).

Invariants (checked after every step, from the model's ground truth and what is observable from outside
the agents: each VM's probe, the state of its drain actions, its executor's jobs, the store's nodes and
sessions, the POSTs). They are those of ``docs/safety.md``, no stronger.
--------------------------------------------------------------------------------------------------------
* S1: when a POST releases a Scheduled event, the event is of a known type and names at least one VM,
  only valid names, and only VMs that run (or ran) a real agent; each of them has been out of rotation
  (probe failing, or its agent down) for at least the drain wait and has its drain actions done (but a
  VM without a member node, with ``absent_peer_grace_seconds``, is the documented exception: out of
  rotation, its drain actions done unless its agent is down or its last drain failed; an agent running
  cut off from the store must have drained itself, provided the model ran a cycle of it between the
  time that rule makes it drain and a drain wait before the release: the rule relies on a loop that
  runs every second, and the model may leave an agent idle for minutes). A dry-run agent never POSTs.
* S2: a VM does not answer 200 while an event naming it is present in the group, once it was out of
  rotation at a moment when that event
  - was Started and its agent had been served it so, and no recovery submitted before that read is
    still running or queued (until then the VM is not drained for the event: the drain queued behind a
    recovery runs after it, and the recovery may answer 200 in between);
  - had been released early (before no restart that lost the state file);
  - or held the VM's acknowledgement, for as long as that acknowledgement stands (the session that made
    it lives) or the event is released: an ack that lapsed with its session before anybody approved on
    it holds nothing any more, and a later approval made on it makes the event released.
  And a VM never answers 200 while an ack of it stands on a present event that names it, whatever its
  own documents show (an approver may release the event on that ack at any moment).
  A flapped read does not make an event gone. A restart that deletes or corrupts the state file drops
  what earlier agents of the VM were shown: the new agent is held to what it is shown itself (the
  document promises no more for a missing or unreadable file). Liveness: ``settle``.
* S3: a POST comes from an agent whose store connection is CONNECTED, under the session its cycle read
  the view with, and whose session owns its member node or the leader node; and no attempt of it (retries
  included) is sent once an operator's pause exists, or while the VM's clock is outside the maintenance
  windows (the fence).
* S4 (budget of one event, keep one serving): an event released early was admitted by the leader (this
  instance of it, or, for an EventId back before the leader saw it gone, the record it inherits); when it
  is admitted, and when it is released, some live VM outside it is not in maintenance; and when it is
  released, no other early-released event (but one of the same Terminate batch) still has a VM that has
  not answered 200 since, unless that VM's agent has been gone for ``policy.recovery_grace``.

What this suite found is kept as deterministic regressions in ``tests/model/test_found_by_model.py``.
* S5: ``Agent.cycle()`` never raises, whatever the document holds.

Running
-------
``pytest tests/model`` (marker ``model``) runs ``MODEL_EXAMPLES`` examples (default 120) of up to
``MODEL_STEPS`` steps (default 80), derandomized: the same steps on every run, without shrinking, so
that a failure is reported within the run's time (the whole failing sequence is printed). Longer or
other runs::

    MODEL_EXAMPLES=2000 MODEL_STEPS=150 pytest tests/model
    MODEL_SEED=12345 pytest tests/model                 # random exploration from that seed
    MODEL_SHRINK=1 pytest tests/model                   # shrink a failure (this can take minutes)
    MODEL_SKIP=schedule_odd,flap pytest tests/model     # leave rules out to look past a known break
    MODEL_LOG_LEVEL=20 pytest tests/model --log-file=model.log   # the agents' own logs, for reading a failure

A failure prints the step sequence (the shortest one found with ``MODEL_SHRINK=1``), as calls on
``CoordinatorModel``, with the violation. The derandomized run draws its steps from a digest of
``CoordinatorModel``'s source: any edit of the class draws other sequences, which may find what the last
ones did not (so run a few ``MODEL_SEED``s after changing it). A ``MODEL_SEED`` draws the same steps
whatever the source, which is how a failure is replayed on the code before a change.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from prometheus_client import CollectorRegistry

from coordinator.actions import Action, ProbeAction
from coordinator.agent import Agent
from coordinator.config import ApproverMode
from coordinator.decide import Policy, session_lapses_after
from coordinator.delivery import Delivery, DeliveryMode
from coordinator.errors import InvalidName
from coordinator.executor import JobExecutor
from coordinator.maintenance_windows import Window, in_windows
from coordinator.metrics import Metrics
from coordinator.models import parse_document
from coordinator.names import normalize_event_id
from coordinator.state import StateFile
from coordinator.store.base import BY_HAND, ConnectionState, EventRecord
from tests.fakezk_group import FakeGroup
from tests.model.harness import (
    STORE_FAULT_POINTS,
    ModelExecutor,
    ModelReadings,
    ModelStore,
    ModelTime,
    RecordingAction,
    VmClock,
    VmTruth,
    WatchedProbe,
)
from tests.model.imds_model import (
    KNOWN_TYPES,
    READ_FAULTS,
    STARTED,
    FakeImds,
    ImdsGroup,
    ModelEvent,
    event_id_for,
    iso_not_before,
    rfc_not_before,
)

pytestmark = pytest.mark.model

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "120"))
STEPS = int(os.environ.get("MODEL_STEPS", "80"))
SEED = os.environ.get("MODEL_SEED")
SHRINK = os.environ.get("MODEL_SHRINK", "0") not in ("", "0")
SKIP = os.environ.get("MODEL_SKIP", "")
RULE_MARKER = "hypothesis_stateful_rule"

VMS = ("vm0", "vm1", "vm2", "vm3")
NAMES_IN_RESOURCES = ("vm0", "vm1", "vm2", "vm3", "VM2", "vm9", "bad/name")
EVENT_TYPES = (*KNOWN_TYPES, "Unknown")
SKEWS = (0.0, 0.0, 3.0, -4.0, 30.0, -30.0)
START = 1_700_000_000.0
SETTLE_CYCLES = 30  # the bound of the liveness check: 30 cycles over 60 s, twice the default ZooKeeper
SETTLE_STEP = 2.0  # session timeout (an agent cut off from the store may wait for its acks to lapse)
DRAIN_WAIT = 10.0  # probe interval x threshold + grace of a fast load balancer: keeps examples short
# Maintenance windows, when an example has them: the first 40 minutes of every hour (UTC), so that a long
# example crosses several window ends. START (22:13:20 UTC) lies in one.
WINDOWS = tuple(Window(days=frozenset(range(7)), start=time(hour, 0), end=time(hour, 40), zone=UTC)
                for hour in range(24))
WINDOW_MINUTES = 40
REUSE_NOTICE = 300  # NotBefore of a reused EventId, from its reuse
# The bound of the L2 check (docs/safety.md): a record whose event is gone is closed within gone_after (two
# fresh documents) plus a cycle of the leader; ticks of 5 s in which every agent cycles once, with room for a
# leader to be elected again after its session came back.
QUIESCE_TICKS = 6

ODD_NOT_BEFORE: dict[str, str | None] = {
    "calendar-max": "9999-12-31T23:59:59-01:00",
    "calendar-min": "0001-01-01T00:00:00+01:00",
    "year-9999": "Fri, 31 Dec 9999 23:59:59 GMT",
    "epoch-zero": "Thu, 01 Jan 1970 00:00:00 GMT",
    "wrong-weekday": "Mon, 15 Nov 2023 00:00:00 GMT",
    "garbage": "next tuesday",
    "missing": None,
}
ODD_SHAPES = ("as-is", "no-resources", "empty-resources", "bare")

vm_names = st.sampled_from(VMS)
_plain_resources = st.lists(st.sampled_from(VMS), min_size=1, max_size=3, unique=True)
_odd_resources = st.lists(st.sampled_from(NAMES_IN_RESOURCES), min_size=1, max_size=4, unique=True)
resources_lists = st.one_of(_plain_resources, _plain_resources, _plain_resources, _odd_resources)
indexes = st.integers(min_value=0, max_value=9)


@dataclass
class VmSlot:
    vm: str
    clock: VmClock
    truth: VmTruth
    state_path: Path
    dry_run: bool = False
    configured: bool = False  # an agent runs on this VM in this example (at times)
    exec_mode: str = "deferred"
    hold_cycles: int = 0  # jobs are held for so many more cycles of this agent
    partition_cycles: int = 0  # the store connection comes back after so many more cycles
    returns_cut_off: bool = False  # started again after ``stop``, it cannot reach the store at first
    slow: str = ""  # how its IMDS answers (``ModelReadings.slow``): "" at once, "sent"/"answered" late
    cycled: list[float] = field(default_factory=list)  # monotonic times of its agent's recent cycles
    agent: Agent | None = None
    store: ModelStore | None = None
    imds: FakeImds | None = None
    readings: ModelReadings | None = None
    probe: WatchedProbe | None = None
    executor: ModelExecutor | None = None
    generation: int = 0  # agent processes started so far
    out_since: float | None = START  # None while the probe answers 200
    serve_epoch: int = 0  # counts the times the VM went back to answering 200
    back_at: float | None = None  # a stopped agent is started again at this time
    down_since: float | None = None  # its agent process has been stopped since then
    absent_since: float | None = None  # no member node of it since then (its agent down or cut off)
    # Events its agents were served Started, naming it: serial -> stamp of the first such read.
    seen_started: dict[int, int] = field(default_factory=dict)
    # Events released early before a restart lost the state file: the new agent cannot know of that.
    forgotten_early: set[int] = field(default_factory=set)

    @property
    def serving(self) -> bool:
        return self.agent is not None and self.probe is not None and self.probe.serving

    @property
    def had_agent(self) -> bool:
        return self.generation > 0 and not self.dry_run


@dataclass
class EarlyRelease:
    event: ModelEvent
    at: float
    epochs: dict[str, int]  # serve epoch, at the release, of each named VM that has run an agent


class CoordinatorModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.time = ModelTime(START)
        self.group = ImdsGroup(lambda: self.time.now)
        self.group.on_early_approval = self._on_early_approval
        self.cluster = FakeGroup(lambda: self.time.now, session_timeout=Policy().session_timeout)
        self.tmp = Path(tempfile.mkdtemp(prefix="coordinator-model-"))
        self.slots: dict[str, VmSlot] = {}
        self.policy = Policy()
        self.violations: dict[str, list[str]] = {
            name: [] for name in ("S1", "S2", "S3", "S4", "S5", "liveness")
        }
        self.lapse_after = self.policy.session_timeout  # the ensemble expires a silent session this late
        self.committed: dict[tuple[str, int], str] = {}  # (vm, event serial) -> why it must stay out
        self.committed_by_ack: set[tuple[str, int]] = set()  # those of ``committed`` held by an ack only
        self.early: list[EarlyRelease] = []
        self.admitted: set[int] = set()  # event serials admitted by the leader while present
        # VMs drained by hand whose agent has taken them out for it: they stay out while the drain lasts
        self.hand_committed: set[str] = set()
        self.sequence = 0  # orders job submissions and reads (see ``_stamp``)

    def teardown(self) -> None:
        for slot in self.slots.values():
            if slot.executor is not None:
                slot.executor.abandon()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- set-up ------------------------------------------------------------------------------------------

    @initialize(
        vm3=st.sampled_from(("agent", "none", "dry-run")),
        leader_mode=st.booleans(),
        skews=st.lists(st.sampled_from(SKEWS), min_size=len(VMS), max_size=len(VMS)),
        absent_grace=st.sampled_from((None, 60.0, 120.0, 120.0)),
        granted=st.sampled_from((None, None, 20.0, 40.0, 60.0)),
        lapse_lag=st.sampled_from((0.0, 1.0, 2.0)),
        named_only=st.sampled_from((False, False, False, True)),
        windows=st.sampled_from((False, False, True)),
        told=st.booleans(),
        two_units=st.sampled_from((False, False, True)),
    )
    def setup(self, vm3: str, leader_mode: bool, skews: list[float], absent_grace: float | None,
              granted: float | None, lapse_lag: float, named_only: bool, windows: bool, told: bool = False,
              two_units: bool = False) -> None:
        """vm0-vm2 run agents; vm3 runs one, an observe-only one, or none (as vm9 never does). Drawn per
        example: ``policy.absent_peer_grace_seconds``; the session timeout the ensemble grants (None: the
        30 s asked for) and how long after it, within a tick, it expires a silent session; whether IMDS
        shows each VM only the events naming it; maintenance windows; whether each agent is told its delivery
        unit and mode (``imds.unit``, ``imds.delivery``: every VM is of one availability set) or left to the
        default (unit unknown, ``auto``); and whether the group spans two delivery units (vm0, vm1 | vm2, vm3,
        vm9: two placement groups of one scale set, each VM shown the events of its own unit)."""
        self.told = told
        if two_units:
            self.group.units = {"vm0": "pg0", "vm1": "pg0", "vm2": "pg1", "vm3": "pg1", "vm9": "pg1"}
        self.policy = Policy(
            approver=ApproverMode.LEADER if leader_mode else ApproverMode.FIRST_RESOURCE, drain_wait=DRAIN_WAIT,
            absent_grace=absent_grace, windows=WINDOWS if windows else (),
        )
        assert 0.0 <= lapse_lag <= self.policy.zk_tick
        self.cluster.granted_session = granted
        self.lapse_after = (granted or self.policy.session_timeout) + lapse_lag
        self.group.named_only = named_only
        for index, vm in enumerate(VMS):
            slot = VmSlot(vm, VmClock(self.time, skews[index]), VmTruth(vm), self.tmp / vm / "state.json")
            slot.configured = vm != "vm3" or vm3 != "none"
            slot.dry_run = vm == "vm3" and vm3 == "dry-run"
            self.slots[vm] = slot
        for slot in self.slots.values():
            if slot.configured:
                self._start(slot)

    # -- helpers -----------------------------------------------------------------------------------------

    def _violation(self, invariant: str, message: str) -> None:
        found = self.violations[invariant]
        if len(found) < 5:
            found.append(message)

    def _stamp(self) -> int:
        self.sequence += 1
        return self.sequence

    def _t(self) -> str:
        return f"t+{self.time.now - START:.0f}s"

    def _live(self) -> frozenset[str]:
        return frozenset(vm for vm, s in self.slots.items() if s.agent is not None and not s.dry_run)

    @staticmethod
    def _key(event: ModelEvent) -> str | None:
        try:
            return normalize_event_id(event.event_id)
        except InvalidName:
            return None

    def _acked(self, vm: str, event: ModelEvent) -> bool:
        key = self._key(event)
        if key is None:
            return False
        with self.cluster.lock:
            record = self.cluster.events.get(key)
            return record is not None and vm in record.acks

    def _store_admitted(self, event: ModelEvent) -> bool:
        key = self._key(event)
        if key is None:
            return False
        with self.cluster.lock:
            record = self.cluster.events.get(key)
            return record is not None and record.admitted is not None

    def _acks_gone_event(self, vm: str) -> bool:
        """``vm`` holds an ack on a record whose event is no longer in the group."""
        present = {self._key(e) for e in self.group.events.values()}
        with self.cluster.lock:
            return any(vm in record.acks for key, record in self.cluster.events.items() if key not in present)

    @staticmethod
    def _same_batch(a: ModelEvent, b: ModelEvent) -> bool:
        if a.event_type != "Terminate" or b.event_type != "Terminate":
            return False
        na, nb = a.not_before_epoch, b.not_before_epoch
        return na is not None and nb is not None and round(na) == round(nb)

    def _stuck(self, vm: str, release: EarlyRelease) -> bool:
        """``vm``, named by an early release, has not answered 200 since, and still counts in the budget:
        a VM whose agent has been gone for ``policy.recovery_grace`` no longer does (docs/safety.md S4).
        Gone is what the leader can see: no member node (its agent down, or running cut off from the store)
        without a break, which the model notes after every cycle, no later than any leader can."""
        slot = self.slots[vm]
        grace = self.policy.recovery_grace
        gone = ((slot.agent is None and slot.down_since is not None and self.time.now - slot.down_since >= grace)
                or (slot.absent_since is not None and self.time.now - slot.absent_since >= grace))
        return not slot.serving and slot.serve_epoch == release.epochs[vm] and not gone

    def _pick(self, serials: list[int], index: int) -> ModelEvent | None:
        if not serials:
            return None
        serial = sorted(serials)[index % len(serials)]
        return self.group.events.get(serial) or self.group.ended.get(serial)

    def _advance(self, seconds: float) -> None:
        self.time.advance(seconds)
        self.group.tick()
        for slot in self.slots.values():
            if slot.agent is not None and slot.store is not None:
                slot.store.lapse_if_due(self.lapse_after)  # the ensemble expires a silent session
            if slot.agent is None and slot.back_at is not None and slot.back_at <= self.time.now:
                # the process manager started it again (cut off from the store at first, if so drawn)
                self._start(slot, store_down=30 if slot.returns_cut_off else 0, unreachable=slot.returns_cut_off)
        # So too the session of an agent stopped while cut off, which could not close it.
        self.cluster.expire_silent(self.lapse_after)
        self._observe()

    # -- agents ------------------------------------------------------------------------------------------

    def _start(self, slot: VmSlot, state_file: str = "keep", failing_reads: int = 0, store_down: int = 0,
               unreachable: bool = False) -> None:
        if state_file != "keep":
            # What its predecessors saw is lost with the file: docs/safety.md promises only what an
            # unreadable file (the first fresh document) or a missing one (the /out node) restores, and
            # the new agent is held to what it is shown itself.
            slot.seen_started.clear()
            slot.forgotten_early |= {s for s, e in self.group.events.items() if e.early}
            for key in [key for key in self.committed if key[0] == slot.vm]:
                del self.committed[key]
                self.committed_by_ack.discard(key)
        if state_file == "delete":
            # A missing state file: the drain by hand is known again from the view only (docs/safety.md S2).
            self.hand_committed.discard(slot.vm)
            slot.state_path.unlink(missing_ok=True)
        elif state_file == "corrupt":
            slot.state_path.parent.mkdir(parents=True, exist_ok=True)
            slot.state_path.write_bytes(b'{"phase": "drained", "draining_for": ["')
        feed = self.group.feed(slot.vm)
        feed.read_faults[:0] = ["timeout"] * failing_reads
        slot.generation += 1
        slot.down_since = None
        generation = slot.generation
        # As ``coordinator run --dry-run`` wires it: the state file is read, never written, and no probe is
        # served (the load balancer sees no answer, as from a VM that runs no agent); a real agent's probe
        # answers 503 from its start until a document clears the VM.
        saved = StateFile(slot.state_path)
        probe = WatchedProbe(lambda serving: self._on_probe(slot, serving), serving=False)
        executor = ModelExecutor("held" if slot.hold_cycles else slot.exec_mode, before_run=self._observe,
                                 stamp=self._stamp)
        store = ModelStore(self.cluster.store(slot.clock.now), self.cluster, on_admit=self._on_admit,
                           on_admit_drain=self._on_admit_drain,
                           pause=lambda: self._advance(self.lapse_after + 1), now=lambda: self.time.now)
        store.suspended_at_start = store_down > 0 and not unreachable
        store.unreachable_at_start = store_down > 0 and unreachable
        slot.partition_cycles = store_down
        imds = FakeImds(self.group, slot.vm, lambda fake, ids: self._on_post(slot, generation, ids),
                        lambda events: self._on_served(slot, events), self._between_attempts, shown_later=True)
        actions: list[Action] = [ProbeAction(probe), RecordingAction(slot.truth, executor.checkpoint)]
        slot.probe, slot.executor, slot.store, slot.imds = probe, executor, store, imds
        slot.readings = ModelReadings(imds.get_document, slot.clock.monotonic, imds.shown)
        slot.readings.slow = slot.slow
        if slot.out_since is None:
            slot.out_since = self.time.now
        slot.agent = Agent(
            vm=slot.vm,
            imds=imds,
            store=store,
            actions=actions,
            policy=self._policy_of_agents(slot.vm),
            metrics=Metrics(CollectorRegistry()),
            clock=slot.clock,
            jobs=cast(JobExecutor, executor),
            state_file=saved,
            readings=slot.readings,
            dry_run=slot.dry_run,
        )

    def _policy_of_agents(self, vm: str) -> Policy:
        """The policy ``vm``'s agent runs with: told its delivery unit and mode, or not (``setup``)."""
        if not self.told:
            return self.policy
        mode = DeliveryMode.NAMED if self.group.named_only else DeliveryMode.UNIT
        return replace(self.policy, delivery=Delivery(self.group.units.get(vm, "as0"), mode))

    def _stop(self, slot: VmSlot) -> None:
        if slot.agent is None:
            return
        assert slot.executor is not None and slot.store is not None
        slot.executor.abandon()
        slot.store.stop()
        if slot.serving:
            slot.out_since = self.time.now
        slot.agent = None
        slot.probe = None
        slot.back_at = None
        slot.down_since = self.time.now

    def _cycle(self, vm: str, poll: bool = True) -> None:
        """One cycle of ``vm``'s agent: after a poll of its IMDS (the poller's reading wakes the loop), or,
        with ``poll`` False, woken by something else (a watch, a job) on the reading it already has."""
        slot = self.slots[vm]
        if slot.agent is None:
            return
        assert slot.store is not None and slot.executor is not None and slot.readings is not None
        if poll:
            slot.readings.poll()
        slot.store.view_session = None
        slot.cycled = [*slot.cycled[-40:], self.time.mono]
        try:
            slot.agent.cycle()
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            self._violation("S5",
                f"{self._t()} {vm}: cycle raised {type(exc).__name__}: {exc} "
                f"(in {Path(frame.filename).name}:{frame.lineno} {frame.name})"
            )
        if slot.partition_cycles > 0:
            slot.partition_cycles -= 1
            if slot.partition_cycles == 0:
                self._reconnect(slot.vm)
        if slot.hold_cycles > 0:
            slot.hold_cycles -= 1
            if slot.hold_cycles == 0:
                slot.executor.mode = slot.exec_mode
        if slot.executor.mode != "held":
            slot.executor.pump()
        self._observe()

    # -- observation hooks -------------------------------------------------------------------------------

    def _observe(self) -> None:
        """Note, for each VM out of rotation, the present events that now require it to stay out, and since
        when each VM has had no member node."""
        self.group.tick()
        with self.cluster.lock:
            members = set(self.cluster.members)
        for slot in self.slots.values():
            if slot.vm in members:
                slot.absent_since = None
            elif slot.absent_since is None:
                slot.absent_since = self.time.now
        for event in self.group.events.values():
            for vm in event.named:
                slot = self.slots.get(vm)
                if slot is not None and slot.serving and self._acked(vm, event):
                    # Whatever the VM's own documents say: an approver may release the event on this ack now.
                    self._violation("S2", f"{self._t()} {vm} answers 200 while its acknowledgement of "
                                          f"{event.describe()} stands")
                if slot is None or not slot.had_agent or slot.serving or (vm, event.serial) in self.committed:
                    continue
                why = None
                if (event.status == STARTED and event.serial in slot.seen_started
                        and not self._recovery_in_flight(slot, slot.seen_started[event.serial])):
                    why = "it is Started and its agent was shown so"
                elif event.early and event.serial not in slot.forgotten_early:
                    why = "it was approved"
                elif self._acked(vm, event):
                    why = f"{vm} has acknowledged it"
                    self.committed_by_ack.add((vm, event.serial))
                if why is not None:
                    self.committed[(vm, event.serial)] = f"{why} ({self._t()})"
        with self.cluster.lock:
            drains, _ = self.cluster.hand.view()
        self.hand_committed &= set(drains)
        for slot in self.slots.values():
            if (slot.agent is not None and not slot.dry_run and slot.vm in drains and not slot.serving
                    and BY_HAND in slot.agent._state.local.draining_for):
                self.hand_committed.add(slot.vm)
        for vm, serial in list(self.committed):
            present = self.group.events.get(serial)
            if present is None or vm not in present.named:
                del self.committed[(vm, serial)]
            elif (vm, serial) in self.committed_by_ack and not self._acked(vm, present) and not present.early \
                    and present.status != STARTED:
                # The ack lapsed with its session (or was withdrawn) and nobody approved on it: nothing
                # can release the event on it any more. An approval made on it later is "released".
                del self.committed[(vm, serial)]
        self.committed_by_ack &= set(self.committed)

    @staticmethod
    def _recovery_in_flight(slot: VmSlot, since: int) -> bool:
        """A recover job submitted before ``since`` has not finished: it may still put the probe back
        to 200 before the drain queued behind it runs. The VM is not drained for the event until then
        (docs/safety.md, "drained for E now": its drain actions for E have finished)."""
        executor = slot.executor
        return executor is not None and any(
            job.kind == "recover" and job.stamp < since for job in executor.pending()
        )

    def _on_served(self, slot: VmSlot, events: list[ModelEvent]) -> None:
        for event in events:
            if event.status == STARTED and slot.vm in event.named:
                slot.seen_started.setdefault(event.serial, self._stamp())

    def _on_probe(self, slot: VmSlot, serving: bool) -> None:
        if not serving:
            if slot.out_since is None:
                slot.out_since = self.time.now
            return
        self._observe()  # the probe still fails here
        if slot.vm in self.hand_committed:
            self._violation("S2", f"{self._t()} {slot.vm} answers 200 again while its drain by hand lasts")
        for (vm, serial), why in self.committed.items():
            if vm == slot.vm:
                event = self.group.events[serial]
                self._violation("S2",
                    f"{self._t()} {vm} answers 200 again while {event.describe()} is present: {why}"
                )
        slot.out_since = None
        slot.serve_epoch += 1

    def _on_admit(self, key: str) -> None:
        event = next((e for e in self.group.events.values() if self._key(e) == key), None)
        if event is None:
            return
        self.admitted.add(event.serial)
        outside = self._live() - event.named
        busy = {vm: self._in_maintenance(vm, event) for vm in outside}
        if all(busy.values()):
            self._violation("S4",
                f"{self._t()} admitted {event.describe()} with no live VM outside it left serving: "
                f"live={sorted(self._live())} in maintenance={busy}"
            )

    def _on_admit_drain(self, vm: str) -> None:
        """The leader admits a drain by hand: it must leave a live VM outside it serving (keep_one_serving),
        and take a VM within ``max_vms_in_maintenance`` (none set here: only the first counts)."""
        outside = self._live() - {vm}
        busy = {other: self._in_maintenance(other, None) for other in outside}
        if self.policy.keep_one_serving and all(busy.values()):
            self._violation("S4", f"{self._t()} admitted the drain by hand of {vm} with no live VM outside it "
                                  f"left serving: live={sorted(self._live())} in maintenance={busy}")

    def _by_hand(self, vm: str) -> bool:
        """Whether ``vm`` is out by an admitted drain by hand (the budget counts it as in maintenance)."""
        with self.cluster.lock:
            drain = self.cluster.hand.view()[0].get(vm)
        return drain is not None and drain.admitted_at is not None

    def _in_maintenance(self, vm: str, event: ModelEvent | None) -> str | None:
        """Why ``vm`` (out of rotation) counts as in maintenance for the budget, if it does."""
        slot = self.slots[vm]
        if slot.serving:
            return None
        if self._by_hand(vm):
            return "drained by hand"
        for other in self.group.events.values():
            if other is event or (event is not None and self._same_batch(other, event)) or vm not in other.named:
                continue
            if other.status == STARTED or other.early or other.serial in self.admitted or self._acked(vm, other):
                return f"held by {other.event_id}"
        if self._acks_gone_event(vm):
            return "acknowledged an event that has ended and not served since"
        for release in self.early:
            if release.event is not event and vm in release.epochs and self._stuck(vm, release):
                return f"not back since {release.event.event_id} was released"
        return None

    def _avoidably_out(self, vm: str, event: ModelEvent) -> str | None:
        """Why ``vm`` is out of rotation because of another event (or a drain by hand) the budget let in, if
        it is."""
        slot = self.slots[vm]
        if slot.serving:
            return None
        if self._by_hand(vm):
            return "drained by hand"
        for other in self.group.events.values():
            if other is event or self._same_batch(other, event) or vm not in other.named:
                continue
            if other.early or other.serial in self.admitted or self._store_admitted(other):
                return f"held by admitted {other.event_id}"
        for release in self.early:
            other = release.event
            if other is not event and not self._same_batch(other, event) and vm in release.epochs and self._stuck(
                vm, release
            ):
                return f"not back since {other.event_id} was released"
        return None

    def _on_post(self, slot: VmSlot, generation: int, ids: list[str]) -> None:
        where = f"{self._t()} {slot.vm} POSTed {ids}"
        if slot.dry_run:
            self._violation("S1", f"{where}: a dry-run agent POSTed")
        if slot.agent is None or slot.generation != generation:
            self._violation("S3", f"{where}: the agent process had stopped")
        assert slot.store is not None
        inner = slot.store.inner
        problems = []
        state = inner.connection_state
        if state is not ConnectionState.CONNECTED:
            problems.append(f"its connection is {state.value}")
        session = inner.session_id
        if session is None or session != slot.store.view_session:
            problems.append(f"its session is {session}, the cycle's view was read under {slot.store.view_session}")
        with self.cluster.lock:
            member = self.cluster.members.get(slot.vm)
            leader = self.cluster.leader
            owns = session is not None and (
                (member is not None and member.session == session) or (leader is not None and leader.session == session)
            )
        if not owns:
            problems.append("its session owns neither its member node nor the leader node")
        # The fence, before every attempt (retries too): no bytes once an operator's pause exists, or
        # outside the maintenance windows (by the VM's own clock, the one its agent can read).
        with self.cluster.lock:
            paused = self.cluster.paused
        if paused is not None:
            problems.append(f"approvals were paused at t+{paused.at - START:.0f}s")
        if not in_windows(self.policy.windows, slot.clock.now()):
            problems.append("its clock is outside the maintenance windows")
        if problems:
            self._violation("S3", f"{where}: " + "; ".join(problems))

    def _between_attempts(self, what: str, backoff: float) -> None:
        """Between two attempts of a retried POST: an operator pauses approvals, or the client backs off
        (and a maintenance window may close meanwhile)."""
        if what == "pause":
            self.cluster.pause("model: paused while a POST was retried", "operator", self.time.now)
        self._advance(backoff)

    def _self_drain_not_due(self, slot: VmSlot, event: ModelEvent) -> bool:
        """With ``absent_peer_grace_seconds``, a VM whose running agent is cut off from the store (no member
        node) drains itself once cut off for the grace minus its drain wait (docs/safety.md S1), on a loop
        that runs every second; its peers stop waiting for it a grace after they saw it gone. When the model
        ran no cycle of that agent between that moment (or the event's creation, if later: it cannot drain
        for an event that does not exist yet) and a drain wait before now (the model may leave an agent idle
        for minutes, its probe still answering), the promise is not due: the VM is not held to it."""
        agent = slot.agent
        grace = self.policy.absent_grace
        if agent is None or grace is None or slot.vm in self.cluster.member_names:
            return False
        connected_at = agent._state.evidence.connected_at  # when it last saw the store CONNECTED (None: never)
        wait = self.policy.drain_wait_by_type.get(event.event_type, self.policy.drain_wait)
        due = float("-inf") if connected_at is None else connected_at + max(grace - wait, 0.0)
        due = max(due, self.time.mono - (self.time.now - event.created_at))  # it drains once the event exists
        return not any(due <= at <= self.time.mono - wait for at in slot.cycled)

    def _on_early_approval(self, event: ModelEvent, poster: str) -> None:
        now = self.time.now
        where = f"{self._t()} {poster} released {event.describe()}"
        s1: list[str] = []
        if not event.known_type:
            s1.append("its type is unknown")
        if event.bad_names:
            s1.append(f"Resources holds invalid names {list(event.bad_names)}")
        if not event.named:
            s1.append("it names no VM")
        wait = self.policy.drain_wait_by_type.get(event.event_type, self.policy.drain_wait)
        for vm in sorted(event.named):
            slot = self.slots.get(vm)
            if slot is None or not slot.had_agent:
                s1.append(f"{vm} runs no agent" + (" (dry-run only)" if slot is not None and slot.dry_run else ""))
                continue
            if self._self_drain_not_due(slot, event):
                continue
            if slot.serving:
                s1.append(f"{vm} answers 200")
            elif slot.out_since is not None and now - slot.out_since < wait:
                s1.append(f"{vm} has been out of rotation for only {now - slot.out_since:.0f}s "
                          f"(drain wait {wait:.0f}s)")
            absent = self.policy.absent_grace is not None and vm not in self.cluster.member_names
            if not slot.truth.actions_drained and not (absent and (slot.agent is None or slot.truth.drain_failed)):
                # With absent_peer_grace_seconds, a VM without a member node is the documented exception:
                # not waited for once its peers saw it gone for the grace. Its dead probe keeps it out if
                # its agent is down; a running agent's self-drain takes it out of rotation (checked
                # above), and cannot make good a drain action that failed.
                s1.append(f"{vm}'s drain actions are not done")
        if s1:
            self._violation("S1", f"{where}: " + "; ".join(s1))

        s4: list[str] = []
        if self.policy.max_events == 1 and self.policy.keep_one_serving:
            if event.serial not in self.admitted:
                s4.append("this event was never admitted into the budget")
            outside = self._live() - event.named
            reasons = {vm: self._avoidably_out(vm, event) for vm in sorted(outside)}
            if outside and all(reasons.values()):
                s4.append(f"no live VM outside it serves: {reasons}")
            for release in self.early:
                other = release.event
                if other is event or self._same_batch(other, event):
                    continue
                present = other.serial in self.group.events
                stuck = sorted(vm for vm in release.epochs
                               if self._stuck(vm, release) and (present or vm not in event.named))
                if stuck:
                    s4.append(f"{other.event_id} (released at t+{release.at - START:.0f}s, "
                              f"{'present' if present else 'ended'}) still has {stuck} out of rotation")
        if s4:
            self._violation("S4", f"{where}: " + "; ".join(s4))
        epochs = {vm: self.slots[vm].serve_epoch for vm in event.named if vm in self.slots and self.slots[vm].had_agent}
        self.early.append(EarlyRelease(event, now, epochs))

    # -- rules: events -----------------------------------------------------------------------------------

    @rule(
        event_type=st.sampled_from(EVENT_TYPES),
        source=st.sampled_from(("Platform", "User", None)),
        resources=resources_lists,
        notice=st.sampled_from((600, 900, 300, 130, 60, 30, 1800)),
        impact=st.sampled_from((15, 5, 60, 600)),
        style=st.sampled_from(("rfc", "iso", "lower-id")),
    )
    def schedule(self, event_type: str, source: str | None, resources: list[str], notice: int, impact: int,
                 style: str) -> None:
        serial = self.group.next_serial()
        start = self.time.now + notice
        self.group.add(ModelEvent(
            serial=serial,
            event_id=event_id_for(serial, lower=style == "lower-id"),
            event_type=event_type,
            source=source,
            resources=tuple(resources),
            start_at=start,
            not_before_raw=iso_not_before(start) if style == "iso" else rfc_not_before(start),
            impact=impact,
            duration=impact if event_type == "Freeze" else -1,
        ))

    @rule(
        not_before=st.sampled_from(tuple(ODD_NOT_BEFORE)),
        shape=st.sampled_from(ODD_SHAPES),
        event_type=st.sampled_from(EVENT_TYPES),
        resources=resources_lists,
        notice=st.sampled_from((300, 30, 900)),
    )
    def schedule_odd(self, not_before: str, shape: str, event_type: str, resources: list[str], notice: int) -> None:
        serial = self.group.next_serial()
        omit: frozenset[str] = frozenset()
        named = tuple(resources)
        if shape == "no-resources":
            named, omit = (), frozenset({"Resources"})
        elif shape == "empty-resources":
            named = ()
        elif shape == "bare":
            omit = frozenset({"Description", "EventSource", "ResourceType", "DurationInSeconds"})
        self.group.add(ModelEvent(
            serial=serial,
            event_id=event_id_for(serial),
            event_type=event_type,
            source="Platform",
            resources=named,
            start_at=self.time.now + notice,
            not_before_raw=ODD_NOT_BEFORE[not_before],
            impact=30,
            omit=omit,
        ))

    @rule(
        event_type=st.sampled_from(("Reboot", "Redeploy", "Freeze")),
        resources=resources_lists,
        impact=st.sampled_from((30, 5, 120)),
    )
    def hardware_failure(self, event_type: str, resources: list[str], impact: int) -> None:
        serial = self.group.next_serial()
        self.group.add(ModelEvent(
            serial=serial,
            event_id=event_id_for(serial),
            event_type=event_type,
            source="Platform",
            resources=tuple(resources),
            start_at=self.time.now,
            not_before_raw=None,
            impact=impact,
            status=STARTED,
        ))

    def _scheduled(self) -> list[int]:
        return [s for s, e in self.group.events.items() if e.status != STARTED]

    @precondition(lambda self: bool(self._scheduled()))
    @rule(index=indexes, resources=resources_lists)
    def change_resources(self, index: int, resources: list[str]) -> None:
        event = self._pick(self._scheduled(), index)
        if event is not None:
            self.group.change_resources(event.serial, tuple(resources))
            self._observe()

    @precondition(lambda self: bool(self._scheduled()))
    @rule(index=indexes)
    def cancel(self, index: int) -> None:
        event = self._pick(self._scheduled(), index)
        if event is not None:
            self.group.cancel(event.serial)
            self._observe()

    @precondition(lambda self: bool(self.group.ended))
    @rule(
        index=indexes,
        event_type=st.sampled_from(EVENT_TYPES),
        resources=resources_lists,
        notice=st.sampled_from((600, 130, 1800)),
    )
    def reuse_event_id(self, index: int, event_type: str, resources: list[str], notice: int) -> None:
        old = self._pick(list(self.group.ended), index)
        assert old is not None
        if any(self._key(e) == self._key(old) for e in self.group.events.values()):
            return
        start = self.time.now + notice
        event = self.group.add(ModelEvent(
            serial=self.group.next_serial(),
            event_id=old.event_id,
            event_type=event_type,
            source="Platform",
            resources=tuple(resources),
            start_at=start,
            not_before_raw=rfc_not_before(start),
            impact=60,
            duration=-1,
        ))
        key = self._key(event)
        with self.cluster.lock:
            record = self.cluster.events.get(key) if key is not None else None
            inherited = record is not None and record.record.done_at is None and record.admitted is not None
        if inherited:
            # Back before the leader saw it gone (and marked its record done): to the agents it is the
            # same event, still admitted. "A reused EventId inherits nothing" needs the gap to be seen.
            self.admitted.add(event.serial)

    # -- rules: IMDS faults ------------------------------------------------------------------------------

    @precondition(lambda self: bool(self.group.events))
    @rule(vm=vm_names, index=indexes)
    def flap(self, vm: str, index: int) -> None:
        event = self._pick(list(self.group.events), index)
        if event is not None:
            self.group.flap(vm, event.serial)

    @rule(vm=vm_names, reset=st.booleans(), by=st.integers(min_value=1, max_value=5))
    def incarnation(self, vm: str, reset: bool, by: int) -> None:
        if reset:
            self.group.reset_incarnation(vm)
        else:
            self.group.skip_incarnation(vm, by)

    @rule(vm=vm_names, faults=st.lists(st.sampled_from(READ_FAULTS), min_size=1, max_size=3))
    def read_faults(self, vm: str, faults: list[str]) -> None:
        self.group.feed(vm).read_faults.extend(faults)

    @rule(vm=vm_names, fault=st.sampled_from(("lost", "refused", "answer-lost")))
    def post_fault(self, vm: str, fault: str) -> None:
        self.group.feed(vm).post_faults.append(fault)

    @rule(vm=vm_names, failures=st.integers(min_value=1, max_value=3),
          between=st.sampled_from(("pause", "backoff", "backoff")), backoff=st.sampled_from((1.0, 2.0, 4.0)))
    def post_retry(self, vm: str, failures: int, between: str, backoff: float) -> None:
        """The VM's next POST loses its first ``failures`` attempts and is retried ``backoff`` seconds later
        each time; an operator pauses approvals after the first failed attempt (``pause``), or nothing but
        time passes (a maintenance window may close). The fence is asked before every attempt."""
        self.group.feed(vm).retries.append((failures, between, backoff))

    @rule(vm=vm_names, slow=st.sampled_from(("", "sent", "sent", "answered")))
    def slow_imds(self, vm: str, slow: str) -> None:
        """The VM's IMDS answers late: each answer arrives at the agent's next poll, up to 5 s after its
        request, showing the events as they were when it was sent (``sent``: changes made meanwhile are
        not in it) or when answered; ``""``: at once again."""
        slot = self.slots[vm]
        slot.slow = slow
        if slot.readings is not None:
            slot.readings.slow = slow

    @precondition(lambda self: bool(self.policy.windows))
    @rule(before=st.sampled_from((0.5, 2.0, 6.0, 15.0)))
    def to_window_edge(self, before: float) -> None:
        """Time passes (nobody cycles) until ``before`` seconds before the current or next maintenance
        window ends."""
        now = datetime.fromtimestamp(self.time.now, UTC)
        end = now.replace(minute=WINDOW_MINUTES, second=0, microsecond=0)
        if end - timedelta(seconds=before) <= now:
            end += timedelta(hours=1)
        self._advance(end.timestamp() - before - self.time.now)

    @rule(paused=st.booleans())
    def operator_pause(self, paused: bool) -> None:
        """``coordinator pause`` / ``coordinator resume``: early approvals stop, or go on, group-wide."""
        if paused:
            self.cluster.pause("model: operator pause", "operator", self.time.now)
        else:
            self.cluster.resume()

    @rule(vm=vm_names, drained=st.booleans())
    def operator_drain(self, vm: str, drained: bool) -> None:
        """``coordinator drain VM`` / ``coordinator undrain VM``: a VM out of rotation by hand, through the
        budget, until undone."""
        if drained:
            self.cluster.drain(vm, "model: operator drain", "operator", self.time.now)
        else:
            self.cluster.undrain(vm)

    # -- rules: time and cycles --------------------------------------------------------------------------

    @rule(seconds=st.sampled_from((1, 5, 15, 35, 60, 120, 300, 900, 3600)))
    def advance(self, seconds: int) -> None:
        self._advance(seconds)

    @precondition(lambda self: bool(self.group.events))
    @rule(extra=st.sampled_from((0, 1, 30)))
    def advance_to_next_change(self, extra: int) -> None:
        at = self.group.next_start()
        if at is not None and at < self.time.now + 24 * 3600:
            self._advance(max(at - self.time.now, 0.0) + extra)

    @rule()
    def clock_ticks(self) -> None:
        """Normal operation: 5 s pass, then every agent runs one cycle."""
        self._advance(5)
        for vm in VMS:
            self._cycle(vm)

    @rule()
    def calm_minute(self) -> None:
        """A minute of normal operation."""
        for _ in range(12):
            self.clock_ticks()

    @rule(vm=vm_names)
    def cycle(self, vm: str) -> None:
        self._cycle(vm)

    @rule(vm=vm_names, seconds=st.sampled_from((0, 0, 0.5, 1, 2)), serve_early=st.booleans())
    def woken(self, vm: str, seconds: float, serve_early: bool) -> None:
        """A cycle woken between polls (a watch, a job), on the last reading, ``seconds`` after it; then,
        if the agent asked for an early read and the model serves it, the cycle that reading wakes."""
        if seconds:
            self._advance(seconds)
        self._cycle(vm, poll=False)
        readings = self.slots[vm].readings
        if serve_early and readings is not None and readings.asked:
            self._cycle(vm)

    @rule(order=st.permutations(VMS), rounds=st.integers(min_value=1, max_value=3))
    def cycle_all(self, order: list[str], rounds: int) -> None:
        for _ in range(rounds):
            for vm in order:
                self._cycle(vm)

    @rule(seconds=st.sampled_from((10, 30, 60, 150)), order=st.permutations(VMS))
    def operate(self, seconds: int, order: list[str]) -> None:
        for _ in range(seconds // 5):
            self._advance(5)
            for vm in order:
                self._cycle(vm)

    # -- rules: agent processes --------------------------------------------------------------------------

    @rule(vm=vm_names, state_file=st.sampled_from(("keep", "delete", "corrupt")),
          failing_reads=st.integers(min_value=0, max_value=3), store_down=st.sampled_from((0, 3, 20, 60)),
          unreachable=st.booleans())
    def restart(self, vm: str, state_file: str, failing_reads: int, store_down: int, unreachable: bool) -> None:
        """A new process: its state file kept, deleted or corrupted; its first IMDS reads failing; the
        store cut off for its first ``store_down`` cycles: a first session made and suspended at once, or
        (``unreachable``) no server reached at all, so no session."""
        slot = self.slots[vm]
        if slot.agent is not None:
            self._stop(slot)
            self._start(slot, state_file, failing_reads, store_down, unreachable)

    def _stopped(self) -> list[str]:
        return [vm for vm, s in self.slots.items() if s.configured and s.agent is None]

    @rule(vm=vm_names, down_for=st.sampled_from((30, 300, 1200, None)), returns_cut_off=st.booleans())
    def stop(self, vm: str, down_for: int | None, returns_cut_off: bool) -> None:
        """The agent process dies (its session ends with it; the leader starts timing its absence) and
        the VM fails its probe until it is started again: after ``down_for`` seconds (state file kept;
        with ``returns_cut_off``, unable to reach any ZooKeeper server for its first 30 cycles), or by
        ``start`` (None)."""
        slot = self.slots[vm]
        self._stop(slot)
        slot.returns_cut_off = returns_cut_off
        if down_for is not None and slot.configured:
            slot.back_at = self.time.now + down_for

    @precondition(lambda self: bool(self._stopped()))
    @rule(index=indexes, state_file=st.sampled_from(("keep", "delete", "corrupt")),
          failing_reads=st.integers(min_value=0, max_value=3), store_down=st.sampled_from((0, 3, 20, 60)),
          unreachable=st.booleans())
    def start(self, index: int, state_file: str, failing_reads: int, store_down: int, unreachable: bool) -> None:
        """Start a stopped agent, as ``restart`` does."""
        stopped = self._stopped()
        self._start(self.slots[stopped[index % len(stopped)]], state_file, failing_reads, store_down, unreachable)

    @rule(vm=vm_names, eager=st.booleans())
    def executor_mode(self, vm: str, eager: bool) -> None:
        """Jobs finish at submission (eager) or right after the cycle that submitted them."""
        slot = self.slots[vm]
        slot.exec_mode = "eager" if eager else "deferred"
        if slot.executor is not None and slot.hold_cycles == 0:
            slot.executor.mode = slot.exec_mode

    @rule(vm=vm_names, cycles=st.sampled_from((3, 10, 40)))
    def hold_jobs(self, vm: str, cycles: int) -> None:
        """Slow drains and recoveries: jobs wait for so many cycles of the agent (or ``release_jobs``)."""
        slot = self.slots[vm]
        if slot.executor is not None and slot.agent is not None:
            slot.hold_cycles = cycles
            slot.executor.mode = "held"

    @rule(vm=vm_names, count=st.integers(min_value=1, max_value=2))
    def release_jobs(self, vm: str, count: int) -> None:
        slot = self.slots[vm]
        if slot.executor is not None and slot.agent is not None:
            slot.executor.pump(count)
            self._observe()

    @rule(vm=vm_names, drains=st.integers(min_value=0, max_value=3), recovers=st.integers(min_value=0, max_value=3))
    def action_failures(self, vm: str, drains: int, recovers: int) -> None:
        """The next so many drains and recoveries of the VM's actions fail."""
        truth = self.slots[vm].truth
        truth.fail_drains, truth.fail_recovers = drains, recovers

    def _operate(self, seconds: float, skip: str | None = None) -> None:
        for _ in range(int(seconds // 5)):
            self._advance(5)
            for vm in VMS:
                if vm != skip:
                    self._cycle(vm)

    @rule(vm=vm_names, down_for=st.sampled_from((30, 90)), uptime=st.sampled_from((45, 70)),
          first=st.booleans())
    def reboot_cut_off(self, vm: str, down_for: int, uptime: int, first: bool) -> None:
        """The VM reboots: its agent is down for ``down_for`` seconds while the others run (the leader
        times its absence), and its new agent reaches no ZooKeeper server for a long while. After
        ``uptime`` seconds of it, maintenance is scheduled for it and a live peer (it first in Resources,
        or second); the group runs on for a minute."""
        slot = self.slots[vm]
        if slot.agent is None or slot.dry_run:
            return
        self._stop(slot)
        self._operate(down_for, skip=vm)
        self._start(slot, store_down=60, unreachable=True)
        self._operate(uptime)
        peers = sorted(self._live() - {vm})
        if not peers:
            return
        resources = [vm, peers[0]] if first else [peers[0], vm]
        self.schedule("Reboot", "Platform", resources, 600, 60, "rfc")
        self._operate(60)

    @rule(vm=vm_names, index=indexes, seconds=st.sampled_from((25, 45, 55)))
    def ack_outlives_cut_off(self, vm: str, index: int, seconds: int) -> None:
        """While an operator's pause holds approvals, maintenance is scheduled for a live peer and ``vm``
        (the peer first in Resources); once ``vm`` has acknowledged it, ``vm`` is cut off (its session, and
        its ack, live on in the ensemble up to the timeout it granted) and the event names it no more;
        after ``seconds`` it names both again, the pause is lifted and the group runs on for 15 s."""
        slot = self.slots[vm]
        store = self._store(vm)
        peers = sorted(self._live() - {vm})
        if slot.dry_run or store is None or store.inner.connection_state is not ConnectionState.CONNECTED or not peers:
            return
        peer = peers[index % len(peers)]
        self.cluster.pause("model: held while an ack is made", "operator", self.time.now)
        self.schedule("Reboot", "Platform", [peer, vm], 900, 60, "rfc")
        serial = max(self.group.events)
        event = self.group.events[serial]
        for _ in range(12):
            if self._acked(vm, event):
                break
            self._operate(5)
        if self._acked(vm, event) and store.inner.connection_state is ConnectionState.CONNECTED:
            store.suspend()
            slot.partition_cycles = 0
            self.group.change_resources(serial, (peer,))
            self._operate(seconds)
            self.group.change_resources(serial, (peer, vm))
        self.cluster.resume()
        self._operate(15)

    # -- rules: coordination store -----------------------------------------------------------------------

    def _store(self, vm: str) -> ModelStore | None:
        slot = self.slots[vm]
        if slot.agent is None or slot.store is None or slot.store.inner.connection_state is ConnectionState.LOST:
            return None
        return slot.store

    @rule(vm=vm_names, cycles=st.sampled_from((2, 5, 30, 0)), lapse=st.booleans())
    def partition(self, vm: str, cycles: int, lapse: bool) -> None:
        """The agent loses the store for so many of its cycles (0: until ``heal``): the connection is
        SUSPENDED and comes back to the same session, or (``lapse``) the ensemble, cut off from the
        agent, expires its session meanwhile and the client finds it LOST when it is reachable again. A
        suspension that lasts a session timeout becomes the latter (``ModelStore.lapse_if_due``)."""
        store = self._store(vm)
        if store is None:
            return
        if lapse:
            store.partition()
        else:
            store.suspend()
        self.slots[vm].partition_cycles = cycles

    def _reconnect(self, vm: str) -> None:
        slot = self.slots[vm]
        if slot.store is None or slot.agent is None:
            return
        slot.store.reconnect()

    @rule(vm=vm_names)
    def heal(self, vm: str) -> None:
        self._reconnect(vm)
        self.slots[vm].partition_cycles = 0

    @rule(vm=vm_names)
    def expire(self, vm: str) -> None:
        """Session loss: the session expires, the client reconnects at once with a new one."""
        store = self._store(vm)
        if store is not None and store.inner.connection_state is ConnectionState.CONNECTED:
            store.expire_session()

    @rule()
    def expire_leader(self) -> None:
        with self.cluster.lock:
            leader = self.cluster.leader
        if leader is None:
            return
        for vm in VMS:
            store = self._store(vm)
            if store is not None and store.inner.session_id is not None and store.inner.session_id == leader.session:
                store.expire_session()
                return

    @rule(vm=vm_names, point=st.sampled_from(STORE_FAULT_POINTS), fault=st.sampled_from(("expire", "suspend")))
    def arm_store_fault(self, vm: str, point: str, fault: str) -> None:
        slot = self.slots[vm]
        if slot.store is not None:
            slot.store.armed[point] = fault

    # -- rules: liveness ---------------------------------------------------------------------------------

    @rule(vm=vm_names)
    def settle(self, vm: str) -> None:
        """Heal one VM; if no event names it, it must answer 200 within a bounded number of cycles."""
        slot = self.slots[vm]
        if slot.agent is None or slot.dry_run:
            return
        assert slot.executor is not None
        self._heal_vm(slot)
        readable = True
        # A VM cut off from the store may wait until every session that could hold its acks has lapsed.
        cycles = max(SETTLE_CYCLES, math.ceil(2 * self._lapses_after() / SETTLE_STEP))
        for _ in range(cycles):
            if any(vm in e.named for e in self.group.events.values()) or self._held_by_hand(slot):
                return
            try:
                parse_document(self.group.serve(vm, consume=False)[1])
            except Exception:
                readable = False
            self._cycle(vm)
            if slot.serving:
                return
            self._advance(SETTLE_STEP)
        if readable and not any(vm in e.named for e in self.group.events.values()):
            self._violation("S2",
                f"{self._t()} {vm} is named by no event, reads documents fine, and still fails its probe "
                f"after {cycles} cycles and {cycles * SETTLE_STEP:.0f}s"
            )

    def _held_by_hand(self, slot: VmSlot) -> bool:
        """Whether the VM may stay out for a drain by hand: one lasts, or its agent holds one it cannot check,
        cut off from the store since it started on an unreadable state file (docs/safety.md S2)."""
        with self.cluster.lock:
            drained = slot.vm in self.cluster.hand.drains
        agent, store = slot.agent, slot.store
        return drained or (agent is not None and store is not None and BY_HAND in agent._state.local.draining_for
                           and store.inner.connection_state is not ConnectionState.CONNECTED)

    def _lapses_after(self) -> float:
        return session_lapses_after(self.policy, self.cluster.granted_session)

    def _heal_vm(self, slot: VmSlot) -> None:
        """The VM's IMDS feed, executor and actions work again (not its store)."""
        assert slot.executor is not None
        self.group.heal(slot.vm)
        slot.truth.fail_drains = slot.truth.fail_recovers = 0
        slot.hold_cycles = 0
        slot.exec_mode = slot.executor.mode = "deferred"
        slot.executor.pump()
        slot.slow = ""
        if slot.readings is not None:
            slot.readings.slow = ""

    def _record_done(self, key: str) -> bool:
        with self.cluster.lock:
            record = self.cluster.events.get(key)
            return record is None or record.record.done_at is not None

    def _reusable(self) -> list[int]:
        present = {self._key(e) for e in self.group.events.values()}
        return [serial for serial, e in self.group.ended.items()
                if e.early and self._key(e) is not None and self._key(e) not in present]

    @precondition(lambda self: bool(self._reusable()))
    @rule(index=indexes)
    def reuse_approved_event_id(self, index: int) -> None:
        """Azure reuses the EventId of a maintenance approved early, for a new maintenance of the same VMs
        (the same approver, unless its agent changed), once the leader has marked the record done. The
        group is first calmed: every VM healed and its store reachable again, no pause.

        Liveness: if the new instance is approvable early (known type, every VM it names runs a real
        agent, a live VM outside it, no other event, inside the windows, every VM shown every event), it
        is approved before its NotBefore by normal operation."""
        old = self._pick(self._reusable(), index)
        assert old is not None
        key = self._key(old)
        assert key is not None
        self._calm()
        for _ in range(30):
            if self._record_done(key):
                break
            self.clock_ticks()
        if not self._record_done(key) or self.group.present_with_id(old.event_id) is not None:
            return
        start = self.time.now + REUSE_NOTICE
        event = self.group.add(ModelEvent(
            serial=self.group.next_serial(),
            event_id=old.event_id,
            event_type=old.event_type,
            source=old.source,
            resources=old.resources,
            start_at=start,
            not_before_raw=rfc_not_before(start),
            impact=60,
            duration=old.duration,
        ))
        live = self._live()
        # Across two units the leader sees only its own unit's events: in leader mode another unit's event
        # is approved at its NotBefore (docs/safety.md L1); in first-resource mode its approver sees it.
        leader_blind = bool(self.group.units) and self.policy.approver is ApproverMode.LEADER
        approvable = (
            not self.group.named_only and not leader_blind and event.known_type and not event.bad_names
            and bool(event.named)
            and event.named <= live and bool(live - event.named) and len(self.group.events) == 1
            and all(in_windows(self.policy.windows, at) for at in range(
                int(self.time.now - 60), int(start + 60), 30))
        )
        while self.time.now < start - 5 and not event.early and event.serial in self.group.events:
            self.clock_ticks()
        if approvable and not event.early and self._live() == live:
            self._violation("liveness",
                f"{self._t()} {event.describe()}, a reused EventId (approved early before, by "
                f"{old.approved_by}), was not approved before its NotBefore in a calm group")

    def _calm(self) -> None:
        """Every fault heals: each running agent's IMDS feed, executor and actions work again, its store
        reaches the ensemble again with no fault armed, an agent the process manager starts again meanwhile
        reaches it at once, and no operator pause or drain by hand holds anything."""
        self.cluster.resume()
        with self.cluster.lock:
            drained = list(self.cluster.hand.drains)
        for vm in drained:
            self.cluster.undrain(vm)
        for slot in self.slots.values():
            slot.returns_cut_off = False  # else a VM back during the quiet time is cut off for 30 more cycles
            if slot.agent is not None and not slot.dry_run:
                self._heal_vm(slot)
                slot.partition_cycles = 0
                self._reconnect(slot.vm)
                if slot.store is not None:
                    slot.store.armed.clear()

    def _gone_records_open(self) -> list[str]:
        """Records not marked done whose event has left the group, but those L2 excuses (docs/safety.md L2):
        one that names no VM with a live agent (its closer) and whose event the leader's documents would not
        list while present (it does not name the leader, and the leader was not told that IMDS shows it
        every event of the group's one unit)."""
        present = {self._key(e) for e in self.group.events.values()}
        live = self._live()
        with self.cluster.lock:
            leader = self.cluster.leader.vm if self.cluster.leader is not None else None
            records = [event.record for event in self.cluster.events.values()]
        units = self.group.units

        def leader_sees(record: EventRecord) -> bool:
            # Told that IMDS shows it every event of its unit, and the record is of that unit.
            if not self.told or self.group.named_only or leader is None:
                return False
            first = next((vm for vm in record.resources if vm in units), None)
            return not units or (first is not None and units[first] == units.get(leader))

        return sorted(r.event_id for r in records
                      if r.done_at is None and r.event_id not in present
                      and (leader in r.resources or leader_sees(r) or bool(live & set(r.resources))))

    @rule()
    def quiesce(self) -> None:
        """Every fault heals (``_calm``), and the group runs normally. Liveness (docs/safety.md L2): within
        ``QUIESCE_TICKS`` cycles of every agent, every record whose event has left the group is closed,
        whoever leads now and whatever it saw of the event before (a restarted agent, sightings dropped
        while its store was cut off)."""
        self._calm()
        if not any(slot.agent is not None and not slot.dry_run for slot in self.slots.values()):
            return
        open_before = self._gone_records_open()
        for _ in range(QUIESCE_TICKS):
            if not self._gone_records_open():
                return
            self.clock_ticks()
        still = [key for key in self._gone_records_open() if key in open_before]
        with self.cluster.lock:
            leader = self.cluster.leader.vm if self.cluster.leader is not None else None
        # No leader: every running agent is still cut off (an agent that never reached any server stays so
        # until it is stopped); nobody can close a record, and L2 promises nothing.
        if still and leader is not None:
            self._violation("liveness",
                f"{self._t()} the records of {', '.join(still)} stay open {QUIESCE_TICKS * 5} s after every fault "
                f"healed, although their events have left the group (leader: {leader})")

    # -- invariants --------------------------------------------------------------------------------------

    @invariant()
    def s1_released_only_when_drained(self) -> None:
        assert not self.violations["S1"], "S1 violated:\n" + "\n".join(self.violations["S1"])

    @invariant()
    def s2_drained_until_gone(self) -> None:
        self._observe()
        for (vm, serial), why in self.committed.items():
            if self.slots[vm].serving and not self.violations["S2"]:
                self._violation("S2",
                    f"{self._t()} {vm} answers 200 while {self.group.events[serial].describe()} is present: {why}"
                )
        assert not self.violations["S2"], "S2 violated:\n" + "\n".join(self.violations["S2"])

    @invariant()
    def s3_posts_hold_the_session(self) -> None:
        assert not self.violations["S3"], "S3 violated:\n" + "\n".join(self.violations["S3"])

    @invariant()
    def s4_budget(self) -> None:
        assert not self.violations["S4"], "S4 violated:\n" + "\n".join(self.violations["S4"])

    @invariant()
    def acks_within_out_marks(self) -> None:
        """A VM acknowledges an event only while its ``/out`` mark names it: what lets the leader weigh the
        budget on every ``/out`` mark without reading the other VMs' acks (``Part.LEAD``)."""
        with self.cluster.lock:
            for key, record in self.cluster.events.items():
                for vm in record.acks:
                    mark = self.cluster.out.get(vm)
                    assert mark is not None and key in {e.upper() for e in mark.events}, (
                        f"{self._t()} {vm} acknowledges {key} without an /out mark naming it: {mark}")

    @invariant()
    def s5_cycles_never_raise(self) -> None:
        assert not self.violations["S5"], "S5 violated:\n" + "\n".join(self.violations["S5"])

    @invariant()
    def liveness_holds(self) -> None:
        assert not self.violations["liveness"], "liveness:\n" + "\n".join(self.violations["liveness"])


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,  # a step runs many agent cycles: its time says nothing
    derandomize=SEED is None,
    database=None,
    # Shrinking re-runs hundreds of sequences of agent cycles: minutes. Off unless asked for.
    phases=(Phase.explicit, Phase.generate, *((Phase.shrink,) if SHRINK else ())),
    # Steps run agent cycles (slow on a loaded machine); long MODEL_STEPS sequences draw much data.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=False,
)


def _machine() -> type[CoordinatorModel]:
    """The state machine, without the rules named in ``MODEL_SKIP`` and seeded by ``MODEL_SEED``."""
    skipped = {name.strip() for name in SKIP.split(",") if name.strip()}
    rules = {name for name in dir(CoordinatorModel) if hasattr(getattr(CoordinatorModel, name), RULE_MARKER)}
    unknown = skipped - rules
    if unknown:
        raise ValueError(f"MODEL_SKIP names no rule: {sorted(unknown)}")
    if not skipped and SEED is None:
        return CoordinatorModel
    overrides: dict[str, object] = {name: _not_a_rule for name in skipped}
    machine = type("ConfiguredCoordinatorModel", (CoordinatorModel,), overrides)
    return seed(int(SEED))(machine) if SEED is not None else machine


def _not_a_rule(self: CoordinatorModel) -> None:
    """Stands for a rule left out with ``MODEL_SKIP``."""


@pytest.fixture
def quiet_agents() -> Iterator[None]:
    """Agents log every decision; thousands of cycles of it only slow the run and bury the report.
    ``MODEL_LOG_LEVEL`` (a number: 20 for INFO) lets them through, with pytest's ``--log-file``."""
    logger = logging.getLogger("coordinator")
    level = logger.level
    logger.setLevel(int(os.environ.get("MODEL_LOG_LEVEL", logging.CRITICAL)))
    try:
        yield
    finally:
        logger.setLevel(level)


def test_safety_model(quiet_agents: None) -> None:
    run_state_machine_as_test(_machine(), settings=SETTINGS)
