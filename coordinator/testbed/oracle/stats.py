"""The run's statistics that come with every verdict: events by type and by how they started or ended,
approval POSTs, the load's failed requests (set apart: those during an event created without notice,
and those while HAProxy had no server UP), who served the load, and the number of samples and restarts.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from coordinator.testbed.oracle.context import Context, approvals, zk_blind_at

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
    none_up = []
    for request in other:
        index = bisect.bisect_right(ctx.server_times, request.t)
        around = [ctx.server_times[i] for i in (index - 1, index) if 0 <= i < len(ctx.server_times)]
        for t in around:
            sample = ctx.servers_at(t)
            if abs(t - request.t) <= 1.0 and sample and not any(s.up for s in sample.values()):
                none_up.append(request)
                break
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
        "requests_failed_other_with_a_server_up": len(other) - len(none_up),
        "failed_other_by_cause": dict(Counter(str(r.status or r.error) for r in other)),
        "failed_other_at": [round(r.t - obs.started_at, 2) for r in other[:50]],
        "served_by": dict(served),
        "probe_samples": len(obs.probes),
        "server_samples": len(obs.servers),
        "agent_restarts": max(0, len(obs.processes) - len(obs.settings.agent_vms)),
    }
