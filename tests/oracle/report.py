"""What the oracle says: the verdict, its violations, and the timeline shown with each violation.

``Verdict`` holds every ``Violation`` (the invariant, when, a one-line summary and a timeline) and the
run's statistics, and renders them as text or JSON with times relative to the run's start.
``timeline`` gathers what happened around a violation to the VMs and events it concerns (simulator log,
ZooKeeper nodes, probe, HAProxy and load balancer admin state changes, the harness's actions, processes,
failed load, agent log lines), sorted by time.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.oracle.context import Context, Series

__all__ = ["FRAME", "RAISED", "TimelineEntry", "Verdict", "Violation", "timeline"]

# A frame of the project's code, and an exception's name, in a traceback the interpreter printed.
FRAME = re.compile(r'File "(coordinator/[^"]+)", line (\d+), in (\w+)')
RAISED = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\b(?::|$)")


@dataclass(frozen=True)
class TimelineEntry:
    t: float
    source: str
    text: str


@dataclass(frozen=True)
class Violation:
    invariant: str  # S1 ... S5, or liveness
    t: float
    summary: str
    timeline: tuple[TimelineEntry, ...] = ()

    def render(self, origin: float) -> str:
        lines = [f"{self.invariant} at t={self.t - origin:.2f}s: {self.summary}"]
        lines.extend(f"    t={e.t - origin:8.3f}s  {e.source:<8} {e.text}" for e in self.timeline)
        return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    violations: tuple[Violation, ...]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations

    def render(self, origin: float) -> str:
        head = "no violation" if self.ok else f"{len(self.violations)} violation(s)"
        parts = [head] + [v.render(origin) for v in self.violations]
        return "\n".join(parts)

    def to_json(self, origin: float) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stats": self.stats,
            "violations": [
                {"invariant": v.invariant, "t": round(v.t - origin, 3), "summary": v.summary,
                 "timeline": [{"t": round(e.t - origin, 3), "source": e.source, "text": e.text} for e in v.timeline]}
                for v in self.violations
            ],
        }


# -- the timeline shown with each violation -------------------------------------------------------------


def _describe_sim(entry: Mapping[str, Any]) -> str | None:
    kind = entry.get("kind")
    if kind == "transition":
        return (f"{entry['event_type']} {entry['event_id']} [{','.join(entry['resources'])}] "
                f"{entry.get('from') or 'new'} -> {entry.get('to') or 'removed'} ({entry.get('reason')})")
    if kind == "approval":
        return f"approval POST from {entry['vm']}: {entry.get('results') or entry.get('error')}"
    if kind == "impact":
        return f"impact {entry.get('impact')} of {entry['event_id']} on {','.join(entry.get('vms') or [])}"
    if kind == "signal":
        return f"{entry['signal']} to pid {entry['pid']} ({entry['vm']}, {entry.get('reason')}): {entry.get('result')}"
    if kind == "fault":
        return f"served fault {entry.get('fault')} to {entry.get('vm')} on {entry.get('method') or 'its port'}"
    if kind == "hold":
        return f"{entry['event_id']} held by {','.join(entry.get('held_by') or [])}"
    return None


def _sim_vms(entry: Mapping[str, Any]) -> set[str]:
    vms = {str(v).lower() for v in (entry.get("resources") or entry.get("vms") or [])}
    if entry.get("vm"):
        vms.add(str(entry["vm"]).lower())
    return vms


def timeline(ctx: Context, lo: float, hi: float, vms: Iterable[str], events: Iterable[str] = (),
              limit: int = 160) -> tuple[TimelineEntry, ...]:
    """What happened between ``lo`` and ``hi`` to ``vms`` and ``events``: sorted by time."""
    vms = {vm.lower() for vm in vms}
    events = {e.upper() for e in events}
    out: list[TimelineEntry] = []
    obs = ctx.obs
    for entry in obs.sim_log:
        t = float(entry.get("t", 0))
        if not lo <= t <= hi:
            continue
        text = _describe_sim(entry)
        if text is None:
            continue
        if str(entry.get("event_id", "")).upper() in events or _sim_vms(entry) & vms or entry.get("kind") == "approval":
            out.append(TimelineEntry(t, "imds", text))
    for node in obs.nodes:
        if node.vm is not None and node.vm.lower() not in vms and (node.event_id or "").upper() not in events:
            continue
        name = "/".join(x for x in (node.kind, node.event_id, node.vm) if x)
        if lo <= node.ctime <= hi:
            owner = f" session 0x{node.owner:x}" if node.owner else ""
            out.append(TimelineEntry(node.ctime, "zk", f"{name} created{owner}"))
        if node.gone_seen is not None and lo <= node.gone_seen <= hi:
            out.append(TimelineEntry(node.gone_seen, "zk", f"{name} seen gone"))
    for vm in sorted(vms):
        previous: int | str | None = "start"
        for sample in ctx.probe(vm).between(lo, hi):
            if sample.code != previous:
                out.append(TimelineEntry(sample.t, "probe", f"{vm} {_code(sample.code)}"))
                previous = sample.code
        label = ""
        for server_sample in ctx.servers.get(vm, Series(())).between(lo, hi):
            if server_sample.label != label:
                out.append(TimelineEntry(server_sample.t, "haproxy", f"{vm} {server_sample.label}"))
                label = server_sample.label
        state = ""
        for admin_sample in ctx.admin.get(vm, Series(())).between(lo, hi):
            if admin_sample.state != state:
                out.append(TimelineEntry(admin_sample.t, "lb", f"{vm} admin state {admin_sample.state}"))
                state = admin_sample.state
    for record in obs.harness:
        if lo <= record.t <= hi:
            pid = f" pid {record.pid}" if record.pid else ""
            text = f"{record.kind} {record.target}{pid} {record.detail}".strip()
            out.append(TimelineEntry(record.t, "harness", text))
    for process in obs.processes:
        if process.vm.lower() not in vms:
            continue
        if lo <= process.started <= hi:
            out.append(TimelineEntry(process.started, "process", f"agent of {process.vm} started, pid {process.pid}"))
        if process.exited is not None and lo <= process.exited <= hi:
            out.append(TimelineEntry(process.exited, "process",
                                     f"agent of {process.vm} pid {process.pid} exited ({process.returncode})"))
    failed: Counter[int] = Counter()
    failed_detail: dict[int, Counter[str]] = defaultdict(Counter)
    for request in obs.requests:
        if lo <= request.t <= hi and not request.ok:
            second = int(request.t)
            failed[second] += 1
            failed_detail[second][str(request.status or request.error)] += 1
    for second, count in failed.items():
        detail = ", ".join(f"{k} x{n}" for k, n in failed_detail[second].items())
        out.append(TimelineEntry(float(second), "load", f"{count} request(s) failed in this second: {detail}"))
    for line in obs.agent_logs:
        if line.t is not None and lo <= line.t <= hi and line.vm.lower() in vms:
            if line.stderr and not (FRAME.search(line.text) or RAISED.search(line.text)):
                continue
            out.append(TimelineEntry(line.t, f"{'stderr' if line.stderr else 'log'} {line.vm}", line.text[:300]))
    out.sort(key=lambda e: e.t)
    if len(out) > limit:
        keep = {id(e) for e in out if e.source in ("imds", "harness", "zk", "process")}
        others = [e for e in out if id(e) not in keep]
        budget = max(0, limit - len(keep))
        chosen = {id(e) for e in others[-budget:]} if budget else set()
        out = [e for e in out if id(e) in keep or id(e) in chosen]
    return tuple(out)


def _code(code: int | None) -> str:
    return "no answer" if code is None else str(code)
