"""Carrying out a plan's approvals: the store's last check, then the fenced POST.

For each event the plan approves, ``Store.approve`` checks again, in one transaction on this agent's own
session, what the decision rested on (connected, admitted, not done, every required ack) and records the
approval. Only the events it confirmed are POSTed, all in one ``StartRequests``, and only while the
session is still connected. Before every attempt of the POST, retries included, ``snapshot.approval_fence``
is asked again with what is true then: the time since the store's check against the session timeout
asked for and granted, the connection, the operator's pause read from the ensemble now, the maintenance
window and how long ago the peers were confirmed in rotation. A closed fence sends nothing; the next cycle
decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from coordinator.errors import ImdsError, ImdsFenced, InvalidName, StoreError
from coordinator.metrics import Metrics
from coordinator.snapshot import Plan, Policy, Snapshot, approval_fence
from coordinator.store.base import ApprovalOutcome, ConnectionState, Pause, Store
from coordinator.telemetry import Telemetry

__all__ = ["send_approvals"]

# Logged as the agent: these lines are what the agent did (operators filter on this logger).
log = logging.getLogger("coordinator.agent")


def send_approvals(store: Store, approve: Callable[..., None], vm: str, snap: Snapshot, plan: Plan, *,
                   policy: Policy, metrics: Metrics, telemetry: Telemetry, mono: Callable[[], float],
                   now: Callable[[], float], peers_confirmed_at: float | None) -> frozenset[str]:
    """Confirm ``plan.approve`` in the store and POST what it confirmed with ``approve`` (the IMDS
    client's ``approve(event_ids, fence=...)``). Returns the keys of the events whose POST was accepted;
    anything else is retried by the next cycle's decision."""
    confirmed: list[str] = []
    checked_at: float | None = None
    for intent in plan.approve:
        if store.connection_state is not ConnectionState.CONNECTED:
            break
        started = mono()
        try:
            result = store.approve(intent.key, vm, intent.required, as_leader=intent.as_leader, at=snap.now,
                                   admission=intent.admission)
        except StoreError as exc:
            metrics.approvals.labels("unknown").inc()
            log.warning("approval not confirmed (vm=%s event=%s): %s", vm, intent.event_id, exc,
                        extra={"event_id": intent.event_id})
            continue
        if result.outcome is ApprovalOutcome.REFUSED:
            metrics.approvals.labels("refused").inc()
            log.info("approval refused by re-check (vm=%s event=%s): %s", vm, intent.event_id, result.reason,
                     extra={"event_id": intent.event_id})
            continue
        confirmed.append(intent.event_id)
        checked_at = started if checked_at is None else checked_at
    # The last gate: a session that was lost while confirming never POSTs, and neither does one that
    # may have lapsed since (the process paused, or the POST retried, past the fence).
    if not confirmed or checked_at is None or store.connection_state is not ConnectionState.CONNECTED:
        return frozenset()
    closed: list[str] = []

    def fence() -> bool:
        """The evidence for ``approval_fence``, gathered right before an attempt of the POST: the
        operator's pause is read from the ensemble (a pause made during the retries stops them)."""
        paused: Pause | str | None = None
        if store.connection_state is ConnectionState.CONNECTED:
            try:
                paused = store.read_pause()
            except (StoreError, InvalidName) as exc:
                paused = str(exc)
        why = approval_fence(policy, mono=mono(), now=now(), checked_at=checked_at,
                             granted=store.granted_session_timeout, connection=store.connection_state,
                             paused=paused, peers_confirmed_at=peers_confirmed_at)
        closed.append(why)
        return not why

    events = ",".join(confirmed)
    try:
        approve(confirmed, fence=fence)
    except ImdsFenced as exc:
        metrics.approvals.labels("fenced").inc()
        log.warning("approval not sent (vm=%s events=%s): %s: %s; re-checked next cycle", vm, confirmed, exc,
                    closed[-1] if closed else "", extra={"event_id": events})
        return frozenset()
    except ImdsError as exc:
        metrics.approvals.labels("failed").inc()
        metrics.errors.labels("imds").inc()
        log.warning("approval POST failed, retried next cycle (vm=%s events=%s): %s", vm, confirmed, exc,
                    extra={"event_id": events})
        return frozenset()
    posted_at = now()
    for intent in plan.approve:
        if intent.event_id in confirmed:
            metrics.approvals.labels("posted").inc()
            telemetry.approved(snap.document.event(intent.event_id) if snap.document else None, posted_at)
            record = snap.cluster.records.get(intent.key) if snap.cluster else None
            if record is not None:
                metrics.approval_latency.observe(max(snap.now - record.published_at, 0.0))
    log.info("approved (vm=%s events=%s)", vm, events, extra={"event_id": events})
    return frozenset(intent.key for intent in plan.approve if intent.event_id in confirmed)
