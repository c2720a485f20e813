"""Carrying out a plan's writes to the coordination store, in the order the decision relies on.

``/out/{me}`` first (the budget must see this VM out before anything else it does), then records, reopenings
and admissions (of events, then of drains by hand), acks and withdrawals, done marks, absences, the ``/out``
marks of VMs an approval will go ahead without, ``/out`` cleared, then the leader's moves of finished records
to the history (``Store.archive_done``) and its purges of old ones. A write that fails stops the rest
for this cycle (logged and counted): the next cycle decides again from what the store then shows, so nothing
is half-remembered. Approvals are not written here: they go through the store's last check and the fenced POST
(``coordinator.plan_approvals``).

A done mark carries, for the group's history, when this agent first saw the event Started in its own
documents (``note_started``, kept by the agent loop beside the decision, which does not need it): written
in the rewrite the done mark makes anyway, and not at all when this agent never saw it Started (it was
restarted since, or its documents do not list the event).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from coordinator.errors import InvalidName, StoreError
from coordinator.metrics import Metrics
from coordinator.models import Document
from coordinator.snapshot import LocalState, Plan, Snapshot
from coordinator.store.base import Store, WriteResult

__all__ = ["STARTED_KEPT", "note_started", "write_plan"]

# Logged as the agent: these lines are what the agent did (operators filter on this logger).
log = logging.getLogger("coordinator.agent")


#: The most events whose first Started sighting an agent keeps: far more than a group has at once.
STARTED_KEPT = 256


def note_started(started: Mapping[str, float], document: Document, records: Collection[str] | None,
                 at: float) -> dict[str, float]:
    """Event key -> the wall time this agent first saw the event Started (``started``), after a new document
    that arrived at the wall time ``at``. An event neither in the document nor among the store's records
    (``records``; None when the store could not be read: nothing is forgotten then) is forgotten; past
    ``STARTED_KEPT`` events, the earliest seen are."""
    present = {event.event_id.upper() for event in document.events}
    kept = {key: when for key, when in started.items() if key in present or records is None or key in records}
    for event in document.events:
        if event.is_started:
            kept.setdefault(event.event_id.upper(), at)
    if len(kept) > STARTED_KEPT:
        kept = dict(sorted(kept.items(), key=lambda item: (item[1], item[0]))[-STARTED_KEPT:])
    return kept


def write_plan(store: Store, vm: str, snap: Snapshot, local: LocalState, plan: Plan, *, metrics: Metrics,
               purge_before: float | None, wake: Callable[[], None],
               started: Mapping[str, float] | None = None) -> bool:
    """Send the plan's writes. ``purge_before``: purge records done before this time (None: not now).
    ``started``: event key -> when this agent first saw it Started (``note_started``), for the done marks.
    Returns False if a write failed."""
    try:
        if plan.mark_out is not None:
            store.mark_out(vm, plan.mark_out, snap.now)
        for record in plan.publish:
            store.publish_event(record)
        for key in plan.reopen:
            if store.reopen(key) is WriteResult.DONE:
                log.info("event back after it was marked done: reopened (vm=%s event=%s)", vm, key,
                         extra={"event_id": key})
        for key in plan.admit:
            if store.admit(key, vm, snap.now) is WriteResult.DONE:
                log.info("admitted into the maintenance budget (vm=%s event=%s)", vm, key, extra={"event_id": key})
        for other, asked in sorted(plan.admit_drains.items()):
            if store.admit_drain(other, asked, vm, snap.now) is WriteResult.DONE:
                log.info("admitted the drain by hand of %s into the maintenance budget (vm=%s)", other, vm)
        for other in plan.forget_admissions:
            store.forget_drain_admission(other)
        for key in plan.ack:
            if store.acknowledge(key, vm, snap.now) is WriteResult.DONE:
                metrics.acknowledged(local.drain_started, snap.mono - local.drain_started)
                log.info("acknowledged (vm=%s event=%s)", vm, key, extra={"event_id": key})
        for key in plan.withdraw:
            store.withdraw_ack(key, vm)
            log.info("acknowledgement withdrawn (vm=%s event=%s)", vm, key, extra={"event_id": key})
        if plan.withdraw:
            wake()  # the next cycle sees the acks gone and may recover
        for key in plan.mark_done:
            store.mark_done(key, snap.now, started_at=(started or {}).get(key))
        for name in plan.mark_absent:
            store.mark_absent(name, snap.now)
        for name in plan.clear_absent:
            store.clear_absent(name)
        for other, events in sorted(plan.mark_out_for.items()):
            if store.mark_out(other, events, snap.now) is WriteResult.DONE:
                log.info("marked %s out of rotation for %s: its agent is absent past the grace, and the "
                         "approval goes ahead without it (vm=%s)", other, ",".join(events), vm)
        if plan.clear_out:
            store.clear_out(vm)
            log.info("back in the load balancer's rotation (vm=%s)", vm)
        if plan.archive:
            moved = store.archive_done(plan.archive, plan.history_from)
            if moved:
                log.info("moved %d finished event records to the history (vm=%s)", moved, vm)
        if purge_before is not None:
            purged = store.purge_done(purge_before)
            if purged:
                log.info("purged %d finished event records (vm=%s)", purged, vm)
    except (StoreError, InvalidName) as exc:
        metrics.errors.labels("store").inc()
        log.warning("store write failed, retried next cycle (vm=%s): %s", vm, exc)
        return False
    return True
