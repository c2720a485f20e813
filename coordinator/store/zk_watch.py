"""The watched view of the ZooKeeper store: an idle agent sends no request at all.

The agent asks, every cycle, for its membership (``join``), for leadership (``campaign``) and for the
view (``read_view``), and the agents that probe their peers for the peers' member info
(``member_info``). ``WatchedView`` answers from what the last read saw, for as long as that read is
provably current:

* ``read_view`` notes the session's change counter (``ZooKeeperSession.generation``) *before* it sends
  its requests, and keeps the view with that number. Every node whose change matters is read with a
  watch (see ``coordinator.store.zk_view``); a watch that fires, a connection change (SUSPENDED, LOST,
  reconnection, the start or end of a quiet period) and every write made through this store move the
  counter. A later ``read_view`` for the same VM returns the kept view, with no request, when the
  counter has not moved, the session is the same and the connection is CONNECTED; otherwise it reads
  again, setting the watches again. A change made while a read was under way moves the counter past the
  number noted, so that read is never served twice.
* ``join`` answers EXISTS with no request when this session created (or found as its own) the member
  node and the last view shows the node, owned by this session, and the VM in the registry, while
  nothing of the membership has changed since (the members list, a member node, the registry, the
  connection): a change elsewhere, such as an ack, does not make the agent join again.
* ``campaign`` answers likewise from the last view when it shows a ``/leader`` node and neither that
  node nor the connection has changed since: True if this session owns it. With no leader in sight it
  tries to take the node, as always.
* ``member_info`` reads each member node once, with a watch, and keeps what it said until that watch
  fires (``coordinator.store.zk_nodes.NodeCache``).
* When the view must be read again, only what changed is read: every answer of an earlier read of the
  same session and connection is kept (``NodeCache``) until the watch its request set fires, so a read
  sends requests only for the nodes whose watches fired and the new names of the lists that changed.
  kazoo answers requests on one thread and runs watchers on another, so a watch event that came before
  a read's answers may not have been counted yet when they arrive: before a read, the watch events that
  reached the client are let to run; after it, those that came before its answers
  (``ZooKeeperSession.watch_events_delivered``), and a read that took from the cache an answer whose
  watch fired meanwhile is made again (``READ_ATTEMPTS``, the last with nothing kept). A view therefore
  never mixes an old answer with newer ones. See docs/architecture.md, "The view and what a change
  costs".

Nothing is ever served while the connection is not CONNECTED: the same ``StoreUnavailable`` (reads) or
``StoreUnknownOutcome`` (``join``) as without the cache. A new session (after an expiry) never serves
what the old one read: its watches died with it.

What the cache does not change: a view is as current as the watches that reached this client, which
they do within a network round trip of the change (ZooKeeper sends a watch event before the new data can
be read by the watcher). ``approve`` never uses the cache: it re-reads everything itself.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar, cast

from kazoo.protocol.states import WatchedEvent, ZnodeStat

from coordinator.store.base import ClusterView, ConnectionState, Part
from coordinator.store.zk_nodes import NodeCache, stale
from coordinator.store.zk_paths import ZooKeeperPaths, is_canonical_vm
from coordinator.store.zk_session import ZooKeeperSession
from coordinator.store.zk_view import Fetch, ViewRead, read_member_info, read_view

__all__ = ["CachedView", "WatchedView"]

log = logging.getLogger(__name__)

_R = TypeVar("_R")


@dataclass(frozen=True)
class CachedView:
    """The last read for ``vm``, current while ``generation`` is the session's and ``read.session_id``
    the session's id."""

    vm: str
    generation: int
    read: ViewRead
    standing: tuple[int, int] = (-1, -1)  # (standing generation, epoch) noted before the read
    part: Part = Part.WHOLE  # the whole view, or what ``own_view`` or ``named_view`` keeps of it


class WatchedView:
    """The cache of one store (see the module docstring). Called from the agent loop, except ``watch``,
    which kazoo calls from its threads."""

    def __init__(self, session: ZooKeeperSession, paths: ZooKeeperPaths, *, ack_times: bool = False) -> None:
        self._session = session
        self._paths = paths
        self._ack_times = ack_times  # read each ack's data for its time (``zk_view.read_view``)
        self._cached: CachedView | None = None
        self._joined: tuple[str, int] | None = None  # (vm, session id) whose member node this store made
        self._nodes = NodeCache()
        self._members_lock = threading.Lock()
        self._standing_generation = 0  # moved by watch events on /members, a member, /registry, /leader
        self.requests_sent = 0  # requests sent by view and member info reads (for tests and benchmarks)
        # One bound method object, so that kazoo's per-path watcher sets hold it once.
        self.watch = self._on_watch

    # Reads that take unchanged answers from the cache; the last one reads everything. Each attempt after
    # the first sends only the requests for what fired meanwhile; a group that changes many times a second
    # makes a read stale about half the time, so three attempts fell back to a full read for about one read
    # in four (a loopback server with 500 writes a second: 16.6 requests per read with 3 attempts, 3.7
    # with 5, 3.4 with 8).
    READ_ATTEMPTS = 6

    # -- the view -------------------------------------------------------------------------------------

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        """The view for ``vm`` (normalised), whole or the ``part`` of it that ``own_view`` or ``named_view`` keeps:
        the kept one if current, else a new read. Raises ``StoreUnavailable`` when not CONNECTED (nothing
        is served then) or when the read fails."""
        generation = self._session.generation  # before anything is sent: see the module docstring
        standing = self._standing()
        epoch = self._session.epoch
        _, session_id = self._session.connected(write=False)
        cached = self.current(session_id, vm)
        if cached is not None and cached.part is part:
            return dataclasses.replace(cached.read.view, connection=self._session.connection_state)
        for attempt in range(self.READ_ATTEMPTS):
            if attempt == self.READ_ATTEMPTS - 1:
                self._nodes.clear()
            fetch, read = self._read(session_id, epoch,
                                     lambda f: read_view(self._session, self._paths, vm, f, part=part,
                                                         ack_times=self._ack_times))
            if fetch is not None:
                break
        self._cached = CachedView(vm, generation, read, standing, part)
        return read.view

    def _read(self, session_id: int, epoch: int, read: Callable[[Fetch], _R]) -> tuple[Fetch | None, _R]:
        """One read through the node cache: (the fetch, what ``read`` made of it), or (None, it) if a watch
        fired during the read on an answer it took from the cache (the result may mix that old answer with
        newer ones: read again). kazoo answers requests on one thread and runs watchers on another, in the
        order the server sent them: the watch events that came before now, those of this store's own
        writes among them, are let to arrive first, and those that came before the read's answers after."""
        if len(self._nodes):
            self._session.watch_events_delivered(self._session.deadline())
        self._nodes.begin((session_id, epoch))
        try:
            fetch = Fetch(self._session, self._nodes, self.watch)
            result = read(fetch)
            if fetch.kept or fetch.kept_memos:
                self._session.watch_events_delivered(fetch.deadline)
        finally:
            fired = self._nodes.end()
        self.requests_sent += fetch.sent
        return (None if stale(fetch.kept, fetch.kept_memos, fired) else fetch), result

    def touch(self, event_id: str) -> None:
        """This store wrote to the record of ``event_id`` (normalised): its node and the record made of it
        are read again next time. What the write changed under it, its own watch events drop: the server
        sends them before the write's reply, so the acks it did not touch are not read again."""
        self._nodes.drop_node(self._paths.event(event_id))

    def known_data(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        """The data and stat of ``path`` as a watched read of this store got them, while its watch has not
        fired (None: not kept). Only ever the start of a versioned write, which fails if it is stale."""
        found, answer = self._nodes.get(("data", path))
        return cast("tuple[bytes, ZnodeStat]", answer) if found else None

    def forget_records(self) -> None:
        """Read every record again next time (after a purge)."""
        self._nodes.drop_under(self._paths.events)

    def _standing(self) -> tuple[int, int]:
        with self._members_lock:
            return self._standing_generation, self._session.epoch

    def _standing_read(self, session_id: int) -> CachedView | None:
        """The kept read, if nothing of membership or leadership has changed since it was made (other
        changes do not matter to ``join`` and ``campaign``), for this session, while CONNECTED."""
        cached = self._cached
        if cached is None or cached.read.session_id != session_id or cached.standing != self._standing():
            return None
        if self._session.session_id != session_id or self._session.connection_state is not ConnectionState.CONNECTED:
            return None
        return cached

    def current(self, session_id: int, vm: str | None = None) -> CachedView | None:
        """The kept read, if it is still current for ``session_id`` (and was made for ``vm``, if given)
        and the connection is CONNECTED; else None."""
        cached = self._cached
        if cached is None or (vm is not None and cached.vm != vm):
            return None
        if cached.generation != self._session.generation or cached.read.session_id != session_id:
            return None
        if self._session.session_id != session_id or self._session.connection_state is not ConnectionState.CONNECTED:
            return None
        return cached

    # -- membership -----------------------------------------------------------------------------------

    def joined(self, vm: str, session_id: int | None) -> None:
        """``join`` made sure that ``session_id`` owns the member node of ``vm`` (None: it could not
        tell)."""
        self._joined = (vm, session_id) if session_id is not None else None

    def join_answer(self, vm: str, session_id: int) -> bool:
        """True if the current view shows that the member node of ``vm`` is this session's own, made by
        this store, and that ``vm`` is registered: ``join`` has nothing to do."""
        cached = self._standing_read(session_id)
        if cached is None or self._joined != (vm, session_id):
            return False
        view = cached.read.view
        return cached.read.member_owner == session_id and cached.vm == vm and vm in view.members and vm in view.known

    def campaign_answer(self, session_id: int, reclaimable: Callable[[int], bool] = lambda _: False) -> bool | None:
        """Whether this session holds ``/leader``, if the last view shows the node, held by this session or by
        one not ``reclaimable``, and nothing of membership or leadership has changed since; None otherwise."""
        cached = self._standing_read(session_id)
        owner = cached.read.leader_owner if cached is not None else None
        if owner is None or (owner != session_id and reclaimable(owner)):
            return None
        return owner == session_id

    # -- member info ----------------------------------------------------------------------------------

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        """What the member nodes of ``vms`` (normalised) say, from the node cache where current. Raises
        ``StoreUnavailable`` when not CONNECTED or when a read fails."""
        _, session_id = self._session.connected(write=False)
        wanted = [vm for vm in dict.fromkeys(vms) if is_canonical_vm(vm)]
        _, found = self._read(session_id, self._session.epoch,
                              lambda f: read_member_info(self._session, self._paths, wanted, f))
        return {vm: copy.deepcopy(found[vm]) for vm in wanted if vm in found}

    # -- watches --------------------------------------------------------------------------------------

    def _on_watch(self, event: WatchedEvent) -> None:
        # Runs on kazoo's event thread: drop what the event makes stale, count, then let the session count
        # and wake the agent (in this order: a read that sees the count moved sees the answers dropped).
        self._nodes.on_watch(event)
        path = event.path
        members = path is None or path == self._paths.members or path.startswith(self._paths.members + "/")
        if members or path in (self._paths.registry, self._paths.leader):
            with self._members_lock:
                self._standing_generation += 1
        self._session.watch(event)
