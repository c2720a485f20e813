"""What the agent reports about itself beyond one cycle's plan: metrics derived from successive cycles,
and its liveness and readiness.

``Telemetry`` is fed by the agent loop only (``cycle_done`` after each cycle, ``approved`` after each
accepted POST); ``live`` and ``ready`` are read by the admin HTTP server's threads. It keeps what
spans cycles:

* the previous document, to see an event naming this VM turn from Scheduled to Started without this
  group's approval (NotBefore came first), and a Started event come back under a new EventId (IMDS may
  re-issue an id while an event runs: one maintenance, one drain, two ids);
* the approvals of the group it has read, so that an event approved by a peer while this agent was cut
  off from ZooKeeper is not taken for one that started without approval: an event that started while
  no view could be read is judged once a view is read again (said as "not known yet" meanwhile);
* the ZooKeeper session this agent held, to count session losses even when the new session was
  established before the loop looked (the id changed);
* when the last cycle completed, whether one has completed with a ZooKeeper view and a valid document
  read that cycle, and how the latest cycles went: the outage of the view under way, if any
  (``coordinator.outage``: also its log lines), and when a valid document was last read.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.blockers import Blocker
from coordinator.config import ApprovalRule
from coordinator.decide import LocalState, Plan, Policy, Snapshot, rule_for
from coordinator.errors import ImdsBadRequest, ImdsError, ImdsUnavailable, MalformedDocument
from coordinator.metrics import EventRow, Metrics, bounded_status, bounded_type
from coordinator.models import Document, ScheduledEvent
from coordinator.outage import ViewOutage
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, Part

__all__ = ["Health", "Telemetry", "status_dict"]

log = logging.getLogger(__name__)
# The lines that describe the agent's cycles are logged as the agent's own.
agent_log = logging.getLogger("coordinator.agent")

_ID_LABEL_MAX = 128


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str
    lead: str | None = None  # what an HTTP body leads with instead of "ok" or "failing" (``/readyz``)


class Telemetry:
    def __init__(self, metrics: Metrics, vm: str, policy: Policy, *, started: float, live_after: float) -> None:
        self._metrics = metrics
        self._vm = vm
        self._policy = policy
        self._started = started
        self.live_after = live_after
        self._previous: Document | None = None
        self._records: Mapping[str, EventRecord] = {}
        self._follows = True  # the last view was the whole one (else: no acks or approvals of others read)
        self._blocked: Mapping[str, tuple[Blocker, ...]] = {}  # the last reasons decided on a fresh document
        self._session: object | None = None  # the ZooKeeper session id this agent last held
        self._completed_at: float | None = None  # monotonic time of the last completed cycle
        self._ready = False
        self._duplicate: str | None = None  # another agent runs as this VM (the last cycle said so)
        self._described = ""  # the last cycle's description, to log a cycle at INFO only when it changes
        self._paused_seen = False  # for the log line when an operator's pause starts or ends
        self._outage = ViewOutage(vm, agent_log)  # the cluster view's outage under way, and its log lines
        self._document_at: float | None = None  # monotonic time of the last cycle with a valid, fresh document
        self._document_now = False  # the last cycle had one
        # Keys of the records this agent has read with the group's approval (whole views only; forgotten
        # with their records), and the events naming this VM that started while whether the group had
        # approved them could not be read: key -> event id as IMDS spells it, judged at the next view.
        self._approvals_seen: set[str] = set()
        self._unsettled: dict[str, str] = {}

    # -- liveness and readiness (any thread) -------------------------------------------------------------

    def completed(self, mono: float, now: float) -> None:
        """A cycle completed (monotonic and wall time)."""
        self._completed_at = mono
        self._metrics.last_cycle.set(now)

    def since_cycle(self, mono: float) -> float:
        """Seconds since the last completed cycle (since start, before the first)."""
        last = self._completed_at
        return mono - (last if last is not None else self._started)

    def live(self, mono: float) -> Health:
        """Live while a cycle has completed within ``live_after`` seconds (or since start, before the first)."""
        last = self._completed_at
        since = self.since_cycle(mono)
        if since > self.live_after:
            what = f"since the start {since:.0f} s ago" if last is None else f"for {since:.0f} s"
            return Health(False, f"no cycle completed {what} (bound {self.live_after:.0f} s)")
        if last is None:
            return Health(True, "starting: first cycle not completed yet")
        return Health(True, f"last cycle completed {since:.1f} s ago")

    def view_outage(self, mono: float) -> dict[str, object] | None:
        """The cluster view's outage under way, for ``/status``: how long, and why the last read failed."""
        outage = self._outage.lasting(mono)
        return None if outage is None else {"for_seconds": round(outage[0], 1), "why": outage[1]}

    def ready(self, mono: float) -> Health:
        """Ready once a cycle has completed with both a ZooKeeper view and a valid IMDS document, and from
        then on (another agent running as this VM aside): what fails later is the group's shared
        dependency or IMDS, not this agent, and a restart would not bring it back. The detail says what
        holds now: "coordinating" only while the last cycles read both; else what is missing, since when."""
        duplicate = self._duplicate
        if duplicate is not None:
            return Health(False, duplicate)
        if not self._ready:
            return Health(False, "no cycle yet with both a ZooKeeper view and a valid IMDS document")
        missing: list[str] = []
        outage = self._outage.lasting(mono)
        if outage is not None:
            lasted, problem = outage
            missing.append(f"no ZooKeeper view for {lasted:.0f} s ({problem}): nothing is approved until it is back")
        document_at = self._document_at
        if not self._document_now and document_at is not None:
            missing.append(f"no valid IMDS document in the last cycle (the last one {mono - document_at:.0f} s ago): "
                           "nothing new is drained or approved without one")
        if missing:
            # Still ready (a restart would not bring back what is missing), but the body leads with what is
            # true now: a ``curl -f`` sees 200, a person reading it sees "not coordinating".
            return Health(True, "; ".join(missing) + "; still ready: it joined its group, and a restart would "
                          "not bring this back", lead="not coordinating")
        return Health(True, "coordinating: the last cycle read the ZooKeeper view and a valid IMDS document")

    # -- the loop ------------------------------------------------------------------------------------------

    def report(self, snap: Snapshot, plan: Plan, local: LocalState, connection: ConnectionState,
               session: object | None) -> str:
        """Describe a cycle in one log line (INFO when it acted or its description changed), say once when
        an operator's pause begins or ends, and update what spans cycles. Returns the description."""
        description = plan.describe()
        vm = self._vm
        if plan.acts or description != self._described:
            incarnation = snap.document.document_incarnation if snap.document else None
            agent_log.info("cycle (vm=%s phase=%s incarnation=%s): %s", vm, local.phase.value, incarnation, description)
        else:
            agent_log.debug("cycle (vm=%s): %s", vm, description)
        for problem in plan.invalid:
            if problem not in self._described:
                agent_log.warning("cannot coordinate (vm=%s): %s", vm, problem)
        self._described = description + "".join(plan.invalid)
        if snap.cluster is not None:
            paused = snap.cluster.paused
            if (paused is not None) != self._paused_seen:
                if paused is not None:
                    agent_log.warning("early approvals paused for the group by %s: %s; drains go on (vm=%s)",
                                paused.by, paused.reason, vm)
                else:
                    agent_log.info("pause lifted: early approvals resume (vm=%s)", vm)
            self._paused_seen = paused is not None
            self._metrics.paused.set(1 if paused is not None else 0)
        self._duplicate = snap.duplicate
        self._metrics.duplicate.set(1 if snap.duplicate else 0)
        self.cycle_done(snap, plan, local, connection, session)
        return description

    def view_unavailable(self, problem: object, mono: float) -> None:
        """A read of the cluster view failed (``coordinator.outage``: logged once, then reminded)."""
        self._outage.unavailable(problem, mono)

    def imds_error(self, exc: ImdsError) -> None:
        """A reading that failed: counted, and logged by kind."""
        vm = self._vm
        self._metrics.errors.labels("imds").inc()
        if isinstance(exc, MalformedDocument):
            self._metrics.documents_invalid.inc()
            agent_log.warning("IMDS document ignored (vm=%s): %s; content: %s", vm, exc, exc.content)
        elif isinstance(exc, ImdsBadRequest):
            agent_log.error("IMDS refused our request (a bug; vm=%s): %s %s", vm, exc, exc.body[:500])
        elif isinstance(exc, ImdsUnavailable):
            agent_log.warning("IMDS unavailable (vm=%s, %s): %s", vm, exc.outcome, exc)
        else:
            agent_log.warning("IMDS error (vm=%s): %s", vm, exc)

    def cycle_done(self, snap: Snapshot, plan: Plan, local: LocalState, connection: ConnectionState,
                   session: object | None) -> None:
        """After a cycle: everything derived from it and from the cycles before."""
        metrics = self._metrics
        whole: ClusterView | None = None  # this cycle's view, if it holds the approvals (a whole one)
        if snap.cluster is not None:
            self._outage.available(snap.mono)
            self._records = snap.cluster.records
            self._follows = snap.cluster.complete
            if snap.document is not None:
                self._ready = True
            # Every record keeps its node in either view: what is forgotten is what was purged.
            self._approvals_seen &= set(self._records)
            if snap.cluster.complete:
                whole = snap.cluster
                self._approvals_seen |= {k for k, r in self._records.items() if r.approval is not None}
        self._document_now = snap.document is not None
        if snap.document is not None:
            self._document_at = snap.mono
        self._session_changes(connection, session)
        document = snap.last_document
        if document is not None and document is not self._previous:
            if self._previous is not None:
                self._compare(self._previous, document, local, whole)
            self._previous = document
        if whole is not None and self._unsettled:
            self._settle(local, whole)
        if snap.document is not None:
            # Without a fresh document the decision gives no reasons at all: keep the last ones.
            self._blocked = plan.blocked
        counts: Counter[str] = Counter()
        for reasons in self._blocked.values():
            counts.update({r.kind.value for r in reasons})
        metrics.set_blocked(counts)
        nearest = math.inf
        rows: list[EventRow] = []
        for event in document.events if document is not None else ():
            key = event.event_id.upper()
            record = self._records.get(key)
            approved = self._approved(event, record, local)
            if event.is_scheduled and not approved and event.not_before is not None:
                nearest = min(nearest, event.not_before.timestamp() - snap.now)
            named = {r.lower() for r in event.resources}
            acked = len(named & set(record.acks)) if record is not None else 0
            rows.append(EventRow(
                event_id=event.event_id[:_ID_LABEL_MAX],
                event_type=bounded_type(event.event_type),
                status=bounded_status(event.event_status),
                named_vms=len(named),
                # An agent that follows only its own part of the group (no event names it) reads no other
                # VM's ack nor the approval: those series come from the VMs named and the leader.
                acknowledged_vms=acked if self._follows else None,
                approved=approved if self._follows else None,
                not_before=event.not_before.timestamp() if event.not_before is not None else None,
                blocked=tuple(sorted({r.kind.value for r in self._blocked.get(key, ())})),
            ))
        metrics.next_not_before.set(nearest if math.isfinite(nearest) else math.nan)
        metrics.event_detail.update(rows)

    def approved(self, event: ScheduledEvent | None, at: float) -> None:
        """This agent's POST approving ``event`` was accepted at ``at`` (wall clock)."""
        if event is None:
            return
        rule = rule_for(event, self._policy)
        self._metrics.approved.labels("immediately" if rule is ApprovalRule.IMMEDIATELY else "after_drain").inc()
        if event.not_before is not None:
            self._metrics.notice_reclaimed.observe(max(event.not_before.timestamp() - at, 0.0))

    # -- internals -------------------------------------------------------------------------------------------

    def _approved(self, event: ScheduledEvent, record: EventRecord | None, local: LocalState) -> bool:
        key = event.event_id.upper()
        return (key in local.posted or key in self._approvals_seen
                or (record is not None and record.approval is not None))

    def _group_approved(self, key: str, local: LocalState, whole: ClusterView | None) -> bool | None:
        """Whether this group approved the event ``key``: True on any evidence of it (this agent's POST, an
        approval record read now or before); False only when this cycle read the whole view and its record
        holds no approval (an approval is written on the record before any POST); None when it cannot be
        known now (no view, or only this VM's part of it)."""
        if key in local.posted or key in self._approvals_seen:
            return True
        if whole is None:
            return None
        record = whole.records.get(key)
        return record is not None and record.approval is not None

    def _started_unapproved(self, event_id: str, why: str) -> None:
        self._metrics.started_unapproved.inc()
        log.warning("event started without this group's approval: %s (vm=%s event=%s)", why, self._vm, event_id,
                    extra={"event_id": event_id})

    def _settle(self, local: LocalState, whole: ClusterView) -> None:
        """Judge the events that started while no view could be read, now that the whole one is."""
        for key, event_id in sorted(self._unsettled.items()):
            if self._group_approved(key, local, whole):
                record = whole.records.get(key)
                by = record.approval.by if record is not None and record.approval is not None else "this VM"
                log.info("event started with this group's approval (vm=%s event=%s): approved by %s, read once "
                         "the ZooKeeper view was back", self._vm, event_id, by, extra={"event_id": event_id})
            else:
                self._started_unapproved(event_id, "no approval in its record, read once the ZooKeeper view was "
                                                   "back: its NotBefore came first")
        self._unsettled.clear()

    def _session_changes(self, connection: ConnectionState, session: object | None) -> None:
        held = self._session
        if connection is ConnectionState.LOST:
            if held is not None:
                self._lost(held, "lost")
            self._session = None
        elif session is not None:
            if held is not None and session != held:
                self._lost(held, "replaced by a new one")
            self._session = session

    def _lost(self, session: object, how: str) -> None:
        self._metrics.session_losses.inc()
        log.warning("ZooKeeper session %s %s (vm=%s): its acknowledgements, member node and leadership are gone",
                    f"0x{session:x}" if isinstance(session, int) else session, how, self._vm)

    def _compare(self, before: Document, after: Document, local: LocalState, whole: ClusterView | None) -> None:
        """Two successive documents: events naming this VM that started unapproved (judged on ``whole``, this
        cycle's whole view, or later when there is none), and running events (Started, or approved) that
        came back Started under another id."""
        mine_before = {e.event_id: e for e in before.events if e.names(self._vm)}
        mine_after = {e.event_id: e for e in after.events if e.names(self._vm)}
        for event_id, event in mine_after.items():
            earlier = mine_before.get(event_id)
            if earlier is None or not earlier.is_scheduled or not event.is_started:
                continue
            key = event_id.upper()
            approved = self._group_approved(key, local, whole)
            if approved is None:
                self._unsettled[key] = event_id
                log.info("event started (vm=%s event=%s); whether this group approved it is not known yet: this "
                         "cycle read no approvals from ZooKeeper; said once it does", self._vm, event_id,
                         extra={"event_id": event_id})
            elif not approved:
                self._started_unapproved(event_id, "its NotBefore came first")
        # Running before: Started, or Scheduled and approved by this group (the POST started it; the read
        # that would have shown it Started under its old id may never come).
        gone = [e for eid, e in mine_before.items() if eid not in mine_after and (
            e.is_started or (e.is_scheduled and self._approved(e, self._records.get(eid.upper()), local)))]
        for event_id, event in mine_after.items():
            if not event.is_started or event_id in mine_before:
                continue
            match = next((e for e in gone if _same_maintenance(e, event)), None)
            if match is None:
                continue
            gone.remove(match)
            self._metrics.event_id_changes.inc()
            log.warning("Started event came back under a new id (vm=%s event=%s, was %s): same type and Resources, "
                        "one maintenance and one drain, counted once", self._vm, event_id, match.event_id,
                        extra={"event_id": event_id})


def _same_maintenance(a: ScheduledEvent, b: ScheduledEvent) -> bool:
    return a.event_type == b.event_type and {r.lower() for r in a.resources} == {r.lower() for r in b.resources}


def status_dict(vm: str, local: LocalState, plan: Plan | None, snap: Snapshot | None, description: str,
                cycles: int) -> dict[str, Any]:
    """The agent's ``/status`` document: its phase, what it holds and approved, and the last cycle's view."""
    out: dict[str, Any] = {
        "vm": vm,
        "phase": local.phase.value,
        "cycles": cycles,
        "last_cycle": description,
        "approved_by_me": sorted(local.posted),
        "drained_for": sorted(local.draining_for),
        "stays_out": plan.waiting if plan is not None else "",
        "duplicate": snap.duplicate if snap is not None else None,
    }
    if snap is None or plan is None:
        return out
    cluster = snap.cluster
    out["imds"] = {
        "fresh": snap.document is not None,
        "incarnation": snap.last_document.document_incarnation if snap.last_document else None,
    }
    out["cluster"] = None if cluster is None else {
        "connection": cluster.connection.value,
        "leader": cluster.leader,
        "i_am_leader": cluster.i_am_leader,
        "members": sorted(cluster.members),
        "paused": None if cluster.paused is None else {
            "reason": cluster.paused.reason, "by": cluster.paused.by, "at": cluster.paused.at},
        # the leader's reason for each drain by hand it does not admit yet (``coordinator status`` shows it)
        "drain_waits": dict(sorted(plan.drain_waits.items())),
    }
    if snap.peers is not None:
        # What this agent's probes of its peers showed, as the budget counts them (leader and named VMs).
        out["peers"] = {vm: {"in_rotation": seen.in_rotation, "seen": seen.detail,
                             "age_seconds": round(snap.mono - seen.at, 1)} for vm, seen in sorted(snap.peers.items())}
    events = []
    for event in snap.last_document.events if snap.last_document else ():
        key = event.event_id.upper()
        record = cluster.records.get(key) if cluster else None
        events.append({
            "event_id": event.event_id,
            "type": event.event_type,
            "status": event.event_status,
            "resources": list(event.resources),
            "not_before": event.not_before.isoformat() if event.not_before else None,
            "approver": plan.approvers.get(key),
            # null: not read by this agent, which approves, closes and leads nothing (its approver's /status
            # and `coordinator status` show them)
            "acks": (sorted(record.acks) if record else []) if cluster is None or cluster.complete else None,
            # whether this VM's own ack stands, on any view that holds the records (null: it reads none)
            "acked_here": (snap.me in record.acks if record else False)
            if cluster is not None and cluster.part.holds(Part.NAMED) else None,
            "approved_by": record.approval.by if record and record.approval else None,
            # why it is not approved now: in words, and as the values ``coordinator status`` reads
            "waiting_for": list(plan.reasons(key)),
            "blockers": [blocker.as_json() for blocker in plan.blocked.get(key, ())],
        })
    out["events"] = events
    return out
