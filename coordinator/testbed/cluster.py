"""A whole group on one machine: ZooKeeper, the IMDS simulator and N agents, each its own process.

Used by ``coordinator demo`` and by the end-to-end tests. Every process is started here, its PID
recorded, and only those PIDs are stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from azuresim.client import SimControl
from coordinator.testbed.haproxy import BackendTarget, LocalHAProxy
from coordinator.testbed.processes import free_port, stop_process
from coordinator.testbed.waiting import wait_until
from coordinator.testbed.zookeeper import LocalZooKeeper

__all__ = ["HAPROXY_CHECK_FALL", "HAPROXY_CHECK_INTERVAL_SECONDS", "PROBE_LAG_SECONDS", "AdminStateDrain",
           "AgentProcess", "LocalCluster"]

#: The load balancer pool the testbed's simulated ARM serves when agents drain through admin state.
STORY_POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-story/providers/"
              "Microsoft.Network/loadBalancers/lb-story/backendAddressPools/pool-app")

#: HAProxy's health check of each server, the testbed's load balancer probe: every ``inter`` (given to
#: ``LocalHAProxy`` here), a server taken out after ``fall`` failed checks (its configuration's ``fall 2``).
HAPROXY_CHECK_INTERVAL_SECONDS = 0.5
HAPROXY_CHECK_FALL = 2
#: The probe's lag: how long HAProxy may still send new requests to a VM whose probe failed.
PROBE_LAG_SECONDS = HAPROXY_CHECK_INTERVAL_SECONDS * HAPROXY_CHECK_FALL


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    if not wait_until(predicate, timeout, interval=0.05):
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass(frozen=True)
class AdminStateDrain:
    """Agents drain through the load balancer's admin state too: the simulator serves ARM with one pool
    holding every VM's address (named after the VM), each agent gets an ``azure-lb`` action beside its
    probe, and with HAProxy the simulator applies every effective admin state to it (``--lb-haproxy``).
    Whether the agents also drain HAProxy themselves is ``LocalCluster(haproxy_action=...)``: without it,
    the admin state (and, when ARM fails, the probe) is the only drain HAProxy sees.

    ``arm_async_seconds``: how long the simulated ARM takes to complete a write; ``fallback_wait``: how
    long a drain that could not reach ARM lasts at least (the probe's lag, which it then relies on: with
    HAProxy, at least ``PROBE_LAG_SECONDS``); ``timeout_seconds`` and ``deadline_seconds``: the ``azure-lb``
    action's per-request timeout and its deadline for one drain or recovery."""

    pool_id: str = STORY_POOL
    arm_async_seconds: float = 0.5
    fallback_wait: float = 1.5
    timeout_seconds: float = 2.0
    deadline_seconds: float = 10.0


@dataclass
class AgentProcess:
    vm: str
    config_path: Path
    log_path: Path
    probe_url: str
    admin_url: str
    proc: subprocess.Popen[bytes] | None = None
    _http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=2.0, trust_env=False))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def probe(self) -> int | None:
        """The health probe's HTTP status, or None if the agent does not answer."""
        try:
            return self._http.get(self.probe_url).status_code
        except httpx.HTTPError:
            return None

    def status(self) -> dict[str, Any] | None:
        try:
            response = self._http.get(self.admin_url + "/status")
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def metrics(self) -> str:
        return self._http.get(self.admin_url + "/metrics").text


class LocalCluster:
    """Start with ``start()``; ``stop()`` ends every process this object started."""

    def __init__(
        self,
        workdir: Path,
        vms: Sequence[str] = ("vm0", "vm1", "vm2"),
        *,
        cluster: str = "demo",
        drain_wait: float = 2.0,
        poll_interval: float = 0.5,
        session_timeout: float = 6.0,
        approver: str = "first-resource",
        started_for: float = 3.0,
        zk_hosts: str | None = None,
        extra_config: dict[str, Any] | None = None,
        sim_args: Sequence[str] = (),
        per_vm_config: dict[str, dict[str, Any]] | None = None,
        with_haproxy: bool = False,
        haproxy_action: bool = True,
        with_agents: bool = True,
        admin_state: AdminStateDrain | None = None,
    ) -> None:
        self.workdir = workdir
        self.vms = list(vms)
        self.cluster = cluster
        self._drain_wait = drain_wait
        self._poll_interval = poll_interval
        self._session_timeout = session_timeout
        self._approver = approver
        self._started_for = started_for
        self._extra = extra_config or {}
        self._sim_args = list(sim_args)
        self._per_vm = per_vm_config or {}
        self._with_haproxy = with_haproxy
        self._haproxy_action = haproxy_action
        self._with_agents = with_agents
        self._admin_state = admin_state
        if admin_state is not None and with_haproxy and admin_state.fallback_wait < PROBE_LAG_SECONDS:
            raise ValueError(f"AdminStateDrain.fallback_wait ({admin_state.fallback_wait:g} s) must cover HAProxy's "
                             f"probe lag ({PROBE_LAG_SECONDS:g} s): a drain that falls back to the probe waits it out")
        self.arm_url = ""  # the simulated ARM's base URL, served with admin_state
        self.haproxy: LocalHAProxy | None = None
        self.apps: dict[str, subprocess.Popen[bytes]] = {}
        self.app_ports: dict[str, int] = {}
        self._ports: dict[str, tuple[int, int]] = {}  # vm -> (probe port, admin port)
        self.zk: LocalZooKeeper | None = None
        self.zk_hosts = zk_hosts
        self.sim_proc: subprocess.Popen[bytes] | None = None
        self.sim: SimControl | None = None
        self.imds_urls: dict[str, str] = {}
        self.agents: dict[str, AgentProcess] = {}
        self.dry_runs: dict[str, AgentProcess] = {}  # ``start_dry_run``: observers beside (or instead of) agents

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, on_step: Callable[[str], None] = lambda _: None, *, wait_joined: bool = True) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.zk_hosts is None and self._with_agents:
                on_step("starting ZooKeeper")
                self.zk = LocalZooKeeper(self.workdir / "zookeeper")
                self.zk.start()
                self.zk_hosts = self.zk.hosts
            on_step(f"ZooKeeper serving on {self.zk_hosts}; starting the IMDS simulator" if self.zk_hosts
                    else "starting the IMDS simulator")
            self._start_simulator()
            if self._admin_state is not None:
                self._attach_admin_state(self._admin_state)
            self._ports = {vm: (free_port(), free_port()) for vm in self.vms}
            if self._with_haproxy:
                on_step("starting one app server per VM and HAProxy in front of them")
                self._start_haproxy()
            if not self._with_agents:
                return
            for vm in self.vms:
                on_step(f"starting the agent of {vm}")
                self.start_agent(vm)
            if wait_joined:
                self.wait_members(len(self.vms))
                self.wait_first_documents()
                on_step(f"{len(self.vms)} agents joined, each has read its first document")
        except BaseException:
            self.stop()
            raise

    def _start_simulator(self) -> None:
        ready = self.workdir / "imds-sim.ready.json"
        ready.unlink(missing_ok=True)
        log = open(self.workdir / "imds-sim.log", "ab")  # noqa: SIM115 - owned by the child
        self.sim_proc = subprocess.Popen(
            [sys.executable, "-m", "azuresim", "--vms", ",".join(self.vms), "--base-port", "0",
             "--control", "127.0.0.1:0", "--ready-file", str(ready), "--started-for", str(self._started_for),
             *self._admin_state_args(), *self._sim_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        _wait(lambda: ready.exists() or self.sim_proc is None or self.sim_proc.poll() is not None, 30,
              "the IMDS simulator")
        if not ready.exists():
            raise RuntimeError(f"the IMDS simulator exited; see {self.workdir / 'imds-sim.log'}")
        info = json.loads(ready.read_text())
        self.imds_urls = dict(info["vms"])
        self.arm_url = str(info.get("arm", ""))
        self.sim = SimControl(info["control"])

    @property
    def haproxy_socket(self) -> Path:
        """Where HAProxy's runtime socket will be (known before HAProxy starts, for the simulator)."""
        return self.workdir / "haproxy" / "admin.sock"

    def _admin_state_args(self) -> list[str]:
        """The simulator's ARM, its write time, and (with HAProxy) the data plane it drives."""
        if self._admin_state is None:
            return []
        args = ["--arm", "127.0.0.1:0", "--arm-async-seconds", f"{self._admin_state.arm_async_seconds:g}"]
        if self._with_haproxy:
            args += ["--lb-haproxy", str(self.haproxy_socket)]
        return args

    def _attach_admin_state(self, setup: AdminStateDrain) -> None:
        """One pool with every VM's address, ``None`` at first, and an ``azure-lb`` action per agent, which
        reaches ARM with its VM's identity through that VM's IMDS port."""
        assert self.sim is not None
        self.sim.add_pool(setup.pool_id, [{"name": vm, "ip_address": "127.0.0.1"} for vm in self.vms])
        for vm in self.vms:
            action = {"type": "azure-lb", "backend_pools": [setup.pool_id], "backend_address": vm,
                      "arm_url": self.arm_url, "imds_url": self.imds_urls[vm],
                      "timeout_seconds": setup.timeout_seconds, "deadline_seconds": setup.deadline_seconds,
                      "fallback_wait_seconds": setup.fallback_wait}
            self._per_vm.setdefault(vm, {}).setdefault("actions", []).append(action)

    def pool_effective(self) -> dict[str, str]:
        """The effective admin state of each address of the admin-state pool ({} without one)."""
        if self._admin_state is None or self.sim is None:
            return {}
        pool = self.sim.pools().get(self._admin_state.pool_id, {})
        return dict(pool.get("effective", {}))

    def _start_haproxy(self) -> None:
        """One app process per VM, and HAProxy routing to them; HAProxy's health check of each server
        is that VM's agent probe, as an Azure Load Balancer's would be, and each agent also drains its
        own server through the runtime API (unless ``haproxy_action`` is False: the probe alone)."""
        targets = {}
        for vm in self.vms:
            self.app_ports[vm] = free_port()
            self.start_app(vm)
            targets[vm] = BackendTarget(self.app_ports[vm], check_port=self._ports[vm][0])
        self.haproxy = LocalHAProxy(self.haproxy_socket.parent, targets, server_timeout="5s",
                                    check_interval=f"{HAPROXY_CHECK_INTERVAL_SECONDS * 1000:g}ms")
        self.haproxy.start()
        for vm in self.vms if self._haproxy_action else ():
            action = {"type": "haproxy", "runtime": str(self.haproxy.socket_path), "backend": self.haproxy.backend,
                      "server": vm, "drain_timeout_seconds": 10}
            self._per_vm.setdefault(vm, {}).setdefault("actions", []).append(action)

    def probe_port(self, vm: str) -> int:
        """The port of ``vm``'s health probe (HAProxy's check of its server goes there)."""
        return self._ports[vm][0]

    def start_app(self, vm: str) -> subprocess.Popen[bytes]:
        """Start ``vm``'s app server on its port (again, after an impact killed it, as a rebooted VM would)."""
        log = open(self.workdir / f"app-{vm}.log", "ab")  # noqa: SIM115 - owned by the child
        self.apps[vm] = subprocess.Popen(
            [sys.executable, "-m", "coordinator.testbed.app", "--name", vm, "--port", str(self.app_ports[vm])],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        return self.apps[vm]

    def agent_config(self, vm: str, probe_port: int, admin_port: int) -> dict[str, Any]:
        """The configuration written for ``vm``'s agent; ``extra_config`` and then ``per_vm_config[vm]``
        sections are merged in. With HAProxy, the agent is told its probe's lag (``PROBE_LAG_SECONDS``, as
        ``drain.probe_interval_seconds`` x ``drain.probe_threshold``), which its warnings weigh waits against."""
        drain: dict[str, Any] = {"wait_seconds": self._drain_wait}
        if self._with_haproxy:
            # The same lag as HAProxy's 0.5 s x 2, told as one probe of 1 s (the agents take 1 s at least).
            drain.update(probe_interval_seconds=PROBE_LAG_SECONDS, probe_threshold=1)
        config: dict[str, Any] = {
            "cluster": self.cluster,
            "vm_name": vm,
            # Time runs compressed here (polls every 0.3-1 s, events minutes long at most): failed polls
            # back off to 2 s at most, where a VM would wait up to the 8 s default.
            "imds": {"url": self.imds_urls[vm], "poll_interval": self._poll_interval,
                     "first_request_timeout": 10, "request_timeout": 2,
                     "backoff_max_seconds": max(2.0, self._poll_interval)},
            "zookeeper": {"hosts": self.zk_hosts, "session_timeout": self._session_timeout,
                          "operation_timeout": 2},
            "policy": {"approver": self._approver},
            "drain": drain,
            "probe": {"listen": f"127.0.0.1:{probe_port}", "path": "/health"},
            "http": {"listen": f"127.0.0.1:{admin_port}"},
            "state_file": str(self.workdir / f"state-{vm}.json"),
        }
        for extra in (self._extra, self._per_vm.get(vm, {})):
            for section, values in extra.items():
                if isinstance(values, dict):
                    config.setdefault(section, {}).update(values)
                else:
                    config[section] = values
        return config

    def start_agent(self, vm: str, *, extra_args: Sequence[str] = (),
                    on_spawn: Callable[[AgentProcess], None] | None = None) -> AgentProcess:
        """Start ``vm``'s agent and wait until it answers ``/status``; ``on_spawn`` is called as soon as the
        process exists (before that wait), for a caller that must know its PID at once."""
        existing = self.spawn_agent(vm, extra_args=extra_args)
        if on_spawn is not None:
            on_spawn(existing)
        _wait_answering(existing, f"the agent of {vm}")
        return existing

    def spawn_agent(self, vm: str, *, extra_args: Sequence[str] = ()) -> AgentProcess:
        """Start ``vm``'s agent process and return at once, without waiting for it to answer (a caller
        starting many agents in parallel waits for them itself)."""
        existing = self.agents.get(vm)
        if existing is None:
            probe_port, admin_port = self._ports.get(vm) or (free_port(), free_port())
            config_path = self.workdir / f"agent-{vm}.yaml"
            config_path.write_text(yaml.safe_dump(self.agent_config(vm, probe_port, admin_port)))
            existing = AgentProcess(
                vm=vm, config_path=config_path, log_path=self.workdir / f"agent-{vm}.log",
                probe_url=f"http://127.0.0.1:{probe_port}/health", admin_url=f"http://127.0.0.1:{admin_port}",
            )
            self.agents[vm] = existing
        existing.proc = _run_agent_process(existing, extra_args)
        return existing

    def start_dry_run(self, vm: str) -> AgentProcess:
        """Start ``coordinator run --dry-run`` for ``vm`` with its agent's configuration, beside its agent (or
        where it is stopped), its admin surface on a port of its own; wait until it answers ``/status``.
        Its ``probe_url`` is the agent's: a dry run serves no probe, so what answers there is the agent."""
        agent = self.agents[vm]  # started once at least: its configuration is written
        admin_port = free_port()
        dry = AgentProcess(vm=vm, config_path=agent.config_path, log_path=self.workdir / f"dry-run-{vm}.log",
                           probe_url=agent.probe_url, admin_url=f"http://127.0.0.1:{admin_port}")
        dry.proc = _run_agent_process(dry, ["--dry-run", "--admin-listen", f"127.0.0.1:{admin_port}"])
        self.dry_runs[vm] = dry
        _wait_answering(dry, f"the dry run of {vm}")
        return dry

    def stop_agent(self, vm: str, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        stop_process(self.agents[vm].proc, sig, timeout)

    def stop(self) -> None:
        for dry in self.dry_runs.values():
            stop_process(dry.proc)
        for vm in list(self.agents):
            self.stop_agent(vm)
        stop_process(self.sim_proc)
        if self.haproxy is not None:
            self.haproxy.stop()
        for app in self.apps.values():
            stop_process(app, timeout=5)
        if self.zk is not None:
            self.zk.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation -------------------------------------------------------------------------------

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {vm: agent.status() for vm, agent in self.agents.items()}

    def wait_members(self, n: int, timeout: float = 30) -> None:
        def joined() -> bool:
            for agent in self.agents.values():
                st = agent.status() if agent.alive() else None
                if st and st.get("cluster") and len(st["cluster"]["members"]) >= n:
                    return True
            return False

        _wait(joined, timeout, f"{n} agents to join")

    def wait_first_documents(self, timeout: float = 30) -> None:
        """Until every agent has acted on its first document: an agent joins the group before IMDS
        first answers (its loop never waits on IMDS), and stays out of rotation until then."""
        def acted() -> bool:
            for agent in self.agents.values():
                st = agent.status() if agent.alive() else None
                if not st or st.get("phase") == "unknown" or not (st.get("imds") or {}).get("incarnation"):
                    return False
            return True

        _wait(acted, timeout, "every agent's first document")

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        _wait(predicate, timeout, what)


def _run_agent_process(agent: AgentProcess, extra_args: Sequence[str]) -> subprocess.Popen[bytes]:
    """``coordinator run --config`` of ``agent``'s file, its output appended to its log, with no
    ``COORDINATOR__`` override of this environment."""
    log = open(agent.log_path, "ab")  # noqa: SIM115 - owned by the child
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR__")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "run", "--config", str(agent.config_path), *extra_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
    )
    log.close()  # the child holds its own descriptor
    return proc


def _wait_answering(agent: AgentProcess, what: str) -> None:
    """Until ``agent`` answers ``/status``; RuntimeError if its process exits first."""
    _wait(lambda: agent.status() is not None or not agent.alive(), 30, what)
    if not agent.alive():
        raise RuntimeError(f"{what} exited; see {agent.log_path}")
