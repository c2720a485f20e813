"""One maintenance story, played on a local group under one of three strategies, and measured.

The group: three VMs, each an app server behind a real HAProxy whose health check is that VM's probe, a
steady load through HAProxy, and the IMDS simulator with real impacts (a Freeze pauses the VM's app
server and agent; a Reboot, Redeploy or Preempt kills them, and the VM comes back after a while: the
story restarts both when the simulator logs the VM ``back``). The events, one step after the other,
each announced as the previous one ends:

1. ``freeze``: a live-migration Freeze on vm0 and vm1 (15 minutes of notice);
2. ``reboot``: a platform Reboot rolling through the group one VM after another, one fault domain per
   VM, the next announced as the previous ends (the simulator's rollout; 15 minutes of notice each);
3. ``redeploy``: a user-initiated Redeploy of vm2 (10 minutes);
4. ``preempt``: a Preempt of vm1 with 30 s of notice.

Strategies: ``coordinated`` (the agents of this product), ``self-approve`` and ``wait`` (the baseline
agents of ``coordinator.testbed.baselines``). Every strategy drains the same way: the probe fails, then
``drain_wait`` seconds pass.

Time: notices run ``time_scale`` times faster (the simulator's clock); impacts are given in real seconds
(``freeze_seconds``, ``down_seconds``) and scaled into the simulator's clock, so the load meets them at
their real length; the drain, the load balancer and the load are real time. Every time this module
reports is read from the simulator's log (``t``: wall clock; ``sim_t``: the simulated clock).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.processes import stop_process
from coordinator.testbed.traffic import LoadGenerator

__all__ = ["STEPS", "STRATEGIES", "EventOutcome", "StoryConfig", "StoryOutcome", "report", "run_story", "summarize"]

STRATEGIES = ("coordinated", "self-approve", "wait")
STEPS = ("freeze", "reboot", "redeploy", "preempt")
VMS = ("vm0", "vm1", "vm2")


@dataclass(frozen=True)
class StoryConfig:
    time_scale: float = 60.0
    steps: tuple[str, ...] = STEPS
    reboot_vms: tuple[str, ...] = VMS  # the rollout's VMs, one per step
    drain_wait: float = 1.5  # HAProxy marks a server down after 2 failed checks 0.5 s apart
    freeze_seconds: float = 3.0  # real seconds a Freeze pauses the VM
    down_seconds: float = 2.0  # real seconds a killed VM stays down
    rate: float = 20.0  # requests per second through HAProxy
    request_timeout: float = 2.0  # a request not answered 200 within this has failed
    settle_seconds: float = 3.0  # failures this long after an event's removal still count for it
    poll_interval: float = 0.5
    timeout: float = 300.0  # give up on the story after this many real seconds


@dataclass
class EventOutcome:
    step: str
    event_type: str
    event_id: str
    resources: list[str]
    created_t: float
    created_sim_t: float
    not_before: float | None  # simulated epoch seconds
    started_t: float | None = None
    started_sim_t: float | None = None
    start_reason: str | None = None
    removed_t: float | None = None
    approved_by: list[str] = field(default_factory=list)
    failed: int = 0
    failed_during_impact: int = 0

    @property
    def notice(self) -> float:
        """The notice the event gave, in simulated seconds."""
        return (self.not_before or self.created_sim_t) - self.created_sim_t

    @property
    def to_start(self) -> float | None:
        """Simulated seconds from the notice to the start."""
        return None if self.started_sim_t is None else self.started_sim_t - self.created_sim_t

    @property
    def reclaimed(self) -> float:
        """Simulated seconds of notice reclaimed: NotBefore minus the start."""
        if self.not_before is None or self.started_sim_t is None:
            return 0.0
        return max(0.0, self.not_before - self.started_sim_t)

    def view(self) -> dict[str, Any]:
        return {**asdict(self), "notice": self.notice, "to_start": self.to_start, "reclaimed": self.reclaimed}


@dataclass
class StoryOutcome:
    strategy: str
    time_scale: float
    sent: int = 0
    failed: int = 0
    failed_outside_events: int = 0
    started_t: float = 0.0
    started_sim_t: float = 0.0
    ended_t: float | None = None
    ended_sim_t: float | None = None
    events: list[EventOutcome] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)  # the simulator's approval entries
    drained_before_start: dict[str, bool] = field(default_factory=dict)  # event id -> every named VM out first

    @property
    def story_sim_seconds(self) -> float | None:
        return None if self.ended_sim_t is None else self.ended_sim_t - self.started_sim_t

    @property
    def story_real_seconds(self) -> float | None:
        return None if self.ended_t is None else self.ended_t - self.started_t

    def view(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "time_scale": self.time_scale, "sent": self.sent, "failed": self.failed,
                "failed_outside_events": self.failed_outside_events, "story_sim_seconds": self.story_sim_seconds,
                "story_real_seconds": self.story_real_seconds, "events": [e.view() for e in self.events],
                "approvals": self.approvals, "drained_before_start": self.drained_before_start}


class _Vms:
    """Starts and restarts what stands for each VM: its app server and its agent (real or baseline)."""

    def __init__(self, cluster: LocalCluster, strategy: str, config: StoryConfig) -> None:
        self._cluster = cluster
        self._strategy = strategy
        self._config = config
        self.baselines: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, vm: str, *, restart: bool) -> None:
        cluster = self._cluster
        assert cluster.sim is not None
        if restart:
            cluster.apps[vm].poll()  # collect the killed process
            cluster.start_app(vm)
        if self._strategy == "coordinated":
            if restart:
                old = cluster.agents[vm].proc
                if old is not None:
                    old.poll()
                cluster.start_agent(vm)
            agent_pid = cluster.agents[vm].pid
        else:
            if vm in self.baselines:
                self.baselines[vm].poll()
            log = open(cluster.workdir / f"baseline-{vm}.log", "ab")  # noqa: SIM115 - owned by the child
            self.baselines[vm] = subprocess.Popen(
                [sys.executable, "-m", "coordinator.testbed.baselines", "--vm", vm, "--imds", cluster.imds_urls[vm],
                 "--probe-port", str(cluster.probe_port(vm)), "--strategy", self._strategy,
                 "--drain-wait", str(self._config.drain_wait), "--poll-interval", str(self._config.poll_interval)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            agent_pid = self.baselines[vm].pid
        pids = [cluster.apps[vm].pid]
        if agent_pid is not None:
            pids.append(agent_pid)
        cluster.sim.register_pids(vm, pids)

    def stop(self) -> None:
        for proc in self.baselines.values():
            stop_process(proc, timeout=5)

    def probe(self, vm: str) -> int | None:
        if self._strategy == "coordinated":
            return self._cluster.agents[vm].probe()
        import httpx  # the baselines have no agent object; ask their probe directly

        try:
            return httpx.get(f"http://127.0.0.1:{self._cluster.probe_port(vm)}/health", timeout=1.0,
                             trust_env=False).status_code
        except httpx.HTTPError:
            return None


def make_cluster(workdir: Path, strategy: str, config: StoryConfig, zk_hosts: str | None = None) -> LocalCluster:
    """The group for one run: probe-only drains (the same for every strategy), the scaled simulator."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
    scale = config.time_scale
    return LocalCluster(
        workdir, VMS, cluster=f"story{uuid.uuid4().hex[:8]}", zk_hosts=zk_hosts, drain_wait=config.drain_wait,
        poll_interval=config.poll_interval, started_for=1.0 * scale, with_haproxy=True, haproxy_action=False,
        with_agents=strategy == "coordinated",
        sim_args=["--time-scale", f"{scale:g}", "--not-before-clock", "real", "--fault-domains", str(len(VMS))],
        extra_config={"drain": {"wait_seconds_by_type": {"Preempt": config.drain_wait},
                                "return_wait_seconds": 1.0, "gone_after_seconds": 1.0}},
    )


def run_story(workdir: Path, strategy: str, config: StoryConfig = StoryConfig(), *,
              zk_hosts: str | None = None, progress: Callable[[str], None] = lambda _: None) -> StoryOutcome:
    """Start a group, play the story under ``strategy``, stop every process started; returns the outcome.

    Raises ``TimeoutError`` if the story does not end within ``config.timeout`` real seconds."""
    cluster = make_cluster(workdir, strategy, config, zk_hosts)
    cluster.start(on_step=lambda step: progress(f"{strategy}: {step}"))
    vms = _Vms(cluster, strategy, config)
    assert cluster.haproxy is not None and cluster.sim is not None
    load = LoadGenerator(cluster.haproxy.frontend_url, config.rate, timeout=config.request_timeout)
    try:
        for vm in VMS:
            vms.start(vm, restart=False)
        cluster.wait(lambda: all(vms.probe(vm) == 200 for vm in VMS), 60, "every VM serving")
        cluster.wait(lambda: all(cluster.haproxy.status(vm) == "UP" for vm in VMS),  # type: ignore[union-attr]
                     30, "HAProxy routing to every VM")
        load.start()
        time.sleep(1.0)  # a little steady state first
        outcome = _play(cluster, vms, load, strategy, config, progress)
        time.sleep(1.0)
        load.stop()
        _account(outcome, cluster, load, config)
        return outcome
    finally:
        load.stop()
        vms.stop()
        cluster.stop()


def _play(cluster: LocalCluster, vms: _Vms, load: LoadGenerator, strategy: str, config: StoryConfig,
          progress: Callable[[str], None]) -> StoryOutcome:
    sim = cluster.sim
    assert sim is not None
    scale = config.time_scale
    impact = {"freeze": config.freeze_seconds * scale, "kill": config.down_seconds * scale}
    outcome = StoryOutcome(strategy, scale, started_t=time.time(), started_sim_t=sim.now())
    since = sim.log()[-1]["seq"] if sim.log() else 0
    steps = list(config.steps)
    current: str | None = None
    rollout: int | None = None
    pending: set[str] = set()  # ids of the current step's events not yet removed
    by_id: dict[str, EventOutcome] = {}
    deadline = time.monotonic() + config.timeout
    next_line = time.monotonic() + 1.0
    load.take_window()

    def begin(step: str) -> None:
        nonlocal rollout
        if step == "freeze":
            view = sim.schedule("Freeze", ["vm0", "vm1"], impact_seconds=impact["freeze"])
        elif step == "reboot":
            created = sim.rollout("Reboot", groups=[[vm] for vm in config.reboot_vms], impact_seconds=impact["kill"])
            rollout, view = created["rollout"], created["event"]
        elif step == "redeploy":
            view = sim.schedule("Redeploy", ["vm2"], source="User", impact_seconds=impact["kill"])
        elif step == "preempt":
            view = sim.schedule("Preempt", ["vm1"], impact_seconds=impact["kill"])
        else:
            raise ValueError(f"unknown step {step!r}")
        pending.add(view["event_id"])
        progress(f"{strategy}: {step}: {view['event_type']} {view['event_id']} on {','.join(view['resources'])}, "
                 f"NotBefore in {view['not_before'] - view['created_at']:.0f} s (simulated)")

    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the story under {strategy} did not end within {config.timeout:.0f} s")
        if current is None or (not pending and (rollout is None or _rollout_done(sim, rollout))):
            if not steps:
                break
            current, rollout = steps.pop(0), None
            begin(current)
        entries = sim.log(since=since)
        if entries:
            since = entries[-1]["seq"]
        for entry in entries:
            if entry["kind"] == "transition":
                eid = entry["event_id"]
                if entry["from"] is None:
                    view = sim.event(eid) or {}
                    pending.add(eid)
                    by_id[eid] = EventOutcome(current or "?", entry["event_type"], eid, entry["resources"],
                                              entry["t"], entry["sim_t"], view.get("not_before"))
                    outcome.events.append(by_id[eid])
                elif entry["to"] == "Started" and eid in by_id:
                    by_id[eid].started_t, by_id[eid].started_sim_t = entry["t"], entry["sim_t"]
                    by_id[eid].start_reason = entry["reason"]
                elif entry["to"] is None and eid in by_id:
                    by_id[eid].removed_t = entry["t"]
                    pending.discard(eid)
            elif entry["kind"] == "back":
                progress(f"{strategy}: {entry['vm']} is back from {entry['event_id']}: restarting its app and agent")
                vms.start(entry["vm"], restart=True)
        if time.monotonic() >= next_line:
            next_line += 1.0
            progress(_line(cluster, vms, sim.events().get("events", []), load, outcome))
        time.sleep(0.1)
    cluster.wait(lambda: all(vms.probe(vm) == 200 for vm in VMS), 60, "every VM serving again")
    cluster.wait(lambda: all(cluster.haproxy.status(vm) == "UP" for vm in VMS),  # type: ignore[union-attr]
                 30, "HAProxy routing to every VM again")
    outcome.ended_t, outcome.ended_sim_t = time.time(), sim.now()
    progress(f"{strategy}: story over: every event gone, every VM back in rotation")
    return outcome


def _rollout_done(sim: Any, rollout: int) -> bool:
    return any(r["rollout"] == rollout and r["done"] for r in sim.rollouts())


def _line(cluster: LocalCluster, vms: _Vms, events: Sequence[dict[str, Any]], load: LoadGenerator,
          outcome: StoryOutcome) -> str:
    window = load.take_window()
    cells = []
    for vm in VMS:
        probe = vms.probe(vm)
        lb = cluster.haproxy.status(vm) if cluster.haproxy is not None else "?"
        cells.append(f"{vm} probe {probe or 'down'} lb {lb or '?'} {window.get(vm, 0)}/s")
    now = time.time()
    evs = ", ".join(f"{e['event_type']} {e['status']} on {','.join(e['resources'])}"
                    + (f" approved by {','.join(e['approved_by'])}" if e["approved_by"] else "") for e in events)
    return (f"[{outcome.strategy} {now - outcome.started_t:5.1f}s] {' | '.join(cells)} "
            f"| errors {window.get('error', 0)} | {evs or 'no event'}")


def _account(outcome: StoryOutcome, cluster: LocalCluster, load: LoadGenerator, config: StoryConfig) -> None:
    """Requests, failures per event, approvals, and whether every named VM was out of rotation at the start."""
    assert cluster.sim is not None
    outcome.sent, outcome.failed = load.sent, len(load.failures)
    outcome.approvals = [e for e in cluster.sim.log(kind="approval") if e.get("accepted")]
    for event in outcome.events:
        event.approved_by = sorted({a["vm"] for a in outcome.approvals if event.event_id in a["accepted"]})
    for sent_at, _ in load.failures:
        owner = None
        for event in outcome.events:
            end = (event.removed_t or sent_at) + config.settle_seconds
            if event.created_t <= sent_at <= end:
                owner = event  # the latest event whose window holds it
        if owner is None:
            outcome.failed_outside_events += 1
            continue
        owner.failed += 1
        if owner.started_t is not None and owner.started_t <= sent_at <= (owner.removed_t or sent_at):
            owner.failed_during_impact += 1
    outcome.drained_before_start = {e.event_id: e.notice / config.time_scale >= config.drain_wait
                                    for e in outcome.events}


# -- the report ---------------------------------------------------------------------------------------------


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per strategy, over runs (``StoryOutcome.view()`` dicts): medians and ranges of the headline figures."""
    out: dict[str, dict[str, Any]] = {}
    for strategy in STRATEGIES:
        mine = [r for r in runs if r["strategy"] == strategy]
        if not mine:
            continue
        figures: dict[str, list[float]] = {"sent": [], "failed": [], "story_sim_seconds": [], "story_real_seconds": [],
                                           "reclaimed_sim_seconds": [], "approved_early": []}
        per_step: dict[str, dict[str, list[float]]] = {}
        for r in mine:
            figures["sent"].append(r["sent"])
            figures["failed"].append(r["failed"])
            figures["story_sim_seconds"].append(r["story_sim_seconds"])
            figures["story_real_seconds"].append(r["story_real_seconds"])
            figures["reclaimed_sim_seconds"].append(sum(e["reclaimed"] for e in r["events"]))
            figures["approved_early"].append(sum(1 for e in r["events"] if e["start_reason"] == "approved"))
            for e in r["events"]:
                step = per_step.setdefault(e["step"], {"failed": [], "to_start": [], "notice": [], "events": []})
                step["failed"].append(e["failed"])
                step["to_start"].append(e["to_start"] if e["to_start"] is not None else float("nan"))
                step["notice"].append(e["notice"])
        out[strategy] = {
            "runs": len(mine),
            **{k: _stats(v) for k, v in figures.items()},
            "events": len(mine[0]["events"]),
            "steps": {name: {"failed": _stats(_per_run(v["failed"], len(mine))),
                             "to_start": _stats(v["to_start"]), "notice": _stats(v["notice"])}
                      for name, v in per_step.items()},
        }
    return out


def _per_run(values: list[float], runs: int) -> list[float]:
    """Per-event values summed per run (a step of several events, e.g. the rollout)."""
    per = len(values) // runs if runs else 0
    if per <= 1:
        return values
    return [sum(values[i * per:(i + 1) * per]) for i in range(runs)]


def _stats(values: Sequence[float]) -> dict[str, float]:
    clean = [float(v) for v in values if v == v]
    if not clean:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(clean), "min": min(clean), "max": max(clean)}


def _fig(stats: dict[str, float], digits: int = 0, unit: str = "") -> str:
    med, lo, hi = (f"{stats[k]:.{digits}f}" for k in ("median", "min", "max"))
    return f"{med}{unit}" if lo == hi else f"{med}{unit} ({lo}-{hi})"


def _ratio(value: float, reference: float) -> str:
    if reference == 0:
        return "-" if value == 0 else "∞"
    return f"{value / reference:.1f} x"


def report(summary: dict[str, dict[str, Any]], steps: Sequence[str] = STEPS) -> str:
    """The headline table (Markdown): one row per strategy, medians with (min-max) when runs differ."""
    head = ("| strategy | runs | requests sent | failed | " + " | ".join(f"failed: {s}" for s in steps)
            + " | notice -> start, per step (simulated s, median) | story (simulated min) | story (real s) "
            "| notice reclaimed vs wait (simulated min) | events approved early |")
    lines = [head, "|" + "---|" * (9 + len(steps))]
    for strategy, s in summary.items():
        to_start = ", ".join(f"{name} {s['steps'][name]['to_start']['median']:.0f}" for name in steps
                             if name in s["steps"])
        sim_min = {k: v / 60 for k, v in s["story_sim_seconds"].items()}
        reclaimed = {k: v / 60 for k, v in s["reclaimed_sim_seconds"].items()}
        lines.append(
            f"| {strategy} | {s['runs']} | {_fig(s['sent'])} | {_fig(s['failed'])} | "
            + " | ".join(_fig(s["steps"][name]["failed"]) if name in s["steps"] else "-" for name in steps)
            + f" | {to_start} | {_fig(sim_min, 1)} | {_fig(s['story_real_seconds'], 1)} | {_fig(reclaimed, 1)} | "
            f"{_fig(s['approved_early'])} of {s['events']} |")
    if "coordinated" in summary:
        ref = summary["coordinated"]
        lines += ["", "Ratios to `coordinated` (medians):", "",
                  "| strategy | failed requests | story time | notice reclaimed |", "|---|---|---|---|"]
        for strategy, s in summary.items():
            lines.append(f"| {strategy} | {_ratio(s['failed']['median'], ref['failed']['median'])} | "
                         f"{_ratio(s['story_sim_seconds']['median'], ref['story_sim_seconds']['median'])} | "
                         f"{_ratio(s['reclaimed_sim_seconds']['median'], ref['reclaimed_sim_seconds']['median'])} |")
    return "\n".join(lines)
