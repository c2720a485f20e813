"""The coordination-store contract, implemented on ZooKeeper by ``coordinator.store.zookeeper``.

Layout (ZooKeeper paths, relative to the cluster's chroot ``{root}/{cluster}``)::

    /members/{vm}               ephemeral   one per live agent: {"vm", "started_at", "version", "admin", "probe",
                                            "host", "boot_id", "pid", "pid_start"}
    /registry/{vm}              persistent  every VM that has ever run an agent here: {"vm", "first_seen"}
    /absent/{vm}                persistent  the leader saw this registered VM without an agent since {"since"}
    /leader                     ephemeral   held by the leader: {"vm", "since"}
    /events/{EVENT_ID}          persistent  the event as first seen: {"event_id", "event_type", "resources",
                                            "not_before", "published_by", "published_at", "unit", "done_at",
                                            "started_at", "closed"}
                                            (``unit``: the publisher's delivery unit, null if it did not know it;
                                            optional, set by ``mark_done``: ``started_at``, when the closing
                                            agent first saw the event Started in its own documents, and
                                            ``closed``, {"done_at", "admitted", "approval"}: what the record's
                                            ``admitted`` and ``approval`` held when ``mark_done`` deleted
                                            them, kept for ``coordinator status --history``)
    /out/{vm}                   persistent  the VM is out of its load balancer's rotation: {"vm", "since", "events"}
    /events/{EVENT_ID}/acks/{vm} ephemeral  {"vm", "at"}: the VM is drained for this event now (its session)
    /events/{EVENT_ID}/admitted persistent  {"by", "at"}: the leader admitted the event into the
                                            disruption budget (written once, with a versioned rewrite of
                                            the record: never on a record marked done)
    /events/{EVENT_ID}/approval persistent  {"by", "at", "as_leader", "acks", "acked_at"}: written once,
                                            before the POST (likewise with a versioned rewrite of the
                                            record); ``acks``, ``acked_at`` (optional): the VMs whose
                                            acknowledgements the approval gate found, and released the
                                            approval on, and when each acknowledged
    /drains/{vm}                persistent  {"vm", "reason", "by", "at"}: an operator's drain of the VM by hand
                                            (``coordinator drain``), deleted by ``coordinator undrain``
    /drains-admitted/{vm}       persistent  {"by", "at", "drain"}: the leader admitted the drain by hand whose
                                            node has the creation zxid ``drain`` into the budget
    /layout                     persistent  {"version"}: the layout version of the group's nodes, written once
                                            (``zk_paths.LAYOUT_VERSION``; absent in groups made before it: 1)

VM names are stored lower case and event ids upper case (see ``coordinator.names``); both are validated
before they reach a path.

Every method is bounded by the store's operation timeout. Results follow a three-way contract:

* reads return a value or raise ``StoreUnavailable`` (the view is unknown: keep drained, approve nothing);
* writes return a ``WriteResult`` (DONE, EXISTS: another writer got there first, MISSING: the node it
  belongs under is gone) or raise ``StoreUnknownOutcome`` (the write may or may not have happened: the
  caller assumes the unsafe half did not, i.e. no approval, and retries next cycle).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from coordinator.errors import DuplicateMember

__all__ = [
    "BY_HAND",
    "Approval",
    "ApprovalOutcome",
    "ApprovalResult",
    "Closed",
    "ClusterView",
    "ConnectionState",
    "EventRecord",
    "HandDrain",
    "OutMark",
    "Part",
    "Pause",
    "Store",
    "Vouch",
    "Wakeup",
    "WriteResult",
    "lead_view",
    "named_view",
    "own_view",
]

log = logging.getLogger(__name__)


class WriteResult(Enum):
    DONE = "done"
    EXISTS = "exists"
    MISSING = "missing"


class ConnectionState(Enum):
    """CONNECTED is the only state in which an agent may approve.

    SUSPENDED means "maybe not leader any more" (the session may be expiring); LOST means the session
    and every ephemeral node of it are gone.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class Part(Enum):
    """How much of the group a VM reads and watches (``coordinator.decide.view_needed``), each part holding
    the one before it:

    * ``OWN``: members, registry, leader, pause and its own ``/out`` mark; no record (``own_view``);
    * ``NAMED``: that, and every record with its admission and approval but with this VM's ack only
      (``named_view``): what a VM an event names needs to publish, drain, ack and withdraw, while another
      VM approves and closes the event and the leader weighs the budget;
    * ``LEAD``: that, and every VM's ``/out`` mark, absence and drain by hand (``lead_view``): what a leader
      that approves nothing needs to admit events and drains, weigh the budget, close records and mark
      absences. Another VM's ack costs it nothing: a VM acknowledges only while its ``/out`` mark names the
      event (it writes the mark first and deletes it last), so the marks hold every VM an ack would;
    * ``WHOLE``: everything, every VM's acks among it.
    """

    OWN = 1
    NAMED = 2
    LEAD = 3
    WHOLE = 4

    def holds(self, other: Part) -> bool:
        """Whether a view of this part holds everything a view of ``other`` does."""
        return self.value >= other.value


@dataclass(frozen=True)
class Approval:
    """Who approved an event, when, and whether as the leader (else as the first live VM in Resources).
    ``acks``: the VMs whose acknowledgements the approval gate found and released it on, in name order
    (empty: none was required; None: not recorded, an approval written by an earlier version), and
    ``acked_at`` when each of them acknowledged, as its ack says (those whose ack gives it). ``vouched``: the
    VMs an operator vouched for (``coordinator approve``: VMs that run no agent, approved without their ack;
    ``by`` is then the operator), with the operator's ``reason``; None for an agent's approval."""

    by: str
    at: float
    as_leader: bool
    acks: tuple[str, ...] | None = None
    acked_at: Mapping[str, float] | None = None
    vouched: tuple[str, ...] | None = None
    reason: str | None = None
    vouched_by: str | None = None  # the operator whose word it is


@dataclass(frozen=True)
class Vouch:
    """An operator's word for the VMs an event names that run no agent (``coordinator approve``): while the
    record is open, the group waits for every other VM's ack only, and approves the event itself; the VMs
    vouched for that ever ran an agent here are marked out of rotation first, as VMs absent past the grace
    are. Cleared when the record is marked done."""

    by: str
    at: float
    reason: str
    vms: tuple[str, ...]


@dataclass(frozen=True)
class Closed:
    """What a record held when it was marked done, which ``mark_done`` deletes (``admitted``, ``approval``)
    and keeps in the record's data for the group's history (``coordinator status --history``): the
    admission (when, and by which leader: None when its node did not say) and the approval, each None when
    the record had none. Never read by a decision: a record reopened holds nothing of before."""

    admitted_at: float | None = None
    admitted_by: str | None = None
    approval: Approval | None = None


@dataclass(frozen=True)
class EventRecord:
    """What the cluster knows about one event. ``acks`` maps VM name to the time it acknowledged (None: not
    read; an agent's ZooKeeper view lists the acks by name only, ``coordinator status`` reads their times)."""

    event_id: str
    event_type: str
    resources: tuple[str, ...]
    not_before: float | None
    published_by: str
    published_at: float
    acks: Mapping[str, float | None] = field(default_factory=dict)
    approval: Approval | None = None
    done_at: float | None = None
    admitted_at: float | None = None
    # The delivery unit of the VM that published the record (None: it did not know it). IMDS shows a VM only
    # events of its own unit, so this is the event's unit (``coordinator.snapshot.Delivery``).
    unit: str | None = None
    # Set when the record is marked done, for the history only (None: not known, or not done): when the
    # agent that marked it done first saw the event Started in its own documents, and what the record held
    # of its admission and approval then (``Closed``; None: marked done by an earlier version).
    started_at: float | None = None
    closed: Closed | None = None
    vouched: Vouch | None = None  # an operator's word for the VMs it names that run no agent (open records only)


@dataclass(frozen=True)
class OutMark:
    """``/out/{vm}``: the VM is out of its load balancer's rotation (draining, drained, recovering, or
    just started and not yet cleared), for ``events`` (ids as IMDS spells them; empty when it is out
    for no event, e.g. at start-up). Written by the VM itself before or as it drains, deleted by it only
    once the load balancer routes to it again; the disruption budget counts every VM that has one."""

    since: float
    events: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pause:
    """An operator's pause of early approvals for the whole group (``coordinator pause``)."""

    reason: str
    by: str
    at: float


# What an ``/out`` mark, a plan's ``holding`` and the state file's ``draining_for`` name for a drain by hand,
# beside event keys: not an event id (``coordinator.names``), so no event of IMDS is ever taken for it.
BY_HAND = "(BY HAND)"


@dataclass(frozen=True)
class HandDrain:
    """An operator's drain of one VM by hand (``coordinator drain VM --reason``): the VM goes out of
    rotation once the leader admitted it into the disruption budget (``admitted_at``; at once in a group
    without a budget) and stays out until ``coordinator undrain`` deletes it."""

    reason: str
    by: str
    at: float
    admitted_by: str | None = None
    admitted_at: float | None = None
    asked: int = 0  # which drain of the VM this is (its node's creation zxid): what an admission names


@dataclass(frozen=True)
class ClusterView:
    """One consistent-enough read of the store, taken once per cycle and never mutated."""

    members: frozenset[str]
    leader: str | None
    i_am_leader: bool
    records: Mapping[str, EventRecord]
    connection: ConnectionState
    known: frozenset[str] = frozenset()  # every VM that has ever joined (the registry)
    absent_since: Mapping[str, float] = field(default_factory=dict)  # leader-observed, may be stale
    out: Mapping[str, OutMark] = field(default_factory=dict)  # VMs out of rotation, by their own account
    paused: Pause | None = None  # early approvals paused by an operator: none is approved, drains go on
    drains: Mapping[str, HandDrain] = field(default_factory=dict)  # VM -> its drain by hand (OWN, NAMED: its own)
    # VMs with an admission that admits no drain of theirs (undone since): the leader deletes it (WHOLE only)
    stale_admissions: frozenset[str] = frozenset()
    # What of the group was read (``Part``): less than WHOLE for a VM that leads nothing and approves and
    # closes nothing, which then reads neither the other VMs' ``/out`` marks and absences nor (OWN) any record
    # or (NAMED) any other VM's ack, and is told of no change to them.
    part: Part = Part.WHOLE

    @property
    def complete(self) -> bool:
        """The whole view, every VM's acks among it: what approving rests on."""
        return self.part is Part.WHOLE

    @property
    def weighs_group(self) -> bool:
        """Every VM's ``/out`` mark, absence and drain by hand: what admitting, closing a record and weighing
        the budget rest on (``Part.LEAD`` or the whole view)."""
        return self.part.holds(Part.LEAD)


def named_view(view: ClusterView, vm: str) -> ClusterView:
    """What a VM that an event names, and that neither leads nor approves or closes anything, reads of
    ``view``: what ``own_view`` keeps, and every record with its admission and approval, each with this
    VM's own ack only. Every record, so that it can tell which of its events has none yet (it publishes
    it) and which of them holds its ack; its own ack, so that it withdraws it and serves again only once it
    is gone. Another VM's ack or ``/out`` mark costs it nothing: the event's approver and the leader read
    those (``coordinator.decide.view_needed``)."""
    records = {key: replace(record, acks={vm: record.acks[vm]} if vm in record.acks else {})
               for key, record in view.records.items()}
    out = {vm: view.out[vm]} if vm in view.out else {}
    drains = {vm: view.drains[vm]} if vm in view.drains else {}
    return replace(view, records=records, out=out, drains=drains, absent_since={}, part=Part.NAMED)


def lead_view(view: ClusterView, vm: str) -> ClusterView:
    """What a leader that approves nothing reads of ``view``: everything but the other VMs' acks (each
    record with this VM's own ack only, as ``named_view``). The budget counts a VM that acknowledges by its
    ``/out`` mark, which names the event for as long as the ack stands (``Part.LEAD``)."""
    records = {key: replace(record, acks={vm: record.acks[vm]} if vm in record.acks else {})
               for key, record in view.records.items()}
    return replace(view, records=records, part=Part.LEAD)


def own_view(view: ClusterView, vm: str) -> ClusterView:
    """What a VM that follows only its own part of the group reads of ``view``: members, registry, leader,
    pause and its own ``/out`` mark; no record, no other VM's mark, no absence. What it must know of an
    event (that one names it), its own documents show it: IMDS shows a VM every event naming it, in every
    delivery mode. Whoever decides on it must not publish, admit, approve, close a record or weigh the
    budget (``coordinator.decide.view_needed``). Its own drain by hand, if any, it reads in every part."""
    out = {vm: view.out[vm]} if vm in view.out else {}
    drains = {vm: view.drains[vm]} if vm in view.drains else {}
    return replace(view, records={}, out=out, drains=drains, absent_since={}, part=Part.OWN)


class ApprovalOutcome(Enum):
    APPROVED = "approved"  # the approval record exists (written now or before): POST may proceed
    REFUSED = "refused"  # a re-check failed; ``reason`` on the result says which


@dataclass(frozen=True)
class ApprovalResult:
    outcome: ApprovalOutcome
    reason: str = ""
    record: Approval | None = None


class Wakeup:
    """The agent's wake-up callback, as a store holds it: set from any thread, fired from the store's
    threads (kazoo's, or a writer's). Firing never raises: a faulty callback is logged, not propagated
    into a thread that must survive it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callback: Callable[[], None] | None = None

    def set(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callback = callback

    def fire(self) -> None:
        with self._lock:
            callback = self._callback
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("wakeup callback failed")


class Store(Protocol):
    """The coordination store as the agent uses it. Implementations must be thread-safe for
    ``connection_state`` and ``set_wakeup``; every other method is called from the agent loop only."""

    def start(self) -> None:
        """Connect (bounded by the operation timeout). Raises ``StoreUnavailable`` on failure."""

    def stop(self) -> None:
        """Close the session (ephemeral nodes vanish). Never raises."""

    @property
    def connection_state(self) -> ConnectionState: ...

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        """Register a callback invoked (from a store thread, never blocking) whenever something the
        agent reads may have changed: membership, leader, events, acks, approvals, connection state."""

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        """Make sure this agent's ephemeral member node exists and belongs to the current session, and
        that ``/registry/{vm}`` exists.

        DONE: created now; EXISTS: already ours. A live node of another session is replaced only when
        it provably belongs to this VM's previous agent process (same host, started earlier, and gone:
        another boot, or its pid no longer runs; see ``coordinator.store.members``) or to an earlier
        session of this store. Otherwise another agent runs with this VM's name: its node is left alone,
        this session gives up ``/leader`` if it held it, and ``DuplicateMember`` (a ``StoreError``) is
        raised, and kept in ``duplicate`` until a ``join`` succeeds. Raises ``StoreUnknownOutcome``."""

    @property
    def duplicate(self) -> DuplicateMember | None:
        """While the last ``join`` was refused (another agent runs with this VM's name): that refusal,
        whose message says who holds the node; None otherwise. Sends nothing. Meanwhile ``campaign``
        raises it, ``approve`` refuses and ``read_view`` does not count this VM among the members."""

    def campaign(self, vm: str) -> bool:
        """Try, without blocking, to hold leadership. True if this session holds ``/leader`` now.
        Raises ``StoreUnavailable``, or ``DuplicateMember`` (with nothing sent) while ``duplicate`` is
        set for ``vm``."""

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        """Read members, leader and every event record with its acks and approval; with ``part`` OWN or
        NAMED, only what ``own_view`` or ``named_view`` keeps of that (and only that is watched). ``vm`` is
        not among the members while ``duplicate`` is set for it. Raises ``StoreUnavailable``."""

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        """The member info of those of ``vms`` that have a member node (what they joined with).
        Raises ``StoreUnavailable``."""

    def read_pause(self) -> Pause | None:
        """The operator's pause as the ensemble holds it now (a read, not the watched view): the fence of
        an approval's POST asks before every attempt. Raises ``StoreUnavailable``."""

    @property
    def granted_session_timeout(self) -> float | None:
        """The longest session timeout, in seconds, that a server granted this store's sessions (None:
        no session yet). ZooKeeper may grant more than was asked (at least two ticks) or less."""

    def publish_event(self, record: EventRecord) -> WriteResult:
        """Create the event record if absent (EXISTS if another agent published it first)."""

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        """Create ``acks/{vm}`` under the event, ephemeral: it vanishes with this session, so an ack
        never outlives the agent that stands behind it. EXISTS if present, MISSING if the record is
        gone."""

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        """Delete ``acks/{vm}``. DONE if deleted, MISSING if it was not there."""

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
        admission: bool = False,
    ) -> ApprovalResult:
        """Re-confirm, then record the approval once. The last gate before the POST to IMDS.

        In order: the connection is CONNECTED; a synced read shows that this session owns
        ``/leader`` (``as_leader``) or ``/members/{vm}``; the record is not marked done; with
        ``admission``, the event is admitted; every VM of ``required`` has an ack; then ``approval`` is
        created, naming the VMs whose acks it found (``Approval.acks``), or found, written by anyone
        (approval is idempotent). Any failed check returns REFUSED with the reason. Raises
        ``StoreUnknownOutcome`` when it cannot tell."""

    def vouch(self, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
        """Write an operator's word for ``vms`` into the open record (``coordinator approve``, never the agent
        loop): a versioned rewrite of the record, keeping what it holds. DONE; EXISTS if the record holds a
        word already (the first is kept); MISSING if there is no record, or it is marked done."""

    def approve_vouched(self, event_id: str, by: str, required: Collection[str], vouched: Collection[str], *,
                        reason: str, at: float) -> ApprovalResult:
        """An operator's approval (``coordinator approve``, never the agent loop): the checks of ``approve``
        but ownership, with each VM of ``vouched`` (which the event names, and none of which has a member
        node: it runs no agent) standing in for its ack; ``by`` is the operator, and the approval names the
        VMs vouched for and ``reason``. Every VM the event names is in ``required`` or ``vouched``."""

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        """Create ``admitted`` under the event (EXISTS if present, MISSING if the record is gone or marked
        done). Only the leader calls it; admission is never revoked, except by ``mark_done``. An
        admission never lands on a record marked done after it was read, nor survives ``mark_done``."""

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        """Create ``/absent/{vm}`` with ``since: at`` (EXISTS if present). Only the leader calls it, for
        registered VMs it sees without a member node."""

    def clear_absent(self, vm: str) -> WriteResult:
        """Delete ``/absent/{vm}`` (MISSING if it was not there): the leader sees the VM live again."""

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        """Set ``done_at`` on the record and delete its ``admitted`` and ``approval``, in one
        transaction (EXISTS if already set, MISSING if no record): should the event come back (a
        flap, or a reused EventId) nothing of before counts. An admission or approval written
        concurrently either is deleted too or is refused: none survives on a record marked done.
        The same rewrite of the record keeps, for the history, what those two held (``EventRecord.closed``)
        and ``started_at`` (when this agent first saw the event Started; None: it did not)."""

    def reopen(self, event_id: str) -> WriteResult:
        """Clear ``done_at`` (the event is present again), and with it ``started_at`` and ``closed``. EXISTS
        if it was not set, MISSING if no record. Only the leader calls it."""

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        """Create or update ``/out/{vm}`` (persistent) with the events it is out for; ``since`` is kept
        from an existing node. EXISTS if it already holds these events."""

    def clear_out(self, vm: str) -> WriteResult:
        """Delete ``/out/{vm}``: the VM is back in its load balancer's rotation. MISSING if absent."""

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        """Create ``/drains-admitted/{vm}``: the leader ``by`` admits the drain by hand ``asked``
        (``HandDrain.asked``) of ``vm`` into the disruption budget (EXISTS if it is admitted already; MISSING
        if that drain is gone: undone meanwhile). An admission of an earlier drain of the VM is replaced.
        Only the leader calls it; an admission is never revoked while its drain lasts."""

    def forget_drain_admission(self, vm: str) -> WriteResult:
        """Delete ``/drains-admitted/{vm}`` if it admits no drain of ``vm`` there is now (EXISTS if it still
        admits one, MISSING if there is none). Only the leader calls it, for ``stale_admissions``."""

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        """Move the done records of ``event_ids`` out of the records the agents read, into the history that
        ``coordinator status --history`` reads (a record not done, or changed meanwhile, stays), and delete
        the history's records done before ``older_than``. Only the leader calls it, for records nothing
        holds (``decide.records.to_archive``). Returns how many records were moved."""

    def purge_done(self, older_than: float) -> int:
        """Delete records (with their children) whose ``done_at`` is older than ``older_than``.
        Returns how many were deleted."""
