"""What the checks share: the ground truth read from the simulator's log, and indexes over the samples.

``sim_events`` rebuilds every event's lifecycle (created, Started and why, removed and why, early
approvals) from the simulator's log; ``approvals`` lists the approval POSTs it received and
``clean_reads`` when each VM was served a well-formed Scheduled Events document. ``Context`` is built
once per run: the events, each VM's probe samples, each server's HAProxy samples and each VM's effective
admin state in the load balancer (a run draining through admin state) as time-sorted ``Series``.
``pause_windows`` says when each agent process was stopped (SIGSTOP until SIGCONT or its end).
``recovery_grace`` is the agents' grace for a VM whose agent is gone, as the run's settings give it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.config import PolicyConfig
from tests.oracle.records import (
    AdminStateSample,
    Observations,
    OracleSettings,
    ProbeSample,
    ServerSample,
)

__all__ = ["EARLY_RESULTS", "Context", "Series", "SimEvent", "approvals", "clean_reads", "pause_windows",
           "recovery_grace", "sim_events"]

EARLY_RESULTS = ("approved", "already_approved")
_SCHEDULED_EVENTS = "/metadata/scheduledevents"


def recovery_grace(settings: OracleSettings) -> float:
    """How long a VM whose agent is gone (no member node) still counts out of rotation for the agents'
    budget (``policy.recovery_grace_seconds``, ``decide.budget.out_vms``): the settings' own
    ``recovery_grace_seconds`` when they carry one (a run that configured another), else the agents'
    default (a record kept without it was made with the default)."""
    grace = getattr(settings, "recovery_grace_seconds", None)
    if grace is None:
        return float(PolicyConfig.model_fields["recovery_grace_seconds"].default)
    return float(grace)


# -- ground truth from the simulator's log --------------------------------------------------------------


@dataclass
class SimEvent:
    """One event's lifecycle as the simulator logged it."""

    event_id: str  # upper case
    event_type: str
    resources: tuple[str, ...]  # lower case
    created: float
    created_status: str
    started: float | None = None
    start_reason: str | None = None
    removed: float | None = None
    removal_reason: str | None = None
    early_approvals: list[float] = field(default_factory=list)

    def present(self, t: float) -> bool:
        return self.created <= t and (self.removed is None or t < self.removed)

    @property
    def without_notice(self) -> bool:
        return self.created_status == "Started"

    def end(self, default: float) -> float:
        return self.removed if self.removed is not None else default


def sim_events(sim_log: Sequence[Mapping[str, Any]]) -> dict[str, SimEvent]:
    """Every event the simulator created, by upper-case id."""
    events: dict[str, SimEvent] = {}
    for entry in sim_log:
        if entry.get("kind") == "transition":
            key = str(entry["event_id"]).upper()
            if entry.get("from") is None:
                resources = tuple(str(r).lower() for r in entry["resources"])
                events[key] = SimEvent(key, str(entry.get("event_type")), resources, float(entry["t"]),
                                     str(entry.get("to")))
                if entry.get("to") == "Started":
                    events[key].started = float(entry["t"])
                    events[key].start_reason = "without notice"
                continue
            event = events.get(key)
            if event is None:
                continue
            if entry.get("to") == "Started":
                event.started, event.start_reason = float(entry["t"]), str(entry.get("reason"))
            elif entry.get("to") is None:
                event.removed, event.removal_reason = float(entry["t"]), str(entry.get("reason"))
        elif entry.get("kind") == "approval":
            for event_id, result in (entry.get("results") or {}).items():
                event = events.get(str(event_id).upper())
                if event is not None and result in EARLY_RESULTS:
                    event.early_approvals.append(float(entry["t"]))
    return events


def approvals(sim_log: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in sim_log if e.get("kind") == "approval" and e.get("event_ids") and not e.get("error")]


def zk_blind_at(obs: Observations, t: float) -> bool:
    """Whether the ZooKeeper recorder read nothing around ``t`` (``Observations.zk_blind``): a node that
    existed then may have come and gone unseen."""
    return any(start <= t <= end for start, end in obs.zk_blind)


def clean_reads(sim_log: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per VM, when it was served a well-formed Scheduled Events document (the request's log time).

    A request answered 200 right after a ``malformed`` or ``wrong_type`` fault of that VM is that
    fault's answer; one answered during a ``delay`` fault may have been given up by the client."""
    spoiled: set[int] = set()
    pending: dict[str, int] = defaultdict(int)  # vm -> garbage answers still to match with a request
    delays: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for entry in sim_log:
        kind, vm = entry.get("kind"), str(entry.get("vm") or "").lower()
        if kind == "fault" and entry.get("method") == "GET":
            if entry.get("fault") in ("malformed", "wrong_type"):
                pending[vm] += 1
            elif entry.get("fault") == "delay":
                delays[vm].append((float(entry["t"]), float(entry["t"]) + float(entry.get("seconds") or 0) + 0.5))
        elif kind == "request" and entry.get("method") == "GET" and str(entry.get("path", "")).endswith(
                _SCHEDULED_EVENTS):
            if pending[vm] > 0:
                pending[vm] -= 1
                spoiled.add(int(entry["seq"]))
            elif any(a <= float(entry["t"]) <= b for a, b in delays[vm]):
                spoiled.add(int(entry["seq"]))
    reads: dict[str, list[float]] = defaultdict(list)
    for entry in sim_log:
        if (entry.get("kind") == "request" and entry.get("method") == "GET" and entry.get("status") == 200
                and str(entry.get("path", "")).endswith(_SCHEDULED_EVENTS) and int(entry["seq"]) not in spoiled):
            reads[str(entry["vm"]).lower()].append(float(entry["t"]))
    return reads


# -- indexes over the samples ---------------------------------------------------------------------------


class Series:
    """Samples of one VM (or server), sorted by time, with lookups by time."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = sorted(items, key=lambda s: s.t)
        self.times = [s.t for s in self.items]

    def before(self, t: float) -> Any | None:
        index = bisect.bisect_right(self.times, t)
        return self.items[index - 1] if index else None

    def after(self, t: float) -> Any | None:
        index = bisect.bisect_left(self.times, t)
        return self.items[index] if index < len(self.items) else None

    def between(self, lo: float, hi: float) -> list[Any]:
        return self.items[bisect.bisect_left(self.times, lo):bisect.bisect_right(self.times, hi)]


class Context:
    """One run's observations with the ground truth and indexes every check reads."""

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        self.settings = obs.settings
        self.agent_vms = {vm.lower() for vm in obs.settings.agent_vms}
        self.events = sim_events(obs.sim_log)
        self.probes: dict[str, Series] = {}
        by_vm: dict[str, list[ProbeSample]] = defaultdict(list)
        for sample in obs.probes:
            by_vm[sample.vm.lower()].append(sample)
        self.probes = {vm: Series(samples) for vm, samples in by_vm.items()}
        by_server: dict[str, list[ServerSample]] = defaultdict(list)
        for server_sample in obs.servers:
            by_server[server_sample.server.lower()].append(server_sample)
        self.servers = {name: Series(samples) for name, samples in by_server.items()}
        self.server_times = sorted({s.t for s in obs.servers})
        self.pid_vm = {p.pid: p.vm.lower() for p in obs.processes}
        by_address: dict[str, list[AdminStateSample]] = defaultdict(list)
        for admin_sample in obs.admin_states:
            by_address[admin_sample.vm.lower()].append(admin_sample)
        # Empty unless the run's agents drained through the load balancer's admin state.
        self.admin = {vm: Series(samples) for vm, samples in by_address.items()}

    def probe(self, vm: str) -> Series:
        return self.probes.get(vm, Series(()))

    def servers_at(self, t: float) -> dict[str, ServerSample]:
        """The HAProxy sample taken at ``t`` exactly (one per server)."""
        out = {}
        for name, series in self.servers.items():
            sample = series.before(t)
            if sample is not None and sample.t == t:
                out[name] = sample
        return out

    def admin_around(self, vm: str, t: float) -> list[AdminStateSample]:
        """``vm``'s effective admin state next to ``t``: the last sample at or before it, then the first
        after it when there is one less than ``server_sample_gap_seconds`` later ([] when the run has no
        sample before ``t``, or the one before is older than that gap)."""
        series = self.admin.get(vm)
        if series is None:
            return []
        before = series.before(t)
        gap = self.settings.server_sample_gap_seconds
        if before is None or t - before.t > gap:
            return []
        index = bisect.bisect_right(series.times, t)
        after = series.items[index] if index < len(series.items) else None
        return [before] if after is None or after.t - before.t > gap else [before, after]

    def admin_state(self, vm: str, t: float) -> str | None:
        """``vm``'s effective admin state across ``t`` when the samples on both sides of it agree (or the last
        one, at the end of the run); None when unknown: no admin-state samples, too far apart, or a change
        between them."""
        around = self.admin_around(vm, t)
        states = {sample.state for sample in around}
        return states.pop() if len(states) == 1 else None

    def admin_down(self, vm: str, t: float) -> bool:
        """Whether the load balancer had ``vm`` Down across ``t`` (no new flows, whatever its probe says).
        Unknown counts as not Down: the judgement then rests on the probe and HAProxy, as without admin
        state."""
        return self.admin_state(vm, t) == "Down"

    def servers_around(self, t: float) -> list[tuple[float, dict[str, ServerSample]]]:
        """HAProxy's samples next to ``t``, each with its time: the last at or before it, then the first
        after it (either missing at the ends of the run)."""
        index = bisect.bisect_right(self.server_times, t)
        return [(self.server_times[i], self.servers_at(self.server_times[i]))
                for i in (index - 1, index) if 0 <= i < len(self.server_times)]


def pause_windows(ctx: Context) -> dict[int, list[tuple[float, float, str]]]:
    """Per PID, when it was stopped: (SIGSTOP, the next SIGCONT or its end, who stopped it)."""
    signals: list[tuple[float, int, str, str]] = []
    for record in ctx.obs.harness:
        if record.kind in ("sigstop", "sigcont") and record.pid is not None:
            signals.append((record.t, record.pid, record.kind, "the harness"))
    for entry in ctx.obs.sim_log:
        if entry.get("kind") == "signal" and entry.get("result") == "sent" and entry.get("signal") in ("SIGSTOP",
                                                                                                     "SIGCONT"):
            signals.append((float(entry["t"]), int(entry["pid"]), str(entry["signal"]).lower(),
                            f"the simulator ({entry.get('event_id')})"))
    ends = {p.pid: p.exited for p in ctx.obs.processes}
    out: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    open_since: dict[int, tuple[float, str]] = {}
    for t, pid, kind, who in sorted(signals):
        if kind == "sigstop":
            open_since.setdefault(pid, (t, who))
        elif pid in open_since:
            start, by = open_since.pop(pid)
            out[pid].append((start, t, by))
    for pid, (start, by) in open_since.items():
        end = ends.get(pid)
        out[pid].append((start, end if end is not None else ctx.obs.ended_at, by))
    return out
