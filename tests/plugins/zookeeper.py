"""ZooKeeper fixtures (see coordinator.testbed.zookeeper).

* ``zk_server`` (session): one real ZooKeeper server for the whole test session, tickTime 500 ms so
  that sessions can be short, maxSessionTimeout 60 s.
* ``zk_hosts`` / ``zk_chroot`` (function): the connection string, and a root path unique to the test
  (removed afterwards), so tests sharing the server never see each other's nodes.
* ``zk_server_factory`` (function): starts private servers for tests that pause or kill them.
* ``zk_ensemble`` (function): a private three-server ensemble on 127.0.0.1.
* ``zk_tls_server`` (session): a TLS-only server (client certificates required) with its throw-away
  PKI (``server.tls.pki``: client certificates ``agent``, ``operator``, ``reader`` and ``stranger``); its
  certificate names 127.0.0.1 only.

Tests that use these fixtures get the ``zookeeper`` marker. When ZooKeeper's jars or java are missing the
test is skipped, or fails if the ``CI`` environment variable is set: CI must run the real thing.

Helpers: ``expire_session`` (real, server-side expiry), ``wait_until`` (poll a condition with a deadline).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest
from kazoo.client import KazooClient

from coordinator.store.zookeeper import ClientFactory, ZooKeeperStore, default_client_factory
from coordinator.testbed.certs import make_pki
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper, ServerTls, find_classpath

__all__ = ["expire_session", "wait_until"]

_T = TypeVar("_T")
log = logging.getLogger(__name__)

TICK_TIME_MS = 500
MAX_SESSION_TIMEOUT_MS = 60_000
_FIXTURES = ("zk_server", "zk_hosts", "zk_chroot", "zk_server_factory", "zk_ensemble", "zk_tls_server")
_counter = itertools.count(1)


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"ZooKeeper is required in CI: {reason}", pytrace=False)
    pytest.skip(f"ZooKeeper not available: {reason}")


def _check_prerequisites() -> None:
    if shutil.which("java") is None:
        _unavailable("no 'java' on PATH ('apt-get install zookeeper' pulls in a Java runtime)")
    try:
        find_classpath()
    except RuntimeError as exc:
        _unavailable(str(exc))


def _start(data_dir: Path, tls: ServerTls | None = None) -> LocalZooKeeper:
    _check_prerequisites()
    if tls is not None:
        try:
            find_classpath(tls=True)
        except RuntimeError as exc:
            _unavailable(str(exc))
    server = LocalZooKeeper(data_dir, tick_time_ms=TICK_TIME_MS, max_session_timeout_ms=MAX_SESSION_TIMEOUT_MS,
                            tls=tls)
    try:
        server.start(timeout=30)
    except RuntimeError as exc:
        # java and the jars are there: a server that does not start is a failure, never a skip.
        pytest.fail(f"ZooKeeper did not start: {exc}", pytrace=False)
    return server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in _FIXTURES):
            item.add_marker(pytest.mark.zookeeper)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    server = _start(tmp_path_factory.mktemp("zookeeper"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    directory = tmp_path_factory.mktemp("zookeeper-tls")
    try:
        # The address only, not the name localhost: a test reaches it as localhost to see hostname checks.
        pki = make_pki(directory / "pki", clients=("agent", "operator", "reader", "stranger"),
                       server_names=("IP:127.0.0.1",))
    except RuntimeError as exc:
        _unavailable(str(exc))
    server = _start(directory / "server", ServerTls(pki))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return zk_server.hosts


@pytest.fixture
def zk_chroot(zk_hosts: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A root path no other test uses, deleted (with everything below it) after the test."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    root = f"/tests/{next(_counter):04d}-{name or 'test'}"
    yield root
    client = KazooClient(hosts=zk_hosts, timeout=5.0)
    try:
        client.start(timeout=5.0)
        client.delete(root, recursive=True)
    except Exception as exc:  # cleanup only: a leftover path under /tests harms nobody
        log.warning("could not remove %s: %r", root, exc)
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk_server_factory(tmp_path: Path) -> Iterator[Callable[[], LocalZooKeeper]]:
    """Start private servers (stopped, and continued first if paused, at teardown)."""
    servers: list[LocalZooKeeper] = []

    def start() -> LocalZooKeeper:
        server = _start(tmp_path / f"zookeeper-{len(servers)}")
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def zk_ensemble(tmp_path: Path) -> Iterator[LocalEnsemble]:
    """Three servers (ids 1-3, indexes 0-2) that have reached a quorum; stopped at teardown."""
    _check_prerequisites()
    ensemble = LocalEnsemble(
        tmp_path / "ensemble", 3, tick_time_ms=TICK_TIME_MS, max_session_timeout_ms=MAX_SESSION_TIMEOUT_MS
    )
    try:
        ensemble.start(timeout=30)
    except RuntimeError as exc:
        pytest.fail(f"the ZooKeeper ensemble did not start: {exc}", pytrace=False)
    try:
        yield ensemble
    finally:
        ensemble.stop()


def wait_until(condition: Callable[[], _T], *, timeout: float = 10.0, interval: float = 0.02, message: str = "") -> _T:
    """Poll ``condition`` until it returns something truthy and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"condition not met within {timeout:.1f}s: {message or condition!r}")
        time.sleep(interval)


def expire_session(target: KazooClient | ZooKeeperStore, *, timeout: float = 10.0) -> int:
    """Expire the session of ``target`` on the server, for real, and return the expired session id.

    A second client attaches to the same session (id and password) and closes it: the server ends the
    session and deletes its ephemeral nodes at once (kazoo's test harness only fakes expiry on the client
    side). Waits until ``target`` itself no longer reports that session.
    """
    client = target.client if isinstance(target, ZooKeeperStore) else target
    if client is None or client.client_id is None:
        raise RuntimeError("the client is not connected: no session to expire")
    session_id, password = client.client_id
    hosts = ",".join(f"{host}:{port}" for host, port in client.hosts)
    duplicate = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=5.0)
    try:
        duplicate.start(timeout=timeout)
    finally:
        duplicate.stop()
        duplicate.close()
    wait_until(
        lambda: client.client_id is None or client.client_id[0] != session_id,
        timeout=timeout,
        message=f"client to notice that session 0x{session_id:x} expired",
    )
    return session_id


StoreMaker = Callable[..., ZooKeeperStore]


@pytest.fixture
def make_store() -> Iterator[StoreMaker]:
    """Build and start stores; every one is stopped at the end of the test."""
    stores: list[ZooKeeperStore] = []

    def make(
        hosts: str,
        root: str,
        cluster: str = "alpha",
        *,
        session_timeout: float = 4.0,
        operation_timeout: float = 3.0,
        client_factory: ClientFactory = default_client_factory,
        ack_times: bool = False,
    ) -> ZooKeeperStore:
        store = ZooKeeperStore(
            hosts,
            root,
            cluster,
            session_timeout=session_timeout,
            operation_timeout=operation_timeout,
            client_factory=client_factory,
            ack_times=ack_times,
        )
        store.start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.stop()
