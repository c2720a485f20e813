"""One maintenance story, played on a local group under one of four strategies, and measured.

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

Strategies: ``coordinated`` (the agents of this product, draining through the probe), ``admin-state``
(the same agents, also setting their VM's address ``Down`` in the load balancer's backend pool through the
simulated ARM, which drives HAProxy: an effective ``Down`` drains the VM's HAProxy server), ``self-approve``
and ``wait`` (the baseline agents of ``coordinator.testbed.baselines``). Every probe drain is the same: the
probe fails, then ``drain_wait`` seconds pass. ``admin-state`` waits ``admin_drain_wait`` instead: its drain
job ends once ARM reports the write succeeded, when HAProxy already drains the server, so its wait need not
cover the probe's lag (HAProxy's checks: 2 failures 0.5 s apart).

What HAProxy did is observed too (``coordinator.testbed.rotation``): when each VM named by an event left
rotation (``DOWN``: its probe; ``DRAIN``: admin state) after the notice.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator.testbed.cluster import AdminStateDrain, LocalCluster
from coordinator.testbed.processes import stop_process
from coordinator.testbed.rotation import Change, RotationWatch, out_of_rotation_since
from coordinator.testbed.traffic import LoadGenerator
from coordinator.testbed.waiting import wait_until

__all__ = ["AGENT_STRATEGIES", "STEPS", "STRATEGIES", "EventOutcome", "StoryConfig", "StoryOutcome", "drain_report",
           "report", "run_story", "summarize"]

STRATEGIES = ("coordinated", "admin-state", "self-approve", "wait")
AGENT_STRATEGIES = ("coordinated", "admin-state")  # this product's agents; the others are baselines
STEPS = ("freeze", "reboot", "redeploy", "preempt")
VMS = ("vm0", "vm1", "vm2")


@dataclass(frozen=True)
class StoryConfig:
    time_scale: float = 60.0
    steps: tuple[str, ...] = STEPS
    reboot_vms: tuple[str, ...] = VMS  # the rollout's VMs, one per step
    drain_wait: float = 1.5  # HAProxy marks a server down after 2 failed checks 0.5 s apart
    # admin-state: the write is effective (HAProxy drains) before the drain job returns; the wait only lets
    # requests already sent to the VM be answered (milliseconds), with room for a slow HAProxy command.
    admin_drain_wait: float = 0.5
    arm_async_seconds: float = 0.5  # the simulated ARM completes a write this long after the PUT
    freeze_seconds: float = 3.0  # real seconds a Freeze pauses the VM
    down_seconds: float = 2.0  # real seconds a killed VM stays down
    rate: float = 20.0  # requests per second through HAProxy
    request_timeout: float = 2.0  # a request not answered 200 within this has failed
    settle_seconds: float = 3.0  # failures this long after an event's removal still count for it
    poll_interval: float = 0.5
    timeout: float = 300.0  # give up on the story after this many real seconds


def drain_wait_of(strategy: str, config: StoryConfig) -> float:
    return config.admin_drain_wait if strategy == "admin-state" else config.drain_wait


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
    drained_t: float | None = None  # every named VM out of HAProxy's rotation (wall clock), if before the start
    drained_by: list[str] = field(default_factory=list)  # the HAProxy status that took each one out
    # Why it was not approved yet, as its approver (or, with none, the leader) last said in ``/status``
    # while it was Scheduled: who said it, and its reasons.
    waited_by: str | None = None
    waited_for: list[str] = field(default_factory=list)

    @property
    def held_by(self) -> str:
        """What held it back, as last said: "vmN: reason; reason", or that no agent said."""
        return f"{self.waited_by}: {'; '.join(self.waited_for)}" if self.waited_by else "no agent recorded why"

    @property
    def missed(self) -> bool:
        """Started at its NotBefore although the policy allowed an early start: not approved, and the
        last reasons recorded for it did not begin with the policy's own (``policy: ... never approved
        early``)."""
        policy = bool(self.waited_for) and self.waited_for[0].startswith("policy:")
        return self.start_reason == "not_before" and not policy

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

    @property
    def to_drained(self) -> float | None:
        """Real seconds from the notice until HAProxy sent no new request to any VM the event names."""
        return None if self.drained_t is None else self.drained_t - self.created_t

    @property
    def to_start_real(self) -> float | None:
        """Real seconds from the notice to the start."""
        return None if self.started_t is None else self.started_t - self.created_t

    def view(self) -> dict[str, Any]:
        return {**asdict(self), "notice": self.notice, "to_start": self.to_start, "reclaimed": self.reclaimed,
                "to_drained": self.to_drained, "to_start_real": self.to_start_real, "held_by": self.held_by,
                "missed": self.missed}


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
    pool_at_end: dict[str, str] = field(default_factory=dict)  # admin-state: each address's effective state
    data_plane: dict[str, Any] | None = None  # admin-state: the simulator's HAProxy commands, applied and failed

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
                "approvals": self.approvals, "drained_before_start": self.drained_before_start,
                "pool_at_end": self.pool_at_end, "left_down": self.left_down, "data_plane": self.data_plane}

    @property
    def left_down(self) -> list[str]:
        """Addresses whose effective admin state was still ``Down`` when the story ended."""
        return sorted(vm for vm, state in self.pool_at_end.items() if state == "Down")


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
        if self._strategy in AGENT_STRATEGIES:
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
        if self._strategy in AGENT_STRATEGIES:
            return self._cluster.agents[vm].probe()
        import httpx  # the baselines have no agent object; ask their probe directly

        try:
            return httpx.get(f"http://127.0.0.1:{self._cluster.probe_port(vm)}/health", timeout=1.0,
                             trust_env=False).status_code
        except httpx.HTTPError:
            return None


def make_cluster(workdir: Path, strategy: str, config: StoryConfig, zk_hosts: str | None = None) -> LocalCluster:
    """The group for one run: probe drains (every strategy), plus admin state through the simulated ARM
    driving HAProxy for ``admin-state`` (a drain that cannot reach ARM falls back to the probe's wait)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
    scale = config.time_scale
    wait = drain_wait_of(strategy, config)
    admin = AdminStateDrain(arm_async_seconds=config.arm_async_seconds, fallback_wait=config.drain_wait) \
        if strategy == "admin-state" else None
    return LocalCluster(
        workdir, VMS, cluster=f"story{uuid.uuid4().hex[:8]}", zk_hosts=zk_hosts, drain_wait=wait,
        poll_interval=config.poll_interval, started_for=1.0 * scale, with_haproxy=True, haproxy_action=False,
        with_agents=strategy in AGENT_STRATEGIES, admin_state=admin,
        sim_args=["--time-scale", f"{scale:g}", "--not-before-clock", "real", "--fault-domains", str(len(VMS))],
        extra_config={"drain": {"wait_seconds_by_type": {"Preempt": wait},
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
    watch = RotationWatch(cluster.haproxy.statuses)
    try:
        for vm in VMS:
            vms.start(vm, restart=False)
        cluster.wait(lambda: all(vms.probe(vm) == 200 for vm in VMS), 60, "every VM serving")
        cluster.wait(lambda: all(cluster.haproxy.status(vm) == "UP" for vm in VMS),  # type: ignore[union-attr]
                     30, "HAProxy routing to every VM")
        watch.start()
        load.start()
        time.sleep(1.0)  # a little steady state first
        outcome = _play(cluster, vms, load, strategy, config, progress)
        time.sleep(1.0)
        load.stop()
        watch.stop()
        _account(outcome, cluster, load, config)
        _account_rotation(outcome, watch.changes)
        return outcome
    finally:
        watch.stop()
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
            if strategy == "coordinated":
                _note_waits(cluster, by_id)
        time.sleep(0.1)
    cluster.wait(lambda: all(vms.probe(vm) == 200 for vm in VMS), 60, "every VM serving again")
    if strategy == "admin-state":
        # Recorded, not raised: a VM left Down is a result to report (HAProxy's wait below then fails too).
        wait_until(lambda: "Down" not in cluster.pool_effective().values(), 30, interval=0.1)
        outcome.pool_at_end = cluster.pool_effective()
        outcome.data_plane = sim.arm_calls().get("data_plane")
        if outcome.left_down:
            progress(f"{strategy}: left Down in the pool: {', '.join(outcome.left_down)}")
    cluster.wait(lambda: all(cluster.haproxy.status(vm) == "UP" for vm in VMS),  # type: ignore[union-attr]
                 30, "HAProxy routing to every VM again")
    outcome.ended_t, outcome.ended_sim_t = time.time(), sim.now()
    progress(f"{strategy}: story over: every event gone, every VM back in rotation")
    return outcome


def _note_waits(cluster: LocalCluster, by_id: Mapping[str, EventOutcome]) -> None:
    """What held each Scheduled event back, as the agents say it now: its approver's reasons in ``/status``
    (the leader's when it has no approver among the agents)."""
    statuses = {vm: status for vm, status in cluster.statuses().items() if status is not None}
    leader = next((vm for vm, status in statuses.items() if status.get("leader") == vm), None)
    for eid, outcome in by_id.items():
        if outcome.started_t is not None:
            continue
        said = {vm: event for vm, status in statuses.items() for event in status.get("events") or []
                if event.get("event_id") == eid and event.get("status") == "Scheduled" and event.get("waiting_for")}
        for vm in [next((vm for vm, e in said.items() if e.get("approver") == vm), None), leader]:
            if vm is not None and vm in said:
                outcome.waited_by, outcome.waited_for = vm, [str(r) for r in said[vm]["waiting_for"]]
                break


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
    wait = drain_wait_of(outcome.strategy, config)
    outcome.drained_before_start = {e.event_id: e.notice / config.time_scale >= wait for e in outcome.events}


def _account_rotation(outcome: StoryOutcome, changes: Sequence[Change]) -> None:
    """When every VM an event names was out of HAProxy's rotation, if that was before the event started
    (a VM taken out by the impact itself, a paused or killed app failing its checks, was not drained)."""
    for event in outcome.events:
        outs = [out_of_rotation_since(changes, vm, event.created_t, event.started_t) for vm in event.resources]
        if event.started_t is None or any(o is None for o in outs):
            continue
        event.drained_t = max(max(o.t for o in outs if o is not None), event.created_t)
        event.drained_by = [o.status for o in outs if o is not None]


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
            **_drain_figures(mine),
            "events": len(mine[0]["events"]),
            "steps": {name: {"failed": _stats(_per_run(v["failed"], len(mine))),
                             "to_start": _stats(v["to_start"]), "notice": _stats(v["notice"])}
                      for name, v in per_step.items()},
        }
    return out


def _drain_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over every event of ``runs``: real seconds from the notice to drained (in HAProxy) and to the start,
    how many events were drained before they started, by which HAProxy status, and VMs left ``Down``.
    Runs recorded before these figures existed give none (NaN, zero)."""
    events = [e for r in runs for e in r["events"]]
    drained = [e for e in events if e.get("to_drained") is not None]
    statuses = sorted({s.split()[0] for e in drained for s in e.get("drained_by", [])})
    return {
        "to_drained": _stats([e["to_drained"] for e in drained]),
        "to_start_real": _stats([e["to_start_real"] for e in events if e.get("to_start_real") is not None]),
        "drain_to_start": _stats([e["to_start_real"] - e["to_drained"] for e in drained
                                  if e.get("to_start_real") is not None]),
        "drained_events": len(drained),
        "all_events": len(events),
        "drained_by": {s: sum(1 for e in drained for x in e.get("drained_by", []) if x.split()[0] == s)
                       for s in statuses},
        "left_down": sorted({vm for r in runs for vm in r.get("left_down", [])}),
        "data_plane_failed": sum((r.get("data_plane") or {}).get("failed", 0) for r in runs),
    }


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
    if stats["median"] != stats["median"]:  # NaN: nothing measured
        return "-"
    med, lo, hi = (f"{stats[k]:.{digits}f}" for k in ("median", "min", "max"))
    return f"{med}{unit}" if lo == hi else f"{med}{unit} ({lo}-{hi})"


def drain_report(summary: dict[str, dict[str, Any]]) -> str:
    """Drain figures (Markdown), real seconds over every event of every run: notice to drained (HAProxy sent
    the event's VMs no new request), notice to start, and what took the VMs out of rotation."""
    lines = ["| strategy | requests failed | events drained before their start | notice -> drained (real s) "
             "| notice -> start (real s) | drained -> start (real s) | taken out by (HAProxy status: VMs) "
             "| left Down at the end |", "|---|---|---|---|---|---|---|---|"]
    for strategy, s in summary.items():
        by = ", ".join(f"{status} {n}" for status, n in s["drained_by"].items()) or "-"
        left = ("none" if not s["left_down"] else ", ".join(s["left_down"])) if strategy == "admin-state" else "-"
        lines.append(f"| {strategy} | {_fig(s['failed'])} | {s['drained_events']} of {s['all_events']} | "
                     f"{_fig(s['to_drained'], 2)} | {_fig(s['to_start_real'], 2)} | {_fig(s['drain_to_start'], 2)} "
                     f"| {by} | {left} |")
    return "\n".join(lines)


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
