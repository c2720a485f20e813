"""What the decision function reads and returns: the snapshot of one cycle, this VM's local state, the
policy, and the plan. Plain frozen dataclasses: ``coordinator.decide`` is where they are used."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.blockers import Blocker, Hold
from coordinator.config import ApprovalRule, ApproverMode, PeersPolicy
from coordinator.delivery import Delivery
from coordinator.maintenance_windows import Window, in_windows
from coordinator.models import Document, EventSource, EventType, ScheduledEvent
from coordinator.operations import ApprovalIntent, Operation
from coordinator.state import PersistedState
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, Pause

__all__ = [
    "ApprovalIntent",
    "LocalState",
    "PeerSeen",
    "Phase",
    "Plan",
    "Policy",
    "Sighting",
    "Snapshot",
    "approval_fence",
    "is_gone",
    "pause_holds",
    "rule_for",
    "session_lapses_after",
    "sight",
    "window_holds",
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
    draining_for: frozenset[str] = frozenset()  # keys (upper-cased ids) of the events held drained
    posted: frozenset[str] = frozenset()  # keys of the events this process POSTed, for their current instance
    # event key -> when the cycle that first found it approvable (without a break since) began
    approvable_since: Mapping[str, float] = field(default_factory=dict)
    # A recovery from UNKNOWN runs every action (False: restarted while serving, only those that always recover)
    recover_all_at_start: bool = True
    approving: bool = False  # this VM approves an event of its last fresh document (it probes its peers)
    asked: frozenset[str] = frozenset()  # records published by peers for which IMDS was read early
    last_purge: float = float("-inf")  # monotonic time the leader last purged old done records
    saved: PersistedState | None = None  # what the state file holds, as this process last read or wrote it
    # An approval waits for peers asked again: the next cycle asks them before it decides (``confirmed_peers``)
    confirm_peers: bool = False


@dataclass(frozen=True)
class Sighting:
    """How recently fresh documents showed something, timed by the requests that read them: ``last`` is
    when the last answer that showed it *arrived* (it was there at some point up to then), ``misses`` the
    number of answers since then that did not show it, and ``missed_at`` when the request of the latest
    of those was *sent* (it was missing at some point from then on). Both ends are taken on the side that
    makes "gone" later: a slow answer never stretches the misses."""

    last: float
    misses: int = 0
    missed_at: float | None = None
    # False for a record first heard of from the store and never listed by this VM's documents since
    # (``coordinator.evidence.after_view``): in groups whose IMDS shows each VM only the events naming it,
    # its misses say nothing about the event.
    listed: bool = True


def is_gone(sighting: Sighting | None, gone_after: float) -> bool:
    """Gone means missing from at least two fresh documents whose requests were sent ``gone_after``
    seconds or more after the last answer that showed it arrived: a single flapped read, an incarnation
    reset that drops an event for one poll, or two quick reads whose answers came late never put a VM
    back. Time without answers (IMDS unreachable) adds nothing."""
    if sighting is None:
        return True
    return (sighting.misses >= 2 and sighting.missed_at is not None
            and sighting.missed_at - sighting.last >= gone_after)


def sight(sightings: Mapping[str, Sighting], present: set[str], sent: float, answered: float) -> dict[str, Sighting]:
    """One fresh document, read by a request sent at ``sent`` and answered at ``answered``: what it
    shows is seen (as late as ``answered``), everything else tracked misses once more (as early as
    ``sent``)."""
    out: dict[str, Sighting] = {}
    for key, sighting in sightings.items():
        if key not in present:
            missed_at = sent if sighting.missed_at is None else max(sighting.missed_at, sent)
            out[key] = Sighting(sighting.last, sighting.misses + 1, missed_at, sighting.listed)
    for key in present:
        out[key] = Sighting(answered)
    return out


@dataclass(frozen=True)
class PeerSeen:
    """One answer (or its absence) from a peer's health probe (see ``coordinator.peers``)."""

    in_rotation: bool  # answered 200, and its agent says "serving": its return wait is over
    at: float  # monotonic time the answer came (or the attempt failed)
    detail: str  # what was seen, for logs and the status view: "serving", "503 draining", "no answer: ..."
    answered: bool = True  # False: the probe did not answer at all (refused, timed out, not asked)


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
    # The connection history, on this process's monotonic clock: when it was last seen CONNECTED (None:
    # never, in this process) and when the process started.
    connected_at: float | None = None
    started: float = float("-inf")
    # The longest session timeout a server granted this process (None: not known, no session yet).
    granted_session: float | None = None
    # When this cycle began, and when the request of the reading it uses (``document`` or not) was sent.
    cycle_started: float = float("-inf")
    read_sent: float = float("-inf")
    # Another live agent holds this VM's member node (two agents run with one vm_name): why, in one line.
    duplicate: str | None = None
    peers: Mapping[str, PeerSeen] | None = None  # vm -> last probe answer; None: peers are not probed
    # This process's documents have shown an event that does not name this VM: IMDS delivers to it every
    # event of its unit (``Delivery.every_event`` with ``imds.delivery: auto``).
    seen_unnamed: bool = False
    # event key -> when this process's view first showed its record marked done (``Evidence.done_seen``)
    done_seen: Mapping[str, float] = field(default_factory=dict)
    # Event key -> the wall time this process first saw it Started (``evidence.note_started``): the done mark
    # carries it into the group's history.
    started_seen: Mapping[str, float] = field(default_factory=dict)
    # When this cycle asked the peers' probes again, before deciding (None: it did not). ``peers`` then holds
    # those answers.
    peers_confirmed_at: float | None = None

    @property
    def uptime(self) -> float:
        return self.mono - self.started

    @property
    def cut_off_for(self) -> float:
        """How long this process has been without a CONNECTED session, counted from before it started
        when it never had one: a restarted agent does not know when its previous session ended, and the
        peers may have seen this VM gone since before the restart."""
        if self.cluster is not None and self.cluster.connection is ConnectionState.CONNECTED:
            return 0.0
        if self.connected_at is None:
            return float("inf")
        return self.mono - self.connected_at


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
    # How long after its approver a VM cut off from ZooKeeper may first see an event (its polls, a slow
    # IMDS answer): an event naming VMs absent past ``absent_grace`` waits this long beyond their drain
    # wait before it is approved without them.
    absent_notice: float = 5.0
    terminate_together: bool = True
    recover_retry: float = 5.0
    drain_retry: float = 30.0  # a failed drain is tried again this long after it began (the VM stays out)
    done_retention: float = 7 * 24 * 3600.0
    # How long after its done mark a record stays among the records the agents read, when a VM it names runs
    # an agent (it closed on a document of that VM's unit, which no longer listed it): long past the time the
    # other VMs of the unit take to find it gone (two readings ``gone_after`` apart), after which a VM whose
    # documents listed it again would publish it as a new record anyway (``decide.records.to_archive``).
    archive_after: float = 10.0
    session_timeout: float = 30.0  # what the agent asks ZooKeeper for
    # ZooKeeper's tickTime as the operator configured it: the server grants at least 2 ticks, and expires
    # a session only on a tick boundary, up to one tick after its timeout.
    zk_tick: float = 2.0
    # How old a peer's probe answer may be and still count; None: peers are not probed, and a live member
    # without an /out node or an ack counts as in rotation.
    peer_fresh: float | None = None
    windows: tuple[Window, ...] = ()  # maintenance windows: approve early only inside one (none: always)
    delivery: Delivery = field(default_factory=Delivery)  # this VM's delivery unit and how IMDS delivers in it

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
    # write /out/{vm} for other VMs, with these events: VMs an approval goes ahead without (absent past the
    # grace), marked out before it does, since their agents cannot say so (docs/safety.md S4)
    mark_out_for: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the leader admits these drains by hand into the budget (VM -> ``HandDrain.asked``), and forgets the
    # admissions of drains undone since
    admit_drains: Mapping[str, int] = field(default_factory=dict)
    forget_admissions: tuple[str, ...] = ()
    drain_waits: Mapping[str, str] = field(default_factory=dict)  # the leader's reason for each it does not
    purge_before: float | None = None
    # the leader moves these done records out of the records the agents read, into the history, and deletes
    # the history's records done before ``history_from`` (``decide.records.to_archive``)
    archive: tuple[str, ...] = ()
    history_from: float = 0.0
    holding: tuple[str, ...] = ()  # ids of the events that hold this VM drained
    approvers: Mapping[str, str] = field(default_factory=dict)  # event key -> approver (or "")
    blocked: Mapping[str, tuple[Blocker, ...]] = field(default_factory=dict)  # event key -> why not approved
    invalid: tuple[str, ...] = ()  # why some events cannot be coordinated
    waiting: str = ""  # why this VM is not recovering although nothing holds it
    # read IMDS now: an approval waits for a document read after it became approvable, or a peer published an
    # event this VM's documents do not show yet
    read_now: bool = False
    unseen: str = ""  # what this cycle could not read (no fresh IMDS document, no ZooKeeper view): decided blind
    # This VM's own state once the plan is carried out (its results, such as POSTs accepted, come on top), and
    # what the loop does beside the group's writes: which recover actions run (all, or only those that always
    # recover), the state file written before the drain job and after the cycle, whether the peers are probed
    # (None: peers are not probed, or no view: as it was).
    local: LocalState = field(default_factory=LocalState)
    recover_all: bool = True
    save_first: PersistedState | None = None
    save: PersistedState | None = None
    probe_peers: bool | None = None
    # What the shell carries out, in this order (``decide.order.in_order``): the fields above as operations.
    operations: tuple[Operation, ...] = ()

    def reasons(self, key: str) -> tuple[str, ...]:
        """What holds the event ``key`` from being approved now, in words (empty: nothing the plan says)."""
        return tuple(str(blocker) for blocker in self.blocked.get(key, ()))

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
            or bool(self.mark_out_for)
            or bool(self.admit_drains)
            or bool(self.forget_admissions)
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
        for other, events in sorted(self.mark_out_for.items()):
            parts.append(f"mark {other} out for {','.join(events)}")
        if self.admit_drains:
            parts.append(f"admit the drain by hand of {','.join(sorted(self.admit_drains))}")
        if self.waiting:
            parts.append(f"stays out: {self.waiting}")
        for key in sorted(self.blocked):
            parts.append(f"{key} waits: {'; '.join(self.reasons(key))}")
        for other, reason in sorted(self.drain_waits.items()):
            parts.append(f"drain by hand of {other} waits: {reason}")
        if self.unseen:
            # Blind to ZooKeeper or IMDS, a cycle approves nothing; the VM still drains when its own evidence
            # says so (NotBefore close, cut off long enough), and recovers on it: say so, never "stays as it is".
            changes = ("drains" if self.start_drain else "recovers" if self.start_recover
                       else f"turns {self.next_phase.value}" if self.next_phase else "")
            parts.append(f"{self.unseen}: {changes} on this VM's own evidence, approves nothing" if changes
                         else f"{self.unseen}: the VM stays as it is")
        return "; ".join(parts) if parts else "nothing to do"


def pause_holds(paused: Pause | None) -> Blocker | None:
    """The operator's pause, as it holds approvals. The one rule, asked at each moment it is checked: by
    the decision, before every attempt of an approval's POST (``approval_fence``), and by an operator's
    approval by hand (``coordinator.override``). The store's gate checks the pause node itself."""
    if paused is None:
        return None
    return Blocker(Hold.PAUSED, f"approvals paused by {paused.by}: {paused.reason}")


def window_holds(policy: Policy, now: float) -> Blocker | None:
    """The maintenance windows, as they hold approvals now (``now``: wall clock); asked at the same moments
    as the pause."""
    if in_windows(policy.windows, now):
        return None
    return Blocker(Hold.OUTSIDE_WINDOW, "outside the maintenance windows")


def session_lapses_after(policy: Policy, granted: float | None) -> float:
    """How long after a session was last heard from by the server it has certainly expired there: the
    longest timeout it may have been granted (what was asked, what a server granted this process, and
    ZooKeeper's minimum of two ticks), plus one tick (expiry happens on tick boundaries). A session of an
    earlier process of this agent is bounded the same way."""
    timeout = max(policy.session_timeout, granted or 0.0, 2 * policy.zk_tick)
    return timeout + policy.zk_tick


def approval_fence(
    policy: Policy,
    *,
    mono: float,
    now: float,
    checked_at: float,
    granted: float | None,
    connection: ConnectionState,
    paused: Pause | str | None,
    peers_confirmed_at: float | None,
) -> str:
    """Why no (more) bytes of an approval may be sent now (empty: they may). Checked before every attempt
    of the POST, retries included: the session may have lapsed (half the shorter of the asked and the
    granted timeout since the final check began), the connection is not CONNECTED, an operator paused
    approvals since (``paused``: the pause read now, or why it could not be read), the maintenance window
    closed, or the peers counted as serving were confirmed too long ago."""
    session = min(policy.session_timeout, granted) if granted else policy.session_timeout
    if mono >= checked_at + session / 2:
        return f"more than half a session timeout ({session / 2:.1f}s) since the final check"
    if connection is not ConnectionState.CONNECTED:
        return f"ZooKeeper connection {connection.value}"
    if isinstance(paused, str):
        return f"the pause could not be read: {paused}"
    held = pause_holds(paused) or window_holds(policy, now)
    if held is not None:
        return str(held)
    peers_fresh_until = None if peers_confirmed_at is None or policy.peer_fresh is None else (
        peers_confirmed_at + policy.peer_fresh)
    if peers_fresh_until is not None and mono >= peers_fresh_until:
        return "the peers were confirmed in rotation too long ago"
    return ""
