"""The coordination store on ZooKeeper, through kazoo.

Layout: see ``coordinator.store.base``. Every path lives under ``{root}/{cluster}`` so that one ensemble
serves many VM groups (``coordinator.store.zk_paths``). The prefix is added by the store rather than by
a ZooKeeper chroot in the connection string, so that the store can create its own base path on first
start (a chroot cannot be created through a client that is chrooted into it).

The modules behind it:

* ``coordinator.store.zk_session``: the kazoo client, its options (auth, TLS), and the timing and failure
  rules every method follows: one deadline of ``operation_timeout`` per method, nothing sent unless
  CONNECTED, a failed write is an unknown outcome, a quiet period after an unanswered request;
* ``coordinator.store.zk_view``: ``read_view``, and what a read does with nodes that do not parse;
* ``coordinator.store.payloads``: the node data (UTF-8 JSON, one pydantic model per node kind).

Node data that does not parse, in the writes of this module: the leader node read by ``approve`` counts as
held by nobody (REFUSED); an existing approval record read by ``approve``, or the record read by
``mark_done``, raises ``StoreUnknownOutcome``; ``purge_done`` leaves the record, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.errors import ConfigError, StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import (
    Approval,
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    WriteResult,
)
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    ApprovalNode,
    EventNode,
    LeaderNode,
    MemberNode,
    OutNode,
    PayloadError,
    RegistryNode,
)
from coordinator.store.zk_paths import ZooKeeperPaths, validate_cluster, validate_root
from coordinator.store.zk_session import (
    ClientFactory,
    ClientOptions,
    Deadline,
    TlsOptions,
    ZooKeeperSession,
    default_client_factory,
)
from coordinator.store.zk_view import read_member_info, read_view

__all__ = [
    "ClientFactory",
    "ClientOptions",
    "TlsOptions",
    "ZooKeeperStore",
    "default_client_factory",
]

log = logging.getLogger(__name__)


class ZooKeeperStore:
    """``Store`` on a ZooKeeper ensemble. See ``coordinator.store.zk_session`` for the timing rules.

    ``session_timeout`` is what the client asks for (the server may lower it to its
    ``maxSessionTimeout``); ``operation_timeout`` bounds every method, including ``start``.
    ``client_factory`` builds the kazoo client (tests inject their own); ``clock`` gives the wall-clock
    time written into ``/leader`` and ``/registry/{vm}``.
    """

    def __init__(
        self,
        hosts: str,
        root: str,
        cluster: str,
        *,
        session_timeout: float = 10.0,
        operation_timeout: float = 5.0,
        client_factory: ClientFactory = default_client_factory,
        auth_data: Collection[tuple[str, str]] = (),
        tls: TlsOptions | None = None,
        clock: Callable[[], float] = time.time,
        create_layout: bool = True,
    ) -> None:
        if "/" in hosts:
            raise ConfigError(
                f"zookeeper hosts {hosts!r} must not carry a chroot: the store's paths come from root and cluster"
            )
        if session_timeout <= 0 or operation_timeout <= 0:
            raise ConfigError("session_timeout and operation_timeout must be positive")
        self._paths = ZooKeeperPaths(f"{validate_root(root)}/{validate_cluster(cluster)}")
        options = ClientOptions(hosts=hosts, session_timeout=session_timeout, auth_data=tuple(auth_data), tls=tls)
        self._session = ZooKeeperSession(options, operation_timeout, client_factory)
        self._clock = clock
        self._create_layout = create_layout  # False for an observer that must write nothing (dry run)

    # -- introspection ------------------------------------------------------------------------------

    @property
    def base_path(self) -> str:
        """``{root}/{cluster}``: where this store's nodes live."""
        return self._paths.base

    @property
    def operation_timeout(self) -> float:
        return self._session.operation_timeout

    @property
    def client(self) -> KazooClient | None:
        """The kazoo client of the current connection (for diagnostics and tests), or None."""
        return self._session.client

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or None while not connected."""
        return self._session.session_id

    # -- life cycle and signalling --------------------------------------------------------------------

    def start(self) -> None:
        """Connect and create the base layout, within ``operation_timeout``. Raises ``StoreUnavailable``.
        Calling it again while started does nothing (kazoo reconnects by itself after a loss)."""
        if self._session.client is not None:
            return
        deadline = self._session.deadline()
        client = self._session.connect(deadline)
        try:
            with self._session.reading("create the base layout"):
                self._ensure_layout(client, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("connected to ZooKeeper %s, base path %s", self._session.options.hosts, self._paths.base)

    def stop(self) -> None:
        """Close the session (its ephemeral nodes vanish). Bounded by ``operation_timeout``; never raises."""
        self._session.close()

    @property
    def connection_state(self) -> ConnectionState:
        """kazoo's state, except SUSPENDED during the quiet period that follows an unanswered request."""
        return self._session.connection_state

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._session.set_wakeup(callback)

    def _ensure_layout(self, client: KazooClient, deadline: Deadline) -> None:
        if not self._create_layout:
            return
        for result in [client.ensure_path_async(path) for path in self._paths.layout()]:
            self._session.wait(result, deadline)

    # -- membership and leadership --------------------------------------------------------------------

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, session = self._session.connected(write=True)
        deadline = self._session.deadline()
        data = MemberNode.of(vm, info).to_bytes()
        with self._session.writing(f"join as {vm}"):
            result = self._join_members(client, session, vm, data, deadline)
            self._register(client, vm, deadline)
        return result

    def _join_members(self, client: KazooClient, session: int, vm: str, data: bytes, deadline: Deadline) -> WriteResult:
        path = self._paths.member(vm)
        wait = self._session.wait
        for _ in range(3):
            try:
                wait(client.create_async(path, data, ephemeral=True), deadline)
                log.info("joined as %s (session 0x%x)", vm, session)
                return WriteResult.DONE
            except NoNodeError:
                self._ensure_layout(client, deadline)
                continue
            except NodeExistsError:
                pass
            stat = wait(client.exists_async(path), deadline)
            if stat is None:
                continue  # vanished in between: create again
            if stat.ephemeralOwner == session:
                return WriteResult.EXISTS
            # Left by an older session of this VM (agent restart before the old session expired):
            # replace it, deleting exactly the version seen so that a newer node is never removed.
            log.warning(
                "member node of %s belongs to session 0x%x, not ours (0x%x): replacing it",
                vm,
                stat.ephemeralOwner,
                session,
            )
            with contextlib.suppress(NoNodeError, BadVersionError):
                wait(client.delete_async(path, version=stat.version), deadline)
        raise StoreUnknownOutcome(f"member node of {vm} keeps being taken by another session")

    def _register(self, client: KazooClient, vm: str, deadline: Deadline) -> None:
        """Make sure ``/registry/{vm}`` exists; a read when it does (the usual case), a write once."""
        path = self._paths.registered(vm)
        if self._session.wait(client.exists_async(path), deadline) is not None:
            return
        data = RegistryNode(vm=vm, first_seen=self._clock()).to_bytes()
        for _ in range(2):
            try:
                self._session.wait(client.create_async(path, data), deadline)
                log.info("registered %s", vm)
                return
            except NodeExistsError:
                return
            except NoNodeError:
                self._ensure_layout(client, deadline)
        raise StoreUnknownOutcome(f"{self._paths.registry} keeps disappearing")

    def campaign(self, vm: str) -> bool:
        vm = normalize_vm_name(vm)
        client, session = self._session.connected(write=False)
        deadline = self._session.deadline()
        data = LeaderNode(vm=vm, since=self._clock()).to_bytes()
        with self._session.reading(f"campaign as {vm}"):
            for _ in range(2):
                try:
                    self._session.wait(client.create_async(self._paths.leader, data, ephemeral=True), deadline)
                    log.info("%s is the leader now (session 0x%x)", vm, session)
                    return True
                except NodeExistsError:
                    pass
                stat = self._session.wait(client.exists_async(self._paths.leader), deadline)
                if stat is not None:
                    return stat.ephemeralOwner == session
        return False

    # -- reads ----------------------------------------------------------------------------------------

    def read_view(self, vm: str) -> ClusterView:
        """See ``coordinator.store.zk_view.read_view``."""
        return read_view(self._session, self._paths, normalize_vm_name(vm))

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        """See ``coordinator.store.zk_view.read_member_info``."""
        return read_member_info(self._session, self._paths, [normalize_vm_name(vm) for vm in vms])

    # -- writes ---------------------------------------------------------------------------------------

    def publish_event(self, record: EventRecord) -> WriteResult:
        """Create ``/events/{EVENT_ID}`` and its ``acks`` node atomically. The record's ``acks``,
        ``approval`` and ``admitted_at`` are not written (they have their own methods)."""
        event_id = normalize_event_id(record.event_id)
        published_by = normalize_vm_name(record.published_by)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        data = EventNode.of(
            EventRecord(
                event_id=event_id,
                event_type=record.event_type,
                resources=record.resources,
                not_before=record.not_before,
                published_by=published_by,
                published_at=record.published_at,
                done_at=record.done_at,
            )
        ).to_bytes()
        with self._session.writing(f"publish event {event_id}"):
            for _ in range(2):
                transaction = client.transaction()
                transaction.create(self._paths.event(event_id), data)
                transaction.create(self._paths.acks(event_id), b"")
                results = self._session.wait(transaction.commit_async(), deadline)
                first = results[0] if results else None
                if isinstance(first, NodeExistsError):
                    return WriteResult.EXISTS
                if isinstance(first, NoNodeError):
                    self._ensure_layout(client, deadline)
                    continue
                failure = next((r for r in results if isinstance(r, BaseException)), None)
                if failure is not None:
                    raise failure
                log.info("event %s: published by %s", event_id, published_by)
                return WriteResult.DONE
        return WriteResult.MISSING

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        data = AckNode(vm=vm, at=at).to_bytes()
        with self._session.writing(f"event {event_id}: acknowledge for {vm}"):
            try:
                # Ephemeral: the ack stands only as long as the session of the agent that drained.
                self._session.wait(client.create_async(self._paths.ack(event_id, vm), data, ephemeral=True), deadline)
            except NodeExistsError:
                return WriteResult.EXISTS
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        with self._session.writing(f"event {event_id}: withdraw the ack of {vm}"):
            try:
                self._session.wait(client.delete_async(self._paths.ack(event_id, vm)), deadline)
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
        admission: bool = False,
    ) -> ApprovalResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        needed = {normalize_vm_name(name) for name in required}

        # 1. The connection is CONNECTED (SUSPENDED may mean that our session, and leadership, are gone).
        try:
            client, session = self._session.connected(write=True)
        except StoreUnknownOutcome as exc:
            return ApprovalResult(ApprovalOutcome.REFUSED, reason=str(exc))
        deadline = self._session.deadline()
        paths = self._paths
        wait = self._session.wait
        with self._session.writing(f"event {event_id}: approve as {vm}"):
            # 2. A synced read: the server we talk to has caught up with the ensemble's leader, so a
            # node deleted elsewhere (an expired leader) is not still seen here.
            wait(client.sync_async(paths.base), deadline)
            owner_path = paths.leader if as_leader else paths.member(vm)
            try:
                data, stat = wait(client.get_async(owner_path), deadline)
            except NoNodeError:
                return _refused(
                    f"{owner_path} does not exist: this agent is not the leader"
                    if as_leader
                    else f"{owner_path} does not exist: this agent is not a member"
                )
            if stat.ephemeralOwner != session:
                return _refused(f"{owner_path} belongs to session 0x{stat.ephemeralOwner:x}, not ours (0x{session:x})")
            if as_leader:
                try:
                    holder: str | None = LeaderNode.from_bytes(data, owner_path).vm
                except PayloadError as exc:
                    log.warning("undecodable leader node, held by nobody: %s", exc)
                    holder = None
                if holder != vm:
                    return _refused(f"{owner_path} is held by this session for {holder!r}, not {vm!r}")

            # 3. The record is not done (a returning event is reopened first), it is admitted if it must
            # be, and every required VM has acknowledged.
            try:
                record_data, _ = wait(client.get_async(paths.event(event_id)), deadline)
                done_at = EventNode.from_bytes(record_data, paths.event(event_id)).done_at
            except NoNodeError:
                return _refused(f"event {event_id} has no record in the store")
            except PayloadError as exc:
                return _refused(f"event {event_id}: undecodable record: {exc}")
            if done_at is not None:
                return _refused(f"event {event_id} is marked done")
            if admission and wait(client.exists_async(paths.admitted(event_id)), deadline) is None:
                return _refused(f"event {event_id} is not admitted")
            try:
                ack_names: list[str] = wait(client.get_children_async(paths.acks(event_id)), deadline)
            except NoNodeError:
                return _refused(f"event {event_id} has no record in the store")
            missing = sorted(needed - set(ack_names))
            if missing:
                return _refused(f"event {event_id}: no ack yet from {', '.join(missing)}")

            # 4. Nothing changed locally meanwhile, then write the approval once (or find it).
            client_id = client.client_id
            if self.connection_state is not ConnectionState.CONNECTED or client_id is None or client_id[0] != session:
                return _refused("the ZooKeeper session changed during the checks")
            approval = Approval(by=vm, at=at, as_leader=as_leader)
            try:
                wait(client.create_async(paths.approval(event_id), ApprovalNode.of(approval).to_bytes()), deadline)
                log.info("event %s: approval recorded by %s (as leader: %s)", event_id, vm, as_leader)
                return ApprovalResult(ApprovalOutcome.APPROVED, record=approval)
            except NoNodeError:
                return _refused(f"event {event_id} has no record in the store")
            except NodeExistsError:
                pass
            data, _ = wait(client.get_async(paths.approval(event_id)), deadline)
        try:
            existing = ApprovalNode.from_bytes(data, paths.approval(event_id)).to_approval()
        except PayloadError as exc:
            raise StoreUnknownOutcome(f"event {event_id}: undecodable approval record: {exc}") from exc
        return ApprovalResult(ApprovalOutcome.APPROVED, reason="approved before", record=existing)

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        """Create ``admitted`` under the event, once. The store does not check that ``vm`` leads."""
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        data = AdmittedNode(by=vm, at=at).to_bytes()
        with self._session.writing(f"event {event_id}: admit (by {vm})"):
            try:
                self._session.wait(client.create_async(self._paths.admitted(event_id), data), deadline)
            except NodeExistsError:
                return WriteResult.EXISTS
            except NoNodeError:
                return WriteResult.MISSING
        log.info("event %s: admitted by %s", event_id, vm)
        return WriteResult.DONE

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        data = AbsentNode(since=at).to_bytes()
        with self._session.writing(f"mark {vm} absent"):
            for _ in range(2):
                try:
                    self._session.wait(client.create_async(self._paths.absent_vm(vm), data), deadline)
                    return WriteResult.DONE
                except NodeExistsError:
                    return WriteResult.EXISTS
                except NoNodeError:
                    self._ensure_layout(client, deadline)
        raise StoreUnknownOutcome(f"{self._paths.absent} keeps disappearing")

    def clear_absent(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        with self._session.writing(f"clear the absence of {vm}"):
            try:
                self._session.wait(client.delete_async(self._paths.absent_vm(vm)), deadline)
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def mark_done(self, event_id: str, at: float) -> WriteResult:
        """Set ``done_at``, and delete ``admitted`` and ``approval``, in one versioned transaction: an
        event that comes back (a flap, a reused EventId) inherits neither. Every other field of the
        record is kept (including fields unknown to this version)."""
        return self._set_done(event_id, at, drop=("admitted", "approval"))

    def reopen(self, event_id: str) -> WriteResult:
        """Clear ``done_at`` with a versioned write, keeping every other field of the record."""
        return self._set_done(event_id, None, drop=())

    def _set_done(self, event_id: str, done_at: float | None, *, drop: tuple[str, ...]) -> WriteResult:
        """Rewrite the record's ``done_at`` (EXISTS if it already is set, or clear, as asked) and delete the
        children named in ``drop``, in one transaction, versioned so that a concurrent writer is never
        overwritten: re-read and decide again. Raises ``StoreUnknownOutcome`` if the record does not parse."""
        event_id = normalize_event_id(event_id)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        path = self._paths.event(event_id)
        with self._session.writing(f"event {event_id}: {'reopen' if done_at is None else 'mark done'}"):
            for _ in range(3):
                try:
                    data, stat = self._session.wait(client.get_async(path), deadline)
                except NoNodeError:
                    return WriteResult.MISSING
                try:
                    node = EventNode.from_bytes(data, path)
                except PayloadError as exc:
                    raise StoreUnknownOutcome(f"event {event_id}: undecodable record: {exc}") from exc
                if (node.done_at is None) == (done_at is None):
                    return WriteResult.EXISTS
                children: list[str] = self._session.wait(client.get_children_async(path), deadline) if drop else []
                transaction = client.transaction()
                rewritten = node.model_copy(update={"done_at": done_at}).to_bytes()
                transaction.set_data(path, rewritten, version=stat.version)
                for child in drop:
                    if child in children:
                        transaction.delete(f"{path}/{child}")
                results = self._session.wait(transaction.commit_async(), deadline)
                if not any(isinstance(result, Exception) for result in results):
                    return WriteResult.DONE
        raise StoreUnknownOutcome(f"event {event_id}: record keeps changing")

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        path = self._paths.out_vm(vm)
        with self._session.writing(f"mark {vm} out of rotation"):
            for _ in range(3):
                try:
                    data, stat = self._session.wait(client.get_async(path), deadline)
                except NoNodeError:
                    try:
                        fresh = OutNode(vm=vm, since=at, events=events).to_bytes()
                        self._session.wait(client.create_async(path, fresh), deadline)
                        return WriteResult.DONE
                    except NodeExistsError:
                        continue
                    except NoNodeError:
                        self._ensure_layout(client, deadline)
                        continue
                try:
                    existing = OutNode.from_bytes(data, path)
                    if existing.events == tuple(events):
                        return WriteResult.EXISTS
                    since = existing.since
                except PayloadError:
                    since = at
                updated = OutNode(vm=vm, since=since, events=events).to_bytes()
                try:
                    self._session.wait(client.set_async(path, updated, version=stat.version), deadline)
                    return WriteResult.DONE
                except (BadVersionError, NoNodeError):
                    continue
        raise StoreUnknownOutcome(f"{path} keeps changing")

    def clear_out(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        with self._session.writing(f"clear {vm} out of rotation"):
            try:
                self._session.wait(client.delete_async(self._paths.out_vm(vm)), deadline)
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def purge_done(self, older_than: float) -> int:
        """Delete, each in one transaction with its whole subtree, the records done before ``older_than``.
        A record that gains a child meanwhile is left for the next call; one that does not parse is left
        too, with a warning."""
        client, _ = self._session.connected(write=True)
        deadline = self._session.deadline()
        wait = self._session.wait
        deleted = 0
        with self._session.writing("purge done events"):
            try:
                event_ids = wait(client.get_children_async(self._paths.events), deadline)
            except NoNodeError:
                return 0
            reads = {e: client.get_async(self._paths.event(e)) for e in event_ids}
            for event_id, result in reads.items():
                try:
                    data, _ = wait(result, deadline)
                    done_at = EventNode.from_bytes(data, self._paths.event(event_id)).done_at
                except NoNodeError:
                    continue
                except PayloadError as exc:
                    log.warning("event %s: undecodable record, not purged: %s", event_id, exc)
                    continue
                if done_at is None or done_at >= older_than:
                    continue
                subtree = self._subtree(client, self._paths.event(event_id), deadline)
                transaction = client.transaction()
                for path in reversed(subtree):  # children before parents
                    transaction.delete(path)
                results = wait(transaction.commit_async(), deadline)
                if all(result is True for result in results):
                    deleted += 1
                    log.info("event %s: record purged (done at %.0f)", event_id, done_at)
        return deleted

    def _subtree(self, client: KazooClient, path: str, deadline: Deadline) -> list[str]:
        """``path`` and every node below it, parents before children."""
        nodes = [path]
        index = 0
        while index < len(nodes):
            try:
                children = self._session.wait(client.get_children_async(nodes[index]), deadline)
            except NoNodeError:
                children = []
            nodes.extend(f"{nodes[index]}/{child}" for child in children)
            index += 1
        return nodes


def _refused(reason: str) -> ApprovalResult:
    log.info("approval refused: %s", reason)
    return ApprovalResult(ApprovalOutcome.REFUSED, reason=reason)
