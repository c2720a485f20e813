"""The session timeout a ZooKeeper server really grants, learnt from a real server.

ZooKeeper grants at least ``minSessionTimeout`` (two ticks by default) whatever the client asks for, and
kazoo keeps only a read timeout derived from it. The store records the granted value at every connection
(``Store.granted_session_timeout``) and the decision times a cut-off session by it
(``coordinator.snapshot.session_lapses_after``): an agent that trusted its configured timeout would serve
again while its acks still stood on the server.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.snapshot import Policy, session_lapses_after
from coordinator.store.zookeeper import ZooKeeperStore
from coordinator.testbed.zookeeper import LocalZooKeeper

pytestmark = pytest.mark.zookeeper


def _server(tmp_path: Path, tick_ms: int) -> LocalZooKeeper:
    server = LocalZooKeeper(tmp_path / f"zk-tick-{tick_ms}", tick_time_ms=tick_ms,
                            max_session_timeout_ms=20 * tick_ms)
    server.start(timeout=30)
    return server


def test_a_server_with_a_3s_tick_grants_6s_to_an_agent_asking_for_4s(tmp_path: Path) -> None:
    server = _server(tmp_path, 3000)
    store = ZooKeeperStore(server.hosts, "/timing", "alpha", session_timeout=4.0, operation_timeout=3.0)
    try:
        assert store.granted_session_timeout is None
        store.start()
        store.join("vm0", {})
        assert store.granted_session_timeout == pytest.approx(6.0)
        policy = Policy(session_timeout=4.0, zk_tick=3.0)
        assert session_lapses_after(policy, store.granted_session_timeout) == pytest.approx(9.0)
    finally:
        store.stop()
        server.stop()


def test_a_server_that_grants_what_was_asked_reports_it(tmp_path: Path) -> None:
    server = _server(tmp_path, 500)
    store = ZooKeeperStore(server.hosts, "/timing", "alpha", session_timeout=5.0, operation_timeout=3.0)
    try:
        store.start()
        deadline = time.monotonic() + 5
        while store.granted_session_timeout is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.granted_session_timeout == pytest.approx(5.0)
    finally:
        store.stop()
        server.stop()
