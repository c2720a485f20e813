"""Setting up and tearing down the processes of a chaos run, and watching them while it runs.

``RunProcesses`` starts the ZooKeeper ensemble (unless the run shares one), one link proxy per agent
between that agent and the ensemble (with link faults; ``tests.chaos.netproxy``), and the group:
the IMDS simulator (with the run's delivery units and delivery: ``planning.DeliveryLayout.sim_args``),
HAProxy, and an app server and an agent per VM, each agent's connect string naming its own proxies and,
where the layout tells them, its configuration its unit and the delivery (``imds.unit``,
``imds.delivery``); with ``admin_state`` the agents drain through the load balancer's admin state
(``AdminStateDrain``) and their probe, without an ``haproxy`` action of their own: HAProxy is drained only
by the admin state the simulator applies to it and by its health check of each probe. It builds the
samplers (every agent's probe, HAProxy's server states, every VM's effective admin state with
``admin_state``, the agents' ``/status``, the simulator's log), records every agent process started and
how it ended, and brings a VM whose agent or app server died back as a rebooted VM would come back. At the
end it stops the agents, reads the simulator's and the agents' logs, and stops every process it started,
by PID.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

from azuresim.client import SimControl
from coordinator.testbed.cluster import AdminStateDrain, LocalCluster
from tests.chaos.netproxy import ZooKeeperLink
from tests.chaos.observers import Sampler
from tests.chaos.result import read_agent_log
from tests.chaos.state import Abort, RunState
from tests.oracle import LogLine, ProbeSample, ProcessRecord, ServerSample, StatusSample
from tests.oracle.records import AdminStateSample

__all__ = ["RunProcesses"]


class RunProcesses(RunState):
    """The processes of a run: started, sampled, brought back when they die, stopped at the end."""

    # -- set-up ----------------------------------------------------------------------------------------------

    def _start(self) -> None:
        config = self.config
        if self._own_ensemble:
            self.say("starting a 3-server ZooKeeper ensemble")
            try:
                self.ensemble.start(timeout=60)
            except RuntimeError as exc:
                raise Abort(f"ZooKeeper ensemble did not start: {exc}") from exc
        tick = f"tickTime {self.tick_ms} ms, sessions granted {self.session_granted_ms} ms (asked "
        self.say(tick + f"{config.session_timeout * 1000:.0f} ms)")
        if self.tick_ms != self.planned_tick_ms:
            self.say(f"the shared ensemble's tickTime ({self.tick_ms} ms) is not the seed's "
                     f"({self.planned_tick_ms} ms): the link cuts meant to outlast a session were sized for the seed's")
        per_vm: dict[str, dict[str, Any]] = {}
        if config.link_faults:
            for vm in config.vms:
                link = ZooKeeperLink.for_hosts(self.ensemble.hosts, name=vm)
                self.links[vm] = link
                try:
                    link.start()
                except OSError as exc:
                    raise Abort(f"the ZooKeeper link proxy of {vm} did not start: {exc}") from exc
                per_vm[vm] = {"zookeeper": {"hosts": link.hosts}}
            self.say("each agent reaches ZooKeeper through a link proxy of its own: "
                     + ", ".join(f"{vm} {link.hosts}" for vm, link in self.links.items()))
        # The delivery layout: the simulator's units and delivery, and (told) each agent's imds.unit and delivery.
        for vm in config.vms:
            for section, values in self.layout.agent_config(vm).items():
                per_vm.setdefault(vm, {}).setdefault(section, {}).update(values)
        self.say(f"delivery layout: {self.layout.describe()}")
        self.admin_setup = AdminStateDrain() if config.admin_state else None
        self.say("starting the IMDS simulator, HAProxy, app servers and agents"
                 + (" (draining through the load balancer's admin state and the probe, no HAProxy action)"
                    if self.admin_setup else ""))
        self.cluster = LocalCluster(
            self.workdir / "group", config.vms, cluster=self.cluster_name, drain_wait=config.drain_wait,
            poll_interval=config.poll_interval, session_timeout=config.session_timeout,
            started_for=config.started_for_sim, zk_hosts=self.ensemble.hosts, with_haproxy=True,
            sim_args=["--time-scale", f"{config.time_scale:g}", "--not-before-clock", "real", *self.layout.sim_args()],
            # The agents know the servers' tickTime, as an operator configures it: a cut-off agent serves again
            # only once its session has certainly lapsed (granted timeout plus a tick).
            extra_config={"drain": {"latest_start_seconds": config.latest_start}, "logging": {"format": "json"},
                          "zookeeper": {"tick_seconds": self.tick_ms / 1000.0}},
            # With admin state, the agents drain through it and the probe only: HAProxy is what the simulated
            # load balancer applies to it and what its health check sees, so an ARM failure shows as traffic.
            per_vm_config=per_vm, admin_state=self.admin_setup, haproxy_action=self.admin_setup is None,
        )
        before = time.time()
        try:
            self.cluster.start()
        except (RuntimeError, TimeoutError) as exc:
            raise Abort(f"the group did not start: {exc}") from exc
        self._check_layout()
        for vm in config.vms:
            self._note_start(vm, before)
            self._register(vm)

    def _check_layout(self) -> None:
        """The simulator holds the layout it was given (``GET /vms``): every VM in its unit, the delivery."""
        sim = self._cluster().sim
        assert sim is not None
        try:
            served = sim.vms()
        except Exception as exc:
            raise Abort(f"the simulator did not say its layout: {exc}") from exc
        units = {str(info["name"]).lower(): str(info["unit"]) for info in served.get("vms", [])}
        wanted = {vm.lower(): unit for vm, unit in self.layout.vm_units().items()}
        if units != wanted or served.get("delivery") != self.layout.delivery:
            raise Abort(f"the simulator's layout ({served.get('delivery')} delivery, units {units}) is not the run's "
                        f"({self.layout.describe()})")

    # -- the samplers --------------------------------------------------------------------------------------

    def _samplers(self) -> list[Sampler]:
        cluster = self._cluster()
        samplers = [Sampler(f"probe-{vm}", 0.1, self._probe_sampler(vm)) for vm in self.config.vms]
        samplers.append(Sampler("haproxy", 0.2, self._sample_haproxy))
        if self.config.admin_state:
            samplers.append(Sampler("admin-state", 0.15, self._admin_state_sampler()))
        samplers.append(Sampler("status", 1.0, self._sample_statuses))
        samplers.append(Sampler("supervisor", 0.1, self._supervise))
        assert cluster.sim is not None
        samplers.append(Sampler("imds-log", 0.25, self._tail_sim_log))
        return samplers

    def _probe_sampler(self, vm: str) -> Callable[[], None]:
        url = self._cluster().agents[vm].probe_url
        client = httpx.Client(timeout=0.3, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))

        def sample() -> None:
            sent = time.time()
            try:
                code: int | None = client.get(url).status_code
            except httpx.HTTPError:
                code = None
            with self._lock:
                self.probes.append(ProbeSample(vm, sent, time.time(), code))

        return sample

    def _sample_haproxy(self) -> None:
        haproxy = self._cluster().haproxy
        assert haproxy is not None
        t = time.time()
        text = haproxy.command(f"show servers state {haproxy.backend}", timeout=1.0)
        lines = [line for line in text.splitlines() if line.strip()]
        header = next((line.lstrip("# ").split() for line in lines if line.startswith("#")), None)
        if header is None:
            return
        rows = [dict(zip(header, line.split(), strict=False)) for line in lines if not line.startswith("#")]
        samples = [ServerSample(t, row["srv_name"], int(row["srv_op_state"]), int(row["srv_admin_state"]),
                                int(row.get("srv_uweight", "1"))) for row in rows if "srv_name" in row]
        with self._lock:
            self.servers.extend(samples)

    def _admin_state_sampler(self) -> Callable[[], None]:
        """Every VM's *effective* admin state (the data plane, not what ARM was last told) from ``GET
        /arm/pools`` of the simulator's control API, on a client of its own (short timeout, no other caller
        waiting behind it)."""
        cluster = self._cluster()
        assert cluster.sim is not None and self.admin_setup is not None
        control = SimControl(cluster.sim.url, timeout=1.0)
        self._closers.append(control.close)
        pool_id = self.admin_setup.pool_id

        def sample() -> None:
            t = time.time()
            pool = control.pools().get(pool_id, {})
            samples = [AdminStateSample(t, vm, str(state)) for vm, state in (pool.get("effective") or {}).items()]
            with self._lock:
                self.admin_states.extend(samples)

        return sample

    def _sample_statuses(self) -> None:
        cluster = self._cluster()
        client = self._status_client
        for vm, agent in list(cluster.agents.items()):
            proc = agent.proc
            if proc is None or proc.poll() is not None:
                continue
            t = time.time()
            try:
                response = client.get(agent.admin_url + "/status")
                body = response.json() if response.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                body = {}
            with self._lock:
                self.statuses.append(StatusSample(t, vm, proc.pid, body.get("cycles"), body.get("phase")))

    def _tail_sim_log(self) -> None:
        sim = self._cluster().sim
        assert sim is not None
        entries = sim.log(since=self._sim_seq)
        for entry in entries:
            self._sim_seq = max(self._sim_seq, int(entry["seq"]))
            kind = entry["kind"]
            if kind == "transition":
                label = next((k for k, v in self._labels.items() if v == entry["event_id"]), entry["event_id"][:8])
                self.say(f"imds: {label} {entry['event_type']} [{','.join(entry['resources'])}] "
                         f"{entry['from'] or 'new'} -> {entry['to'] or 'removed'} ({entry['reason']})")
            elif kind == "approval" and entry.get("event_ids"):
                self.say(f"imds: approval POST from {entry['vm']}: {entry.get('results')}")
            elif kind == "signal":
                self.say(f"imds: impact {entry['signal']} to the {entry['vm']} pid {entry['pid']} ({entry['result']})")

    # -- processes -------------------------------------------------------------------------------------------

    def _note_start(self, vm: str, started: float) -> None:
        proc = self._cluster().agents[vm].proc
        if proc is not None:
            with self._lock:
                self.processes.setdefault((vm, proc.pid), ProcessRecord(vm, proc.pid, started))

    def _note_exit(self, vm: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.poll()
        if code is None:
            return
        with self._lock:
            known = self.processes.get((vm, proc.pid))
            if known is not None and known.exited is None:
                self.processes[(vm, proc.pid)] = ProcessRecord(vm, proc.pid, known.started, time.time(), code)

    def _register(self, vm: str) -> None:
        """Tell the simulator which processes stand for ``vm`` (its impacts pause or kill them)."""
        cluster = self._cluster()
        assert cluster.sim is not None
        pids = [p.pid for p in (cluster.agents[vm].proc, cluster.apps.get(vm)) if p is not None and p.poll() is None]
        with contextlib.suppress(httpx.HTTPError, Exception):
            cluster.sim.register_pids(vm, pids)

    def _start_app(self, vm: str) -> None:
        if self._stopping.is_set():
            return
        cluster = self._cluster()
        app = cluster.apps.get(vm)
        if app is not None and app.poll() is not None:
            cluster.start_app(vm)
            self.record("restart", vm, cluster.apps[vm].pid, "app server")
            self._register(vm)

    def _start_agent(self, vm: str) -> None:
        """Bring ``vm`` back as a rebooted VM: its app server if it is down, then its agent, whose PID the
        simulator learns as soon as it exists (an impact during its start-up hits it)."""
        if self._stopping.is_set():
            return
        cluster = self._cluster()
        self._start_app(vm)
        before = time.time()

        def spawned(agent: Any) -> None:
            self._note_start(vm, before)
            self.record("restart", vm, agent.pid, "agent")
            self._register(vm)

        try:
            cluster.start_agent(vm, on_spawn=spawned)
        except (RuntimeError, TimeoutError) as exc:
            self.say(f"the agent of {vm} did not start: {exc}")
        agent_proc = cluster.agents[vm].proc
        if agent_proc is not None:
            self._note_exit(vm, agent_proc)

    def _supervise(self) -> None:
        """Notice agents that died (an impact killed the VM, or anything else), and bring the VM back after
        ``reboot_seconds`` unless a fault step holds it."""
        if self._stopping.is_set():
            return
        cluster = self._cluster()
        for vm in self.config.vms:
            with self._vm_locks[vm]:
                app = cluster.apps.get(vm)
                if app is not None and app.poll() is not None:
                    died = self._died_at.setdefault(f"app:{vm}", time.time())
                    if time.time() - died >= self.config.reboot_seconds:
                        self.say(f"{vm}'s app server comes back (pid {app.pid} ended with {app.returncode})")
                        self._start_app(vm)
                        self._died_at.pop(f"app:{vm}", None)
                proc = cluster.agents[vm].proc
                if proc is None or proc.poll() is None:
                    self._died_at.pop(vm, None)
                    continue
                self._note_exit(vm, proc)
                if vm in self._busy:
                    continue
                died = self._died_at.setdefault(vm, time.time())
                if time.time() - died < self.config.reboot_seconds:
                    continue
                self.say(f"{vm} comes back: restarting its agent (pid {proc.pid} ended with {proc.returncode})")
                self._start_agent(vm)
                self._died_at.pop(vm, None)

    # -- tear-down -------------------------------------------------------------------------------------------

    def _shutdown(self) -> tuple[list[dict[str, Any]], list[LogLine]]:
        """Let the fault steps end (they wait on the stop event), stop the agents (SIGTERM, recorded), then
        read the simulator's log and the agents' logs."""
        for thread in self._step_threads:
            thread.join(60)
        cluster = self.cluster
        if cluster is None:
            return [], []
        for vm, agent in cluster.agents.items():
            proc = agent.proc
            if proc is not None and proc.poll() is None:
                self.record("sigterm", vm, proc.pid)
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for vm, agent in cluster.agents.items():
            proc = agent.proc
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            self._note_exit(vm, proc)
        sim_log: list[dict[str, Any]] = []
        if cluster.sim is not None:
            with contextlib.suppress(Exception):
                sim_log = cluster.sim.log()
        logs: list[LogLine] = []
        for vm, agent in cluster.agents.items():
            logs.extend(read_agent_log(vm, agent.log_path))
        return sim_log, logs

    def _stop_everything(self) -> None:
        self._status_client.close()
        self._arm_http.close()
        for close in self._closers:
            with contextlib.suppress(Exception):
                close()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
        for link in self.links.values():
            link.stop()
        if self._own_ensemble:
            self.ensemble.stop()
        else:
            for index, server in enumerate(self.ensemble.servers):
                if not server.running:
                    with contextlib.suppress(RuntimeError):
                        self.ensemble.restart(index, timeout=45)
