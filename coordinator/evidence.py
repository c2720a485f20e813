"""What an agent has observed beyond one cycle, as plain data updated by pure functions.

The decision (``coordinator.decide``) reads this evidence from the snapshot: when each event last named
this VM and was last listed at all (for "gone"), since when each registered VM has been seen without its
agent (for ``absent_peer_grace_seconds``), and when the store was last seen CONNECTED (for "cut off").
The agent only feeds observations in, with the times they were made; every rule about what they mean
lives here and in ``coordinator.snapshot``, where the model-based suite drives it.

Times are this process's monotonic clock. A document counts with the time its request was *sent* and the
time its answer *arrived* (``coordinator.snapshot.sight``): an event it lists was there as late as the
answer, an event it misses was gone as early as the request, so a slow answer never makes an event look
gone for longer than it was.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from coordinator.models import Document
from coordinator.snapshot import Sighting, is_gone, sight
from coordinator.store.base import ClusterView, ConnectionState, Part

__all__ = ["STARTED_KEPT", "Evidence", "Restart", "after_connection", "after_reading", "after_view", "holding_also",
           "note_started", "observed"]

#: The most events whose first Started sighting an agent keeps: far more than a group has at once.
STARTED_KEPT = 256


@dataclass(frozen=True)
class Evidence:
    named: Mapping[str, Sighting] = field(default_factory=dict)  # event key -> when documents last named me
    seen: Mapping[str, Sighting] = field(default_factory=dict)  # event key -> when documents last listed it
    absent_since: Mapping[str, float] = field(default_factory=dict)  # vm -> since when seen without its agent
    connected_at: float | None = None  # when the store was last seen CONNECTED (None: never, in this process)
    # A document of this process has listed an event naming other VMs and not this one: IMDS shows this VM
    # every event of its unit (``coordinator.delivery.Delivery.every_event``). Never unlearnt.
    seen_unnamed: bool = False
    # event key -> when this process's view first showed its record marked done (cleared once reopened)
    done_seen: Mapping[str, float] = field(default_factory=dict)
    # event key -> the *wall* time this process first saw it Started (``note_started``), for the done mark
    started_seen: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Restart:
    """What a restart could not read from its state file, taken from the first observation that can say it.
    ``assume_worst``: the file was unreadable, so maybe drained for anything: every event naming this VM in the
    first fresh document holds it. ``from_store``: the file was missing: the events this VM's own ``/out`` node
    names, in the first view of the group, hold it."""

    assume_worst: bool = False
    from_store: bool = False


def observed(
    evidence: Evidence, restart: Restart, draining_for: frozenset[str], *, me: str, document: Document | None,
    sent: float, answered: float, arrived: float, cluster: ClusterView | None, connection: ConnectionState,
    mono: float, gone_after: float,
) -> tuple[Evidence, Restart, frozenset[str], tuple[str, ...]]:
    """One cycle's observations fed to the evidence, in order: the view, a new fresh reading (``document``,
    None if none: counted once, timed by its request ``sent`` and its answer ``answered``, on the monotonic
    clock, and ``arrived`` on the wall clock), the connection. The first of each also restores what the restart
    could not read (``restart``). Returns the evidence, what is left to restore, the events that hold this VM
    from now on besides ``draining_for``, and why, in words, for each restoration made."""
    evidence = after_view(evidence, cluster, mono)
    held: frozenset[str] = frozenset()
    why: list[str] = []

    def hold(event_ids: set[str], reason: str) -> None:
        nonlocal evidence, held
        if event_ids:
            keys = frozenset(eid.upper() for eid in event_ids)
            why.append(f"staying drained for {','.join(sorted(event_ids))} until gone: {reason}")
            held |= keys
            evidence = holding_also(evidence, keys, mono)

    if document is not None:
        if restart.assume_worst:
            restart = replace(restart, assume_worst=False)
            hold({e.event_id for e in document.events if e.names(me)}, "the state file was unreadable")
        records = set(cluster.records) if cluster is not None else None
        evidence = after_reading(evidence, document, me=me, sent=sent, answered=answered,
                                 draining_for=draining_for | held, records=records, gone_after=gone_after)
        evidence = replace(evidence, started_seen=note_started(evidence.started_seen, document, records, arrived))
    if cluster is not None and restart.from_store:
        restart = replace(restart, from_store=False)
        mark = cluster.out.get(me)
        if mark is not None:
            hold(set(mark.events), "its /out node says so and the state file is missing")
    return after_connection(evidence, connection, mono), restart, held, tuple(why)


def after_reading(
    evidence: Evidence, document: Document, *, me: str, sent: float, answered: float,
    draining_for: Collection[str], records: Collection[str] | None, gone_after: float,
) -> Evidence:
    """A new document (each reading counts once). Events this VM no longer drains for, and records the
    store no longer has, are forgotten once gone. While the store cannot be read (``records`` None), what
    was listed is kept even once gone: the record may still be open, and a leader that forgot its
    sightings could no longer tell that the event is over."""
    naming = {e.event_id.upper() for e in document.events if e.names(me)}
    named = sight(evidence.named, naming, sent, answered)
    named = {k: s for k, s in named.items() if k in draining_for or not is_gone(s, gone_after)}
    present = {e.event_id.upper() for e in document.events}
    seen = sight(evidence.seen, present, sent, answered)
    seen = {k: s for k, s in seen.items() if records is None or k in records or not is_gone(s, gone_after)}
    unnamed = evidence.seen_unnamed or any(e.resources and not e.names(me) for e in document.events)
    return replace(evidence, named=named, seen=seen, seen_unnamed=unnamed)


def after_view(evidence: Evidence, cluster: ClusterView | None, mono: float) -> Evidence:
    """A cycle's cluster view (None: it could not be read). A record first heard of from the store counts
    as just seen, with or without a new reading: a record a peer published since this VM's last poll is
    never taken for one gone. Absence is counted only while watched without a gap."""
    if cluster is None:
        return replace(evidence, absent_since={})
    seen = dict(evidence.seen)
    for key in set(cluster.records) - set(seen):
        seen[key] = Sighting(mono, listed=False)
    absent = cluster.known - cluster.members
    absent_since = {vm: evidence.absent_since.get(vm, mono) for vm in absent}
    done_seen = ({key: evidence.done_seen.get(key, mono) for key, record in cluster.records.items()
                  if record.done_at is not None}
                 if cluster.part.holds(Part.NAMED) else evidence.done_seen)  # a VM's own part holds no record
    return replace(evidence, seen=seen, absent_since=absent_since, done_seen=done_seen)


def after_connection(evidence: Evidence, connection: ConnectionState, mono: float) -> Evidence:
    """The store's connection state at the end of a cycle's observation."""
    if connection is ConnectionState.CONNECTED:
        return replace(evidence, connected_at=mono)
    return evidence


def holding_also(evidence: Evidence, keys: Collection[str], mono: float) -> Evidence:
    """Events held from another source than a document (an unreadable state file, an ``/out`` node):
    named now, so that they are held until gone."""
    named = dict(evidence.named)
    for key in keys:
        named.setdefault(key.upper(), Sighting(mono))
    return replace(evidence, named=named)


def note_started(started: Mapping[str, float], document: Document, records: Collection[str] | None,
                 at: float) -> dict[str, float]:
    """Event key -> the wall time this agent first saw the event Started (``started``), after a new document
    that arrived at the wall time ``at``. An event neither in the document nor among the store's records
    (``records``; None when the store could not be read: nothing is forgotten then) is forgotten; past
    ``STARTED_KEPT`` events, the earliest seen are. The done mark carries it into the group's history: written
    in the rewrite the done mark makes anyway, and not at all when this agent never saw the event Started (it
    was restarted since, or its documents do not list the event)."""
    present = {event.event_id.upper() for event in document.events}
    kept = {key: when for key, when in started.items() if key in present or records is None or key in records}
    for event in document.events:
        if event.is_started:
            kept.setdefault(event.event_id.upper(), at)
    if len(kept) > STARTED_KEPT:
        kept = dict(sorted(kept.items(), key=lambda item: (item[1], item[0]))[-STARTED_KEPT:])
    return kept
