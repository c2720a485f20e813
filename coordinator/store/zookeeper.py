"""The coordination store on ZooKeeper, through kazoo.

Layout: see ``coordinator.store.base``. Every path lives under ``{root}/{cluster}`` so that one ensemble
serves many VM groups. The prefix is added by this module rather than by a ZooKeeper chroot in the
connection string, so that the store can create its own base path on first start (a chroot cannot be
created through a client that is chrooted into it).

Timing and failure rules:

* Every method is bounded by ``operation_timeout`` as a whole: requests are sent with kazoo's
  ``*_async`` calls and awaited with ``get(timeout=...)`` against one deadline per method. kazoo queues
  requests made while SUSPENDED until the connection returns, so an unbounded call can hang the agent
  loop (https://github.com/zalando/patroni/issues/1981).
* No request is sent unless the connection is CONNECTED: reads then raise ``StoreUnavailable`` and writes
  ``StoreUnknownOutcome`` at once. A request that was sent and timed out may still be applied later
  (it sits in a socket buffer); that is why a failed write is an unknown outcome, never "not done".
* After a request times out, the store reports SUSPENDED and sends nothing for a quiet period of
  2/3 of the session timeout plus 0.5 s. kazoo detects a dead connection only through its pings, and
  it sends a ping only when no request was sent for 1/3 of the session timeout: an agent that keeps
  polling a frozen server would otherwise keep that connection (and CONNECTED) until TCP gives up,
  minutes later, instead of moving to another server of the ensemble. The quiet period ends early when
  kazoo reports a new state or when the unanswered request is answered after all (a slow server); at
  its end, kazoo has either dropped the connection (SUSPENDED, then reconnection) or had a ping answered.
* The kazoo connection listener and every watch only record the state and call the wakeup callback
  (kazoo requires listeners not to block). Watches are one-shot and are set again by each ``read_view``,
  which suits a level-triggered loop: a missed or reset watch costs at most one poll interval.
* Node data is UTF-8 JSON.

Authentication and TLS: ``ClientOptions`` carries ``auth_data`` (kazoo ``(scheme, credential)`` pairs)
and ``TlsOptions``; ``default_client_factory`` passes them to ``KazooClient``. Nodes are created with the
client's default ACL (open); restricting ACLs for authenticated clusters is left to a later change of
``default_client_factory`` (kazoo's ``default_acl``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat

from coordinator.errors import ConfigError, StoreUnavailable, StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import (
    Approval,
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    Wakeup,
    WriteResult,
)

__all__ = [
    "ClientFactory",
    "ClientOptions",
    "TlsOptions",
    "ZooKeeperStore",
    "default_client_factory",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_PATH_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

_STATES = {
    KazooState.CONNECTED: ConnectionState.CONNECTED,
    KazooState.SUSPENDED: ConnectionState.SUSPENDED,
    KazooState.LOST: ConnectionState.LOST,
}


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the ensemble (kazoo ``use_ssl``). Paths are PEM files."""

    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    keyfile_password: str | None = field(default=None, repr=False)
    verify_certs: bool = True
    check_hostname: bool = True


@dataclass(frozen=True)
class ClientOptions:
    """Everything a ``ClientFactory`` needs to build the kazoo client of one store."""

    hosts: str
    session_timeout: float
    auth_data: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    tls: TlsOptions | None = None


ClientFactory = Callable[[ClientOptions], KazooClient]


def default_client_factory(options: ClientOptions) -> KazooClient:
    """A ``KazooClient`` that retries the connection forever with at most 1 s between attempts (kazoo's
    default backs off to an hour, far too long to come back after a Freeze)."""
    tls: dict[str, Any] = {}
    if options.tls is not None:
        tls = {
            "use_ssl": True,
            "ca": options.tls.ca,
            "certfile": options.tls.certfile,
            "keyfile": options.tls.keyfile,
            "keyfile_password": options.tls.keyfile_password,
            "verify_certs": options.tls.verify_certs,
            "check_hostname": options.tls.check_hostname,
        }
    return KazooClient(
        hosts=options.hosts,
        timeout=options.session_timeout,
        auth_data=list(options.auth_data) or None,
        connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        **tls,
    )


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())


def _encode(value: Mapping[str, object]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _decode(data: bytes) -> dict[str, Any]:
    value = json.loads(data.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _optional_float(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number or null, got {value!r}")
    return float(value)


def _float(value: object) -> float:
    result = _optional_float(value)
    if result is None:
        raise ValueError("expected a number, got null")
    return result


def _record_from_data(event_id: str, data: Mapping[str, Any]) -> EventRecord:
    resources = data.get("resources", [])
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise ValueError(f"resources must be a list of strings, got {resources!r}")
    return EventRecord(
        event_id=event_id,
        event_type=str(data["event_type"]),
        resources=tuple(resources),
        not_before=_optional_float(data.get("not_before")),
        published_by=str(data["published_by"]),
        published_at=_float(data["published_at"]),
        done_at=_optional_float(data.get("done_at")),
    )


def _approval_from_data(data: Mapping[str, Any]) -> Approval:
    return Approval(by=str(data["by"]), at=_float(data["at"]), as_leader=bool(data["as_leader"]))


class _Paths:
    def __init__(self, base: str) -> None:
        self.base = base
        self.members = f"{base}/members"
        self.registry = f"{base}/registry"
        self.absent = f"{base}/absent"
        self.leader = f"{base}/leader"
        self.events = f"{base}/events"

    def member(self, vm: str) -> str:
        return f"{self.members}/{vm}"

    def registered(self, vm: str) -> str:
        return f"{self.registry}/{vm}"

    def absent_vm(self, vm: str) -> str:
        return f"{self.absent}/{vm}"

    def event(self, event_id: str) -> str:
        return f"{self.events}/{event_id}"

    def acks(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/acks"

    def ack(self, event_id: str, vm: str) -> str:
        return f"{self.events}/{event_id}/acks/{vm}"

    def approval(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/approval"

    def admitted(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/admitted"

    def layout(self) -> tuple[str, ...]:
        return (self.members, self.registry, self.absent, self.events)


def _validate_root(root: str) -> str:
    parts = root.strip("/").split("/")
    if not root.startswith("/") or not all(_PATH_COMPONENT.fullmatch(p) for p in parts):
        raise ConfigError(
            f"zookeeper root {root[:100]!r} must be an absolute path of components made of letters, "
            "digits, '.', '_' or '-' (for example /azure-maintenance)"
        )
    return "/" + "/".join(parts)


def _validate_cluster(cluster: str) -> str:
    if not _PATH_COMPONENT.fullmatch(cluster):
        raise ConfigError(
            f"cluster name {cluster[:100]!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return cluster


class ZooKeeperStore:
    """``Store`` on a ZooKeeper ensemble. See the module docstring for the timing rules.

    ``session_timeout`` is what the client asks for (the server may lower it to its
    ``maxSessionTimeout``); ``operation_timeout`` bounds every method, including ``start``.
    ``client_factory`` builds the kazoo client (tests inject their own); ``clock`` gives the wall-clock
    time written into ``/leader``.
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
    ) -> None:
        if "/" in hosts:
            raise ConfigError(
                f"zookeeper hosts {hosts!r} must not carry a chroot: the store's paths come from root and cluster"
            )
        if session_timeout <= 0 or operation_timeout <= 0:
            raise ConfigError("session_timeout and operation_timeout must be positive")
        self._paths = _Paths(f"{_validate_root(root)}/{_validate_cluster(cluster)}")
        self._options = ClientOptions(hosts=hosts, session_timeout=session_timeout, auth_data=tuple(auth_data), tls=tls)
        self._operation_timeout = operation_timeout
        self._client_factory = client_factory
        self._clock = clock
        self._client: KazooClient | None = None
        self._state = ConnectionState.LOST
        self._wakeup = Wakeup()
        self._failures: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError)
        self._timeouts: tuple[type[BaseException], ...] = (KazooTimeoutError,)
        self._quiet_period = session_timeout * 2.0 / 3.0 + 0.5
        self._quiet_until = 0.0  # time.monotonic() before which nothing is sent (see module docstring)
        # One bound method object, so that kazoo's per-path watcher sets hold it once.
        self._watch: Callable[[WatchedEvent], None] = self._on_watch

    # -- introspection ------------------------------------------------------------------------------

    @property
    def base_path(self) -> str:
        """``{root}/{cluster}``: where this store's nodes live."""
        return self._paths.base

    @property
    def operation_timeout(self) -> float:
        return self._operation_timeout

    @property
    def client(self) -> KazooClient | None:
        """The kazoo client of the current connection (for diagnostics and tests), or None."""
        return self._client

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or None while not connected."""
        client = self._client
        client_id = client.client_id if client is not None else None
        return client_id[0] if client_id is not None else None

    # -- life cycle and signalling --------------------------------------------------------------------

    def start(self) -> None:
        """Connect and create the base layout, within ``operation_timeout``. Raises ``StoreUnavailable``.
        Calling it again while started does nothing (kazoo reconnects by itself after a loss)."""
        if self._client is not None:
            return
        deadline = _Deadline(self._operation_timeout)
        client = self._client_factory(self._options)
        self._timeouts = (KazooTimeoutError, client.handler.timeout_exception)
        self._failures = (KazooException, *self._timeouts)
        self._quiet_until = 0.0

        def listener(state: str) -> None:
            # Runs on kazoo's connection thread: record and signal only.
            if self._client is client:
                self._state = _STATES.get(state, ConnectionState.SUSPENDED)
                self._quiet_until = 0.0  # kazoo has decided about the connection
                self._notify()

        client.add_listener(listener)
        self._client = client
        try:
            client.start_async().wait(deadline.remaining())
            if not client.connected:
                raise StoreUnavailable(
                    f"no ZooKeeper connection to {self._options.hosts} within {self._operation_timeout:.1f}s"
                )
            self._state = ConnectionState.CONNECTED
            with self._reading("create the base layout"):
                self._ensure_layout(client, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("connected to ZooKeeper %s, base path %s", self._options.hosts, self._paths.base)

    def stop(self) -> None:
        """Close the session (its ephemeral nodes vanish). Bounded by ``operation_timeout``; never raises."""
        client, self._client = self._client, None
        self._state = ConnectionState.LOST
        if client is None:
            return

        def close() -> None:
            try:
                client.stop()
                client.close()
            except Exception:  # the thread's boundary: stop() must never raise
                log.warning("error while closing the ZooKeeper client", exc_info=True)

        # kazoo's stop() waits for the server's answer to the close request, up to max(10 s, session
        # timeout) when the server does not answer: do not let that hold the caller.
        closer = threading.Thread(target=close, name="zookeeper-store-close", daemon=True)
        closer.start()
        closer.join(self._operation_timeout)
        if closer.is_alive():
            log.warning("ZooKeeper client still closing after %.1fs; left to finish", self._operation_timeout)

    @property
    def connection_state(self) -> ConnectionState:
        """kazoo's state, except SUSPENDED during the quiet period that follows an unanswered request."""
        state = self._state
        if state is ConnectionState.CONNECTED and time.monotonic() < self._quiet_until:
            return ConnectionState.SUSPENDED
        return state

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._wakeup.set(callback)

    def _notify(self) -> None:
        self._wakeup.fire()  # from kazoo's threads: never blocks, never raises

    def _on_watch(self, event: WatchedEvent) -> None:
        self._notify()

    # -- helpers --------------------------------------------------------------------------------------

    def _connected(self, *, write: bool) -> tuple[KazooClient, int]:
        """The client and session id, if CONNECTED; otherwise raise without sending anything."""
        client = self._client
        client_id = client.client_id if client is not None else None
        state = self.connection_state
        if client is None or client_id is None or state is not ConnectionState.CONNECTED:
            state_name = state.value if client is not None else "not started"
            if write:
                raise StoreUnknownOutcome(f"ZooKeeper connection {state_name}: write not attempted")
            raise StoreUnavailable(f"ZooKeeper connection {state_name}")
        return client, client_id[0]

    def _wait(self, result: IAsyncResult[_T], deadline: _Deadline) -> _T:
        try:
            return result.get(timeout=deadline.remaining())
        except self._timeouts:
            self._start_quiet_period(result)
            raise

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._failures as exc:
            raise StoreUnavailable(f"{what}: {self._describe(exc)}") from exc

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._failures as exc:
            raise StoreUnknownOutcome(f"{what}: {self._describe(exc)}") from exc

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, self._timeouts):
            return f"no answer from ZooKeeper within {self._operation_timeout:.1f}s"
        return f"{type(exc).__name__} {exc}".rstrip()

    def _start_quiet_period(self, unanswered: IAsyncResult[Any]) -> None:
        """A request got no answer in time: send nothing until kazoo has pinged (module docstring), or
        until that request is answered after all (the connection is alive, only slow)."""
        if self._state is not ConnectionState.CONNECTED:
            return
        self._quiet_until = time.monotonic() + self._quiet_period
        log.warning(
            "ZooKeeper did not answer within %.1fs: connection treated as suspended for up to %.1fs",
            self._operation_timeout,
            self._quiet_period,
        )
        unanswered.rawlink(self._on_late_answer)
        self._notify()

    def _on_late_answer(self, result: IAsyncResult[Any]) -> None:
        # Runs on kazoo's callback thread. A lost connection fails the request with one of these; any
        # other outcome is an answer from the server.
        if isinstance(result.exception, ConnectionLoss | SessionExpiredError) or self._quiet_until == 0.0:
            return
        self._quiet_until = 0.0
        log.info("ZooKeeper answered late: connection usable again")
        self._notify()

    def _ensure_layout(self, client: KazooClient, deadline: _Deadline) -> None:
        for result in [client.ensure_path_async(path) for path in self._paths.layout()]:
            self._wait(result, deadline)

    # -- membership and leadership --------------------------------------------------------------------

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, session = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"join as {vm}"):
            result = self._join_members(client, session, vm, _encode({**info, "vm": vm}), deadline)
            self._register(client, vm, deadline)
        return result

    def _join_members(
        self, client: KazooClient, session: int, vm: str, data: bytes, deadline: _Deadline
    ) -> WriteResult:
        path = self._paths.member(vm)
        for _ in range(3):
            try:
                self._wait(client.create_async(path, data, ephemeral=True), deadline)
                log.info("joined as %s (session 0x%x)", vm, session)
                return WriteResult.DONE
            except NoNodeError:
                self._ensure_layout(client, deadline)
                continue
            except NodeExistsError:
                pass
            stat = self._wait(client.exists_async(path), deadline)
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
                self._wait(client.delete_async(path, version=stat.version), deadline)
        raise StoreUnknownOutcome(f"member node of {vm} keeps being taken by another session")

    def _register(self, client: KazooClient, vm: str, deadline: _Deadline) -> None:
        """Make sure ``/registry/{vm}`` exists; a read when it does (the usual case), a write once."""
        path = self._paths.registered(vm)
        if self._wait(client.exists_async(path), deadline) is not None:
            return
        data = _encode({"vm": vm, "first_seen": self._clock()})
        for _ in range(2):
            try:
                self._wait(client.create_async(path, data), deadline)
                log.info("registered %s", vm)
                return
            except NodeExistsError:
                return
            except NoNodeError:
                self._ensure_layout(client, deadline)
        raise StoreUnknownOutcome(f"{self._paths.registry} keeps disappearing")

    def campaign(self, vm: str) -> bool:
        vm = normalize_vm_name(vm)
        client, session = self._connected(write=False)
        deadline = _Deadline(self._operation_timeout)
        data = _encode({"vm": vm, "since": self._clock()})
        with self._reading(f"campaign as {vm}"):
            for _ in range(2):
                try:
                    self._wait(client.create_async(self._paths.leader, data, ephemeral=True), deadline)
                    log.info("%s is the leader now (session 0x%x)", vm, session)
                    return True
                except NodeExistsError:
                    pass
                stat = self._wait(client.exists_async(self._paths.leader), deadline)
                if stat is not None:
                    return stat.ephemeralOwner == session
        return False

    # -- reads ----------------------------------------------------------------------------------------

    def read_view(self, vm: str) -> ClusterView:
        vm = normalize_vm_name(vm)
        client, session = self._connected(write=False)
        deadline = _Deadline(self._operation_timeout)
        watch = self._watch
        paths = self._paths
        with self._reading("read the cluster view"):
            members_r = client.get_children_async(paths.members, watch=watch)
            registry_r = client.get_children_async(paths.registry, watch=watch)
            # exists() sets a watch whether or not the node is there, so a new leader wakes us up too.
            leader_r = client.exists_async(paths.leader, watch=watch)
            events_r = client.get_children_async(paths.events, watch=watch)

            absent_r = client.get_children_async(paths.absent, watch=watch)
            members = frozenset(name for name in self._children_or_empty(members_r, deadline) if _is_canonical_vm(name))
            known = frozenset(name for name in self._children_or_empty(registry_r, deadline) if _is_canonical_vm(name))
            leader: str | None = None
            i_am_leader = False
            if self._wait(leader_r, deadline) is not None:
                try:
                    data, stat = self._wait(client.get_async(paths.leader), deadline)
                    leader = str(_decode(data)["vm"])
                    i_am_leader = stat.ephemeralOwner == session and leader == vm
                except NoNodeError:
                    pass
                except (ValueError, KeyError):
                    log.warning("undecodable %s node; treating the leader as unknown", paths.leader)

            absent_since: dict[str, float] = {}
            absent_names = [n for n in self._children_or_empty(absent_r, deadline) if _is_canonical_vm(n)]
            absent_data = {name: client.get_async(paths.absent_vm(name)) for name in absent_names}
            for name, result in absent_data.items():
                try:
                    absent_since[name] = _float(_decode(self._wait(result, deadline)[0])["since"])
                except NoNodeError:
                    pass
                except (ValueError, KeyError, TypeError):
                    log.warning("undecodable %s node; ignored", paths.absent_vm(name))

            event_ids = [e for e in self._children_or_empty(events_r, deadline) if _is_canonical_event_id(e)]
            pending = {
                event_id: (
                    client.get_async(paths.event(event_id), watch=watch),
                    client.get_children_async(paths.event(event_id), watch=watch),
                    client.get_children_async(paths.acks(event_id), watch=watch),
                )
                for event_id in event_ids
            }
            records: dict[str, EventRecord] = {}
            for event_id, (record_r, children_r, acks_r) in pending.items():
                record = self._read_record(client, event_id, record_r, children_r, acks_r, deadline)
                if record is not None:
                    records[event_id] = record
        return ClusterView(
            members=members,
            leader=leader,
            i_am_leader=i_am_leader,
            records=records,
            connection=self.connection_state,
            known=known,
            absent_since=absent_since,
        )

    def _children_or_empty(self, result: IAsyncResult[list[str]], deadline: _Deadline) -> list[str]:
        try:
            return self._wait(result, deadline)
        except NoNodeError:
            return []

    def _read_record(
        self,
        client: KazooClient,
        event_id: str,
        record_r: IAsyncResult[tuple[bytes, ZnodeStat]],
        children_r: IAsyncResult[list[str]],
        acks_r: IAsyncResult[list[str]],
        deadline: _Deadline,
    ) -> EventRecord | None:
        try:
            data, _ = self._wait(record_r, deadline)
            children = self._wait(children_r, deadline)
        except NoNodeError:
            return None  # purged while we were reading
        try:
            record = _record_from_data(event_id, _decode(data))
        except (ValueError, KeyError) as exc:
            log.warning("event %s: undecodable record, ignored: %s", event_id, exc)
            return None
        ack_names = [name for name in self._children_or_empty(acks_r, deadline) if _is_canonical_vm(name)]
        ack_results = {name: client.get_async(self._paths.ack(event_id, name)) for name in ack_names}
        approval_r = client.get_async(self._paths.approval(event_id)) if "approval" in children else None
        admitted_r = client.get_async(self._paths.admitted(event_id)) if "admitted" in children else None

        acks: dict[str, float] = {}
        for name, result in ack_results.items():
            try:
                ack_data, ack_stat = self._wait(result, deadline)
            except NoNodeError:
                continue  # withdrawn meanwhile
            try:
                acks[name] = _float(_decode(ack_data)["at"])
            except (ValueError, KeyError):
                acks[name] = ack_stat.ctime / 1000.0
        approval: Approval | None = None
        if approval_r is not None:
            try:
                approval_data, _ = self._wait(approval_r, deadline)
                approval = _approval_from_data(_decode(approval_data))
            except NoNodeError:
                pass
            except (ValueError, KeyError) as exc:
                # The node exists, so the event was approved; keep what can be shown.
                log.warning("event %s: undecodable approval record: %s", event_id, exc)
                approval = Approval(by="?", at=0.0, as_leader=False)
        admitted_at: float | None = None
        if admitted_r is not None:
            try:
                admitted_data, admitted_stat = self._wait(admitted_r, deadline)
            except NoNodeError:
                admitted_r = None
            else:
                try:
                    admitted_at = _float(_decode(admitted_data)["at"])
                except (ValueError, KeyError):
                    admitted_at = admitted_stat.ctime / 1000.0
        return EventRecord(
            event_id=record.event_id,
            event_type=record.event_type,
            resources=record.resources,
            not_before=record.not_before,
            published_by=record.published_by,
            published_at=record.published_at,
            acks=acks,
            approval=approval,
            done_at=record.done_at,
            admitted_at=admitted_at,
        )

    # -- writes ---------------------------------------------------------------------------------------

    def publish_event(self, record: EventRecord) -> WriteResult:
        """Create ``/events/{EVENT_ID}`` and its ``acks`` node atomically. The record's ``acks`` and
        ``approval`` are not written (they have their own methods)."""
        event_id = normalize_event_id(record.event_id)
        published_by = normalize_vm_name(record.published_by)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        data = _encode(
            {
                "event_id": event_id,
                "event_type": record.event_type,
                "resources": list(record.resources),
                "not_before": record.not_before,
                "published_by": published_by,
                "published_at": record.published_at,
                "done_at": record.done_at,
            }
        )
        with self._writing(f"publish event {event_id}"):
            for _ in range(2):
                transaction = client.transaction()
                transaction.create(self._paths.event(event_id), data)
                transaction.create(self._paths.acks(event_id), b"")
                results = self._wait(transaction.commit_async(), deadline)
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
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"event {event_id}: acknowledge for {vm}"):
            try:
                self._wait(
                    client.create_async(self._paths.ack(event_id, vm), _encode({"vm": vm, "at": at})),
                    deadline,
                )
            except NodeExistsError:
                return WriteResult.EXISTS
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"event {event_id}: withdraw the ack of {vm}"):
            try:
                self._wait(client.delete_async(self._paths.ack(event_id, vm)), deadline)
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float
    ) -> ApprovalResult:
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        needed = {normalize_vm_name(name) for name in required}

        # 1. The connection is CONNECTED (SUSPENDED may mean that our session, and leadership, are gone).
        try:
            client, session = self._connected(write=True)
        except StoreUnknownOutcome as exc:
            return ApprovalResult(ApprovalOutcome.REFUSED, reason=str(exc))
        deadline = _Deadline(self._operation_timeout)
        paths = self._paths
        with self._writing(f"event {event_id}: approve as {vm}"):
            # 2. A synced read: the server we talk to has caught up with the ensemble's leader, so a
            # node deleted elsewhere (an expired leader) is not still seen here.
            self._wait(client.sync_async(paths.base), deadline)
            owner_path = paths.leader if as_leader else paths.member(vm)
            try:
                data, stat = self._wait(client.get_async(owner_path), deadline)
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
                    holder = _decode(data).get("vm")
                except ValueError:
                    holder = None
                if holder != vm:
                    return _refused(f"{owner_path} is held by this session for {holder!r}, not {vm!r}")

            # 3. Every required VM has acknowledged.
            try:
                ack_names: list[str] = self._wait(client.get_children_async(paths.acks(event_id)), deadline)
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
                self._wait(
                    client.create_async(
                        paths.approval(event_id),
                        _encode({"by": approval.by, "at": approval.at, "as_leader": approval.as_leader}),
                    ),
                    deadline,
                )
                log.info("event %s: approval recorded by %s (as leader: %s)", event_id, vm, as_leader)
                return ApprovalResult(ApprovalOutcome.APPROVED, record=approval)
            except NoNodeError:
                return _refused(f"event {event_id} has no record in the store")
            except NodeExistsError:
                pass
            data, _ = self._wait(client.get_async(paths.approval(event_id)), deadline)
        try:
            existing = _approval_from_data(_decode(data))
        except (ValueError, KeyError) as exc:
            raise StoreUnknownOutcome(f"event {event_id}: undecodable approval record: {exc}") from exc
        return ApprovalResult(ApprovalOutcome.APPROVED, reason="approved before", record=existing)

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        """Create ``admitted`` under the event, once. The store does not check that ``vm`` leads."""
        event_id = normalize_event_id(event_id)
        vm = normalize_vm_name(vm)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"event {event_id}: admit (by {vm})"):
            try:
                self._wait(client.create_async(self._paths.admitted(event_id), _encode({"by": vm, "at": at})), deadline)
            except NodeExistsError:
                return WriteResult.EXISTS
            except NoNodeError:
                return WriteResult.MISSING
        log.info("event %s: admitted by %s", event_id, vm)
        return WriteResult.DONE

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"mark {vm} absent"):
            for _ in range(2):
                try:
                    self._wait(client.create_async(self._paths.absent_vm(vm), _encode({"since": at})), deadline)
                    return WriteResult.DONE
                except NodeExistsError:
                    return WriteResult.EXISTS
                except NoNodeError:
                    self._ensure_layout(client, deadline)
        raise StoreUnknownOutcome(f"{self._paths.absent} keeps disappearing")

    def clear_absent(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        with self._writing(f"clear the absence of {vm}"):
            try:
                self._wait(client.delete_async(self._paths.absent_vm(vm)), deadline)
            except NoNodeError:
                return WriteResult.MISSING
        return WriteResult.DONE

    def mark_done(self, event_id: str, at: float) -> WriteResult:
        event_id = normalize_event_id(event_id)
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        path = self._paths.event(event_id)
        with self._writing(f"event {event_id}: mark done"):
            for _ in range(3):
                try:
                    data, stat = self._wait(client.get_async(path), deadline)
                except NoNodeError:
                    return WriteResult.MISSING
                try:
                    content = _decode(data)
                except ValueError as exc:
                    raise StoreUnknownOutcome(f"event {event_id}: undecodable record: {exc}") from exc
                if content.get("done_at") is not None:
                    return WriteResult.EXISTS
                content["done_at"] = at
                try:
                    # Versioned, so that a concurrent writer is not overwritten: re-read and decide again.
                    self._wait(client.set_async(path, _encode(content), version=stat.version), deadline)
                    return WriteResult.DONE
                except BadVersionError:
                    continue
                except NoNodeError:
                    return WriteResult.MISSING
        raise StoreUnknownOutcome(f"event {event_id}: record keeps changing while marking it done")

    def purge_done(self, older_than: float) -> int:
        """Delete, each in one transaction with its whole subtree, the records done before ``older_than``.
        A record that gains a child meanwhile is left for the next call."""
        client, _ = self._connected(write=True)
        deadline = _Deadline(self._operation_timeout)
        deleted = 0
        with self._writing("purge done events"):
            try:
                event_ids = self._wait(client.get_children_async(self._paths.events), deadline)
            except NoNodeError:
                return 0
            reads = {e: client.get_async(self._paths.event(e)) for e in event_ids}
            for event_id, result in reads.items():
                try:
                    data, _ = self._wait(result, deadline)
                    done_at = _optional_float(_decode(data).get("done_at"))
                except NoNodeError:
                    continue
                except ValueError:
                    log.warning("event %s: undecodable record, not purged", event_id)
                    continue
                if done_at is None or done_at >= older_than:
                    continue
                subtree = self._subtree(client, self._paths.event(event_id), deadline)
                transaction = client.transaction()
                for path in reversed(subtree):  # children before parents
                    transaction.delete(path)
                results = self._wait(transaction.commit_async(), deadline)
                if all(result is True for result in results):
                    deleted += 1
                    log.info("event %s: record purged (done at %.0f)", event_id, done_at)
        return deleted

    def _subtree(self, client: KazooClient, path: str, deadline: _Deadline) -> list[str]:
        """``path`` and every node below it, parents before children."""
        nodes = [path]
        index = 0
        while index < len(nodes):
            try:
                children = self._wait(client.get_children_async(nodes[index]), deadline)
            except NoNodeError:
                children = []
            nodes.extend(f"{nodes[index]}/{child}" for child in children)
            index += 1
        return nodes


def _refused(reason: str) -> ApprovalResult:
    log.info("approval refused: %s", reason)
    return ApprovalResult(ApprovalOutcome.REFUSED, reason=reason)


def _is_canonical_vm(name: str) -> bool:
    try:
        return normalize_vm_name(name) == name
    except ValueError:
        return False


def _is_canonical_event_id(event_id: str) -> bool:
    try:
        return normalize_event_id(event_id) == event_id
    except ValueError:
        return False
