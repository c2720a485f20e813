"""What one event of the document is to the decision: its parsed form, its record, who approves it,
whose acknowledgement it waits for, and whether it could be approved early at all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from coordinator.config import ApprovalRule, ApproverMode, PeersPolicy
from coordinator.errors import InvalidName
from coordinator.maintenance_windows import in_windows
from coordinator.models import Document, ScheduledEvent
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.snapshot import Policy, Snapshot, rule_for
from coordinator.store.base import ClusterView, EventRecord

__all__ = ["ParsedEvent", "approvable", "choose_approver", "events_from_store", "first_live", "in_own_documents",
           "new_record", "parse_events", "waited_for"]


def choose_approver(
    resources: tuple[str, ...], cluster: ClusterView, mode: ApproverMode
) -> tuple[str | None, bool]:
    """The approver of an event and whether it approves as leader.

    first-resource: the first VM of ``Resources`` (document order) that is a live member; if none
    is, the leader. leader: always the leader. ``None`` when the approver is the leader and there is
    no leader.
    """
    if mode is ApproverMode.FIRST_RESOURCE:
        first = first_live(resources, cluster)
        if first is not None:
            return first, False
    return cluster.leader, True


def first_live(resources: Sequence[str], cluster: ClusterView) -> str | None:
    """The first VM of ``resources`` (document order) that is a live member; None if none is. It approves the
    event in ``first-resource`` mode (``choose_approver``), and closes its record in every mode
    (``decide.records.closing``): its own documents list the event while it is present, whatever the
    delivery."""
    return next((vm for vm in resources if vm in cluster.members), None)


@dataclass(frozen=True)
class ParsedEvent:
    """One event of the document with everything derived from it once."""

    event: ScheduledEvent
    key: str | None  # None: the id is not safe to use in ZooKeeper
    resources: tuple[str, ...]  # valid names, normalized, in document order
    bad_names: tuple[str, ...]
    rule: ApprovalRule
    listed: int = 1  # how many entries of the document carry this event id
    # Known only from its record (``events_from_store``): its NotBefore as the record holds it (epoch seconds).
    from_store: bool = False
    stored_not_before: float | None = None

    @property
    def held_as(self) -> str:
        """The key this VM holds the event under (``draining_for``, the state file, ``/out``): the id
        upper-cased, as the store keys it, even when it is not usable in ZooKeeper."""
        return self.key or self.event.event_id.upper()

    @property
    def not_before(self) -> float | None:
        if self.from_store:
            return self.stored_not_before
        return self.event.not_before.timestamp() if self.event.not_before is not None else None


def _parse(event: ScheduledEvent, policy: Policy) -> tuple[ParsedEvent, list[str]]:
    problems: list[str] = []
    try:
        key: str | None = normalize_event_id(event.event_id)
    except InvalidName as exc:
        key = None
        problems.append(str(exc))
    names: list[str] = []
    bad: list[str] = []
    for raw in event.resources:
        try:
            name = normalize_vm_name(raw)
        except InvalidName as exc:
            bad.append(raw)
            problems.append(f"event {key or event.event_id[:40]!r}: {exc}")
            continue
        if name not in names:
            names.append(name)
    if event.not_before_error:
        problems.append(f"event {key or event.event_id[:40]!r}: {event.not_before_error}")
    return ParsedEvent(event, key, tuple(names), tuple(bad), rule_for(event, policy)), problems


def parse_events(basis: Document | None, policy: Policy) -> tuple[list[ParsedEvent], list[str]]:
    """The events of ``basis`` (this cycle's document, or else the last one read), each parsed once, and
    every problem found in them."""
    parsed: list[ParsedEvent] = []
    invalid: list[str] = []
    for event in basis.events if basis is not None else ():
        ev, problems = _parse(event, policy)
        parsed.append(ev)
        invalid.extend(problems)
    # An EventId listed more than once (IMDS never does so; the entries may name different VMs): approving
    # it would release every entry, so it is never approved early, and each entry drains the VMs it names.
    listed = Counter(ev.key for ev in parsed if ev.key is not None)
    for index, ev in enumerate(parsed):
        if ev.key is not None and listed[ev.key] > 1:
            parsed[index] = replace(ev, rule=ApprovalRule.NEVER, listed=listed[ev.key])
    invalid.extend(f"event {key!r} is listed {n} times in the document" for key, n in listed.items() if n > 1)
    return parsed, invalid


def new_record(ev: ParsedEvent, snap: Snapshot, policy: Policy) -> EventRecord:
    """The record this VM publishes of an event of its documents: with its own delivery unit, which is the
    event's (IMDS shows a VM only events of its unit)."""
    assert ev.key is not None
    return EventRecord(
        event_id=ev.key,
        event_type=ev.event.event_type,
        resources=ev.resources,
        not_before=ev.not_before,
        published_by=snap.me,
        published_at=snap.now,
        unit=policy.delivery.unit,
    )


def events_from_store(cluster: ClusterView, snap: Snapshot, policy: Policy) -> dict[str, ParsedEvent]:
    """Open records of events this VM's documents have never listed, as events (status Scheduled): the
    leader admits them and the budget counts them. Where IMDS shows every VM every event of the group,
    this is a record a peer published a moment before this VM's next poll; where it shows each VM only
    the events naming it, it is how the leader learns of them at all. Approvals and drains still rest on
    each VM's own documents. A record counts so only once it has been known for ``gone_after`` without
    this VM's documents listing it, and only if they would not list it while it is present
    (``in_own_documents``)."""
    found: dict[str, ParsedEvent] = {}
    for key, record in cluster.records.items():
        sighting = snap.seen.get(key)
        if record.done_at is not None or sighting is None or sighting.listed:
            continue
        if in_own_documents(record, snap, policy):
            continue  # present, its own documents list it: known from them alone, with all they say
        if snap.mono - sighting.last < policy.gone_after:
            # Where every VM sees every event, this VM's own documents list it within a poll or two, with
            # what the record cannot say (its source, its duration): not admitted on the record meanwhile.
            continue
        # NotBefore stays in epoch seconds: a clamped one at the calendar's limits has no datetime.
        event = ScheduledEvent(event_id=key, event_type=record.event_type, event_status="Scheduled",
                               resources=record.resources)
        found[key] = ParsedEvent(event, key, tuple(record.resources), (), rule_for(event, policy), from_store=True,
                            stored_not_before=record.not_before)
    return found


def in_own_documents(record: EventRecord, snap: Snapshot, policy: Policy) -> bool:
    """Whether this VM's own documents list the record's event for as long as it is present: it names this
    VM, or IMDS shows this VM every event of its unit and the event is of that unit
    (``coordinator.delivery.Delivery.covers``). Then those documents alone say whether the event is there,
    whatever this VM saw of it before (a restarted process, sightings dropped while ZooKeeper was
    unreadable): it closes the record once they miss it (``decide.records.record_over``), and the leader never
    admits it from its record alone (``events_from_store``)."""
    return snap.me in record.resources or policy.delivery.covers(record, snap.seen_unnamed)


def waited_for(vm: str, cluster: ClusterView, policy: Policy, snap: Snapshot,
                record: EventRecord | None = None) -> bool:
    """Whether ``vm``'s ack is required: always, unless it has never run an agent and policy ignores
    such VMs, or this agent has itself seen its agent gone for ``absent_grace`` (measured on this
    agent's monotonic clock, never across machines), or an operator vouched for it in the event's open
    ``record`` (``coordinator approve``) while it runs no agent. A cut-off agent drains itself before that
    (``drains_for``), and a dead one took its probe endpoint with it. A live member is always waited for."""
    if vm in cluster.members:
        return True
    if record is not None and record.done_at is None and record.vouched is not None and vm in record.vouched.vms:
        return False
    if policy.unknown_peers is PeersPolicy.IGNORE and vm not in cluster.known:
        return False
    if policy.absent_grace is None or vm not in cluster.known:
        return True
    return snap.absent_for.get(vm, 0.0) < policy.absent_grace


def approvable(ev: ParsedEvent, cluster: ClusterView | None, snap: Snapshot, policy: Policy) -> bool:
    """Whether the event could be approved early at all: a known type whose rule is ``after-drain``,
    a usable id and NotBefore, only valid names, inside a maintenance window, and nobody to wait for who
    cannot ever acknowledge (a VM without an agent). Unknown (no view): assume it could. An operator's
    pause is not checked here: it holds approvals only, and drains go on."""
    if ev.rule is not ApprovalRule.AFTER_DRAIN or ev.key is None or ev.bad_names or not ev.resources:
        return False
    if ev.not_before is None or not in_windows(policy.windows, snap.now):
        return False
    if cluster is None:
        return True
    record = cluster.records.get(ev.key)
    return all(vm in cluster.members or not waited_for(vm, cluster, policy, snap, record) for vm in ev.resources)
