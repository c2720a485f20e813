"""Finished records out of ``/events``: the leader moves each one to ``/history`` once nothing holds it, and
``coordinator status --history`` reads it there.

Every VM an open event names, and the leader, list ``/events`` and read each record in it, with a watch.
A record marked done stays in that list until it is moved: a VM that begins to follow the records reads
it (its node and its acks, or its own ack), so the records kept for ``done_retention_seconds`` (7 days by
default) would make every event cost more than the one before it. Moved, a finished record costs the
agents nothing: no agent lists or watches ``/history``.

``archive_done`` moves records the leader's decision names (``decide.records.to_archive``: done a while
ago, and no VM the budget counts is out of rotation for it), each in one transaction: the record is
created as ``/history/{DONE_MS}-{EVENT_ID}`` (``zk_paths.history_name``) with the data it has, and its
node and children are deleted, the node at the version read. A record rewritten since (reopened: the
event came back) fails the transaction and stays where it is. Its acks go with it: an ack left on a
record that no ``/out`` mark names is an orphan, the VM serving again already. A move costs one request
(the transaction) when the record was read by the view and has no child left but its empty list of acks.
The same call deletes the entries done before ``older_than``, told by their names alone, listing
``/history`` at most every ``LIST_EVERY`` seconds.

What a move changes for the agents: an event that comes back after its record was moved is published
again, as a new record (a reopening keeps nothing of before either). A Terminate whose VM it deleted
keeps its record while that VM's ``/out`` mark still counts (``decide.budget._deleted`` needs it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from coordinator.names import normalize_event_id
from coordinator.store.base import EventRecord
from coordinator.store.payloads import EventNode, PayloadError
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_paths import history_name, parse_history_name
from coordinator.store.zk_records import subtree
from coordinator.store.zk_session import Deadline

__all__ = ["LIST_EVERY", "HistoryKeeping", "archive_done", "read_history"]

log = logging.getLogger(__name__)


#: How often the leader lists ``/history`` for the entries past the retention, at most: a move costs a
#: listing only that often (entries are deleted within this long of their expiry).
LIST_EVERY = 3600.0


class HistoryKeeping:
    """When the leader last listed ``/history`` (a monotonic time; None: never), kept by its store."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.listed_at: float | None = None
        self.monotonic = monotonic

    def due(self) -> bool:
        return self.listed_at is None or self.monotonic() - self.listed_at >= LIST_EVERY


def archive_done(ctx: StoreContext, event_ids: Collection[str], older_than: float,
                 known: Mapping[str, tuple[bytes, ZnodeStat]] | None = None,
                 keeping: HistoryKeeping | None = None) -> int:
    """Move the done records of ``event_ids`` to ``/history`` (see the module docstring), each read first
    as ``known`` gives it, if it does, and delete the entries of ``/history`` done before ``older_than``
    (listed at most every ``LIST_EVERY`` seconds, as ``keeping`` tells). Returns how many records moved."""
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    wait = ctx.session.wait
    moved = 0
    with ctx.session.writing("move finished records to the history"):
        for event_id in sorted(normalize_event_id(e) for e in event_ids):
            if _move(ctx, client, event_id, (known or {}).get(event_id), deadline):
                moved += 1
        if keeping is not None and not keeping.due():
            return moved
        try:
            entries: list[str] = wait(client.get_children_async(ctx.paths.history), deadline)
        except NoNodeError:
            entries = []
        if keeping is not None:
            keeping.listed_at = keeping.monotonic()
        expired = [name for name in entries if (parsed := parse_history_name(name)) and parsed[0] < older_than]
        if expired:
            transaction = client.transaction()
            for name in expired:
                transaction.delete(ctx.paths.history_entry(name))
            results = wait(transaction.commit_async(), deadline)
            if all(result is True for result in results):
                log.info("deleted %d finished records past the retention from the history", len(expired))
    return moved


def _move(ctx: StoreContext, client: KazooClient, event_id: str, known: tuple[bytes, ZnodeStat] | None,
          deadline: Deadline) -> bool:
    """Move one done record; False if it is not there, not done, does not parse, or changed meanwhile. The
    first attempt deletes the record and its list of acks, which is all a done record has once its acks
    are withdrawn; should it have more (an ack left, a child made by hand), they are listed and go too."""
    wait = ctx.session.wait
    path = ctx.paths.event(event_id)
    for attempt in range(3):
        try:
            data, stat = known if known is not None and attempt == 0 else wait(client.get_async(path), deadline)
        except NoNodeError:
            return False
        try:
            node = EventNode.from_bytes(data, path)
        except PayloadError as exc:
            log.warning("event %s: undecodable record, left where it is: %s", event_id, exc)
            return False
        if node.done_at is None:
            return False
        entry = ctx.paths.history_entry(history_name(node.done_at, event_id))
        # Its children, each before its parent (``subtree`` lists the record first, then parents first).
        doomed = [ctx.paths.acks(event_id)] if attempt == 0 else subtree(ctx, client, path, deadline)[:0:-1]
        for create in (True, False):
            transaction = client.transaction()
            if create:
                transaction.create(entry, data)
            for child in doomed:
                transaction.delete(child)
            transaction.delete(path, version=stat.version)
            results = wait(transaction.commit_async(), deadline)
            if all(result is True or isinstance(result, str) for result in results):
                log.info("event %s: finished record moved to the history", event_id)
                return True
            if not (create and isinstance(results[0], NodeExistsError)):
                break
            # Moved already (by a leader before this one, whose delete did not land): the record goes.
        if isinstance(results[0], NoNodeError):
            # The history's parent is missing (a group an earlier version made): made, then again.
            wait(client.ensure_path_async(ctx.paths.history), deadline)
    return False


def read_history(ctx: StoreContext, client: KazooClient, deadline: Deadline, since: float | None = None,
                 kept: dict[str, EventRecord | None] | None = None) -> dict[str, EventRecord]:
    """The records moved to ``/history`` (those done at ``since`` or later, if given), by event id, the
    latest time an event was done where it was done more than once; nothing when the group has none. Read
    without a watch (``coordinator status``). An entry is written once and never changed, so ``kept`` (entry
    name -> its record, None if it does not parse), updated here, saves a watching reader the entries it
    read before: each read then costs the list and the new entries."""
    wait = ctx.session.wait
    kept = {} if kept is None else kept
    try:
        names = wait(client.get_children_async(ctx.paths.history), deadline)
    except NoNodeError:
        names = []
    for name in set(kept) - set(names):
        del kept[name]  # past the retention
    parsed = sorted((p, name) for name in names if (p := parse_history_name(name)) is not None
                    and (since is None or p[0] >= since))
    reads = {name: client.get_async(ctx.paths.history_entry(name)) for _, name in parsed if name not in kept}
    for name, result in reads.items():
        try:
            data, _ = wait(result, deadline)
            node = EventNode.from_bytes(data, ctx.paths.history_entry(name))
        except NoNodeError:
            continue  # past the retention, deleted meanwhile
        except PayloadError as exc:
            log.warning("undecodable record in the history, left out: %s", exc)
            kept[name] = None
            continue
        kept[name] = node.record_of_copies(name.partition("-")[2])
    records: dict[str, EventRecord] = {}
    for (_, event_id), name in parsed:
        record = kept.get(name)
        if record is not None:
            records[event_id] = record
    return records
