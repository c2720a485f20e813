"""What the decision function reads and returns: the snapshot of one cycle, this VM's local state, the
policy, and the plan. Plain frozen dataclasses: ``coordinator.decide`` is where they are used."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.config import ApprovalRule, ApproverMode, PeersPolicy
from coordinator.models import Document, EventSource, EventType, ScheduledEvent
from coordinator.store.base import ClusterView, EventRecord
from coordinator.windows import Window

__all__ = [
    "ApprovalIntent",
    "LocalState",
    "PeerSeen",
    "Phase",
    "Plan",
    "Policy",
    "Sighting",
    "Snapshot",
    "is_gone",
    "rule_for",
]


class Phase(StrEnum):
    """This VM's own drain state. Only SERVING (and RECOVERING once its recovery finished) answers the
    health probe with 200; only SERVING counts as back in rotation."""

    UNKNOWN = "unknown"  # just started: no document read yet that clears the VM
    SERVING = "serving"
    DRAINING = "draining"  # drain actions running
    DRAINED = "drained"  # drain actions done; acks follow once each event's drain wait is over
    RECOVERING = "recovering"  # recover actions running, then the load balancer's return wait


@dataclass(frozen=True)
class LocalState:
    phase: Phase = Phase.UNKNOWN
    phase_since: float = 0.0  # monotonic time the phase began
    drain_started: float = 0.0  # monotonic time the current drain began
    job_running: bool = False  # the executor is still running this phase's actions
    job_failed: bool = False  # the last drain/recover job of this phase failed
    job_done_at: float = 0.0  # monotonic time the last job finished
    draining_for: frozenset[str] = frozenset()  # ids (as IMDS spells them) of the events held drained
    posted: frozenset[str] = frozenset()  # event ids this process has POSTed successfully


@dataclass(frozen=True)
class Sighting:
    """How recently fresh documents showed something: ``last`` is the monotonic time of the last
    fresh document that did, ``misses`` the number of fresh documents since then that did not."""

    last: float
    misses: int = 0


def is_gone(sighting: Sighting | None, mono: float, gone_after: float) -> bool:
    """Gone means missing from at least two fresh documents and for ``gone_after`` seconds: a single
    flapped read, or an incarnation reset that drops an event for one poll, never puts a VM back."""
    if sighting is None:
        return True
    return sighting.misses >= 2 and mono - sighting.last >= gone_after


@dataclass(frozen=True)
class PeerSeen:
    """One answer (or its absence) from a peer's health probe (see ``coordinator.peers``)."""

    in_rotation: bool  # answered 200, and its agent says "serving": its return wait is over
    at: float  # monotonic time the answer came (or the attempt failed)
    detail: str  # what was seen, for logs and the status view: "serving", "503 draining", "no answer: ..."


@dataclass(frozen=True)
class Snapshot:
    me: str
    now: float  # wall clock, epoch seconds
    mono: float  # monotonic clock
    document: Document | None  # read this cycle; None if the read failed
    last_document: Document | None  # the last document that parsed, possibly this one
    cluster: ClusterView | None  # None if the store could not be read this cycle
    named: Mapping[str, Sighting] = field(default_factory=dict)  # event id -> when it last named me
    seen: Mapping[str, Sighting] = field(default_factory=dict)  # event key -> when it was last present
    absent_for: Mapping[str, float] = field(default_factory=dict)  # vm -> seconds this agent saw it absent
    disconnected_for: float = 0.0  # seconds since the store connection was last seen CONNECTED
    uptime: float = float("inf")  # seconds since this process started
    peers: Mapping[str, PeerSeen] | None = None  # vm -> last probe answer; None: peers are not probed


@dataclass(frozen=True)
class Policy:
    approver: ApproverMode = ApproverMode.FIRST_RESOURCE
    approval: Mapping[str, ApprovalRule] = field(default_factory=dict)
    freeze_immediately_below: float | None = None
    unknown_peers: PeersPolicy = PeersPolicy.BLOCK
    absent_grace: float | None = None
    drain_wait: float = 35.0
    drain_wait_by_type: Mapping[str, float] = field(default_factory=dict)
    return_wait: float | None = None  # None: the drain wait (the load balancer notices both ways alike)
    gone_after: float = 3.0
    latest_start: float = 120.0
    lead_time: float | None = None
    unapprovable_at_once: bool = False  # drain at once for events that can never be approved early
    max_events: int | None = 1
    max_vms: int | None = None
    keep_one_serving: bool = True
    recovery_grace: float = 600.0
    terminate_together: bool = True
    recover_retry: float = 5.0
    done_retention: float = 7 * 24 * 3600.0
    session_timeout: float = 30.0
    # How old a peer's probe answer may be and still count; None: peers are not probed, and a live member
    # without an /out node or an ack counts as in rotation.
    peer_fresh: float | None = None
    windows: tuple[Window, ...] = ()  # maintenance windows: approve early only inside one (none: always)

    @property
    def budgeted(self) -> bool:
        """Whether the leader admits events before their VMs drain early. ``keep_one_serving`` needs
        admissions as much as a budget does: without them two events could take out every VM."""
        return self.max_events is not None or self.max_vms is not None or self.keep_one_serving

    def wait_for(self, event: ScheduledEvent) -> float:
        return self.drain_wait_by_type.get(event.event_type, self.drain_wait)

    @property
    def back_after(self) -> float:
        return self.drain_wait if self.return_wait is None else self.return_wait


def rule_for(event: ScheduledEvent, policy: Policy) -> ApprovalRule:
    """The approval rule of an event: ``User`` wins over the type; unknown types are never approved."""
    if not event.is_known_type:
        return ApprovalRule.NEVER
    if event.event_source == EventSource.USER and "User" in policy.approval:
        return policy.approval["User"]
    duration = event.duration_in_seconds
    if (
        event.event_type == EventType.FREEZE
        and policy.freeze_immediately_below is not None
        and duration is not None
        and 0 <= duration < policy.freeze_immediately_below
    ):
        return ApprovalRule.IMMEDIATELY
    return policy.approval.get(event.event_type, ApprovalRule.AFTER_DRAIN)


@dataclass(frozen=True)
class ApprovalIntent:
    event_id: str  # exactly as IMDS spelled it: it goes back in the POST
    key: str  # normalized id: the store key
    required: tuple[str, ...]  # VMs whose acks the store must see right before the POST
    as_leader: bool
    admission: bool = False  # the store must also see the event's admission right before the POST


@dataclass(frozen=True)
class Plan:
    next_phase: Phase | None = None
    start_drain: bool = False
    start_recover: bool = False
    publish: tuple[EventRecord, ...] = ()
    admit: tuple[str, ...] = ()
    ack: tuple[str, ...] = ()
    withdraw: tuple[str, ...] = ()
    approve: tuple[ApprovalIntent, ...] = ()
    mark_done: tuple[str, ...] = ()
    reopen: tuple[str, ...] = ()
    mark_absent: tuple[str, ...] = ()
    clear_absent: tuple[str, ...] = ()
    mark_out: tuple[str, ...] | None = None  # write /out/{me} for these events (None: leave it)
    clear_out: bool = False  # delete /out/{me}: back in rotation
    purge_before: float | None = None
    holding: tuple[str, ...] = ()  # ids of the events that hold this VM drained
    approvers: Mapping[str, str] = field(default_factory=dict)  # event key -> approver (or "")
    blocked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # event key -> reasons
    invalid: tuple[str, ...] = ()  # why some events cannot be coordinated
    waiting: str = ""  # why this VM is not recovering although nothing holds it

    @property
    def acts(self) -> bool:
        """True if carrying out the plan changes anything (the cycle is then logged at INFO)."""
        return bool(
            self.next_phase
            or self.start_drain
            or self.start_recover
            or self.publish
            or self.admit
            or self.ack
            or self.withdraw
            or self.approve
            or self.mark_done
            or self.reopen
            or self.mark_absent
            or self.clear_absent
            or self.mark_out is not None
            or self.clear_out
        )

    def describe(self) -> str:
        parts: list[str] = []
        if self.start_drain:
            parts.append(f"drain for {','.join(self.holding)}")
        if self.start_recover:
            parts.append("recover")
        if self.next_phase and not (self.start_drain or self.start_recover):
            parts.append(f"-> {self.next_phase.value}")
        for label, items in (("publish", [r.event_id for r in self.publish]), ("admit", self.admit),
                             ("ack", self.ack), ("withdraw ack", self.withdraw),
                             ("approve", [i.event_id for i in self.approve]), ("done", self.mark_done),
                             ("reopen", self.reopen), ("absent", self.mark_absent), ("back", self.clear_absent)):
            if items:
                parts.append(f"{label} {','.join(items)}")
        if self.clear_out:
            parts.append("back in rotation")
        if self.waiting:
            parts.append(f"stays out: {self.waiting}")
        for key, reasons in sorted(self.blocked.items()):
            parts.append(f"{key} waits: {'; '.join(reasons)}")
        return "; ".join(parts) if parts else "nothing to do"
