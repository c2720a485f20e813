"""The kazoo client of one ZooKeeper store: building it, bounding every request, and the connection state.

Timing and failure rules (the store's methods rely on them):

* Every store method is bounded by ``operation_timeout`` as a whole: requests are sent with kazoo's
  ``*_async`` calls and awaited with ``get(timeout=...)`` against one ``Deadline`` per method (``wait``).
  kazoo queues requests made while SUSPENDED until the connection returns, so an unbounded call can hang
  the agent loop (https://github.com/zalando/patroni/issues/1981).
* No request is sent unless the connection is CONNECTED (``connected``): reads then raise
  ``StoreUnavailable`` and writes ``StoreUnknownOutcome`` at once. A request that was sent and timed out
  may still be applied later (it sits in a socket buffer); that is why a failed write is an unknown
  outcome, never "not done" (``writing``).
* After a request times out, the session reports SUSPENDED and sends nothing for a quiet period of
  2/3 of the session timeout plus 0.5 s. kazoo detects a dead connection only through its pings, and
  it sends a ping only when no request was sent for 1/3 of the session timeout: an agent that keeps
  polling a frozen server would otherwise keep that connection (and CONNECTED) until TCP gives up,
  minutes later, instead of moving to another server of the ensemble. The quiet period ends early when
  kazoo reports a new state or when the unanswered request is answered after all (a slow server); at
  its end, kazoo has either dropped the connection (SUSPENDED, then reconnection) or had a ping answered.
* The kazoo connection listener and every watch (``watch``) only record the state, count a change and
  fire the wakeup callback (kazoo requires listeners not to block).

Change counters, for the cached view (``coordinator.store.zk_watch``): ``generation`` grows on every watch
event, every connection state change (kazoo's listener, the start and end of a quiet period, connect and
close) and every write sent through ``writing`` (or counted with ``changed``); ``epoch`` grows on the
connection changes only. A read that noted ``generation`` before sending its requests is still current
while ``generation`` has not moved and the session is the same: every node it read carries a watch, and
any watch that fires moves the counter before the wakeup callback runs.

Authentication and TLS: ``ClientOptions`` carries ``auth_data`` (kazoo ``(scheme, credential)`` pairs)
and ``TlsOptions``; ``default_client_factory`` passes them to ``KazooClient``. Nodes are created with the
client's default ACL (open); restricting ACLs for authenticated clusters is left to a later change of
``default_client_factory`` (kazoo's ``default_acl``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import Callback, KazooState, WatchedEvent

from coordinator.errors import StoreUnavailable, StoreUnknownOutcome
from coordinator.store.base import ConnectionState, Wakeup
from coordinator.store.zk_security import NodeAcls, identity_words

__all__ = [
    "ClientFactory",
    "ClientOptions",
    "Deadline",
    "TlsOptions",
    "ZooKeeperSession",
    "client_arguments",
    "default_client_factory",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

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
    acls: NodeAcls | None = None  # None: nodes are created open (world:anyone, every permission)


ClientFactory = Callable[[ClientOptions], KazooClient]


def default_client_factory(options: ClientOptions) -> KazooClient:
    """A ``KazooClient`` that retries the connection forever with at most 1 s between attempts (kazoo's
    default backs off to an hour, far too long to come back after a Freeze)."""
    return KazooClient(**client_arguments(options))


def client_arguments(options: ClientOptions) -> dict[str, Any]:
    """The ``KazooClient`` arguments for ``options``: hosts, session timeout, auth, TLS, and a connection
    retried forever with at most 1 s between attempts."""
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
    return {
        "hosts": options.hosts,
        "timeout": options.session_timeout,
        "auth_data": list(options.auth_data) or None,
        "default_acl": list(options.acls.default) if options.acls is not None else None,
        "connection_retry": {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        **tls,
    }


def record_granted_timeout(client: KazooClient, record: Callable[[float], None]) -> None:
    """Call ``record`` with the session timeout (seconds) the server grants at each (re)connection.

    kazoo negotiates it in ``ConnectionHandler._connect`` and keeps only the read timeout it derives
    (two thirds of it), which ``_connect`` returns: wrapped here, on this client's handler alone. A kazoo
    whose handler has no such method leaves the value unknown (the agent then assumes the longest
    timeout the server may grant, see ``coordinator.snapshot.session_lapses_after``)."""
    handler = getattr(client, "_connection", None)
    original = getattr(handler, "_connect", None)
    if handler is None or original is None:
        log.warning("cannot learn the session timeout ZooKeeper grants from this kazoo version")
        return

    def connect(host: str, hostip: str, port: int) -> tuple[float, float]:
        read_timeout, connect_timeout = original(host, hostip, port)
        record(read_timeout * 1.5 / 1000.0)
        return read_timeout, connect_timeout

    handler._connect = connect


class Deadline:
    """A point in monotonic time, ``seconds`` from now: the budget of one store method."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._end - time.monotonic())


class ZooKeeperSession:
    """The kazoo client of one store and the rules of the module docstring.

    ``connection_state`` and ``set_wakeup`` are thread-safe; everything else is called from the agent
    loop only. ``operation_timeout`` bounds ``connect`` and ``close``, and is the budget of ``deadline``.
    """

    def __init__(self, options: ClientOptions, operation_timeout: float, client_factory: ClientFactory) -> None:
        self._options = options
        self._operation_timeout = operation_timeout
        self._client_factory = client_factory
        self._client: KazooClient | None = None
        self._state = ConnectionState.LOST
        self._wakeup = Wakeup()
        self._failures: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError)
        self._timeouts: tuple[type[BaseException], ...] = (KazooTimeoutError,)
        self._quiet_period = options.session_timeout * 2.0 / 3.0 + 0.5
        self._quiet_until = 0.0  # time.monotonic() before which nothing is sent (see module docstring)
        self._counters = threading.Lock()
        self._generation = 0  # see the module docstring
        self._epoch = 0
        self._granted: float | None = None  # the longest session timeout a server granted (seconds)
        # One bound method object, so that kazoo's per-path watcher sets hold it once.
        self.watch: Callable[[WatchedEvent], None] = self._on_watch

    # -- introspection --------------------------------------------------------------------------------

    @property
    def granted_timeout(self) -> float | None:
        """The longest session timeout a server granted this store's sessions, in seconds (None: none yet)."""
        return self._granted

    def _granted_by_server(self, seconds: float) -> None:
        if self._granted is None or seconds > self._granted:
            if seconds != self._options.session_timeout:
                log.warning("ZooKeeper granted a session timeout of %.1fs (asked for %.1fs): the agent times "
                            "its session by what was granted", seconds, self._options.session_timeout)
            self._granted = seconds

    @property
    def options(self) -> ClientOptions:
        return self._options

    @property
    def operation_timeout(self) -> float:
        return self._operation_timeout

    @property
    def client(self) -> KazooClient | None:
        """The kazoo client of the current connection, or None before ``connect`` and after ``close``."""
        return self._client

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or None while not connected."""
        client = self._client
        client_id = client.client_id if client is not None else None
        return client_id[0] if client_id is not None else None

    @property
    def connection_state(self) -> ConnectionState:
        """kazoo's state, except SUSPENDED during the quiet period that follows an unanswered request."""
        state = self._state
        quiet_until = self._quiet_until
        if state is ConnectionState.CONNECTED and quiet_until:
            if time.monotonic() < quiet_until:
                return ConnectionState.SUSPENDED
            self._end_quiet_period(quiet_until)
        return state

    @property
    def generation(self) -> int:
        """Grows whenever something read may have changed (see the module docstring). Thread-safe."""
        return self._generation

    @property
    def epoch(self) -> int:
        """Grows on every connection change (state, quiet period, connect, close). Thread-safe."""
        return self._epoch

    def changed(self, *, connection: bool = False) -> None:
        """Count a change: ``generation`` always, ``epoch`` too for a ``connection`` change. Thread-safe."""
        with self._counters:
            self._generation += 1
            if connection:
                self._epoch += 1

    def deadline(self) -> Deadline:
        """A fresh deadline of ``operation_timeout``: one per store method."""
        return Deadline(self._operation_timeout)

    # -- life cycle and signalling --------------------------------------------------------------------

    def connect(self, deadline: Deadline) -> KazooClient:
        """Build the client and connect it before ``deadline``. Raises ``StoreUnavailable`` (after
        closing the client) if it is not connected by then. Must not be called while a client exists."""
        client = self._client_factory(self._options)
        record_granted_timeout(client, self._granted_by_server)
        self._timeouts = (KazooTimeoutError, client.handler.timeout_exception)
        self._failures = (KazooException, *self._timeouts)
        self._quiet_until = 0.0

        def listener(state: str) -> None:
            # Runs on kazoo's connection thread: record and signal only.
            if self._client is client:
                self._state = _STATES.get(state, ConnectionState.SUSPENDED)
                self._quiet_until = 0.0  # kazoo has decided about the connection
                self.changed(connection=True)
                self.notify()

        client.add_listener(listener)
        self._client = client
        try:
            client.start_async().wait(deadline.remaining())
            if not client.connected:
                raise StoreUnavailable(
                    f"no ZooKeeper connection to {self._options.hosts} within {self._operation_timeout:.1f}s"
                )
        except BaseException:
            self.close()
            raise
        self._state = ConnectionState.CONNECTED
        self.changed(connection=True)
        return client

    def close(self) -> None:
        """Close the session (its ephemeral nodes vanish). Bounded by ``operation_timeout``; never raises."""
        client, self._client = self._client, None
        self._state = ConnectionState.LOST
        self.changed(connection=True)
        if client is None:
            return

        def close() -> None:
            try:
                client.stop()
                client.close()
            except Exception:  # the thread's boundary: close() must never raise
                log.warning("error while closing the ZooKeeper client", exc_info=True)

        # kazoo's stop() waits for the server's answer to the close request, up to max(10 s, session
        # timeout) when the server does not answer: do not let that hold the caller.
        closer = threading.Thread(target=close, name="zookeeper-store-close", daemon=True)
        closer.start()
        closer.join(self._operation_timeout)
        if closer.is_alive():
            log.warning("ZooKeeper client still closing after %.1fs; left to finish", self._operation_timeout)

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._wakeup.set(callback)

    def notify(self) -> None:
        """Fire the wakeup callback. Safe from kazoo's threads: never blocks, never raises."""
        self._wakeup.fire()

    def _on_watch(self, event: WatchedEvent) -> None:
        self.changed()
        self.notify()

    # -- requests -------------------------------------------------------------------------------------

    def connected(self, *, write: bool) -> tuple[KazooClient, int]:
        """The client and session id, if CONNECTED; otherwise raise without sending anything:
        ``StoreUnknownOutcome`` if ``write``, else ``StoreUnavailable``."""
        client = self._client
        client_id = client.client_id if client is not None else None
        state = self.connection_state
        if client is None or client_id is None or state is not ConnectionState.CONNECTED:
            state_name = state.value if client is not None else "not started"
            if write:
                raise StoreUnknownOutcome(f"ZooKeeper connection {state_name}: write not attempted")
            raise StoreUnavailable(f"ZooKeeper connection {state_name}")
        return client, client_id[0]

    def wait(self, result: IAsyncResult[_T], deadline: Deadline) -> _T:
        """The result of a request sent, or its exception, before ``deadline``. A request not answered by
        then raises kazoo's timeout exception and starts the quiet period."""
        try:
            return result.get(timeout=deadline.remaining())
        except self._timeouts:
            self._start_quiet_period(result)
            raise

    def watch_events_delivered(self, deadline: Deadline) -> None:
        """Return once every watch event that reached this client before now has been handed to its
        watcher. kazoo sets a request's result on its connection thread but runs watchers on another
        thread, in the order the events came: a marker queued behind them runs after them. So after a
        read has been answered, this makes sure that what the server told before that answer (the same
        transaction's other changes, for instance) has been counted. Raises ``StoreUnavailable`` if the
        watchers do not get there before ``deadline``."""
        client, _ = self.connected(write=False)
        delivered = threading.Event()
        client.handler.dispatch_callback(Callback("watch", delivered.set, ()))
        if not delivered.wait(deadline.remaining()):
            raise StoreUnavailable("ZooKeeper watch events are not being delivered in time")

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Turn kazoo failures (errors and timeouts) inside the block into ``StoreUnavailable``."""
        try:
            yield
        except self._failures as exc:
            raise StoreUnavailable(f"{what}: {self._describe(exc)}") from exc

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Turn kazoo failures (errors and timeouts) inside the block into ``StoreUnknownOutcome``. The
        block is counted as a change however it ends: what was read before may be stale now."""
        try:
            yield
        except self._failures as exc:
            raise StoreUnknownOutcome(f"{what}: {self._describe(exc)}") from exc
        finally:
            self.changed()

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, self._timeouts):
            return f"no answer from ZooKeeper within {self._operation_timeout:.1f}s"
        if isinstance(exc, NoAuthError):
            who = identity_words(self._options.auth_data, self._options.tls)
            return (f"ZooKeeper refused it: not authorised {who} (check zookeeper.auth and the ACL of the "
                    "group's nodes)")
        return f"{type(exc).__name__} {exc}".rstrip()

    def _start_quiet_period(self, unanswered: IAsyncResult[Any]) -> None:
        """A request got no answer in time: send nothing until kazoo has pinged (module docstring), or
        until that request is answered after all (the connection is alive, only slow)."""
        if self._state is not ConnectionState.CONNECTED:
            return
        self._quiet_until = time.monotonic() + self._quiet_period
        self.changed(connection=True)
        log.warning(
            "ZooKeeper did not answer within %.1fs: connection treated as suspended for up to %.1fs",
            self._operation_timeout,
            self._quiet_period,
        )
        unanswered.rawlink(self._on_late_answer)
        self.notify()

    def _on_late_answer(self, result: IAsyncResult[Any]) -> None:
        # Runs on kazoo's callback thread. A lost connection fails the request with one of these; any
        # other outcome is an answer from the server.
        if isinstance(result.exception, ConnectionLoss | SessionExpiredError) or self._quiet_until == 0.0:
            return
        self._quiet_until = 0.0
        self.changed(connection=True)
        log.info("ZooKeeper answered late: connection usable again")
        self.notify()

    def _end_quiet_period(self, quiet_until: float) -> None:
        """The quiet period ``quiet_until`` is over by the clock: count it as a connection change, once."""
        with self._counters:
            if self._quiet_until != quiet_until:
                return  # ended or restarted meanwhile
            self._quiet_until = 0.0
            self._generation += 1
            self._epoch += 1
