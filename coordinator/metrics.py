"""Prometheus metrics of one agent, on a registry passed in (never the global default).

Labels are low-cardinality only (event type, status, outcome, phase). Per-event state (which VM has
acknowledged which event) is on ``/status``, not in metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coordinator.decide import Phase
from coordinator.models import EventType
from coordinator.store.base import ConnectionState

__all__ = ["Metrics"]

_KNOWN_TYPES = {t.value for t in EventType}


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.imds_requests = Counter(
            "coordinator_imds_requests_total", "IMDS HTTP attempts by method and outcome",
            ["method", "outcome"], registry=registry,
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
            "coordinator_acknowledgements_total", "Acknowledgements written by this agent", registry=registry
        )
        self.approvals = Counter(
            "coordinator_approvals_total", "Approval attempts by outcome (posted, refused, failed)",
            ["outcome"], registry=registry,
        )
        self.is_leader = Gauge("coordinator_is_leader", "1 while this agent holds leadership", registry=registry)
        self.zk_state = Gauge(
            "coordinator_zookeeper_connection_state", "1 for the current ZooKeeper connection state",
            ["state"], registry=registry,
        )
        self.phase = Gauge("coordinator_drain_phase", "1 for this VM's current drain phase", ["phase"],
                           registry=registry)
        self.paused = Gauge("coordinator_paused", "1 while an operator has paused early approvals for the group",
                            registry=registry)
        self.members = Gauge("coordinator_cluster_members", "Live agents seen in ZooKeeper", registry=registry)
        self.drain_seconds = Histogram(
            "coordinator_drain_duration_seconds", "From the start of a drain to the acknowledgement",
            registry=registry, buckets=(1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.approval_latency = Histogram(
            "coordinator_approval_latency_seconds", "From an event's first publication to its approval",
            registry=registry, buckets=(1, 5, 10, 30, 60, 120, 300, 600, 900),
        )
        self.cycle_seconds = Histogram(
            "coordinator_cycle_duration_seconds", "Duration of one agent cycle", registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.errors = Counter(
            "coordinator_errors_total", "Errors by stage (imds, store, action, bug)", ["stage"],
            registry=registry,
        )
        for state in ConnectionState:
            self.zk_state.labels(state.value)
        for phase in Phase:
            self.phase.labels(phase.value)

    def set_connection(self, current: ConnectionState) -> None:
        for state in ConnectionState:
            self.zk_state.labels(state.value).set(1 if state is current else 0)

    def set_phase(self, current: Phase) -> None:
        for phase in Phase:
            self.phase.labels(phase.value).set(1 if phase is current else 0)

    def set_events(self, counts: dict[tuple[str, str], int]) -> None:
        self.events.clear()
        for (etype, status), n in counts.items():
            # Unknown types are folded into one label value to keep cardinality bounded.
            self.events.labels(etype if etype in _KNOWN_TYPES else "Other", status).set(n)
