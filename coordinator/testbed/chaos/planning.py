"""The seeded plan of a chaos run: what happens, to whom, when and for how long, from the seed alone.

``ChaosConfig`` is what every run uses. ``plan(seed, config)`` draws from ``random.Random(seed)`` a story
of maintenance events (overlapping events on different VMs, one event cancelled, a hardware failure
without notice) and a schedule of faults (agents killed or paused, ZooKeeper servers down, IMDS faults,
events scheduled then cancelled), each one a ``Step``. Targets such as "the leader" or "a drained VM"
are named in the plan and resolved only when the step fires.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IMDS_FAULTS", "WRONG_TYPE_FIELDS", "ChaosConfig", "Step", "plan"]

IMDS_FAULTS = ("status", "delay", "malformed", "wrong_type", "drop", "refuse", "post")
WRONG_TYPE_FIELDS = ("DocumentIncarnation", "Events", "EventId", "Resources", "NotBefore", "DurationInSeconds")


@dataclass(frozen=True)
class ChaosConfig:
    """What every run uses. Times are real seconds unless said otherwise."""

    vms: tuple[str, ...] = ("vm0", "vm1", "vm2", "vm3")
    duration: float = 30.0  # the fault window; the run goes on until every event is gone and every VM back
    time_scale: float = 40.0  # simulated seconds per real second: a 15-minute notice lasts 22.5 s
    drain_wait: float = 1.5  # the agents' drain.wait_seconds (HAProxy notices a probe change within ~1 s)
    poll_interval: float = 0.5
    session_timeout: float = 4.0
    latest_start: float = 6.0  # drain.latest_start_seconds, in real seconds (NotBefore is rendered in real time)
    started_for_sim: float = 120.0  # simulated seconds an event stays Started (3 s at the default scale)
    reboot_seconds: float = 1.0  # how long a VM killed by an impact takes to come back
    rate: float = 20.0  # requests per second through HAProxy
    recovery_bound: float = 20.0
    tick_time_ms: int = 500


@dataclass(frozen=True)
class Step:
    """One thing the harness does ``at`` seconds after the story began.

    ``target`` is a VM, ``leader`` or ``drained`` (resolved when the step fires, ``fallback`` if that
    cannot be done), ``zk`` indexes (``zk:0,2``; ``zk:leader``), or empty. ``seconds`` is how long the
    fault lasts (or, for a kill, how long until the restart)."""

    at: float
    kind: str
    target: str = ""
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict, compare=False)
    fallback: str = ""
    label: str = ""

    def describe(self) -> str:
        p = self.params
        if self.kind == "event":
            extra = " (hardware failure: Started, no notice)" if p.get("status") == "Started" else ""
            return f"{self.label}: {p['event_type']} on {','.join(p['resources'])}{extra}"
        if self.kind == "cancel_event":
            return f"cancel {self.label}"
        target = f"{self.target} (else {self.fallback})" if self.fallback else self.target
        if self.kind == "agent_kill":
            return f"SIGKILL the agent of {target}, restart after {self.seconds:.1f}s"
        if self.kind == "agent_pause":
            return f"SIGSTOP the agent of {target} for {self.seconds:.1f}s"
        if self.kind == "zk_down":
            return f"ZooKeeper {self.target} down for {self.seconds:.1f}s"
        if self.kind == "imds":
            where = p.get("vm") or "every VM"
            what = {k: v for k, v in p.items() if k not in ("vm", "fault")}
            return f"IMDS fault {p['fault']} on {where} {what}"
        if self.kind == "cancel":
            return f"schedule {p['event_type']} on {','.join(p['resources'])}, cancel it after {self.seconds:.1f}s"
        return f"{self.kind} {self.target}"


def plan(seed: int, config: ChaosConfig = ChaosConfig()) -> list[Step]:
    """The run's story of events and its faults, in time order: a function of the seed alone."""
    rng = random.Random(seed)
    vms = list(config.vms)
    k = config.duration / 30.0
    order = rng.sample(vms, len(vms))
    a, b, c = order[0], order[1], order[2]
    d = order[3] if len(order) > 3 else rng.choice(vms)
    # Overlapping events on different VMs: a Freeze of two VMs and a Reboot of a third.
    steps: list[Step] = [
        Step(rng.uniform(0.5, 2.5) * k, "event", label="freeze-two",
             params={"event_type": "Freeze", "resources": [a, b], "duration_in_seconds": rng.choice([30, 60, 90])}),
        Step(rng.uniform(1.5, 4.0) * k, "event", label="reboot", params={"event_type": "Reboot", "resources": [c]}),
    ]
    cancelled_at = rng.uniform(5.0, 10.0) * k
    steps.append(Step(cancelled_at, "event", label="cancelled",
                      params={"event_type": rng.choice(["Redeploy", "Reboot"]), "resources": [d]}))
    steps.append(Step(cancelled_at + rng.uniform(1.0, 8.0) * k, "cancel_event", label="cancelled"))
    steps.append(Step(rng.uniform(10.0, 16.0) * k, "event", label="hardware",
                      params={"event_type": "Reboot", "resources": [rng.choice(vms)], "status": "Started",
                              "started_for": config.started_for_sim}))
    steps.append(Step(rng.uniform(14.0, 20.0) * k, "event", label="freeze-late",
                      params={"event_type": "Freeze", "resources": sorted(rng.sample(vms, 2)),
                              "duration_in_seconds": rng.choice([30, 60])}))

    kinds = ["leader_kill", "drained_kill", "pause_long", "zk_one", "zk_two", "imds", "imds", "agent_kill", "cancel"]
    rng.shuffle(kinds)
    extra = ["agent_kill", "pause_long", "pause_short", "imds", "imds", "zk_one", "cancel", "drained_kill"]
    t = rng.uniform(1.5, 3.0) * k
    zk_free = 0.0
    busy: dict[str, float] = {}
    while t < config.duration:
        kind = kinds.pop(0) if kinds else rng.choice(extra)
        fallback = rng.choice(vms)
        free = [vm for vm in vms if busy.get(vm, 0.0) <= t] or vms
        vm = rng.choice(free)
        step: Step
        if kind in ("agent_kill", "leader_kill", "drained_kill"):
            target = {"agent_kill": vm, "leader_kill": "leader", "drained_kill": "drained"}[kind]
            step = Step(t, "agent_kill", target, rng.uniform(0.5, 3.0),
                        fallback="" if kind == "agent_kill" else fallback)
            if kind == "agent_kill":
                busy[vm] = t + step.seconds + 1.0
        elif kind in ("pause_long", "pause_short"):
            long = kind == "pause_long"
            seconds = config.session_timeout + rng.uniform(1.0, 4.0) if long else rng.uniform(0.5, 3.0)
            step = Step(t, "agent_pause", vm, seconds)
            busy[vm] = t + seconds + 1.0
        elif kind in ("zk_one", "zk_two"):
            start = max(t, zk_free)
            if kind == "zk_one":
                target = "zk:leader" if rng.random() < 0.5 else f"zk:{rng.randrange(3)}"
            else:
                target = "zk:" + ",".join(str(i) for i in sorted(rng.sample(range(3), 2)))
            step = Step(start, "zk_down", target, rng.uniform(2.0, 5.0))
            zk_free = start + step.seconds + 4.0  # a restarted server takes a few seconds to rejoin
        elif kind == "imds":
            step = Step(t, "imds", params=_imds_fault(rng, vms))
        else:
            step = Step(t, "cancel", seconds=rng.uniform(0.5, 6.0) * k,
                        params={"event_type": rng.choice(["Freeze", "Redeploy"]), "resources": [vm]})
        steps.append(step)
        t += rng.uniform(1.2, 3.0) * k
    return sorted(steps, key=lambda s: s.at)


def _imds_fault(rng: random.Random, vms: Sequence[str]) -> dict[str, Any]:
    fault = rng.choice(IMDS_FAULTS)
    vm = rng.choice([*vms, None])
    if fault == "status":
        return {"fault": fault, "vm": vm, "status": rng.choice([410, 429, 500, 503]), "count": rng.randint(2, 10)}
    if fault == "delay":
        return {"fault": fault, "vm": vm, "seconds": round(rng.uniform(2.5, 4.0), 2), "count": rng.randint(1, 3)}
    if fault in ("malformed", "drop"):
        return {"fault": fault, "vm": vm, "count": rng.randint(1, 3)}
    if fault == "wrong_type":
        return {"fault": fault, "vm": vm, "field": rng.choice(WRONG_TYPE_FIELDS), "count": rng.randint(1, 2)}
    if fault == "refuse":
        return {"fault": fault, "vm": vm, "seconds": round(rng.uniform(1.0, 4.0), 2)}
    return {"fault": fault, "vm": vm, "status": rng.choice([500, 503]), "count": rng.randint(1, 2)}
