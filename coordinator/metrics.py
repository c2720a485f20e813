"""Prometheus metrics of one agent, on a registry passed in (never the global default).

Every label has a bounded set of values (event type and status, folded into ``Other`` beyond the known
ones; outcome; phase; the configured action names; a fixed set of reasons). No counter or histogram
carries an event id: what each event present now looks like is served by ``EventCollector``, whose
series exist only while their event does. ``docs/metrics.md`` describes every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.blockers import DECIDED
from coordinator.decide import Phase
from coordinator.models import EventStatus, EventType
from coordinator.store.base import ConnectionState

__all__ = [
    "ACTION_OUTCOMES",
    "ADMIN_STATE_CAUSES",
    "APPROVAL_OUTCOMES",
    "APPROVAL_REASONS",
    "BLOCKED_REASONS",
    "ERROR_STAGES",
    "EventCollector",
    "EventRow",
    "Metrics",
    "bounded_status",
    "bounded_type",
]

_KNOWN_TYPES = frozenset(t.value for t in EventType)
_KNOWN_STATUSES = frozenset(s.value for s in EventStatus)

#: Every value of the ``stage`` label of ``coordinator_errors_total``.
ERROR_STAGES = ("imds", "store", "action", "state", "bug")
#: Every value of the ``outcome`` label of ``coordinator_approvals_total``.
APPROVAL_OUTCOMES = ("posted", "refused", "fenced", "failed", "unknown")
#: Every value of the ``outcome`` label of ``coordinator_action_duration_seconds`` (``fallback``: the action
#: held by a fallback, not the way it is configured; ``coordinator.actions.base``); jobs end ``ok`` or ``failed``.
ACTION_OUTCOMES = ("ok", "fallback", "failed")
#: Every value of the ``cause`` label of ``coordinator_admin_state_failures_total``: why the ``azure-lb``
#: action could not use ARM (``coordinator.azure_arm``'s ``ArmError.cause``); any other is ``other``.
ADMIN_STATE_CAUSES = ("token", "forbidden", "not_found", "throttled", "unreachable", "server_error", "conflict",
                      "operation_failed", "not_confirmed", "bad_answer", "other")

#: Why this group approved an event: its rule was after-drain (every VM acknowledged) or immediately.
APPROVAL_REASONS = ("after_drain", "immediately")

#: Every value of the ``reason`` label of ``coordinator_events_blocked`` and ``coordinator_event_blocked``: the
#: kind of each blocker the decision gives (``coordinator.blockers.Hold``).
BLOCKED_REASONS: tuple[str, ...] = tuple(kind.value for kind in DECIDED)


def bounded_type(event_type: str) -> str:
    return event_type if event_type in _KNOWN_TYPES else "Other"


def bounded_status(status: str) -> str:
    return status if status in _KNOWN_STATUSES else "Other"


@dataclass(frozen=True)
class EventRow:
    """One event of the current document as ``EventCollector`` serves it."""

    event_id: str
    event_type: str  # bounded (``bounded_type``)
    status: str  # bounded (``bounded_status``)
    named_vms: int  # VMs its Resources name
    # None (the series is left out): not read, by an agent that no event names and that does not lead
    acknowledged_vms: int | None  # of those, how many have an acknowledgement in ZooKeeper
    approved: bool | None  # this group has approved it (its approval record, or this agent's POST)
    not_before: float | None  # epoch seconds
    blocked: tuple[str, ...] = ()  # bounded reasons (``BLOCKED_REASONS``) that hold its approval back


class HttpCounters(Collector):
    """``coordinator_http_connections_closed_total{reason}``: connections the probe and admin listeners
    ended early, read from the HTTP surface's own counters at each scrape (``source``, set once the
    surface exists; zeros before)."""

    REASONS = ("refused", "timed_out", "hung_up")

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, int]] = lambda: {}

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [self._family({})]

    def collect(self) -> Iterable[CounterMetricFamily]:
        return [self._family(self.source())]

    def _family(self, counts: Mapping[str, int]) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "coordinator_http_connections_closed", "Connections the probe and admin listeners closed early, "
            "by reason (refused: too many open; timed_out: no whole request in time; hung_up: the client left)",
            labels=["reason"])
        for reason in self.REASONS:
            family.add_metric([reason], counts.get(reason, 0))
        return family


class EventCollector(Collector):
    """Present-state detail of each event in the agent's latest document, read at scrape time.

    The agent replaces the rows after every cycle; an event gone from the document is gone from the next
    scrape, so ``event_id`` labels never accumulate."""

    _LABELS = ("event_id", "type", "status")

    def __init__(self) -> None:
        self._rows: tuple[EventRow, ...] = ()

    def update(self, rows: Iterable[EventRow]) -> None:
        self._rows = tuple(rows)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families(())

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self._families(self._rows)

    def _families(self, rows: tuple[EventRow, ...]) -> list[GaugeMetricFamily]:
        labels = list(self._LABELS)
        named = GaugeMetricFamily("coordinator_event_named_vms", "VMs named by the event's Resources",
                                  labels=labels)
        acked = GaugeMetricFamily(
            "coordinator_event_acknowledged_vms",
            "VMs named by the event whose acknowledgement is in ZooKeeper (drained for it now)", labels=labels)
        approved = GaugeMetricFamily(
            "coordinator_event_approved", "1 once this group has approved the event, else 0", labels=labels)
        not_before = GaugeMetricFamily(
            "coordinator_event_not_before_timestamp_seconds", "The event's NotBefore (absent when it has none)",
            labels=labels)
        blocked = GaugeMetricFamily(
            "coordinator_event_blocked", "1 for each reason that holds the event's approval back in this "
            "agent's last decision", labels=[*labels, "reason"])
        for row in rows:
            values = [row.event_id, row.event_type, row.status]
            named.add_metric(values, row.named_vms)
            if row.acknowledged_vms is not None:
                acked.add_metric(values, row.acknowledged_vms)
            if row.approved is not None:
                approved.add_metric(values, 1 if row.approved else 0)
            if row.not_before is not None:
                not_before.add_metric(values, row.not_before)
            for reason in row.blocked:
                blocked.add_metric([*values, reason], 1)
        return [named, acked, approved, not_before, blocked]


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.imds_requests = Counter(
            "coordinator_imds_requests_total", "IMDS HTTP attempts by method and outcome",
            ["method", "outcome"], registry=registry,
        )
        self.imds_latency = Histogram(
            "coordinator_imds_request_duration_seconds",
            "How long each IMDS HTTP attempt waited for its answer or its error, by method",
            ["method"], registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.documents_invalid = Counter(
            "coordinator_imds_documents_invalid_total", "IMDS documents that did not validate (ignored)",
            registry=registry,
        )
        self.document_incarnation = Gauge(
            "coordinator_imds_document_incarnation", "DocumentIncarnation of the last valid document",
            registry=registry,
        )
        self.document_age = Gauge(
            "coordinator_imds_reading_age_seconds",
            "Age of the latest IMDS reading (document or error) when the last cycle ran; NaN before the first",
            registry=registry,
        )
        self.events = Gauge(
            "coordinator_events", "Events in the current document by type and status",
            ["type", "status"], registry=registry,
        )
        self.acks = Counter(
            "coordinator_acknowledgements_total",
            "Drains acknowledged by this agent: once per drain, however many event ids it acknowledged",
            registry=registry,
        )
        self.approvals = Counter(
            "coordinator_approvals_total", "Approval attempts by outcome (posted, refused, fenced, failed, unknown)",
            ["outcome"], registry=registry,
        )
        self.approved = Counter(
            "coordinator_approved_events_total",
            "Events this agent approved (POST accepted) by reason: after_drain, immediately",
            ["reason"], registry=registry,
        )
        self.started_unapproved = Counter(
            "coordinator_events_started_unapproved_total",
            "Events naming this VM seen Scheduled, then Started without this group's approval (NotBefore came "
            "first)", registry=registry,
        )
        self.notice_reclaimed = Histogram(
            "coordinator_notice_reclaimed_seconds",
            "NotBefore minus the time of this agent's approval: the notice given back to the platform",
            registry=registry, buckets=(10, 30, 60, 120, 300, 450, 600, 750, 900, 1200, 1800),
        )
        self.event_id_changes = Counter(
            "coordinator_event_id_changes_total",
            "Started events naming this VM that came back under a new EventId (same type and Resources)",
            registry=registry,
        )
        self.blocked = Gauge(
            "coordinator_events_blocked",
            "Scheduled events whose approval this agent's last decision holds back, by reason",
            ["reason"], registry=registry,
        )
        self.next_not_before = Gauge(
            "coordinator_next_unapproved_not_before_seconds",
            "Seconds until the nearest NotBefore of a Scheduled event not approved yet (negative once past; "
            "NaN when there is none)", registry=registry,
        )
        self.is_leader = Gauge("coordinator_is_leader", "1 while this agent holds leadership", registry=registry)
        self.zk_state = Gauge(
            "coordinator_zookeeper_connection_state", "1 for the current ZooKeeper connection state",
            ["state"], registry=registry,
        )
        self._connected = False  # as the last set_connection said
        self.disconnects = Counter(
            "coordinator_zookeeper_disconnects_total",
            "Times this agent's ZooKeeper connection left the connected state (suspended or lost), as its "
            "cycles saw it: an outage too short to fire CoordinatorZooKeeperDisconnected still counts",
            registry=registry,
        )
        self.session_losses = Counter(
            "coordinator_zookeeper_session_losses_total",
            "ZooKeeper sessions of this agent that ended (expired or lost) while it ran", registry=registry,
        )
        self.phase = Gauge("coordinator_drain_phase", "1 for this VM's current drain phase", ["phase"],
                           registry=registry)
        self.paused = Gauge("coordinator_paused", "1 while an operator has paused early approvals for the group",
                            registry=registry)
        self.members = Gauge("coordinator_cluster_members", "Live agents seen in ZooKeeper", registry=registry)
        self.duplicate = Gauge(
            "coordinator_duplicate_vm_name",
            "1 while another live agent holds this VM's member node (two agents with one vm_name): this agent "
            "stays out of rotation", registry=registry,
        )
        self.drain_seconds = Histogram(
            "coordinator_drain_duration_seconds",
            "From the start of a drain to its first acknowledgement (once per drain)",
            registry=registry, buckets=(1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.action_seconds = Histogram(
            "coordinator_action_duration_seconds",
            "Duration of one action's drain or recover, by phase, action and outcome",
            ["phase", "action", "outcome"], registry=registry,
            buckets=(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.job_seconds = Histogram(
            "coordinator_job_duration_seconds",
            "Duration of a whole drain or recover job (every action in turn), by phase and outcome",
            ["phase", "outcome"], registry=registry,
            buckets=(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.approval_latency = Histogram(
            "coordinator_approval_latency_seconds", "From an event's first publication to its approval",
            registry=registry, buckets=(1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.cycle_seconds = Histogram(
            "coordinator_cycle_duration_seconds", "Duration of one agent cycle", registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.last_cycle = Gauge(
            "coordinator_last_cycle_timestamp_seconds", "Unix time at which the last cycle completed",
            registry=registry,
        )
        self.errors = Counter(
            "coordinator_errors_total", "Errors by stage (imds, store, action, state, bug)", ["stage"],
            registry=registry,
        )
        self.admin_state_failures = Counter(
            "coordinator_admin_state_failures_total",
            "Times the azure-lb action could not set this VM's load balancer admin state through ARM, by cause: "
            "each drain that fell back to the health probe alone, and each failed recovery",
            ["cause"], registry=registry,
        )
        self.info = Gauge(
            "coordinator_info", "1 for the agent: which VM, group and version it is (a join target for rules and "
            "dashboards that have no such target labels)", ["vm", "cluster", "version"], registry=registry,
        )
        self.event_detail = EventCollector()
        registry.register(self.event_detail)
        self.http_closed = HttpCounters()
        registry.register(self.http_closed)
        self._acked_drain: float | None = None
        self._blocked_counts: dict[str, int] = {}
        # Counters the alert rules take increase() of start at 0: a series first seen at 1 has no increase,
        # and a single failed drain would never fire CoordinatorDrainFailed.
        for stage in ERROR_STAGES:
            self.errors.labels(stage)
        for outcome in APPROVAL_OUTCOMES:
            self.approvals.labels(outcome)
        for state in ConnectionState:
            self.zk_state.labels(state.value)
        for phase in Phase:
            self.phase.labels(phase.value)
        for method in ("GET", "POST"):
            self.imds_latency.labels(method)
        for reason in APPROVAL_REASONS:
            self.approved.labels(reason)
        for reason in BLOCKED_REASONS:
            self.blocked.labels(reason)
        self.next_not_before.set(float("nan"))

    def set_connection(self, current: ConnectionState) -> None:
        connected = current is ConnectionState.CONNECTED
        if self._connected and not connected:
            self.disconnects.inc()
        self._connected = connected
        for state in ConnectionState:
            self.zk_state.labels(state.value).set(1 if state is current else 0)

    def set_phase(self, current: Phase) -> None:
        for phase in Phase:
            self.phase.labels(phase.value).set(1 if phase is current else 0)

    def set_events(self, counts: Mapping[tuple[str, str], int]) -> None:
        # Unknown types and statuses are folded into one label value each: cardinality stays bounded.
        folded: dict[tuple[str, str], int] = {}
        for (etype, status), n in counts.items():
            key = (bounded_type(etype), bounded_status(status))
            folded[key] = folded.get(key, 0) + n
        self.events.clear()
        for (etype, status), n in folded.items():
            self.events.labels(etype, status).set(n)

    def set_blocked(self, counts: Mapping[str, int]) -> None:
        """Events held back, by bounded reason (missing reasons are 0)."""
        if counts == self._blocked_counts:
            return
        self._blocked_counts = dict(counts)
        for reason in BLOCKED_REASONS:
            self.blocked.labels(reason).set(counts.get(reason, 0))

    def acknowledged(self, drain: float, seconds: float) -> None:
        """An acknowledgement was written for the drain that began at ``drain`` (its monotonic start).
        Counted, with its duration, for the first acknowledgement of each drain only: a drain stands for
        every event id it acknowledges, and IMDS may re-issue the id of an event while it runs."""
        if drain == self._acked_drain:
            return
        self._acked_drain = drain
        self.acks.inc()
        self.drain_seconds.observe(max(seconds, 0.0))

    def imds_request(self, method: str, outcome: str) -> None:
        self.imds_requests.labels(method, outcome).inc()

    def imds_request_time(self, method: str, seconds: float) -> None:
        self.imds_latency.labels(method).observe(seconds)

    def admin_state_expected(self) -> None:
        """An ``azure-lb`` action is configured: export every cause of
        ``coordinator_admin_state_failures_total`` from 0, so that ``increase()`` sees the first failure."""
        for cause in ADMIN_STATE_CAUSES:
            self.admin_state_failures.labels(cause)

    def admin_state_failed(self, cause: str) -> None:
        """The ``on_failure`` of the ``azure-lb`` action: a drain fell back, or a recovery failed, for
        ``cause`` (folded into ``other`` when it is not one of ``ADMIN_STATE_CAUSES``)."""
        self.admin_state_failures.labels(cause if cause in ADMIN_STATE_CAUSES else "other").inc()

    def action_done(self, phase: str, action: str, outcome: str, seconds: float) -> None:
        self.action_seconds.labels(phase, action, outcome).observe(max(seconds, 0.0))

    def job_done(self, phase: str, outcome: str, seconds: float) -> None:
        self.job_seconds.labels(phase, outcome).observe(max(seconds, 0.0))
