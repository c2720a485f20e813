"""One chaos run from start to verdict, and ``run_chaos``, its entry point.

``ChaosRun.execute`` starts the processes and the observers, waits until every VM serves, starts the
load, plays the plan, heals and settles, stops everything whatever happens, and hands what was recorded
to the oracle. ``run_chaos`` runs one seed and says the verdict, with its statistics and, for each
violation, its timeline.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.testbed.zookeeper import LocalEnsemble
from tests.chaos.faults import FaultSteps
from tests.chaos.observers import LoadGenerator, ZooKeeperRecorder
from tests.chaos.planning import ChaosConfig
from tests.chaos.result import RunResult
from tests.chaos.state import Abort, Clock
from tests.oracle import LogLine, Observations, OracleSettings, Verdict, check, dump
from tests.oracle.history import KINDS, from_txn_log

__all__ = ["ZK_ROOT", "ChaosRun", "run_chaos"]

ZK_ROOT = "/azure-maintenance"
_DEFAULT_CONFIG = ChaosConfig()


class ChaosRun(FaultSteps):
    """One run for a seed: set up, the plan played, healed, stopped, judged by the oracle."""

    def execute(self) -> RunResult:
        started = time.monotonic()
        self._say(f"[seed {self.seed}] plan: ZooKeeper tickTime {self.tick_ms} ms (agents ask a "
                  f"{self.config.session_timeout:g} s session, the servers grant {self.session_granted_ms} ms)"
                  + ("; the agents drain through the load balancer's admin state and their probe"
                     if self.config.admin_state else "")
                  + f"; delivery layout {self.layout.describe()}")
        for step in self.steps:
            self._say(f"[seed {self.seed}] plan t={step.at:5.1f}s {step.describe()}")
        verdict: Verdict | None = None
        error: str | None = None
        recorders: list[Any] = []
        load: LoadGenerator | None = None
        zk_recorder: ZooKeeperRecorder | None = None
        healed_at: float | None = None
        sim_log: list[dict[str, Any]] = []
        logs: list[LogLine] = []
        try:
            self._start()
            cluster = self._cluster()
            assert cluster.haproxy is not None
            zk_recorder = ZooKeeperRecorder(self.ensemble.hosts, f"{ZK_ROOT}/{self.cluster_name}")
            zk_recorder.start()
            recorders = self._samplers()
            for sampler in recorders:
                sampler.start()
            self._wait(lambda: self._all_back(), 40, "every VM serving and UP in HAProxy before the story")
            load = LoadGenerator(cluster.haproxy.frontend_url, self.config.rate)
            load.start()
            self.clock = Clock()
            self.say(f"story begins: {len(self.config.vms)} VMs, load {self.config.rate:g} requests/s")
            self._play(zk_recorder)
            healed_at = self._heal_and_settle()
        except Abort as exc:
            error = str(exc)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self._stopping.set()
            if load is not None:
                load.stop()
            for sampler in recorders:
                sampler.stop()
            if zk_recorder is not None:
                zk_recorder.stop()
            try:
                sim_log, logs = self._shutdown()
            finally:
                self._stop_everything()
        if error is not None:
            self.say(f"run could not be completed: {error}")
        if self.cluster is not None and sim_log:
            observations = Observations(
                # What the agents were configured with (``LocalCluster.agent_config``), for the liveness bounds.
                settings=OracleSettings(agent_vms=self.config.vms, drain_wait_seconds=self.config.drain_wait,
                                        recovery_bound_seconds=self.config.recovery_bound,
                                        poll_interval_seconds=self.config.poll_interval,
                                        imds_backoff_seconds=max(2.0, self.config.poll_interval),
                                        session_lapse_seconds=(self.session_granted_ms + self.tick_ms) / 1000.0,
                                        arm_deadline_seconds=self._arm_deadline(),
                                        # Which events IMDS showed each VM, and which agents were told so.
                                        layout=self.layout.name, units=self.layout.vm_units(),
                                        delivery=self.layout.delivery,
                                        told_vms=self.config.vms if self.layout.told else ()),
                started_at=self.clock.origin, ended_at=time.time(), healed_at=healed_at,
                sim_log=sim_log, nodes=zk_recorder.sightings() if zk_recorder else [],
                probes=sorted(self.probes, key=lambda s: s.t), servers=self.servers,
                requests=sorted(load.samples, key=lambda s: s.t) if load else [],
                harness=sorted(self.harness, key=lambda r: r.t), processes=list(self.processes.values()),
                statuses=self.statuses, agent_logs=logs, zk_blind=zk_recorder.blind() if zk_recorder else [],
                admin_states=sorted(self.admin_states, key=lambda s: s.t),
            )
            # Node history from the ensemble's transaction logs (the recorder's first sightings kept).
            observations = from_txn_log(observations, self.ensemble.data_dir,
                                        chroot=f"{ZK_ROOT}/{self.cluster_name}", kinds=KINDS)
            verdict = check(observations)
            with contextlib.suppress(OSError):
                (self.workdir / "observations.json").write_text(dump(observations))
                (self.workdir / "verdict.txt").write_text(verdict.render(self.clock.origin) + "\n")
            if error is None and healed_at is None:
                error = "the run ended before every fault was healed and every event was gone"
        return RunResult(self.seed, self.steps, self.clock.origin, time.monotonic() - started, verdict, error,
                         self.workdir, tick_time_ms=self.tick_ms, session_granted_ms=self.session_granted_ms,
                         faults=dict(self.faults), faults_skipped=dict(self.faults_skipped),
                         link_faults=list(self.link_faults), admin_state=self.config.admin_state,
                         arm_faults=list(self.arm_faults), layout=self.layout.to_json())

    def _arm_deadline(self) -> float:
        """The agents' azure-lb action deadline as the group configured it (the oracle's default without one)."""
        cluster = self.cluster
        if cluster is not None and self.config.admin_state:
            for action in cluster.agent_config(self.config.vms[0], 0, 0).get("actions", []):
                if action.get("type") == "azure-lb" and action.get("deadline_seconds") is not None:
                    return float(action["deadline_seconds"])
        return float(OracleSettings.arm_deadline_seconds)


def run_chaos(seed: int, config: ChaosConfig = _DEFAULT_CONFIG, *, workdir: Path | None = None,
              say: Callable[[str], None] = print, ensemble: LocalEnsemble | None = None) -> RunResult:
    """One run for ``seed``: returns the plan, the oracle's verdict, or why the run could not be done."""
    directory = workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    result = ChaosRun(seed, config, directory, say, ensemble).execute()
    verdict = result.verdict
    head = f"[seed {seed}] verdict after {result.wall_seconds:.0f}s: "
    if verdict is not None:
        stats = verdict.stats
        say(head + ("OK, no violation" if verdict.ok else f"{len(verdict.violations)} VIOLATION(S)")
            + f" | events {stats['events']}, approved early {stats['approved_early']}, started at NotBefore "
            f"{stats['started_at_not_before']}, without notice {stats['started_without_notice']}, cancelled "
            f"{stats['cancelled']} | requests {stats['requests']}, failed {stats['requests_failed']} "
            f"(events without notice {stats['requests_failed_without_notice']}, other "
            f"{stats['requests_failed_other']})")
        judged = stats.get("liveness") or {}
        outcomes, causes = judged.get("outcomes") or {}, judged.get("misses_by_cause") or {}
        say(f"[seed {seed}] liveness: {outcomes.get('allowable', 0)} event(s) allowable, "
            f"{outcomes.get('approved in time', 0)} approved within the bound; misses: "
            + (", ".join(f"{cause} {n}" for cause, n in sorted(causes.items())) or "none"))
        if not verdict.ok:
            say(verdict.render(result.origin))
    if result.layout:
        layout = result.layout
        say(f"[seed {seed}] delivery layout {layout['name']}, {layout['delivery']} delivery, agents "
            + ("told their unit" if layout["told"] else "at the default delivery"))
    if result.faults or result.faults_skipped:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(result.faults_skipped.items()))
        say(f"[seed {seed}] faults carried out (tickTime {result.tick_time_ms} ms): "
            + ", ".join(f"{k} {v}" for k, v in sorted(result.faults.items()))
            + (f" | skipped: {skipped}" if skipped else ""))
    if result.error:
        say(head + f"ERROR: {result.error}")
    return result
