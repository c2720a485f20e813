"""The drains by hand of a group read (``coordinator drain``), as ``coordinator status`` shows them."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.groupstatus.model import AgentReport, DrainedByHand, utc
from coordinator.groupstatus.read import GroupRead
from coordinator.store.base import BY_HAND

__all__ = ["drained_by_hand"]


def drained_by_hand(read: GroupRead, reports: Mapping[str, AgentReport]) -> list[DrainedByHand]:
    """Each drain by hand, with whether its VM is out for it, its agent's phase and, while the leader does
    not admit it, the leader's reason (from the leader's ``/status``)."""
    view = read.view
    leader = read.agents.get(view.leader or "")
    cluster = leader.body.get("cluster") if leader is not None and leader.body is not None else None
    waits = cluster.get("drain_waits") if isinstance(cluster, dict) else None
    found: list[DrainedByHand] = []
    for vm, drain in sorted(view.drains.items()):
        mark = view.out.get(vm)
        report = reports.get(vm)
        waiting = waits.get(vm) if isinstance(waits, dict) and drain.admitted_at is None else None
        found.append(DrainedByHand(
            vm=vm, reason=drain.reason, by=drain.by, at=utc(drain.at), admitted_by=drain.admitted_by,
            admitted_at=utc(drain.admitted_at) if drain.admitted_at is not None else None,
            out=mark is not None and BY_HAND in (e.upper() for e in mark.events),
            phase=report.phase if report is not None else None,
            waiting=(waiting or None) if isinstance(waiting, str) else None,
        ))
    return found
