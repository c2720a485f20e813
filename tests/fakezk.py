"""An in-process ZooKeeper server and kazoo client, enough of both for ``ZooKeeperStore`` to run over them.

``FakeEnsemble`` plays one ZooKeeper server; each ``FakeClient`` plays a ``kazoo.client.KazooClient`` with
its own session. A ``Link`` is a client factory (``ZooKeeperStore(client_factory=...)``) and the network
path from one store to the server: the test cuts it and restores it.

What it models, as ZooKeeper 3.x and kazoo 2.x do:

* znodes with data, ACL (kept as given), ``version``, ``cversion`` (child creations and deletions),
  ``aversion``, ``czxid``/``mzxid``/``pzxid``, ``ctime``/``mtime`` (milliseconds of the ensemble's clock)
  and ``ephemeralOwner``; one zxid per write, one for a whole transaction;
* the errors kazoo raises: ``NoNodeError``, ``NodeExistsError``, ``BadVersionError``, ``NotEmptyError``,
  ``NoChildrenForEphemeralsError``; a transaction is atomic, and its results are kazoo's: the path of a
  create, True for a delete or a check, the stat of a set; when one operation fails, nothing is applied
  and the results are ``RolledBackError`` before it, its error, ``RuntimeInconsistency`` after it;
* one-shot watches, set on the server as ZooKeeper sets them (``getData`` and ``getChildren`` only on a node
  that exists, ``exists`` whether or not it does) and fired by its rules: a create fires CREATED on the
  node's data watches and CHILD on its parent's child watches; a set fires CHANGED; a delete fires DELETED
  on the node's data and child watches and CHILD on its parent; an ACL change fires
  nothing. The client keeps its watchers per path and pops them by event type as kazoo does (a watcher on
  both the data and the children of a deleted node is called twice), and passes each event through
  ``handler.dispatch_callback``;
* sessions: ephemeral nodes belong to one and are deleted when it is closed (``stop``) or expires, firing
  watches. A connected session never expires; one whose link is cut expires when the test says so
  (``FakeEnsemble.expire``), or once it has been silent for its timeout by the ensemble's clock
  (``FakeEnsemble.expire_silent``), never by wall time. The timeout granted is the one asked for, or
  ``FakeEnsemble.granted_session`` when set; kazoo's hook where it learns it (``_connection._connect``) is
  called at every (re)connection;
* connection states as kazoo reports them to its listeners: CONNECTED at start; on a cut link SUSPENDED,
  requests failing with ``ConnectionLoss`` and every watcher told (an event of type NONE without a path) and
  dropped on both sides, as kazoo does on a connection loss; on a restored link CONNECTED with the same
  session, or, if it expired meanwhile, LOST then CONNECTED with a new session (kazoo reconnects by itself);
  a session expired while connected is SUSPENDED, LOST, then CONNECTED with a new session.

What it does not model: the network (every request is answered at once, so nothing ever times out and
``ZooKeeperSession``'s quiet period never starts), a request queued while SUSPENDED (it fails at once:
the store sends nothing then anyway), quorum and followers behind the leader (one server, so ``sync`` does
nothing), watch events that reach other clients late (each is handed to every client before the request
that caused it returns), ACL enforcement and authentication (``NoAuthError`` never happens), sequential
nodes beyond their name, containers, TTL nodes, persistent watches, quotas, chroots.

Everything runs on the caller's thread; a lock makes the ensemble safe to call from several.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback, EventType, KazooState, KeeperState, WatchedEvent, ZnodeStat
from kazoo.security import ACL, OPEN_ACL_UNSAFE

from coordinator.store.zk_session import ClientOptions

__all__ = ["FakeClient", "FakeEnsemble", "FakeResult", "Link"]

_T = TypeVar("_T")
Watcher = Callable[[WatchedEvent], object]


# -- results and the handler --------------------------------------------------------------------------------


class FakeResult(Generic[_T]):
    """kazoo's ``IAsyncResult``, complete from the start (every request is answered at once)."""

    def __init__(self, value: _T | None = None, exception: BaseException | None = None) -> None:
        self.value = value
        self._exception = exception

    @property
    def exception(self) -> BaseException | None:
        return self._exception

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return self._exception is None

    def get(self, block: bool = True, timeout: float | None = None) -> _T:
        if self._exception is not None:
            raise self._exception
        return cast("_T", self.value)

    def get_nowait(self) -> _T:
        return self.get()

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def rawlink(self, callback: Callable[[FakeResult[_T]], object]) -> None:
        callback(self)

    def unlink(self, callback: Callable[[FakeResult[_T]], object]) -> None:
        return None


class _Handler:
    """kazoo's handler as the store uses it: its timeout exception, and callbacks run at once, in order."""

    timeout_exception = KazooTimeoutError

    def dispatch_callback(self, callback: Callback) -> None:
        callback.func(*callback.args)


class _Connection:
    """Where kazoo negotiates the session timeout (``coordinator.store.zk_session.record_granted_timeout``
    wraps ``_connect``): returns the read timeout, two thirds of the granted one, in milliseconds."""

    def __init__(self) -> None:
        self.granted = 10.0

    def _connect(self, host: str, hostip: str, port: int) -> tuple[float, float]:
        return self.granted * 1000.0 * 2.0 / 3.0, self.granted * 1000.0


# -- the server --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Znode:
    data: bytes
    acl: list[ACL]
    czxid: int
    ctime: int
    owner: int = 0
    mzxid: int = 0
    mtime: int = 0
    pzxid: int = 0
    version: int = 0
    cversion: int = 0
    aversion: int = 0
    children: set[str] = dataclasses.field(default_factory=set)

    def stat(self) -> ZnodeStat:
        return ZnodeStat(self.czxid, self.mzxid, self.ctime, self.mtime, self.version, self.cversion,
                         self.aversion, self.owner, len(self.data), len(self.children), self.pzxid)


@dataclasses.dataclass
class _Session:
    id: int
    password: bytes
    timeout: float
    last_heard: float
    client: FakeClient | None = None  # attached while its link is up
    data_watches: set[str] = dataclasses.field(default_factory=set)
    child_watches: set[str] = dataclasses.field(default_factory=set)


_Delivery = tuple["FakeClient", str, str]  # (client, event type, path)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise BadArgumentsError(f"invalid path {path!r}")


class FakeEnsemble:
    """One ZooKeeper server: the tree, the sessions and their watches (see the module docstring).

    ``clock`` gives the time of ``ctime``/``mtime`` and of session expiry (``expire_silent``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.granted_session: float | None = None  # None: grant what each client asks for
        self.lock = threading.RLock()
        self.zxid = 0
        self.sessions: dict[int, _Session] = {}
        self._ids = itertools.count(0x100000000)
        self.nodes: dict[str, _Znode] = {"/": _Znode(b"", list(OPEN_ACL_UNSAFE), 0, 0)}
        self._add("/zookeeper", b"", list(OPEN_ACL_UNSAFE), 0, [])
        self.requests = 0  # requests answered (reads and writes), for tests and benchmarks

    def link(self) -> Link:
        """A new client factory with its own network path to this server."""
        return Link(self)

    # -- test controls -----------------------------------------------------------------------------------

    def expire(self, session_id: int) -> None:
        """End the session now: its ephemeral nodes go, its client (if attached) finds out and reconnects."""
        with self.lock:
            session = self.sessions.pop(session_id, None)
            if session is None:
                return
            deliveries = self._drop_ephemerals(session_id)
        self._deliver(deliveries)
        if session.client is not None:
            session.client._server_closed()

    def expire_silent(self) -> list[int]:
        """Expire every session whose client is cut off and that has been silent for its timeout, by
        ``clock``. Returns their ids."""
        now = self.clock()
        with self.lock:
            due = [s.id for s in self.sessions.values() if s.client is None and now - s.last_heard >= s.timeout]
        for session_id in due:
            self.expire(session_id)
        return due

    # -- reading the tree (for tests: no session, no watch) --------------------------------------------------

    def get(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        with self.lock:
            node = self.nodes.get(path)
            return (node.data, node.stat()) if node is not None else None

    def children(self, path: str) -> list[str]:
        with self.lock:
            node = self.nodes.get(path)
            return sorted(node.children) if node is not None else []

    def walk(self, path: str = "/") -> Iterator[str]:
        """``path`` and every node below it, parents first."""
        with self.lock:
            paths = sorted(p for p in self.nodes if p == path or p.startswith(path.rstrip("/") + "/"))
        return iter(paths)

    # -- sessions (called by ``FakeClient``) ------------------------------------------------------------------

    def _open(self, client: FakeClient, asked: float) -> _Session:
        with self.lock:
            session = _Session(next(self._ids), os.urandom(16), self.granted_session or asked, self.clock(), client)
            self.sessions[session.id] = session
            return session

    def _attach(self, session_id: int, client: FakeClient) -> _Session | None:
        with self.lock:
            session = self.sessions.get(session_id)
            if session is not None:
                session.client = client
                session.last_heard = self.clock()
            return session

    def _detach(self, session_id: int) -> None:
        """The connection is gone: its watches with it (kazoo does not set them again, having told and
        dropped its watchers); the session lives on until it expires."""
        with self.lock:
            session = self.sessions.get(session_id)
            if session is not None:
                session.client = None
                session.data_watches.clear()
                session.child_watches.clear()

    def _close(self, session_id: int) -> None:
        with self.lock:
            if self.sessions.pop(session_id, None) is None:
                return
            deliveries = self._drop_ephemerals(session_id)
        self._deliver(deliveries)

    def _drop_ephemerals(self, session_id: int) -> list[_Delivery]:
        deliveries: list[_Delivery] = []
        owned = sorted((p for p, n in self.nodes.items() if n.owner == session_id), reverse=True)
        if owned:
            self.zxid += 1
            for path in owned:
                self._remove(path, self.zxid, deliveries)
        return deliveries

    # -- requests --------------------------------------------------------------------------------------------

    def _request(self, session_id: int, op: Callable[[_Session, list[_Delivery]], _T],
                 write: bool) -> FakeResult[_T]:
        """Run one request for ``session_id``; hand out its watch events, then return its result. A write
        takes the next zxid, even if it fails (as ZooKeeper logs an error transaction)."""
        deliveries: list[_Delivery] = []
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None or session.client is None:
                return FakeResult(exception=ConnectionLoss())
            session.last_heard = self.clock()
            self.requests += 1
            if write:
                self.zxid += 1
            try:
                result: FakeResult[_T] = FakeResult(op(session, deliveries))
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError, NoChildrenForEphemeralsError,
                    BadArgumentsError) as exc:
                result = FakeResult(exception=exc)
        self._deliver(deliveries)
        return result

    def _deliver(self, deliveries: list[_Delivery]) -> None:
        for client, kind, path in deliveries:
            client._on_event(kind, path)

    def _trigger(self, path: str, kind: str, deliveries: list[_Delivery], *, data: bool, child: bool) -> None:
        """Fire the watches of ``kind`` on ``path`` (data watches, child watches or both, one event per
        session), removing them: they are one-shot."""
        for session in self.sessions.values():
            hit = False
            if data and path in session.data_watches:
                session.data_watches.discard(path)
                hit = True
            if child and path in session.child_watches:
                session.child_watches.discard(path)
                hit = True
            if hit and session.client is not None:
                deliveries.append((session.client, kind, path))

    def _add(self, path: str, data: bytes, acl: list[ACL], owner: int, deliveries: list[_Delivery]) -> None:
        parent = self.nodes[_parent(path)]
        now = int(self.clock() * 1000)
        self.nodes[path] = _Znode(data, acl, self.zxid, now, owner, self.zxid, now, self.zxid)
        parent.children.add(path.rsplit("/", 1)[1])
        parent.cversion += 1
        parent.pzxid = self.zxid
        self._trigger(path, EventType.CREATED, deliveries, data=True, child=False)
        self._trigger(_parent(path), EventType.CHILD, deliveries, data=False, child=True)

    def _remove(self, path: str, zxid: int, deliveries: list[_Delivery]) -> None:
        del self.nodes[path]
        parent = self.nodes[_parent(path)]
        parent.children.discard(path.rsplit("/", 1)[1])
        parent.cversion += 1
        parent.pzxid = zxid
        self._trigger(path, EventType.DELETED, deliveries, data=True, child=True)
        self._trigger(_parent(path), EventType.CHILD, deliveries, data=False, child=True)

    # The operations, each run under the lock by ``_request`` (or by a transaction, which undoes them).

    def _node(self, path: str) -> _Znode:
        _check_path(path)
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node

    def create(self, session: _Session, path: str, data: bytes, acl: list[ACL], ephemeral: bool,
               sequence: bool, deliveries: list[_Delivery]) -> str:
        _check_path(path)
        if path == "/":
            raise NodeExistsError(path)
        parent = self.nodes.get(_parent(path))
        if parent is None:
            raise NoNodeError(path)
        if parent.owner:
            raise NoChildrenForEphemeralsError(path)
        if sequence:
            path = f"{path}{parent.cversion:010d}"
        if path in self.nodes:
            raise NodeExistsError(path)
        self._add(path, data, acl, session.id if ephemeral else 0, deliveries)
        return path

    def delete(self, path: str, version: int, deliveries: list[_Delivery]) -> bool:
        node = self._node(path)
        if version != -1 and node.version != version:
            raise BadVersionError(path)
        if node.children:
            raise NotEmptyError(path)
        self._remove(path, self.zxid, deliveries)
        return True

    def set_data(self, path: str, data: bytes, version: int, deliveries: list[_Delivery]) -> ZnodeStat:
        node = self._node(path)
        if version != -1 and node.version != version:
            raise BadVersionError(path)
        node.data, node.version, node.mzxid, node.mtime = data, node.version + 1, self.zxid, int(self.clock() * 1000)
        self._trigger(path, EventType.CHANGED, deliveries, data=True, child=False)
        return node.stat()

    def check(self, path: str, version: int) -> bool:
        node = self._node(path)
        if node.version != version:
            raise BadVersionError(path)
        return True

    def read(self, session: _Session, path: str, watch: bool) -> tuple[bytes, ZnodeStat]:
        node = self._node(path)
        if watch:
            session.data_watches.add(path)
        return node.data, node.stat()

    def exists(self, session: _Session, path: str, watch: bool) -> ZnodeStat | None:
        _check_path(path)
        if watch:
            session.data_watches.add(path)
        node = self.nodes.get(path)
        return node.stat() if node is not None else None

    def list_children(self, session: _Session, path: str, watch: bool) -> list[str]:
        node = self._node(path)
        if watch:
            session.child_watches.add(path)
        return sorted(node.children)

    def transaction(self, session: _Session, ops: list[tuple[str, tuple[Any, ...]]],
                    deliveries: list[_Delivery]) -> list[object]:
        """Apply ``ops`` all or none, under one zxid (see the module docstring for the results)."""
        saved = {path: dataclasses.replace(node, children=set(node.children)) for path, node in self.nodes.items()}
        watches = {s.id: (set(s.data_watches), set(s.child_watches)) for s in self.sessions.values()}
        pending: list[_Delivery] = []
        results: list[object] = []
        for index, (kind, args) in enumerate(ops):
            try:
                if kind == "create":
                    results.append(self.create(session, *args, pending))
                elif kind == "delete":
                    results.append(self.delete(*args, pending))
                elif kind == "set_data":
                    results.append(self.set_data(*args, pending))
                else:
                    results.append(self.check(*args))
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError, NoChildrenForEphemeralsError,
                    BadArgumentsError) as exc:
                self.nodes = saved  # a failed transaction changes nothing and fires nothing
                for other in self.sessions.values():
                    other.data_watches, other.child_watches = watches[other.id]
                return [RolledBackError() for _ in range(index)] + [exc] + [
                    RuntimeInconsistency() for _ in range(len(ops) - index - 1)]
        deliveries.extend(pending)
        return results


# -- the client --------------------------------------------------------------------------------------------


class Link:
    """A client factory (``ClientFactory``) and the network path from its clients to the server."""

    def __init__(self, ensemble: FakeEnsemble) -> None:
        self.ensemble = ensemble
        self.up = True
        self.clients: list[FakeClient] = []

    def __call__(self, options: ClientOptions) -> KazooClient:
        client = FakeClient(self, options.session_timeout, options.acls.default if options.acls else None)
        self.clients.append(client)
        return cast(KazooClient, client)

    @property
    def client(self) -> FakeClient | None:
        """The last client made, or None."""
        return self.clients[-1] if self.clients else None

    def cut(self) -> None:
        """Unreachable: every connected client is SUSPENDED (its session lives on, on the server)."""
        self.up = False
        for client in self.clients:
            client._connection_lost()

    def restore(self) -> None:
        """Reachable again: every started client reconnects (see the module docstring)."""
        self.up = True
        for client in list(self.clients):
            client._reconnect()


class FakeClient:
    """The part of ``kazoo.client.KazooClient`` the store and the operator's commands use."""

    hosts = (("fake-zookeeper", 2181),)

    def __init__(self, link: Link, timeout: float, default_acl: Sequence[ACL] | None = None) -> None:
        self._link = link
        self._ensemble = link.ensemble
        self._timeout = timeout
        self.default_acl = list(default_acl) if default_acl else list(OPEN_ACL_UNSAFE)
        self.handler = _Handler()
        self._connection = _Connection()
        self.state = KazooState.LOST
        self._listeners: list[Callable[[str], object]] = []
        self._session_id: int | None = None
        self._password = b"\x00" * 16
        self._started = False
        self._live = threading.Event()
        self._data_watchers: defaultdict[str, set[Watcher]] = defaultdict(set)
        self._child_watchers: defaultdict[str, set[Watcher]] = defaultdict(set)

    # -- life cycle -------------------------------------------------------------------------------------------

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        return (self._session_id, self._password) if self._session_id is not None else None

    @property
    def connected(self) -> bool:
        return self._live.is_set()

    def add_listener(self, listener: Callable[[str], object]) -> None:
        if listener not in self._listeners:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], object]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def start_async(self) -> threading.Event:
        """Connect now if the link is up; the event is set once connected (waiting on it never blocks
        for long: nothing else can connect the client meanwhile)."""
        self._started = True
        self._reconnect()
        return _Connected(self._live)

    def start(self, timeout: float = 15) -> None:
        self.start_async()
        if not self.connected:
            self.stop()
            raise KazooTimeoutError("Connection time-out")

    def stop(self) -> None:
        """Close the session (its ephemeral nodes go) if connected; a cut-off client cannot tell the
        server, whose session then lives until it expires."""
        if not self._started:
            return
        self._started = False
        session, self._session_id = self._session_id, None
        if session is not None and self.connected:
            self._ensemble._detach(session)
            self._ensemble._close(session)
        self._live.clear()
        self._change(KazooState.LOST)
        self._reset_watchers()

    def close(self) -> None:
        return None

    # -- connection changes (driven by ``Link`` and ``FakeEnsemble``) --------------------------------------------

    def _change(self, state: str) -> None:
        if self.state == state:
            return
        self.state = state
        for listener in list(self._listeners):
            listener(state)

    def _reset_watchers(self) -> None:
        watchers = [w for ws in self._child_watchers.values() for w in ws]
        watchers += [w for ws in self._data_watchers.values() for w in ws]
        self._child_watchers.clear()
        self._data_watchers.clear()
        event = WatchedEvent(EventType.NONE, KeeperState.CONNECTING, None)
        for watcher in watchers:
            self.handler.dispatch_callback(Callback("watch", watcher, (event,)))

    def _connection_lost(self) -> None:
        if not self.connected:
            return
        assert self._session_id is not None
        self._ensemble._detach(self._session_id)
        self._live.clear()
        self._change(KazooState.SUSPENDED)
        self._reset_watchers()

    def _reconnect(self) -> None:
        if not self._started or self.connected or not self._link.up:
            return
        session = self._ensemble._attach(self._session_id, self) if self._session_id is not None else None
        if session is None and self._session_id is not None:  # expired meanwhile: the server says so
            self._session_id = None
            self._change(KazooState.LOST)
            self._reset_watchers()
        if session is None:
            session = self._ensemble._open(self, self._timeout)
            self._session_id, self._password = session.id, session.password
        self._connection.granted = session.timeout
        self._connection._connect("fake-zookeeper", "127.0.0.1", 2181)
        self._live.set()
        self._change(KazooState.CONNECTED)

    def _server_closed(self) -> None:
        """The server ended this client's session: the connection drops, then kazoo reconnects."""
        self._connection_lost()
        self._reconnect()

    def _on_event(self, kind: str, path: str) -> None:
        """A watch event from the server: the watchers kazoo pops for it. Like kazoo, a watcher set on both
        the data and the children of a deleted node is called twice."""
        watchers: list[Watcher] = []
        if kind in (EventType.CREATED, EventType.CHANGED, EventType.DELETED):
            watchers += self._data_watchers.pop(path, set())
        if kind in (EventType.CHILD, EventType.DELETED):
            watchers += self._child_watchers.pop(path, set())
        event = WatchedEvent(kind, KeeperState.CONNECTED, path)
        for watcher in watchers:
            self.handler.dispatch_callback(Callback("watch", watcher, (event,)))

    # -- requests ---------------------------------------------------------------------------------------------

    def _send(self, op: Callable[[_Session, list[_Delivery]], _T], *, write: bool = False) -> FakeResult[_T]:
        if not self._started and self._session_id is None:
            return FakeResult(exception=ConnectionClosedError("Connection has been closed"))
        if self._session_id is None:
            return FakeResult(exception=SessionExpiredError())
        if not self.connected:
            return FakeResult(exception=ConnectionLoss())
        return self._ensemble._request(self._session_id, op, write)

    def _watched(self, result: FakeResult[_T], watchers: defaultdict[str, set[Watcher]], path: str,
                 watch: Watcher | None) -> FakeResult[_T]:
        # kazoo registers a watcher once its request is answered without error (``exists`` of a missing
        # node counts as answered).
        if watch is not None and result.successful():
            watchers[path].add(watch)
        return result

    def create_async(self, path: str, value: bytes = b"", acl: Sequence[ACL] | None = None, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = False) -> FakeResult[str]:
        acls = list(acl) if acl else self.default_acl
        if makepath and self._ensemble.get(_parent(path)) is None and _parent(path) != "/":
            self.ensure_path_async(_parent(path), acl).get()
        return self._send(lambda s, d: self._ensemble.create(s, path, value, acls, ephemeral, sequence, d),
                          write=True)

    def ensure_path_async(self, path: str, acl: Sequence[ACL] | None = None) -> FakeResult[object]:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/" + "/".join(parts[:depth])
            found = self.exists_async(sub)
            if found.exception is not None:
                return FakeResult(exception=found.exception)
            if found.value is None:
                created = self.create_async(sub, acl=acl)
                if created.exception is not None and not isinstance(created.exception, NodeExistsError):
                    return FakeResult(exception=created.exception)
        return FakeResult(True)

    def delete_async(self, path: str, version: int = -1) -> FakeResult[bool]:
        return self._send(lambda s, d: self._ensemble.delete(path, version, d), write=True)

    def set_async(self, path: str, value: bytes, version: int = -1) -> FakeResult[ZnodeStat]:
        return self._send(lambda s, d: self._ensemble.set_data(path, value, version, d), write=True)

    def get_async(self, path: str, watch: Watcher | None = None) -> FakeResult[tuple[bytes, ZnodeStat]]:
        result = self._send(lambda s, d: self._ensemble.read(s, path, watch is not None))
        return self._watched(result, self._data_watchers, path, watch)

    def exists_async(self, path: str, watch: Watcher | None = None) -> FakeResult[ZnodeStat | None]:
        result = self._send(lambda s, d: self._ensemble.exists(s, path, watch is not None))
        return self._watched(result, self._data_watchers, path, watch)

    def get_children_async(self, path: str, watch: Watcher | None = None,
                           include_data: bool = False) -> FakeResult[list[str]]:
        result = self._send(lambda s, d: self._ensemble.list_children(s, path, watch is not None))
        return self._watched(result, self._child_watchers, path, watch)

    def get_acls_async(self, path: str) -> FakeResult[tuple[list[ACL], ZnodeStat]]:
        def op(session: _Session, deliveries: list[_Delivery]) -> tuple[list[ACL], ZnodeStat]:
            node = self._ensemble._node(path)
            return list(node.acl), node.stat()
        return self._send(op)

    def set_acls_async(self, path: str, acls: Sequence[ACL], version: int = -1) -> FakeResult[ZnodeStat]:
        def op(session: _Session, deliveries: list[_Delivery]) -> ZnodeStat:
            node = self._ensemble._node(path)
            if version != -1 and node.aversion != version:
                raise BadVersionError(path)
            node.acl, node.aversion = list(acls), node.aversion + 1
            return node.stat()
        return self._send(op, write=True)

    def sync_async(self, path: str) -> FakeResult[str]:
        return self._send(lambda s, d: path)

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    # The blocking forms (the operator's commands use them).

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, ZnodeStat]:
        return self.get_async(path, watch).get()

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        return self.exists_async(path, watch).get()

    def get_children(self, path: str, watch: Watcher | None = None) -> list[str]:
        return self.get_children_async(path, watch).get()

    def get_acls(self, path: str) -> tuple[list[ACL], ZnodeStat]:
        return self.get_acls_async(path).get()

    def set_acls(self, path: str, acls: Sequence[ACL], version: int = -1) -> ZnodeStat:
        return self.set_acls_async(path, acls, version).get()

    def create(self, path: str, value: bytes = b"", acl: Sequence[ACL] | None = None, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        return self.create_async(path, value, acl, ephemeral, sequence, makepath).get()

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        return self.set_async(path, value, version).get()

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        if recursive:
            for child in self.get_children(path):
                self.delete(f"{path}/{child}", recursive=True)
        return self.delete_async(path, version).get()

    def ensure_path(self, path: str, acl: Sequence[ACL] | None = None) -> object:
        return self.ensure_path_async(path, acl).get()


class _Connected:
    """What ``start_async`` returns: kazoo's event, set once connected."""

    def __init__(self, live: threading.Event) -> None:
        self._live = live

    def wait(self, timeout: float | None = None) -> bool:
        return self._live.is_set()

    def is_set(self) -> bool:
        return self._live.is_set()


class FakeTransaction:
    """kazoo's ``TransactionRequest``: operations collected, then committed all or none."""

    def __init__(self, client: FakeClient) -> None:
        self._client = client
        self._ops: list[tuple[str, tuple[Any, ...]]] = []

    def create(self, path: str, value: bytes = b"", acl: Sequence[ACL] | None = None, ephemeral: bool = False,
               sequence: bool = False) -> None:
        self._ops.append(("create", (path, value, list(acl) if acl else self._client.default_acl, ephemeral,
                                     sequence)))

    def delete(self, path: str, version: int = -1) -> None:
        self._ops.append(("delete", (path, version)))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._ops.append(("set_data", (path, value, version)))

    def check(self, path: str, version: int) -> None:
        self._ops.append(("check", (path, version)))

    def commit_async(self) -> FakeResult[list[object]]:
        ops = list(self._ops)
        ensemble = self._client._ensemble
        return self._client._send(lambda s, d: ensemble.transaction(s, ops, d), write=True)

    def commit(self) -> list[object]:
        return self.commit_async().get()
