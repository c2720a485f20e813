"""The state one chaos run shares between its parts, and the helpers they all use.

``RunState`` holds a run's seed, configuration and plan, its ZooKeeper ensemble and (once started) its
group, the locks and the set of VMs a fault step holds, and every record the oracle will judge: what the
harness did, the agent processes started and how they ended, the probe, HAProxy and ``/status``
samples, and (with ``admin_state``) every VM's effective admin state in the simulated load balancer and
the ARM faults queued. It says and records what happens, waits for a condition, and tells whether every VM is back.
The ensemble's tickTime comes from the seed (``planning.tick_time_ms``) unless the run is given an
ensemble, whose own tick then counts. With link faults, each agent reaches ZooKeeper through a
``ZooKeeperLink`` of its own (``links``), started with the group. The delivery layout (``layout``: which
events IMDS shows each VM, whether the agents are told their unit) comes from the seed too
(``planning.delivery_layout``).
``Clock`` gives times relative to the story's beginning; ``Abort`` ends a run that cannot go on.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from coordinator.testbed.cluster import AdminStateDrain, LocalCluster
from coordinator.testbed.zookeeper import LocalEnsemble
from tests.chaos.netproxy import ZooKeeperLink
from tests.chaos.planning import ChaosConfig, delivery_layout, granted_session_ms, plan, tick_time_ms
from tests.oracle import HarnessRecord, ProbeSample, ProcessRecord, ServerSample, StatusSample
from tests.oracle.records import AdminStateSample

__all__ = ["Abort", "Clock", "RunState"]


class Abort(Exception):
    """The run cannot go on (a component would not start or came back)."""


class Clock:
    """Times relative to ``origin``: when the run was set up, then when its story began."""

    def __init__(self) -> None:
        self.origin = time.time()

    def rel(self, t: float | None = None) -> float:
        return (time.time() if t is None else t) - self.origin


class RunState:
    """One run's seed, configuration, plan, processes and records, shared by the parts of the run."""

    def __init__(self, seed: int, config: ChaosConfig, workdir: Path, say: Callable[[str], None],
                 ensemble: LocalEnsemble | None = None) -> None:
        self.seed = seed
        self.config = config
        self.workdir = workdir
        self._say = say
        self.steps = plan(seed, config)
        self.layout = delivery_layout(seed, config)  # which events IMDS shows each VM, and what the agents are told
        self._own_ensemble = ensemble is None
        self.planned_tick_ms = tick_time_ms(seed, config)
        self.ensemble = ensemble or LocalEnsemble(workdir / "zookeeper", 3, tick_time_ms=self.planned_tick_ms,
                                                  max_session_timeout_ms=config.max_session_timeout_ms)
        self.tick_ms = self.ensemble.tick_time_ms
        self.session_granted_ms = granted_session_ms(config, self.tick_ms)
        self.links: dict[str, ZooKeeperLink] = {}  # vm -> its agent's link to ZooKeeper (with link faults)
        self._link_lock = threading.Lock()  # one link fault at a time
        self.faults: dict[str, int] = {}  # fault steps carried out, by kind
        self.faults_skipped: dict[str, int] = {}
        self.link_faults: list[dict[str, Any]] = []  # each link fault carried out: whom, how, how long
        self.arm_faults: list[dict[str, Any]] = []  # each ARM fault queued: when, how long, its body
        self._arm_lock = threading.Lock()  # one ARM fault at a time (clearing one clears them all)
        self._arm_http = httpx.Client(timeout=2.0, trust_env=False)
        self.admin_setup: AdminStateDrain | None = None  # with admin_state, set when the group is built
        self._closers: list[Callable[[], None]] = []  # clients the samplers opened, closed at the end
        self.cluster_name = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
        self.cluster: LocalCluster | None = None
        self.clock = Clock()
        self._lock = threading.Lock()
        self._vm_locks = {vm: threading.Lock() for vm in config.vms}
        self._busy: set[str] = set()  # VMs whose agent a fault step holds (paused, or killed until restarted)
        self._zk_lock = threading.Lock()
        self._stopping = threading.Event()
        self._step_threads: list[threading.Thread] = []
        self.harness: list[HarnessRecord] = []
        self.processes: dict[tuple[str, int], ProcessRecord] = {}  # by (vm, pid): a PID is reused
        self.probes: list[ProbeSample] = []
        self.servers: list[ServerSample] = []
        self.statuses: list[StatusSample] = []
        self.admin_states: list[AdminStateSample] = []
        self._labels: dict[str, str] = {}  # story label -> event id
        self._sim_seq = 0
        self._sim_entries: list[dict[str, Any]] = []
        self._died_at: dict[str, float] = {}
        self._errors: list[str] = []
        self._status_client = httpx.Client(timeout=0.5, trust_env=False,
                                           limits=httpx.Limits(max_keepalive_connections=0))

    # -- reporting ---------------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        self._say(f"[seed {self.seed}] t={self.clock.rel():5.1f}s {message}")

    def record(self, kind: str, target: str = "", pid: int | None = None, detail: str = "") -> None:
        with self._lock:
            self.harness.append(HarnessRecord(time.time(), kind, target, pid, detail))

    def count(self, kind: str, *, skipped: bool = False) -> None:
        """Count a fault step carried out (or skipped) by its kind, for the run's result."""
        with self._lock:
            counts = self.faults_skipped if skipped else self.faults
            counts[kind] = counts.get(kind, 0) + 1

    # -- shared helpers --------------------------------------------------------------------------------------

    def _cluster(self) -> LocalCluster:
        if self.cluster is None:
            raise Abort("the group was not started")
        return self.cluster

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str, fail: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except Exception:
                pass
            time.sleep(0.2)
        if fail:
            raise Abort(f"timed out after {timeout:g} s waiting for {what}")
        self.say(f"timed out after {timeout:g} s waiting for {what}")
        return False

    def _all_back(self) -> bool:
        with self._lock:
            probes: dict[str, int | None] = {}
            for sample in self.probes[-80:]:
                probes[sample.vm] = sample.code
            servers = {s.server: s.up for s in self.servers[-4 * len(self.config.vms):]}
            admin = {s.vm: s.state for s in self.admin_states[-4 * len(self.config.vms):]}
        back = [vm for vm in self.config.vms if probes.get(vm) == 200 and servers.get(vm)]
        if self.config.admin_state:  # and back in the load balancer: its effective admin state None again
            back = [vm for vm in back if admin.get(vm) == "None"]
        return len(back) == len(self.config.vms)
