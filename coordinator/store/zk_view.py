"""The reads of the ZooKeeper store: the cluster view (members, registry, leader, absences, out-of-rotation
marks and every event record) and the member info of given VMs.

All requests of one read are sent at once (kazoo pipelines them) and awaited against one deadline. A watch
is set on every node whose change matters, so that a read stays current until one fires (the cache of
``coordinator.store.zk_watch``):

* the lists ``/members``, ``/registry``, ``/absent``, ``/out`` and ``/events`` (a list that does not
  exist yet gets an ``exists`` watch instead, so that its creation is seen);
* ``/leader`` and ``/pause`` (``exists``, whether or not they are there, and their data), and
  ``/members/{vm}`` of the reading VM (``exists``: whose session owns it);
* the data of ``/absent/{vm}``, ``/out/{vm}`` and ``/events/{EVENT_ID}``, and the children of each event
  and of its ``acks``. An ack, ``approval`` and ``admitted`` are only ever created and deleted, never
  rewritten: the watches on the lists they belong to cover them;
* the data of each ``/members/{vm}`` that ``read_member_info`` reads (a member node is rewritten only by
  being deleted and created again).

Nodes that do not parse (see ``coordinator.store.payloads``) never make the read fail:

* ``/leader``: the leader is reported unknown (and this agent not the leader), with a warning;
* ``/pause``: approvals count as paused (for "undecodable pause node"), with a warning;
* ``/absent/{vm}``: that absence is left out, with a warning;
* ``/out/{vm}``: the VM is counted out of rotation, for no known event, with a warning;
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

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from coordinator.store.base import Approval, ClusterView, EventRecord, OutMark, Pause
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    ApprovalNode,
    EventNode,
    LeaderNode,
    MemberNode,
    OutNode,
    PauseNode,
    PayloadError,
)
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_paths import ZooKeeperPaths, is_canonical_event_id, is_canonical_vm
from coordinator.store.zk_session import Deadline, ZooKeeperSession

__all__ = ["ViewRead", "Watcher", "read_member_info", "read_view"]

log = logging.getLogger(__name__)

Watcher = Callable[[WatchedEvent], None]


@dataclass(frozen=True)
class ViewRead:
    """One read of the view, with what the view does not show: the session the read was made in, and
    the session owning ``/leader`` and the reading VM's ``/members/{vm}`` (None: no such node)."""

    view: ClusterView
    session_id: int
    leader_owner: int | None
    member_owner: int | None


def read_view(
    session: ZooKeeperSession, paths: ZooKeeperPaths, vm: str, watch: Watcher,
    reuse: Mapping[str, EventRecord] | None = None,
) -> ViewRead:
    """The cluster as seen now by ``vm`` (already normalised), every node read watched by ``watch``.
    Event records in ``reuse`` (by event id) are taken as they are, without a request, when the events
    list still holds them: the caller vouches that nothing of theirs changed since they were read (their
    watches have not fired, so they are still set). Raises ``StoreUnavailable`` if not connected, or if a
    request fails or is not answered within the operation timeout."""
    reuse = reuse or {}
    client, session_id = session.connected(write=False)
    deadline = session.deadline()
    with session.reading("read the cluster view"):
        members_r = client.get_children_async(paths.members, watch=watch)
        registry_r = client.get_children_async(paths.registry, watch=watch)
        # exists() sets a watch whether or not the node is there, so a new leader wakes us up too.
        leader_r = client.exists_async(paths.leader, watch=watch)
        member_r = client.exists_async(paths.member(vm), watch=watch)
        events_r = client.get_children_async(paths.events, watch=watch)

        absent_r = client.get_children_async(paths.absent, watch=watch)
        out_r = client.get_children_async(paths.out, watch=watch)
        pause_r = client.exists_async(paths.pause, watch=watch)
        lists = _Lists(session, client, deadline, watch)
        members = frozenset(name for name in lists.names(paths.members, members_r) if is_canonical_vm(name))
        known = frozenset(name for name in lists.names(paths.registry, registry_r) if is_canonical_vm(name))
        member_stat = session.wait(member_r, deadline)
        member_owner = member_stat.ephemeralOwner if member_stat is not None else None
        leader: str | None = None
        leader_owner: int | None = None
        i_am_leader = False
        if session.wait(leader_r, deadline) is not None:
            try:
                data, stat = session.wait(client.get_async(paths.leader, watch=watch), deadline)
                leader_owner = stat.ephemeralOwner
                leader = LeaderNode.from_bytes(data, paths.leader).vm
                i_am_leader = stat.ephemeralOwner == session_id and leader == vm
            except NoNodeError:
                pass
            except PayloadError as exc:
                log.warning("undecodable leader node, leader treated as unknown: %s", exc)

        absent_since: dict[str, float] = {}
        absent_names = [n for n in lists.names(paths.absent, absent_r) if is_canonical_vm(n)]
        # Never rewritten today (created, then deleted), but watched all the same: the cost is nil.
        absent_data = {name: client.get_async(paths.absent_vm(name), watch=watch) for name in absent_names}
        for name, result in absent_data.items():
            try:
                data, _ = session.wait(result, deadline)
                absent_since[name] = AbsentNode.from_bytes(data, paths.absent_vm(name)).since
            except NoNodeError:
                pass
            except PayloadError as exc:
                log.warning("undecodable absence node, ignored: %s", exc)

        out: dict[str, OutMark] = {}
        out_names = [n for n in lists.names(paths.out, out_r) if is_canonical_vm(n)]
        out_data = {name: client.get_async(paths.out_vm(name), watch=watch) for name in out_names}
        for name, result in out_data.items():
            try:
                data, _ = session.wait(result, deadline)
            except NoNodeError:
                continue
            try:
                node = OutNode.from_bytes(data, paths.out_vm(name))
                out[name] = OutMark(since=node.since, events=node.events)
            except PayloadError as exc:
                # Still out of rotation by its own word, for unknown events: the budget counts it.
                log.warning("undecodable out-of-rotation node, counted as out: %s", exc)
                out[name] = OutMark(since=0.0)

        paused = _read_pause(session, client, paths, pause_r, deadline, watch)

        event_ids = [e for e in lists.names(paths.events, events_r) if is_canonical_event_id(e)]
        pending = {
            event_id: (
                client.get_async(paths.event(event_id), watch=watch),
                client.get_children_async(paths.event(event_id), watch=watch),
                client.get_children_async(paths.acks(event_id), watch=watch),
            )
            for event_id in event_ids
            if event_id not in reuse
        }
        records: dict[str, EventRecord] = {}
        for event_id in event_ids:
            if event_id in reuse:
                records[event_id] = reuse[event_id]
                continue
            record_r, children_r, acks_r = pending[event_id]
            record = _read_record(session, client, paths, event_id, record_r, children_r, acks_r, deadline)
            if record is not None:
                records[event_id] = record
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
    )
    return ViewRead(view, session_id, leader_owner, member_owner)


def read_member_info(
    session: ZooKeeperSession, paths: ZooKeeperPaths, vms: Iterable[str], watch: Watcher
) -> dict[str, dict[str, object]]:
    """What the member nodes of ``vms`` say (their agents' member info), read at once, each node watched
    by ``watch``; a VM without a member node, or whose node does not parse, is left out. Raises
    ``StoreUnavailable``."""
    client, _ = session.connected(write=False)
    deadline = session.deadline()
    found: dict[str, dict[str, object]] = {}
    with session.reading("read member info"):
        pending = {vm: client.get_async(paths.member(vm), watch=watch) for vm in vms if is_canonical_vm(vm)}
        for vm, result in pending.items():
            try:
                data, _ = session.wait(result, deadline)
                found[vm] = MemberNode.from_bytes(data, paths.member(vm)).model_dump()
            except NoNodeError:
                continue
            except PayloadError as exc:
                log.warning("undecodable member node, ignored: %s", exc)
    return found


class _Lists:
    """The top-level lists of one read. A list whose node does not exist yet (an observer's store before
    any agent created the layout) reads as empty, and an ``exists`` watch is set on it, since a children
    watch is not set on a missing node; should it exist by then, the read counts as stale at once."""

    def __init__(self, session: ZooKeeperSession, client: KazooClient, deadline: Deadline, watch: Watcher) -> None:
        self._session = session
        self._client = client
        self._deadline = deadline
        self._watch = watch

    def names(self, path: str, result: IAsyncResult[list[str]]) -> list[str]:
        try:
            return self._session.wait(result, self._deadline)
        except NoNodeError:
            pass
        if self._session.wait(self._client.exists_async(path, watch=self._watch), self._deadline) is not None:
            self._session.changed()  # created between the two requests: what was read is not current
        return []


def _children_or_empty(session: ZooKeeperSession, result: IAsyncResult[list[str]], deadline: Deadline) -> list[str]:
    try:
        return session.wait(result, deadline)
    except NoNodeError:
        return []


def read_pause_now(ctx: StoreContext) -> Pause | None:
    """``/pause`` as the server holds it now, without a watch (see ``Store.read_pause``)."""
    client, _ = ctx.session.connected(write=False)
    deadline = ctx.session.deadline()
    with ctx.session.reading("read the pause"):
        exists_r = client.exists_async(ctx.paths.pause)
        return _read_pause(ctx.session, client, ctx.paths, exists_r, deadline, None)


def _read_pause(
    session: ZooKeeperSession, client: KazooClient, paths: ZooKeeperPaths,
    exists_r: IAsyncResult[ZnodeStat | None], deadline: Deadline, watch: Watcher | None,
) -> Pause | None:
    """The operator's pause, if ``/pause`` exists. A node that does not parse still pauses: an operator
    meant to stop approvals, and the safe side is not to approve."""
    exists = session.wait(exists_r, deadline)
    if exists is None:
        return None
    try:
        data, stat = session.wait(client.get_async(paths.pause, watch=watch), deadline)
    except NoNodeError:
        session.changed()  # deleted between the two requests: what was read is not current
        return None
    except NoAuthError:
        # Created with an ACL that shuts the agents out: still a pause (and not a reason to stop reading
        # the rest of the group, which would stop drains too).
        log.warning("pause node %s is not readable with this agent's identity, approvals stay paused", paths.pause)
        return Pause(reason="pause node not readable by the agents", by="?", at=exists.ctime / 1000.0)
    try:
        node = PauseNode.from_bytes(data, paths.pause)
    except PayloadError as exc:
        log.warning("undecodable pause node, approvals stay paused: %s", exc)
        return Pause(reason="undecodable pause node", by="?", at=stat.ctime / 1000.0)
    return Pause(reason=node.reason, by=node.by, at=node.at)


def _ack(data: bytes, path: str, vm: str) -> AckNode | None:
    """The ack at ``path`` (the ack of ``vm``), or None, with a warning, if it is undecodable or names another
    VM: such a node is not counted as an acknowledgement."""
    try:
        return AckNode.of_vm(data, path, vm)
    except PayloadError as exc:
        log.warning("undecodable ack, not counted: %s", exc)
        return None


def _read_record(
    session: ZooKeeperSession,
    client: KazooClient,
    paths: ZooKeeperPaths,
    event_id: str,
    record_r: IAsyncResult[tuple[bytes, ZnodeStat]],
    children_r: IAsyncResult[list[str]],
    acks_r: IAsyncResult[list[str]],
    deadline: Deadline,
) -> EventRecord | None:
    """The record of one event with its acks, approval and admission; None if it is gone or undecodable."""
    try:
        data, _ = session.wait(record_r, deadline)
        children = session.wait(children_r, deadline)
    except NoNodeError:
        return None  # purged while we were reading
    try:
        node = EventNode.from_bytes(data, paths.event(event_id))
    except PayloadError as exc:
        log.warning("event %s: undecodable record, ignored: %s", event_id, exc)
        return None
    ack_names = [name for name in _children_or_empty(session, acks_r, deadline) if is_canonical_vm(name)]
    ack_results = {name: client.get_async(paths.ack(event_id, name)) for name in ack_names}
    approval_r = client.get_async(paths.approval(event_id)) if "approval" in children else None
    admitted_r = client.get_async(paths.admitted(event_id)) if "admitted" in children else None

    acks: dict[str, float] = {}
    for name, result in ack_results.items():
        try:
            ack_data, _ = session.wait(result, deadline)
        except NoNodeError:
            continue  # withdrawn meanwhile
        ack = _ack(ack_data, paths.ack(event_id, name), name)
        if ack is not None:
            acks[name] = ack.at
    approval: Approval | None = None
    if approval_r is not None:
        try:
            approval_data, _ = session.wait(approval_r, deadline)
            approval = ApprovalNode.from_bytes(approval_data, paths.approval(event_id)).to_approval()
        except NoNodeError:
            pass
        except PayloadError as exc:
            # The node exists, so the event was approved; keep what can be shown.
            log.warning("event %s: undecodable approval record: %s", event_id, exc)
            approval = Approval(by="?", at=0.0, as_leader=False)
    admitted_at: float | None = None
    if admitted_r is not None:
        try:
            admitted_data, admitted_stat = session.wait(admitted_r, deadline)
        except NoNodeError:
            pass
        else:
            try:
                admitted_at = AdmittedNode.from_bytes(admitted_data, paths.admitted(event_id)).at
            except PayloadError:
                admitted_at = admitted_stat.ctime / 1000.0
    return node.to_record(event_id, acks=acks, approval=approval, admitted_at=admitted_at)
