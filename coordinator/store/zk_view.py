"""The reads of the ZooKeeper store: the cluster view (members, registry, leader, absences, out-of-rotation
marks and every event record) and the member info of given VMs.

Every request goes through a ``Fetch``, which answers from a ``NodeCache`` (``coordinator.store.zk_nodes``)
what an earlier read of the same session and connection got and no watch has announced a change of since,
and sends the rest, all the requests of one round at once (kazoo pipelines them), awaited against one
deadline. A read of an unchanged group sends nothing; a change costs the nodes it touched. Every request
carries a watch, so that what it answered stays current until one fires:

* the lists ``/members``, ``/registry``, ``/absent``, ``/out``, ``/drains``, ``/drains-admitted`` and
  ``/events`` (a list that does not exist yet gets an ``exists`` watch instead, so that its creation is
  seen);
* ``/leader`` and ``/pause`` (``exists``, whether or not they are there, and their data), and
  ``/members/{vm}`` of the reading VM (``exists``: whose session owns it);
* the data of ``/absent/{vm}``, ``/out/{vm}``, ``/drains/{vm}``, ``/drains-admitted/{vm}`` and
  ``/events/{EVENT_ID}``, the children of each event's ``acks``, and the data of each ack (only ever
  created and deleted, never rewritten: a delete fires the data watch, so a node deleted and created
  again between two reads is never served from the first). A
  record's data holds a copy of its ``admitted`` and ``approval`` (``EventNode.mirrors``): a record
  written by a version that does not keep it is read with its children and their data, as they were;
* the data of each ``/members/{vm}`` that ``read_member_info`` reads (a member node is rewritten only by
  being deleted and created again).

Nodes that do not parse (see ``coordinator.store.payloads``) never make the read fail:

* ``/leader``: the leader is reported unknown (and this agent not the leader), with a warning;
* ``/pause``: approvals count as paused (for "undecodable pause node"), with a warning;
* ``/absent/{vm}``: that absence is left out, with a warning;
* ``/out/{vm}``: the VM is counted out of rotation, for no known event, with a warning;
* ``/drains/{vm}``: the VM is drained by hand all the same, asked at the node's creation;
* ``/drains-admitted/{vm}``: it admits nothing (the drain waits for the budget), with a warning;
* ``/events/{EVENT_ID}``: the record is left out, with a warning;
* an ack: it does not count (the VM has not acknowledged), with a warning; so too an ack whose payload
  names another VM than the node's name. An ack stands for a drain that holds now: a node that cannot
  say so is no ack;
* ``admitted``: its time is taken from the node's creation time instead;
* ``approval``: the node exists, so the event *is* approved: it is shown as approved by ``"?"`` at 0,
  with a warning.

Child names that are not canonical VM names or event ids are skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from coordinator.errors import LayoutMismatch
from coordinator.store.base import Approval, ClusterView, EventRecord, OutMark, Part, Pause
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    ApprovalNode,
    EventNode,
    LayoutNode,
    LeaderNode,
    MemberNode,
    OutNode,
    PauseNode,
    PayloadError,
)
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_drains import DrainReads
from coordinator.store.zk_nodes import Key, NodeCache
from coordinator.store.zk_paths import LAYOUT_VERSION, ZooKeeperPaths, is_canonical_event_id, is_canonical_vm
from coordinator.store.zk_session import ZooKeeperSession

__all__ = ["Fetch", "ViewRead", "Watcher", "read_member_info", "read_view"]

log = logging.getLogger(__name__)

Watcher = Callable[[WatchedEvent], None]
_T = TypeVar("_T")


@dataclass(frozen=True)
class ViewRead:
    """One read of the view, with what the view does not show: the session the read was made in, and
    the session owning ``/leader`` and the reading VM's ``/members/{vm}`` (None: no such node)."""

    view: ClusterView
    session_id: int
    leader_owner: int | None
    member_owner: int | None


def read_view(session: ZooKeeperSession, paths: ZooKeeperPaths, vm: str, fetch: Fetch, *,
              part: Part = Part.WHOLE, ack_times: bool = False) -> ViewRead:
    """The cluster as seen now by ``vm`` (already normalised): every node through ``fetch``, which answers
    from what it keeps and sends a watched request for the rest. With ``part`` less than WHOLE, only what
    ``coordinator.store.base.own_view``, ``named_view`` or ``lead_view`` keeps: below LEAD the lists
    ``/absent``, ``/out``, ``/drains`` and ``/drains-admitted`` are neither read nor watched, ``exists`` of
    this VM's node in the last three is; OWN reads no record (nor ``/events``), NAMED and LEAD read each
    record with ``exists`` of this VM's ack instead of the list of acks. The acks are listed by name; with
    ``ack_times`` (``coordinator status``) each one's data is read too, for its time. Raises
    ``StoreUnavailable`` if not connected, or if a request fails or is not answered within the operation
    timeout."""
    session_id = fetch.session_id
    with session.reading("read the cluster view"):
        members_r = fetch.children(paths.members)
        registry_r = fetch.children(paths.registry)
        # exists() sets a watch whether or not the node is there, so a new leader wakes us up too.
        leader_r = fetch.exists(paths.leader)
        member_r = fetch.exists(paths.member(vm))
        # A VM that follows only its own part reads no record: what it must know of an event, its own
        # documents show it; so another VM's event costs it no request and no watch notification.
        # A VM that an event names but that approves and closes nothing reads each record with its own ack
        # only: another VM's ack or /out mark costs it nothing either.
        # A leader that approves nothing reads every /out mark but no other VM's ack (``Part.LEAD``).
        whole = part is Part.WHOLE
        group = part.holds(Part.LEAD)
        events_r = fetch.children(paths.events) if part.holds(Part.NAMED) else None
        absent_r = fetch.children(paths.absent) if group else None
        out_r = fetch.children(paths.out) if group else None
        own_out_r = None if group else fetch.present(paths.out_vm(vm))
        drains = DrainReads(fetch, paths, None if group else vm)
        pause_r = fetch.exists(paths.pause)
        layout_r = fetch.exists(paths.layout_version)
        lists = _Lists(session, fetch)
        _check_layout(fetch, paths, layout_r)
        members = frozenset(lists.canonical(paths.members, members_r, is_canonical_vm))
        known = frozenset(lists.canonical(paths.registry, registry_r, is_canonical_vm))
        member_stat = member_r.get()
        member_owner = member_stat.ephemeralOwner if member_stat is not None else None
        leader: str | None = None
        leader_owner: int | None = None
        i_am_leader = False
        if leader_r.get() is not None:
            try:
                data, stat = fetch.data(paths.leader).get()
                leader_owner = stat.ephemeralOwner
                leader = LeaderNode.from_bytes(data, paths.leader).vm
                i_am_leader = stat.ephemeralOwner == session_id and leader == vm
            except NoNodeError:
                pass
            except PayloadError as exc:
                log.warning("undecodable leader node, leader treated as unknown: %s", exc)

        absent_since: dict[str, float] = {}
        absent_names = lists.canonical(paths.absent, absent_r, is_canonical_vm) if absent_r is not None else []
        # Never rewritten today (created, then deleted), but watched all the same: the cost is nil.
        absent_data = {name: fetch.data(paths.absent_vm(name)) for name in absent_names}
        if out_r is not None:
            out_names = lists.canonical(paths.out, out_r, is_canonical_vm)
        else:
            out_names = [vm] if own_out_r is not None and own_out_r.get() is not None else []
        out_data = {name: fetch.data(paths.out_vm(name)) for name in out_names}
        drains.send_data(lists)
        for name, result in absent_data.items():
            try:
                data, _ = result.get()
                absent_since[name] = AbsentNode.from_bytes(data, paths.absent_vm(name)).since
            except NoNodeError:
                pass
            except PayloadError as exc:
                log.warning("undecodable absence node, ignored: %s", exc)

        out: dict[str, OutMark] = {}
        for name, result in out_data.items():
            try:
                data, _ = result.get()
            except NoNodeError:
                continue
            try:
                node = OutNode.from_bytes(data, paths.out_vm(name))
                out[name] = OutMark(since=node.since, events=node.events)
            except PayloadError as exc:
                # Still out of rotation by its own word, for unknown events: the budget counts it.
                log.warning("undecodable out-of-rotation node, counted as out: %s", exc)
                out[name] = OutMark(since=0.0)

        hand_drains, stale_admissions = drains.finish()
        paused = _read_pause(session, fetch, paths, pause_r)

        records: dict[str, EventRecord] = {}
        if events_r is not None:
            records = _read_records(fetch, paths, lists.canonical(paths.events, events_r, is_canonical_event_id),
                                    None if whole else vm, ack_times)
    view = ClusterView(
        members=members,
        leader=leader,
        i_am_leader=i_am_leader,
        records=records,
        connection=session.connection_state,
        known=known,
        absent_since=absent_since,
        out=out,
        paused=paused,
        drains=hand_drains,
        stale_admissions=stale_admissions,
        part=part,
    )
    return ViewRead(view, session_id, leader_owner, member_owner)


def read_member_info(
    session: ZooKeeperSession, paths: ZooKeeperPaths, vms: Iterable[str], fetch: Fetch
) -> dict[str, dict[str, object]]:
    """What the member nodes of ``vms`` say (their agents' member info), through ``fetch`` (each node
    watched; what a node said is kept with it); a VM without a member node, or whose node does not parse,
    is left out. Raises ``StoreUnavailable``."""
    found: dict[str, dict[str, object]] = {}
    with session.reading("read member info"):
        wanted = [vm for vm in vms if is_canonical_vm(vm)]
        pending = {vm: fetch.data(paths.member(vm)) for vm in wanted if not fetch.has_memo(paths.member(vm))}
        for vm in wanted:
            path = paths.member(vm)
            result = pending.get(vm)
            if result is None:
                info = fetch.memo(path)
            else:
                try:
                    data, _ = result.get()
                    info = MemberNode.from_bytes(data, path).model_dump()
                except NoNodeError:
                    continue
                except PayloadError as exc:
                    log.warning("undecodable member node, ignored: %s", exc)
                    continue
                fetch.keep_memo(path, info)
            if isinstance(info, dict):
                found[vm] = info
    return found


class Fetch:
    """The requests of one read, through a ``NodeCache``: an answer the cache keeps is used as it is, any
    other is sent at once with ``watch`` (kazoo pipelines what is sent before it is awaited) and kept when
    it comes. ``sent`` counts the requests; ``kept`` the paths of the answers taken from the cache,
    ``kept_memos`` those of the memos."""

    def __init__(self, session: ZooKeeperSession, cache: NodeCache, watch: Watcher) -> None:
        self.client, self.session_id = session.connected(write=False)
        self._session = session
        self._cache = cache
        self._watch = watch
        self.deadline = session.deadline()
        self.sent = 0
        self.kept: set[str] = set()
        self.kept_memos: set[str] = set()

    def children(self, path: str) -> _Pending[list[str]]:
        if self.known_missing(path):
            return _Pending(self, ("children", path), answer=[])  # its creation fires the exists watch
        return self._pending(("children", path), lambda: self.client.get_children_async(path, watch=self._watch))

    def data(self, path: str) -> _Pending[tuple[bytes, ZnodeStat]]:
        return self._pending(("data", path), lambda: self.client.get_async(path, watch=self._watch))

    def exists(self, path: str) -> _Pending[ZnodeStat | None]:
        return self._pending(("exists", path), lambda: self.client.exists_async(path, watch=self._watch))

    def present(self, path: str) -> _Pending[object] | _Present:
        """Whether ``path`` exists (None: it does not): a kept ``exists`` or data answer, else the kept list
        of its parent's children, whose watch fires when it is created or deleted (so a VM that read the whole
        view learns of its own nodes with no request once it reads its own part), else one watched request:
        its data when a watch event announced its creation last (the data read that follows takes it), else
        ``exists``."""
        if not self._cache.get(("exists", path))[0]:
            if self._cache.get(("data", path))[0]:
                self.kept.add(path)
                return _Pending(self, ("exists", path), answer=True)
            parent, _, name = path.rpartition("/")
            listed, names = self._cache.get(("children", parent))
            if listed and isinstance(names, list):
                self.kept.add(parent)
                return _Pending(self, ("exists", path), answer=True if name in names else None)
            if self._cache.created(path):
                return _Present(self, path, self.data(path))
        return cast("_Pending[object]", self.exists(path))

    def known_missing(self, path: str) -> bool:
        """The cache knows (from a watched ``exists``) that ``path`` does not exist."""
        found, answer = self._cache.get(("exists", path))
        return found and answer is None

    def has_memo(self, path: str) -> bool:
        return self._cache.memo(path)[0]

    def memo(self, path: str) -> object:
        found, value = self._cache.memo(path)
        if found:
            self.kept_memos.add(path)
        return value

    def keep_memo(self, path: str, value: object) -> None:
        self._cache.keep_memo(path, value)

    def peek_memo(self, path: str) -> object:
        """What ``memo`` keeps for ``path`` (None if nothing), not counted as taken from the cache."""
        return self._cache.memo(path)[1]

    def wait(self, result: IAsyncResult[_T]) -> _T:
        return self._session.wait(result, self.deadline)

    def _pending(self, key: Key, send: Callable[[], IAsyncResult[_T]]) -> _Pending[_T]:
        found, answer = self._cache.get(key)
        if found:
            self.kept.add(key[1])
            return _Pending(self, key, answer=cast("_T", answer))
        self.sent += 1
        return _Pending(self, key, result=send())

    def _keep(self, key: Key, answer: object) -> None:
        self._cache.keep(key, answer)


class _Pending(Generic[_T]):
    """One answer of a ``Fetch``: kept, or a request on its way (kept by the cache when it comes)."""

    __slots__ = ("_answer", "_fetch", "_key", "_result")

    def __init__(self, fetch: Fetch, key: Key, *, answer: _T | None = None,
                 result: IAsyncResult[_T] | None = None) -> None:
        self._fetch = fetch
        self._key = key
        self._answer = answer
        self._result = result

    def get(self) -> _T:
        if self._result is None:
            return cast("_T", self._answer)
        answer = self._fetch.wait(self._result)  # raises NoNodeError and the like: nothing is kept then
        self._fetch._keep(self._key, answer)
        self._answer, self._result = answer, None
        return answer


class _Present:
    """``Fetch.present`` by a watched read of the node's data: True, or (deleted since its creation was
    announced) a watched ``exists``, so that its next creation is seen."""

    def __init__(self, fetch: Fetch, path: str, data: _Pending[tuple[bytes, ZnodeStat]]) -> None:
        self._fetch, self._path, self._data = fetch, path, data

    def get(self) -> object:
        try:
            return self._data.get() is not None
        except NoNodeError:
            return self._fetch.exists(self._path).get()


class _Lists:
    """The top-level lists of one read. A list whose node does not exist yet (an observer's store before
    any agent created the layout) reads as empty, and an ``exists`` watch is set on it, since a children
    watch is not set on a missing node; should it exist by then, the read counts as stale at once."""

    def __init__(self, session: ZooKeeperSession, fetch: Fetch) -> None:
        self._session = session
        self._fetch = fetch

    def names(self, path: str, result: _Pending[list[str]]) -> list[str]:
        try:
            return result.get()
        except NoNodeError:
            pass
        if self._fetch.exists(path).get() is not None:
            self._session.changed()  # created between the two requests: what was read is not current
        return []

    def canonical(self, path: str, result: _Pending[list[str]], check: Callable[[str], bool]) -> list[str]:
        """The names of the list at ``path`` that pass ``check`` (canonical VM names or event ids), checked
        once per answer: a list kept from an earlier read is not checked again."""
        names = self.names(path, result)
        kept = self._fetch.peek_memo(path)
        if isinstance(kept, tuple) and kept[0] is names:
            return list(kept[1])
        passed = [name for name in names if check(name)]
        self._fetch.keep_memo(path, (names, tuple(passed)))
        return passed


def _check_layout(fetch: Fetch, paths: ZooKeeperPaths, exists_r: _Pending[ZnodeStat | None]) -> None:
    """Raise ``LayoutMismatch`` unless the group is written in this agent's layout version: ``/layout`` says
    ``LAYOUT_VERSION``, or is absent (a group made before the node existed, of version 1). A node that does
    not parse names no version this agent reads either."""
    if exists_r.get() is None:
        return
    try:
        data, _ = fetch.data(paths.layout_version).get()
    except NoNodeError:
        return
    try:
        version: object = LayoutNode.from_bytes(data, paths.layout_version).version
    except PayloadError as exc:
        version = f"unreadable ({exc})"
    if version != LAYOUT_VERSION:
        raise LayoutMismatch(
            f"the group at {paths.base} is written in layout version {version}; this agent reads version "
            f"{LAYOUT_VERSION} only: it reads nothing of the group and approves nothing (what it drained "
            "stays drained) until it runs a version that reads this layout (docs/deployment.md, "
            "\"Upgrading\")")


def read_pause_now(ctx: StoreContext) -> Pause | None:
    """``/pause`` as the server holds it now, without a watch and without the cache (see
    ``Store.read_pause``)."""
    client, _ = ctx.session.connected(write=False)
    deadline = ctx.session.deadline()
    path = ctx.paths.pause
    with ctx.session.reading("read the pause"):
        stat = ctx.session.wait(client.exists_async(path), deadline)
        if stat is None:
            return None
        try:
            data, stat = ctx.session.wait(client.get_async(path), deadline)
        except NoNodeError:
            return None
        except NoAuthError:
            return _unreadable_pause(path, stat)
        return _pause_of(data, stat, path)


def _read_pause(session: ZooKeeperSession, fetch: Fetch, paths: ZooKeeperPaths,
                exists_r: _Pending[ZnodeStat | None]) -> Pause | None:
    """The operator's pause, if ``/pause`` exists. A node that does not parse still pauses: an operator
    meant to stop approvals, and the safe side is not to approve."""
    exists = exists_r.get()
    if exists is None:
        return None
    try:
        data, stat = fetch.data(paths.pause).get()
    except NoNodeError:
        session.changed()  # deleted between the two requests: what was read is not current
        return None
    except NoAuthError:
        return _unreadable_pause(paths.pause, exists)
    return _pause_of(data, stat, paths.pause)


def _unreadable_pause(path: str, stat: ZnodeStat) -> Pause:
    # Created with an ACL that shuts the agents out: still a pause (and not a reason to stop reading
    # the rest of the group, which would stop drains too).
    log.warning("pause node %s is not readable with this agent's identity, approvals stay paused", path)
    return Pause(reason="pause node not readable by the agents", by="?", at=stat.ctime / 1000.0)


def _pause_of(data: bytes, stat: ZnodeStat, path: str) -> Pause:
    try:
        node = PauseNode.from_bytes(data, path)
    except PayloadError as exc:
        log.warning("undecodable pause node, approvals stay paused: %s", exc)
        return Pause(reason="undecodable pause node", by="?", at=stat.ctime / 1000.0)
    return Pause(reason=node.reason, by=node.by, at=node.at)


def _event_node(data: bytes, paths: ZooKeeperPaths, event_id: str) -> EventNode | None:
    """The node of a record; None, with a warning, if it does not parse."""
    try:
        return EventNode.from_bytes(data, paths.event(event_id))
    except PayloadError as exc:
        log.warning("event %s: undecodable record, ignored: %s", event_id, exc)
        return None


def _ack(data: bytes, path: str, vm: str) -> AckNode | None:
    """The ack at ``path`` (the ack of ``vm``), or None, with a warning, if it is undecodable or names another
    VM: such a node is not counted as an acknowledgement."""
    try:
        return AckNode.of_vm(data, path, vm)
    except PayloadError as exc:
        log.warning("undecodable ack, not counted: %s", exc)
        return None


@dataclass(frozen=True)
class _RecordMemo:
    """A record as a read made it, and whose acks it holds (None: every VM's; else that VM's only)."""

    record: EventRecord
    acks_of: str | None


def _read_records(fetch: Fetch, paths: ZooKeeperPaths, event_ids: list[str],
                  acks_of: str | None = None, ack_times: bool = False) -> dict[str, EventRecord]:
    """The records of ``event_ids``, with every ack, or (``acks_of``) with that VM's ack only: a record whose
    nodes no watch has dropped since a read of the same kind made it is taken as it was made
    (``NodeCache.memo``); the others are read again, the nodes each one lacks all sent before any is
    awaited."""
    records: dict[str, EventRecord] = {}
    pending: dict[str, _RecordRead] = {}
    for event_id in event_ids:
        path = paths.event(event_id)
        kept = fetch.peek_memo(path)
        if isinstance(kept, _RecordMemo) and kept.acks_of == acks_of:
            fetch.memo(path)  # counted as taken from the cache
            records[event_id] = kept.record
            continue
        pending[event_id] = _RecordRead(fetch, paths, event_id, acks_of, ack_times)
    for read in pending.values():
        read.send_children()
    for event_id, read in pending.items():
        record = read.finish()
        if record is not None:
            records[event_id] = record
            fetch.keep_memo(paths.event(event_id), _RecordMemo(record, acks_of))
    return {event_id: records[event_id] for event_id in event_ids if event_id in records}


class _RecordRead:
    """The record of one event with its acks, approval and admission, in two rounds: the node and its list
    of acks, then the acks the list names. The node's data holds its admission and approval
    (``EventNode.mirrors``); a node written by a version that does not keep them there costs a round more,
    its children and theirs. With ``acks_of``, that VM's ack only: ``exists`` of its node stands for the
    list of acks, which is neither read nor watched."""

    def __init__(self, fetch: Fetch, paths: ZooKeeperPaths, event_id: str, acks_of: str | None = None,
                 ack_times: bool = False) -> None:
        self._fetch = fetch
        self._ack_times = ack_times
        self._ack_names: list[str] = []
        self._paths = paths
        self._event_id = event_id
        self._record_r = fetch.data(paths.event(event_id))
        self._acks_r = fetch.children(paths.acks(event_id)) if acks_of is None else None
        self._own_ack_r = fetch.present(paths.ack(event_id, acks_of)) if acks_of is not None else None
        self._acks_of = acks_of
        self._node: EventNode | None = None
        self._mirrored = False
        self._acks: dict[str, _Pending[tuple[bytes, ZnodeStat]]] = {}
        self._approval_r: _Pending[tuple[bytes, ZnodeStat]] | None = None
        self._admitted_r: _Pending[tuple[bytes, ZnodeStat]] | None = None

    def send_children(self) -> None:
        fetch, paths, event_id = self._fetch, self._paths, self._event_id
        try:
            data, stat = self._record_r.get()
        except NoNodeError:
            return  # purged while we were reading
        self._node = _event_node(data, paths, event_id)
        if self._node is None:
            return
        ack_names: list[str] = []
        if self._acks_r is not None:
            with contextlib.suppress(NoNodeError):
                ack_names = [name for name in self._acks_r.get() if is_canonical_vm(name)]
        elif self._own_ack_r is not None and self._acks_of is not None and self._own_ack_r.get() is not None:
            ack_names = [self._acks_of]
        self._ack_names = ack_names
        if self._ack_times:
            self._acks = {name: fetch.data(paths.ack(event_id, name)) for name in ack_names}
        self._mirrored = self._node.mirrors(stat)
        if not self._mirrored:
            try:
                children = fetch.children(paths.event(event_id)).get()
            except NoNodeError:
                self._node = None  # purged while we were reading
                return
            self._approval_r = fetch.data(paths.approval(event_id)) if "approval" in children else None
            self._admitted_r = fetch.data(paths.admitted(event_id)) if "admitted" in children else None

    def finish(self) -> EventRecord | None:
        """The record; None if it is gone or undecodable."""
        paths, event_id, node = self._paths, self._event_id, self._node
        if node is None:
            return None
        # Listed by name: an ack node stands for a drain its VM's session holds. What it says is the gate's to
        # judge (``coordinator.store.gate``: one that does not parse, or that another session holds, does not
        # count); the view counts it, which holds a record open and a VM out of rotation: the safe side.
        acks: dict[str, float | None] = {} if self._ack_times else dict.fromkeys(self._ack_names)
        for name, result in self._acks.items():
            try:
                ack_data, _ = result.get()
            except NoNodeError:
                continue  # withdrawn meanwhile
            ack = _ack(ack_data, paths.ack(event_id, name), name)
            if ack is not None:
                acks[name] = ack.at
        if self._mirrored:
            return node.record_of_copies(event_id, acks)
        approval: Approval | None = None
        if self._approval_r is not None:
            try:
                approval_data, _ = self._approval_r.get()
                approval = ApprovalNode.from_bytes(approval_data, paths.approval(event_id)).to_approval()
            except NoNodeError:
                pass
            except PayloadError as exc:
                # The node exists, so the event was approved; keep what can be shown.
                log.warning("event %s: undecodable approval record: %s", event_id, exc)
                approval = ApprovalNode.unknown().to_approval()
        admitted_at: float | None = None
        if self._admitted_r is not None:
            try:
                admitted_data, admitted_stat = self._admitted_r.get()
            except NoNodeError:
                pass
            else:
                admitted_at = AdmittedNode.or_created(admitted_data, paths.admitted(event_id), admitted_stat).at
        return node.to_record(event_id, acks=acks, approval=approval, admitted_at=admitted_at)
