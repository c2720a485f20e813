"""The run's statistics that come with every verdict: events by type and by how they started or ended,
approval POSTs, the load's failed requests (set apart: those during an event created without notice,
those while HAProxy had no server UP, and those while the servers UP changed over between two of its
samples), who served the load, and the number of samples and restarts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.oracle.context import Context, approvals, pause_windows, zk_blind_at
from tests.oracle.records import ServerSample

__all__ = ["statistics"]


def _without_notice_windows(ctx: Context) -> list[tuple[float, float, str]]:
    """For each event created Started (a hardware failure): from its creation until HAProxy had taken
    every VM it names out of rotation (plus a second for requests already sent), at most 10 s."""
    windows = []
    for event in ctx.events.values():
        if not event.without_notice:
            continue
        end = event.created + 10.0
        for t in ctx.server_times:
            if t < event.created:
                continue
            samples = ctx.servers_at(t)
            if all(vm in samples and not samples[vm].up for vm in event.resources if vm in ctx.servers):
                end = min(end, t + 1.0)
                break
        windows.append((event.created - 0.5, end, event.event_id))
    return windows


_LINK_FAULTS = ("zk_link_cut", "zk_link_oneway", "zk_link_delay")


class _WhyOut:
    """What kept a VM out of HAProxy's rotation at a time, the first that applies in this order: its
    agent not running or stopped, an event naming it under way (its maintenance), its probe not sampled
    yet or unanswered, its probe answering 200 before HAProxy's checks put it back, its probe failing
    while an event names it (drained for it), or while none does (its ZooKeeper link faulted, or else
    recovering)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._runs: dict[str, list[tuple[float, float]]] = {}
        for process in ctx.obs.processes:
            end = process.exited if process.exited is not None else float("inf")
            self._runs.setdefault(process.vm.lower(), []).append((process.started, end))
        self._paused: dict[str, list[tuple[float, float]]] = {}
        for pid, windows in pause_windows(ctx).items():
            vm = ctx.pid_vm.get(pid)
            if vm is not None:
                self._paused.setdefault(vm, []).extend((start, end) for start, end, _ in windows)
        self._links: dict[str, list[tuple[float, float]]] = {}
        began: dict[str, float] = {}
        for record in sorted(ctx.obs.harness, key=lambda r: r.t):
            vm = record.target.lower()
            if record.kind in _LINK_FAULTS:
                began.setdefault(vm, record.t)
            elif record.kind == "zk_link_heal" and vm in began:
                self._links.setdefault(vm, []).append((began.pop(vm), record.t))
        for vm, start in began.items():
            self._links.setdefault(vm, []).append((start, float("inf")))

    @staticmethod
    def _within(windows: list[tuple[float, float]], t: float) -> bool:
        return any(start <= t <= end for start, end in windows)

    def at(self, vm: str, t: float) -> str:
        if not self._within(self._runs.get(vm, []), t):
            return "agent not running"
        if self._within(self._paused.get(vm, []), t):
            return "agent stopped (SIGSTOP)"
        naming = [e for e in self._ctx.events.values() if vm in e.resources and e.present(t)]
        if any(e.started is not None and e.started <= t for e in naming):
            return "its event under way"
        probe = self._ctx.probe(vm).before(t)
        if probe is None:
            return "probe not sampled yet"
        if probe.code is None:
            return "probe unanswered"
        if probe.code == 200:
            return "probe 200 but not UP in HAProxy yet"
        if naming:
            return "drained for an event naming it"
        if self._within(self._links.get(vm, []), t):
            return "out: its ZooKeeper link faulted"
        return "out: no event names it (recovering)"


def _why_none_up(ctx: Context, requests: list[Any]) -> dict[str, int]:
    """For the requests that failed while HAProxy had no server UP: how many failed in each combination
    of reasons the VMs were out (``_WhyOut``), e.g. "agent not running x2; drained for an event naming
    it x2"."""
    why = _WhyOut(ctx)
    combos: Counter[str] = Counter()
    for request in requests:
        reasons = Counter(why.at(vm, request.t) for vm in sorted(ctx.servers))
        combos["; ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items()))] += 1
    return dict(combos)


def _up(sample: dict[str, ServerSample]) -> set[str]:
    return {name for name, s in sample.items() if s.up}


def _why_handover(ctx: Context, handovers: list[tuple[float, set[str]]]) -> dict[str, int]:
    """For the requests that failed while every server UP in HAProxy's sample before them was out in the
    sample after, and others had come UP instead (so that neither sample shows none UP), each given as
    the later sample's time and the servers gone out: how many failed for each combination of reasons
    those servers went out, as ``_WhyOut`` says at the later sample, e.g. "drained for an event naming it
    x1". Some instant between the two samples likely had no server UP: HAProxy is sampled every 200 ms,
    and a failed check or a drain takes a server out at once."""
    why = _WhyOut(ctx)
    combos: Counter[str] = Counter()
    for after, gone in handovers:
        reasons = Counter(why.at(vm, after) for vm in sorted(gone))
        combos["; ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items()))] += 1
    return dict(combos)


def statistics(ctx: Context) -> dict[str, Any]:
    obs = ctx.obs
    events = list(ctx.events.values())
    windows = _without_notice_windows(ctx)
    failed = [r for r in obs.requests if not r.ok]
    apart = [r for r in failed if any(a <= r.t <= b for a, b, _ in windows)]
    other = [r for r in failed if not any(a <= r.t <= b for a, b, _ in windows)]
    served = Counter(r.server or "?" for r in obs.requests if r.ok)
    # Failures while HAProxy had no server UP (every VM out: drained, paused, restarting) are a capacity
    # matter; those while some server was UP went to a VM that was hit, or were in flight when it was.
    # HAProxy is sampled every 200 ms: the sample on either side of the request showing none UP counts.
    # A handover: the samples on both sides show a server UP, but no server UP in both (the one serving
    # went out and another came back between them), so HAProxy likely had none UP for a moment.
    none_up, handover = [], []
    for request in other:
        around = [(at, sample) for at, sample in ctx.servers_around(request.t) if abs(at - request.t) <= 1.0]
        if any(sample and not _up(sample) for _, sample in around):
            none_up.append(request)
        elif len(around) == 2 and not _up(around[0][1]) & _up(around[1][1]):  # before, after
            handover.append((around[1][0], _up(around[0][1]) - _up(around[1][1])))
    return {
        "events": len(events),
        "events_by_type": dict(Counter(e.event_type for e in events)),
        "approved_early": sum(1 for e in events if e.early_approvals and e.start_reason == "approved"),
        "started_at_not_before": sum(1 for e in events if e.start_reason == "not_before"),
        "started_without_notice": sum(1 for e in events if e.without_notice),
        "cancelled": sum(1 for e in events if e.removal_reason == "cancelled" and e.started is None),
        "still_present_at_end": sum(1 for e in events if e.removed is None),
        "approval_posts": len(approvals(obs.sim_log)),
        # Approval POSTs received while the ZooKeeper recorder read nothing: S1 could not check their acks.
        "approval_posts_while_zk_blind": sum(1 for a in approvals(obs.sim_log) if zk_blind_at(obs, float(a["t"]))),
        "zk_blind_seconds": round(sum(end - start for start, end in obs.zk_blind), 1),
        "requests": len(obs.requests),
        "requests_failed": len(failed),
        "requests_failed_without_notice": len(apart),
        "requests_failed_other": len(other),
        "requests_failed_other_no_server_up": len(none_up),
        "requests_failed_other_in_handover": len(handover),
        "requests_failed_other_with_a_server_up": len(other) - len(none_up) - len(handover),
        "failed_other_by_cause": dict(Counter(str(r.status or r.error) for r in other)),
        "failed_no_server_up_why": _why_none_up(ctx, none_up),
        "failed_in_handover_why": _why_handover(ctx, handover),
        "failed_other_at": [round(r.t - obs.started_at, 2) for r in other[:50]],
        "served_by": dict(served),
        "probe_samples": len(obs.probes),
        "server_samples": len(obs.servers),
        "agent_restarts": max(0, len(obs.processes) - len(obs.settings.agent_vms)),
    }
