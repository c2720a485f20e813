"""A VM group on the fake ZooKeeper (``tests.fakezk``): ``ZooKeeperStore`` instances over it, an operator's
commands through ``coordinator.control``, and what the group holds, read from the tree as it is.

``FakeGroup`` offers what tests observe and do from outside the agents:

* ``store(clock)``: a ``ZooKeeperStore`` of the group with its own ``Link`` (``links[store]``), to cut and
  restore, and the connection faults of a test (``GroupStore``: ``suspend``, ``resume``, ``partition``,
  ``heal``, ``expire_session``);
* ``pause``, ``resume``, ``drain``, ``undrain``: the operator's commands (``coordinator pause`` ...), run by
  ``coordinator.control`` over a client of their own; a command the product refuses (no group yet, a VM
  that never ran an agent) does nothing, as at the command line, and returns False;
* ``members``, ``leader``, ``events``, ``history``, ``out``, ``paused``, ``hand``, ``registry``, ``absent``:
  the nodes as the server holds them, parsed with the store's payload models, read without a session (no
  request is counted, no watch set);
* ``expire``, ``expire_silent``: the ensemble ends a session, now or once it has been silent long enough.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from coordinator import control
from coordinator.store.base import EventRecord, HandDrain, OutMark, Pause
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    DrainAdmittedNode,
    DrainNode,
    EventNode,
    LeaderNode,
    OutNode,
    PauseNode,
    PayloadError,
    RegistryNode,
)
from coordinator.store.zk_paths import ZooKeeperPaths, parse_history_name
from coordinator.store.zookeeper import ZooKeeperStore
from tests.fakezk import FakeEnsemble, Link

__all__ = ["FakeGroup", "GroupEvent", "GroupStore", "HandDrains", "Holder", "lone_store"]

HOSTS = "fake-zookeeper:2181"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Holder:
    """An ephemeral node's owner: ``/members/{vm}`` or ``/leader``."""

    vm: str
    session: int


@dataclass(frozen=True)
class GroupEvent:
    """An event's record as the tree holds it: the record (with its approval and admission), the VMs whose
    ack node exists, and its admission time (None: not admitted)."""

    record: EventRecord
    acks: dict[str, int] = field(default_factory=dict)  # vm -> the session owning its ack
    admitted: float | None = None


@dataclass(frozen=True)
class HandDrains:
    """``/drains`` and ``/drains-admitted``: the drains by hand, each with the admission that admits it."""

    drains: dict[str, HandDrain]
    stale: frozenset[str]

    def view(self) -> tuple[dict[str, HandDrain], frozenset[str]]:
        return self.drains, self.stale


class GroupStore(ZooKeeperStore):
    """A ``ZooKeeperStore`` of a ``FakeGroup``, with the connection faults a test injects:

    * ``suspend()`` / ``resume()``: the link is cut (SUSPENDED: the session and its ephemeral nodes live on,
      reads raise ``StoreUnavailable``, writes ``StoreUnknownOutcome``, ``approve`` refuses), then restored
      (CONNECTED on the same session, unless the ensemble expired it meanwhile);
    * ``partition()`` / ``heal()``: cut off while the ensemble expires the session (its ephemeral nodes
      vanish); ``start`` fails until ``heal``, after which the client, if started, learns that its session
      expired (LOST) and reconnects with a new one (CONNECTED), as kazoo does by itself;
    * ``expire_session()``: the ensemble ends the session now, and the link is up (restored if it was cut):
      the client goes LOST, then CONNECTED with a new session (through SUSPENDED if it was connected).
    """

    def __init__(self, group: FakeGroup, link: Link, clock: Callable[[], float]) -> None:
        super().__init__(HOSTS, group.root, group.cluster, session_timeout=group.session_timeout,
                         client_factory=link, clock=clock)
        self.cluster = group
        self.link = link

    def suspend(self) -> None:
        self.link.cut()

    def resume(self) -> None:
        self.link.restore()

    def partition(self) -> None:
        self.link.cut()
        self.cluster.expire(self)

    def heal(self) -> None:
        self.link.restore()

    def expire_session(self) -> None:
        self.cluster.expire(self)
        self.link.restore()


class FakeGroup:
    """One VM group, ``{root}/{cluster}``, on its own ``FakeEnsemble`` (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], *, root: str = "/coordinator", cluster: str = "group",
                 session_timeout: float = 30.0) -> None:
        self.ensemble = FakeEnsemble(clock)
        self.root, self.cluster = root, cluster
        self.paths = ZooKeeperPaths(f"{root}/{cluster}")
        self.session_timeout = session_timeout
        self.links: dict[int, Link] = {}  # id(store) -> its link
        self._seen: dict[str, tuple[int, object]] = {}  # what each observation made of the tree, by zxid
        self._operator = control.GroupAddress(HOSTS, root, cluster, client_factory=self.ensemble.link())

    @property
    def lock(self) -> threading.RLock:
        return self.ensemble.lock

    @property
    def granted_session(self) -> float | None:
        """The session timeout the ensemble grants (None: what each client asks for)."""
        return self.ensemble.granted_session

    @granted_session.setter
    def granted_session(self, seconds: float | None) -> None:
        self.ensemble.granted_session = seconds

    # -- stores ------------------------------------------------------------------------------------------

    def store(self, clock: Callable[[], float]) -> GroupStore:
        """A new, unstarted store of the group, with a link of its own."""
        store = GroupStore(self, self.ensemble.link(), clock)
        self.links[id(store)] = store.link
        return store

    def link(self, store: ZooKeeperStore) -> Link:
        return self.links[id(store)]

    def expire(self, store: ZooKeeperStore) -> None:
        """The ensemble ends the store's session (its client, if connected, reconnects with a new one)."""
        session = store.session_id
        if session is not None:
            self.ensemble.expire(session)

    def expire_silent(self, after: float) -> list[int]:
        """Expire the sessions whose client has been cut off and silent for ``after`` seconds."""
        now = self.ensemble.clock()
        with self.lock:
            due = [s.id for s in self.ensemble.sessions.values() if s.client is None and now - s.last_heard >= after]
        for session in due:
            self.ensemble.expire(session)
        return due

    # -- the operator's commands ---------------------------------------------------------------------------

    def pause(self, reason: str, by: str, at: float) -> bool:
        return self._command(lambda: control.pause(self._operator, reason, by=by, at=at))

    def resume(self) -> bool:
        return self._command(lambda: control.resume(self._operator))

    def drain(self, vm: str, reason: str, by: str, at: float) -> bool:
        return self._command(lambda: control.drain(self._operator, vm, reason, by=by, at=at))

    def undrain(self, vm: str) -> bool:
        return self._command(lambda: control.undrain(self._operator, vm))

    @staticmethod
    def _command(run: Callable[[], object]) -> bool:
        try:
            run()
        except control.ControlError:
            return False
        return True

    # -- what the tree holds -------------------------------------------------------------------------------

    def _observed(self, name: str, make: Callable[[], _T]) -> _T:
        """``make()``, made again only once the tree has changed (every write takes a new zxid)."""
        with self.lock:
            zxid = self.ensemble.zxid
            seen = self._seen.get(name)
            if seen is None or seen[0] != zxid:
                seen = (zxid, make())
                self._seen[name] = seen
            return cast("_T", seen[1])

    def _data(self, path: str) -> bytes | None:
        found = self.ensemble.get(path)
        return found[0] if found is not None else None

    def _holder(self, path: str, vm: str | None = None) -> Holder | None:
        found = self.ensemble.get(path)
        if found is None:
            return None
        data, stat = found
        if vm is None:
            try:
                vm = LeaderNode.from_bytes(data, path).vm
            except PayloadError:
                vm = "?"
        return Holder(vm, stat.ephemeralOwner)

    @property
    def members(self) -> dict[str, Holder]:
        return dict(self._observed("members", self._members))

    def _members(self) -> dict[str, Holder]:
        found = {vm: self._holder(self.paths.member(vm), vm) for vm in self.ensemble.children(self.paths.members)}
        return {vm: holder for vm, holder in found.items() if holder is not None}

    @property
    def member_names(self) -> frozenset[str]:
        return frozenset(self.ensemble.children(self.paths.members))

    @property
    def leader(self) -> Holder | None:
        return self._holder(self.paths.leader)

    @property
    def leader_name(self) -> str | None:
        leader = self.leader
        return leader.vm if leader is not None else None

    @property
    def registry(self) -> dict[str, float]:
        """``/registry``: every VM that ever joined, and when it was first seen."""
        return self._times(self.paths.registry, self.paths.registered,
                           lambda data, path: RegistryNode.from_bytes(data, path).first_seen)

    @property
    def absent(self) -> dict[str, float]:
        """``/absent``: the VMs the leader saw without an agent, and since when."""
        return self._times(self.paths.absent, self.paths.absent_vm,
                           lambda data, path: AbsentNode.from_bytes(data, path).since)

    def _times(self, parent: str, child: Callable[[str], str],
               parse: Callable[[bytes, str], float]) -> dict[str, float]:
        found: dict[str, float] = {}
        for vm in self.ensemble.children(parent):
            data = self._data(child(vm))
            with contextlib.suppress(PayloadError):
                if data is not None:
                    found[vm] = parse(data, child(vm))
        return found

    @property
    def paused(self) -> Pause | None:
        data = self._data(self.paths.pause)
        if data is None:
            return None
        try:
            node = PauseNode.from_bytes(data, self.paths.pause)
        except PayloadError:
            return Pause(reason="undecodable pause node", by="?", at=0.0)
        return Pause(reason=node.reason, by=node.by, at=node.at)

    @property
    def out(self) -> dict[str, OutMark]:
        marks: dict[str, OutMark] = {}
        for vm in self.ensemble.children(self.paths.out):
            data = self._data(self.paths.out_vm(vm))
            with contextlib.suppress(PayloadError):
                if data is not None:
                    node = OutNode.from_bytes(data, self.paths.out_vm(vm))
                    marks[vm] = OutMark(since=node.since, events=node.events)
        return marks

    @property
    def events(self) -> dict[str, GroupEvent]:
        return dict(self._observed("events", self._events))

    def _events(self) -> dict[str, GroupEvent]:
        found: dict[str, GroupEvent] = {}
        for event_id in self.ensemble.children(self.paths.events):
            with self.lock:
                event = self._event(event_id)
            if event is not None:
                found[event_id] = event
        return found

    def _event(self, event_id: str) -> GroupEvent | None:
        paths = self.paths
        read = self.ensemble.get(paths.event(event_id))
        if read is None:
            return None
        try:
            node = EventNode.from_bytes(read[0], paths.event(event_id))
        except PayloadError:
            return None
        acks: dict[str, int] = {}
        ack_times: dict[str, float | None] = {}
        for vm in self.ensemble.children(paths.acks(event_id)):
            ack = self.ensemble.get(paths.ack(event_id, vm))
            if ack is None:
                continue
            acks[vm] = ack[1].ephemeralOwner
            try:
                ack_times[vm] = AckNode.of_vm(ack[0], paths.ack(event_id, vm), vm).at
            except PayloadError:
                ack_times[vm] = None
        admitted_at: float | None = None
        admitted = self.ensemble.get(paths.admitted(event_id))
        if admitted is not None:
            admitted_at = AdmittedNode.or_created(admitted[0], paths.admitted(event_id), admitted[1]).at
        approval = node.approval.to_approval() if node.approval is not None else None
        record = node.to_record(event_id, acks=ack_times, approval=approval, admitted_at=admitted_at)
        return GroupEvent(record, acks, admitted_at)

    @property
    def history(self) -> dict[str, EventRecord]:
        """``/history``: the finished records moved out of ``/events``, by event id (the latest time it was
        done, for an event done more than once)."""
        return dict(self._observed("history", self._history))

    def _history(self) -> dict[str, EventRecord]:
        found: dict[str, EventRecord] = {}
        for name in self.ensemble.children(self.paths.history):
            parsed = parse_history_name(name)
            data = self._data(self.paths.history_entry(name))
            if parsed is None or data is None:
                continue
            try:
                node = EventNode.from_bytes(data, self.paths.history_entry(name))
            except PayloadError:
                continue
            approval = node.approval.to_approval() if node.approval is not None else None
            found[parsed[1]] = node.to_record(parsed[1], approval=approval,
                                              admitted_at=node.admitted.at if node.admitted is not None else None)
        return found

    @property
    def hand(self) -> HandDrains:
        return self._observed("hand", self._hand)

    def _hand(self) -> HandDrains:
        paths = self.paths
        drains: dict[str, HandDrain] = {}
        with self.lock:
            for vm in self.ensemble.children(paths.drains):
                read = self.ensemble.get(paths.drain(vm))
                if read is None:
                    continue
                data, stat = read
                try:
                    node = DrainNode.from_bytes(data, paths.drain(vm))
                    drains[vm] = HandDrain(reason=node.reason, by=node.by, at=node.at, asked=stat.czxid)
                except PayloadError:
                    drains[vm] = HandDrain(reason="undecodable drain node", by="?", at=stat.ctime / 1000.0,
                                           asked=stat.czxid)
            stale: set[str] = set()
            for vm in self.ensemble.children(paths.drains_admitted):
                data = self._data(paths.drain_admitted(vm))
                try:
                    admission = DrainAdmittedNode.from_bytes(data or b"", paths.drain_admitted(vm))
                except PayloadError:
                    stale.add(vm)
                    continue
                drain = drains.get(vm)
                if drain is not None and admission.drain == drain.asked:
                    drains[vm] = HandDrain(drain.reason, drain.by, drain.at, admission.by, admission.at, drain.asked)
                else:
                    stale.add(vm)
        return HandDrains(drains, frozenset(stale))


def lone_store(clock: Callable[[], float] = time.time) -> GroupStore:
    """A new, unstarted store of a group of its own (a new ``FakeGroup``): an agent alone in its group."""
    return FakeGroup(clock).store(clock)
