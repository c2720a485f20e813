"""An in-process coordination store with the same contract as the ZooKeeper one.

A ``MemoryCluster`` plays the ensemble: it holds the members, the leader and the event records, and
several ``MemoryStore`` instances (one per simulated agent) attach to it, each with its own session.
Ephemeral nodes (member, leader, acks) belong to a session and vanish with it.

Test controls on ``MemoryStore``:

* ``expire_session()``: the session ends (its ephemeral nodes vanish), the state goes LOST, then a new
  session starts and the state goes CONNECTED, as kazoo does after a server-side expiry;
* ``suspend()`` / ``resume()``: the connection is SUSPENDED (the session and its nodes stay): reads raise
  ``StoreUnavailable``, writes raise ``StoreUnknownOutcome`` and ``approve`` refuses;
* ``partition()`` / ``heal()``: cut off from the ensemble for good: SUSPENDED, and the ensemble expires the
  session (its ephemeral nodes vanish); ``start`` fails until ``heal``, after which the store is LOST
  and the next ``start`` opens a new session.

Wakeup callbacks are called after the cluster lock is released, from the thread that made the change.

Every method runs under the cluster's one lock, so writes cannot interleave: ``mark_done`` drops the
admission and approval it sees (keeping what they held in ``closed``), and ``admit`` and ``approve`` see a
record marked done, atomically (the ZooKeeper store uses versioned transactions: ``zk_records``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace

from coordinator.errors import DuplicateMember, StoreUnavailable, StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import (
    Approval,
    ApprovalOutcome,
    ApprovalResult,
    Closed,
    ClusterView,
    ConnectionState,
    EventRecord,
    OutMark,
    Part,
    Pause,
    Vouch,
    Wakeup,
    WriteResult,
    cut_view,
)
from coordinator.store.gate import AckFact, GateFacts, refusal, vouched_refusal
from coordinator.store.members import duplicate_member, predecessor
from coordinator.store.memory_drains import HandDrains
from coordinator.store.memory_nodes import _Event, _Leader, _Member, archive, purge

__all__ = ["MemoryCluster", "MemoryStore"]

log = logging.getLogger(__name__)


class MemoryCluster:
    """The shared state that ``MemoryStore`` instances attach to: one per simulated VM group."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._sessions = itertools.count(1)
        self.members: dict[str, _Member] = {}
        self.registry: dict[str, float] = {}  # VM name -> first seen
        self.absent: dict[str, float] = {}  # VM name -> since (the leader's observation)
        self.leader: _Leader | None = None
        self.events: dict[str, _Event] = {}
        self.out: dict[str, OutMark] = {}
        self.history: dict[str, EventRecord] = {}  # ``/history``: finished records moved out of the events
        self.paused: Pause | None = None  # ``/pause``: set by ``pause`` / ``resume`` (an operator's command)
        self.hand = HandDrains()  # ``/drains``, ``/drains-admitted``: set by ``drain`` / ``undrain`` (likewise)
        # The session timeout the "ensemble" grants (None: what was asked, which the store does not know).
        self.granted_session: float | None = None
        self._stores: list[MemoryStore] = []

    def new_session(self) -> int:
        with self.lock:
            return next(self._sessions)

    def attach(self, store: MemoryStore) -> None:
        with self.lock:
            if store not in self._stores:
                self._stores.append(store)

    def detach(self, store: MemoryStore) -> None:
        with self.lock:
            if store in self._stores:
                self._stores.remove(store)

    def drop_session(self, session: int) -> None:
        """Delete the ephemeral nodes of ``session`` (call with the lock held)."""
        for vm in [vm for vm, member in self.members.items() if member.session == session]:
            del self.members[vm]
        if self.leader is not None and self.leader.session == session:
            self.leader = None
        for event in self.events.values():
            for vm in [vm for vm, (_, owner) in event.acks.items() if owner == session]:
                del event.acks[vm]

    def changed(self) -> None:
        """Wake every attached store up. Call without holding the lock."""
        with self.lock:
            stores = list(self._stores)
        for store in stores:
            store.notify()

    # What the operators' commands do to the ZooKeeper store: ``coordinator pause`` stops early approvals
    # group-wide, ``resume`` lifts it; ``drain VM`` asks for a drain by hand (not admitted yet), ``undrain``.
    def pause(self, reason: str, by: str, at: float) -> None:
        self._operator(lambda: setattr(self, "paused", Pause(reason=reason, by=by, at=at)))

    def resume(self) -> None:
        self._operator(lambda: setattr(self, "paused", None))

    def drain(self, vm: str, reason: str, by: str, at: float) -> None:
        self._operator(lambda: self.hand.ask(vm, reason, by, at))

    def undrain(self, vm: str) -> None:
        self._operator(lambda: self.hand.undo(vm))

    def _operator(self, change: Callable[[], object]) -> None:
        with self.lock:
            change()
        self.changed()

    # Convenience for tests.
    @property
    def member_names(self) -> frozenset[str]:
        with self.lock:
            return frozenset(self.members)

    @property
    def leader_name(self) -> str | None:
        with self.lock:
            return self.leader.vm if self.leader is not None else None


class MemoryStore:
    """``Store`` backed by a ``MemoryCluster``. Thread-safe."""

    def __init__(self, cluster: MemoryCluster, *, clock: Callable[[], float] = time.time) -> None:
        self._cluster = cluster
        self._clock = clock
        self._session: int | None = None
        self._state = ConnectionState.LOST
        self._wakeup = Wakeup()
        self._partitioned = False
        self._joined_sessions: set[int] = set()  # the sessions in which this store joined
        self._predecessors: set[int] = set()  # sessions of this VM's previous agent, replaced by ``join``
        self._duplicate: DuplicateMember | None = None

    # -- life cycle, signalling, test controls --------------------------------------------------------

    @property
    def cluster(self) -> MemoryCluster:
        return self._cluster

    @property
    def session_id(self) -> int | None:
        return self._session if self._state is ConnectionState.CONNECTED else None

    @property
    def duplicate(self) -> DuplicateMember | None:
        """The refusal of the last ``join`` (another agent runs with this VM's name), until a ``join``
        succeeds; None otherwise."""
        return self._duplicate

    def start(self) -> None:
        if self._partitioned:
            raise StoreUnavailable("cannot reach the ensemble")
        with self._cluster.lock:
            if self._session is not None:
                return
            self._session = self._cluster.new_session()
            self._cluster.attach(self)
        self._set_state(ConnectionState.CONNECTED)

    def stop(self) -> None:
        with self._cluster.lock:
            session, self._session = self._session, None
            if session is None:
                return
            self._cluster.drop_session(session)
            self._state = ConnectionState.LOST
            self._cluster.detach(self)
        self._cluster.changed()

    def expire_session(self) -> None:
        """End the session (its ephemeral nodes vanish): LOST, then CONNECTED with a new session."""
        with self._cluster.lock:
            if self._session is None:
                raise RuntimeError("the store is not started")
            self._cluster.drop_session(self._session)
            self._session = None
        self._set_state(ConnectionState.LOST)
        self._cluster.changed()
        with self._cluster.lock:
            self._session = self._cluster.new_session()
        self._set_state(ConnectionState.CONNECTED)

    def partition(self) -> None:
        """Cut off from the ensemble, which then expires the session: SUSPENDED here, nodes gone there."""
        with self._cluster.lock:
            if self._session is not None:
                self._cluster.drop_session(self._session)
            self._partitioned = True
        self._set_state(ConnectionState.SUSPENDED)
        self._cluster.changed()

    def heal(self) -> None:
        """Reachable again: the client learns that its session expired (LOST); ``start`` reconnects."""
        with self._cluster.lock:
            self._partitioned = False
            self._session = None
        self._set_state(ConnectionState.LOST)

    def suspend(self) -> None:
        """Lose the connection but keep the session: SUSPENDED."""
        if self._session is None:
            raise RuntimeError("the store is not started")
        self._set_state(ConnectionState.SUSPENDED)

    def resume(self) -> None:
        """Reconnect to the same session after ``suspend``: CONNECTED."""
        if self._session is None:
            raise RuntimeError("the store is not started")
        self._set_state(ConnectionState.CONNECTED)

    @property
    def connection_state(self) -> ConnectionState:
        return self._state

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._wakeup.set(callback)

    def notify(self) -> None:
        self._wakeup.fire()

    def _set_state(self, state: ConnectionState) -> None:
        self._state = state
        self.notify()

    def _session_for(self, *, write: bool) -> int:
        session = self._session
        if session is None or self._state is not ConnectionState.CONNECTED:
            state = self._state.value if session is not None else "not started"
            if write:
                raise StoreUnknownOutcome(f"store connection {state}: write not attempted")
            raise StoreUnavailable(f"store connection {state}")
        return session

    # -- membership and leadership --------------------------------------------------------------------

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        """See ``Store.join``: a live member node of another session is replaced only when it provably
        belongs to this VM's previous agent process (``coordinator.store.members``) or to an earlier
        session of this store; else ``DuplicateMember`` (and this session gives up ``/leader``)."""
        vm = normalize_vm_name(vm)
        refused: DuplicateMember | None = None
        with self._cluster.lock:
            session = self._session_for(write=True)
            member = self._cluster.members.get(vm)
            reason = None
            if member is not None and member.session != session:
                reason = ("an earlier session of this agent" if member.session in self._joined_sessions
                          else predecessor(member.info, {**info, "vm": vm}))
            if member is not None and member.session == session:
                result, changed = WriteResult.EXISTS, False
            elif member is not None and reason is None:
                refused = self._duplicate = duplicate_member(vm, member.session, member.info, member.since)
                leader = self._cluster.leader
                changed = leader is not None and leader.session == session
                if changed:
                    self._cluster.leader = None  # a duplicate does not lead
            else:
                if member is not None:
                    log.warning("member node of %s belongs to session %d, not ours (%d), %s: replacing it",
                                vm, member.session, session, reason)
                    self._predecessors.add(member.session)
                self._cluster.members[vm] = _Member(session, {**info, "vm": vm}, self._clock())
                result, changed = WriteResult.DONE, True
            if refused is None:
                changed = vm not in self._cluster.registry or changed
                self._cluster.registry.setdefault(vm, self._clock())
                self._joined_sessions.add(session)
                self._duplicate = None
        if changed:
            self._cluster.changed()
        if refused is not None:
            raise refused
        return result

    def campaign(self, vm: str) -> bool:
        """See ``Store.campaign``; raises the standing ``DuplicateMember`` while ``join`` is refused."""
        vm = normalize_vm_name(vm)
        duplicate = self._duplicate
        if duplicate is not None and duplicate.vm == vm:
            raise duplicate.again()
        with self._cluster.lock:
            session = self._session_for(write=False)
            leader = self._cluster.leader
            if (leader is not None and leader.session != session
                    and (leader.session in self._joined_sessions or leader.session in self._predecessors)):
                # Held by this VM's previous agent process, which is gone: taken back (as the ZooKeeper store).
                log.warning("%s takes back leadership from session %d, its previous agent's, which is gone",
                            vm, leader.session)
                leader = None
            if leader is not None:
                return leader.session == session
            self._cluster.leader = _Leader(vm, session, self._clock())
        self._cluster.changed()
        return True

    # -- reads ----------------------------------------------------------------------------------------

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        view = self._read_view(vm := normalize_vm_name(vm))
        return cut_view(view, vm, part)

    def _read_view(self, vm: str) -> ClusterView:
        with self._cluster.lock:
            session = self._session_for(write=False)
            leader = self._cluster.leader
            records = {
                event_id: replace(
                    event.record,
                    acks={name: at for name, (at, _) in event.acks.items()},
                    approval=event.approval,
                    admitted_at=event.admitted[1] if event.admitted is not None else None,
                )
                for event_id, event in self._cluster.events.items()
            }
            members = frozenset(self._cluster.members)
            drains, stale = self._cluster.hand.view()
            duplicate = self._duplicate
            if duplicate is not None and duplicate.vm == vm:
                members -= {vm}  # the node under its name is another agent's
            return ClusterView(
                members=members,
                leader=leader.vm if leader is not None else None,
                i_am_leader=leader is not None and leader.session == session and leader.vm == vm,
                records=records,
                connection=self._state,
                known=frozenset(self._cluster.registry),
                absent_since=dict(self._cluster.absent),
                out=dict(self._cluster.out),
                paused=self._cluster.paused,
                drains=drains,
                stale_admissions=stale,
            )

    def read_pause(self) -> Pause | None:
        with self._cluster.lock:
            self._session_for(write=False)
            return self._cluster.paused

    @property
    def granted_session_timeout(self) -> float | None:
        return self._cluster.granted_session

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        with self._cluster.lock:
            self._session_for(write=False)
            wanted = {normalize_vm_name(vm) for vm in vms}
            return {vm: dict(m.info) for vm, m in self._cluster.members.items() if vm in wanted}

    # -- writes ---------------------------------------------------------------------------------------

    def publish_event(self, record: EventRecord) -> WriteResult:
        event_id = normalize_event_id(record.event_id)
        published_by = normalize_vm_name(record.published_by)
        with self._cluster.lock:
            self._session_for(write=True)
            if event_id in self._cluster.events:
                return WriteResult.EXISTS
            self._cluster.events[event_id] = _Event(
                replace(record, event_id=event_id, published_by=published_by, acks={}, approval=None, admitted_at=None,
                        started_at=None, closed=None)
            )
        self._cluster.changed()
        return WriteResult.DONE

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            session = self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None:
                return WriteResult.MISSING
            if vm in event.acks:
                return WriteResult.EXISTS
            event.acks[vm] = (at, session)
        self._cluster.changed()
        return WriteResult.DONE

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None or vm not in event.acks:
                return WriteResult.MISSING
            del event.acks[vm]
        self._cluster.changed()
        return WriteResult.DONE

    def approve_vouched(self, event_id: str, by: str, required: Collection[str], vouched: Collection[str], *,
                        reason: str, at: float) -> ApprovalResult:
        return self.approve(event_id, by, required, as_leader=False, at=at,
                            vouched=frozenset(normalize_vm_name(name) for name in vouched), reason=reason)

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
        admission: bool = False, vouched: frozenset[str] | None = None, reason: str | None = None,
    ) -> ApprovalResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm) if vouched is None else vm  # vouched: an operator's approval, ``vm`` is them
        needed = {normalize_vm_name(name) for name in required}
        duplicate = self._duplicate
        if duplicate is not None:
            return _refused(str(duplicate))
        with self._cluster.lock:
            try:
                session = self._session_for(write=True)
            except StoreUnknownOutcome as exc:
                return ApprovalResult(ApprovalOutcome.REFUSED, reason=str(exc))
            cluster = self._cluster
            leader, member = cluster.leader, cluster.members.get(vm)
            owner = (leader.session if leader is not None else None) if as_leader else (
                member.session if member is not None else None)
            event = cluster.events.get(event_id)
            record = None if event is not None and event.record.done_at is None else (
                "missing" if event is None else "done")
            acks = {} if event is None else {
                name: AckFact(ack_session, holder.session if (holder := cluster.members.get(name)) else None,
                              at=acked_at)
                for name, (acked_at, ack_session) in event.acks.items() if name in needed}
            facts = GateFacts(event_id, vm, as_leader, session, "/leader" if as_leader else f"/members/{vm}", owner,
                              leader.vm if as_leader and leader is not None else None, cluster.paused is not None,
                              record, (event is not None and event.admitted is not None) if admission else None,
                              frozenset(needed), acks)
            named = frozenset(event.record.resources) if event is not None else None
            unaccounted = sorted(named - vouched - needed) if named is not None and vouched is not None else []
            refused = refusal(facts) if vouched is None else vouched_refusal(
                facts, {name: m.session if (m := cluster.members.get(name)) else None for name in vouched}, named) or (
                f"event {event_id} names {', '.join(unaccounted)}, neither acknowledged nor vouched for"
                if unaccounted else None)
            if refused is not None:
                return _refused(refused)
            assert event is not None  # a record that exists: refused above otherwise
            if event.approval is not None:
                return ApprovalResult(ApprovalOutcome.APPROVED, reason="approved before", record=event.approval)
            word = event.record.vouched  # an operator's word the group approves on, kept with the approval
            event.approval = Approval(by=vm, at=at, as_leader=as_leader, acks=tuple(sorted(acks)),
                                      acked_at={name: fact.at for name, fact in acks.items() if fact.at is not None},
                                      vouched=tuple(sorted(vouched)) if vouched is not None else
                                      word.vms if word is not None else None,
                                      reason=reason if vouched is not None else word.reason if word else None,
                                      vouched_by=vm if vouched is not None else word.by if word else None)
            result = ApprovalResult(ApprovalOutcome.APPROVED, record=event.approval)
        self._cluster.changed()
        return result

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None or event.record.done_at is not None:
                return WriteResult.MISSING  # a record marked done is admitted no more
            if event.admitted is not None:
                return WriteResult.EXISTS
            event.admitted = (vm, at)
        self._cluster.changed()
        return WriteResult.DONE

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            if vm in self._cluster.absent:
                return WriteResult.EXISTS
            self._cluster.absent[vm] = at
        self._cluster.changed()
        return WriteResult.DONE

    def clear_absent(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            if self._cluster.absent.pop(vm, None) is None:
                return WriteResult.MISSING
        self._cluster.changed()
        return WriteResult.DONE

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        event_id = normalize_event_id(event_id)
        with self._cluster.lock:
            self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None:
                return WriteResult.MISSING
            if event.record.done_at is not None:
                return WriteResult.EXISTS
            admitted_by, admitted_at = event.admitted if event.admitted is not None else (None, None)
            closed = Closed(admitted_at=admitted_at, admitted_by=admitted_by, approval=event.approval)
            event.record = replace(event.record, done_at=at, started_at=started_at, closed=closed, vouched=None)
            event.admitted = None
            event.approval = None
        self._cluster.changed()
        return WriteResult.DONE

    def reopen(self, event_id: str) -> WriteResult:
        event_id = normalize_event_id(event_id)
        with self._cluster.lock:
            self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None:
                return WriteResult.MISSING
            if event.record.done_at is None:
                return WriteResult.EXISTS
            event.record = replace(event.record, done_at=None, started_at=None, closed=None)
        self._cluster.changed()
        return WriteResult.DONE

    def vouch(self, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
        event_id = normalize_event_id(event_id)
        word = Vouch(by=by, at=at, reason=reason, vms=tuple(sorted(normalize_vm_name(vm) for vm in vms)))
        with self._cluster.lock:
            self._session_for(write=True)
            event = self._cluster.events.get(event_id)
            if event is None or event.record.done_at is not None:
                return WriteResult.MISSING
            if event.record.vouched is not None:
                return WriteResult.EXISTS
            event.record = replace(event.record, vouched=word)
        self._cluster.changed()
        return WriteResult.DONE

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            mark = self._cluster.out.get(vm)
            if mark is not None and mark.events == tuple(events):
                return WriteResult.EXISTS
            self._cluster.out[vm] = OutMark(since=mark.since if mark is not None else at, events=tuple(events))
        self._cluster.changed()
        return WriteResult.DONE

    def clear_out(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        with self._cluster.lock:
            self._session_for(write=True)
            if self._cluster.out.pop(vm, None) is None:
                return WriteResult.MISSING
        self._cluster.changed()
        return WriteResult.DONE

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        return self._hand_write(lambda: self._cluster.hand.admit(vm, asked, by, at))

    def forget_drain_admission(self, vm: str) -> WriteResult:
        return self._hand_write(lambda: self._cluster.hand.forget(vm))

    def _hand_write(self, write: Callable[[], WriteResult]) -> WriteResult:
        with self._cluster.lock:
            self._session_for(write=True)
            result = write()
        if result is WriteResult.DONE:
            self._cluster.changed()
        return result

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        with self._cluster.lock:
            self._session_for(write=True)
            moved = archive(self._cluster.events, self._cluster.history, event_ids, older_than)
        return self._changed(moved)

    def purge_done(self, older_than: float) -> int:
        with self._cluster.lock:
            self._session_for(write=True)
            purged = purge(self._cluster.events, older_than)
        return self._changed(purged)

    def _changed(self, count: int) -> int:
        if count:
            self._cluster.changed()
        return count


def _refused(reason: str) -> ApprovalResult:
    return ApprovalResult(ApprovalOutcome.REFUSED, reason=reason)
