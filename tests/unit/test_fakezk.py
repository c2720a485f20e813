"""The fake ZooKeeper (``tests.fakezk``) against ZooKeeper's documented semantics.

Watches are one-shot and fire by type (https://zookeeper.apache.org/doc/current/zookeeperProgrammers.html,
"ZooKeeper Watches"): a data watch (``getData``, ``exists``) on a set or a delete, an ``exists`` watch on a
missing node on its creation, a child watch on a child's creation or deletion and on the node's deletion;
``getData`` and ``getChildren`` of a missing node set none. Versions count changes (``version`` the data's,
``cversion`` the children's); a multi is atomic. The scenarios of ``SCENARIOS`` also run against the real
server of the test session (marker ``zookeeper``), which checks the fake against ZooKeeper itself.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from coordinator.store.zk_session import ClientOptions
from tests.fakezk import FakeEnsemble

Events = list[tuple[str, str | None]]
_ids = itertools.count()


class Side:
    """Clients of one server (the fake, or the real one) under a root path of their own."""

    def __init__(self, make: Callable[[], Any], root: str, real: bool) -> None:
        self._make = make
        self.root = root
        self.real = real
        self.clients: list[Any] = []

    def client(self) -> Any:
        client = self._make()
        client.start(timeout=5.0)
        self.clients.append(client)
        return client

    def settle(self, events: Events, count: int) -> Events:
        """The events once ``count`` have come (the real client delivers them on another thread), plus a
        short wait on the real server so that an extra one would be seen."""
        if self.real:
            deadline = time.monotonic() + 5.0
            while len(events) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)
        return list(events)


def recorder(events: Events) -> Callable[[WatchedEvent], None]:
    def watch(event: WatchedEvent) -> None:
        events.append((event.type, event.path))
    return watch


def _data_watch_fires_once_on_set(side: Side) -> None:
    c = side.client()
    path = f"{side.root}/n"
    c.create(path, b"1", makepath=True)
    events: Events = []
    c.get(path, watch=recorder(events))
    c.set(path, b"2")
    c.set(path, b"3")  # one-shot: nothing more
    assert side.settle(events, 1) == [(EventType.CHANGED, path)]


def _exists_watch_on_missing_node_fires_on_create(side: Side) -> None:
    c, other = side.client(), side.client()
    c.ensure_path(side.root)
    path = f"{side.root}/n"
    events: Events = []
    missing: Events = []
    assert c.exists(path, watch=recorder(events)) is None
    with pytest.raises(NoNodeError):
        c.get(path, watch=recorder(missing))  # no watch set on a missing node
    other.create(path, b"")
    assert side.settle(events, 1) == [(EventType.CREATED, path)]
    assert missing == []


def _child_watch_rules(side: Side) -> None:
    c, other = side.client(), side.client()
    parent = f"{side.root}/p"
    c.create(parent, b"", makepath=True)
    events: Events = []
    c.get_children(parent, watch=recorder(events))
    other.create(f"{parent}/a", b"")
    assert side.settle(events, 1) == [(EventType.CHILD, parent)]
    c.get_children(parent, watch=recorder(events))
    other.set(f"{parent}/a", b"x")  # a child's data is no change of the list
    other.delete(f"{parent}/a")
    assert side.settle(events, 2) == [(EventType.CHILD, parent), (EventType.CHILD, parent)]
    both: Events = []
    watch = recorder(both)
    c.get_children(parent, watch=watch)
    c.get(parent, watch=watch)
    other.delete(parent)  # the node's own deletion: DELETED to both (kazoo calls such a watcher twice)
    assert side.settle(both, 2) == [(EventType.DELETED, parent), (EventType.DELETED, parent)]


def _versions_and_errors(side: Side) -> None:
    c = side.client()
    parent = f"{side.root}/v"
    c.create(parent, b"", makepath=True)
    before = c.exists(parent)
    c.create(f"{parent}/a", b"")
    c.delete(f"{parent}/a")
    after = c.exists(parent)
    assert (after.cversion - before.cversion, after.version, after.numChildren) == (2, 0, 0)
    stat = c.set(parent, b"x", version=0)
    assert stat.version == 1 and stat.mzxid > stat.czxid
    with pytest.raises(BadVersionError):
        c.set(parent, b"y", version=0)
    with pytest.raises(NodeExistsError):
        c.create(parent, b"")
    with pytest.raises(NoNodeError):
        c.create(f"{side.root}/missing/child", b"")
    c.create(f"{parent}/b", b"")
    with pytest.raises(NotEmptyError):
        c.delete(parent)
    with pytest.raises(BadVersionError):
        c.delete(f"{parent}/b", version=3)
    c.create(f"{parent}/e", b"", ephemeral=True)
    with pytest.raises(NoChildrenForEphemeralsError):
        c.create(f"{parent}/e/child", b"")
    assert c.exists(f"{parent}/e").ephemeralOwner == c.client_id[0]


def _transaction_all_or_nothing(side: Side) -> None:
    c, other = side.client(), side.client()
    path = f"{side.root}/t"
    c.create(path, b"", makepath=True)
    c.create(f"{path}/taken", b"")
    events: Events = []
    other.get(path, watch=recorder(events))
    other.get_children(path, watch=recorder(events))
    tx = c.transaction()
    tx.set_data(path, b"x", version=0)
    tx.create(f"{path}/taken", b"")
    tx.create(f"{path}/new", b"")
    results = tx.commit()
    assert [type(r) for r in results] == [RolledBackError, NodeExistsError, RuntimeInconsistency]
    data, stat = c.get(path)
    assert (data, stat.version, sorted(c.get_children(path))) == (b"", 0, ["taken"])
    tx = c.transaction()
    tx.set_data(path, b"y", version=0)
    tx.create(f"{path}/new", b"")
    tx.delete(f"{path}/taken")
    results = tx.commit()
    assert results[0].version == 1 and results[1:] == [f"{path}/new", True]
    new, taken = c.exists(f"{path}/new"), c.get(path)[1]
    assert new.czxid == taken.mzxid  # one zxid for the whole transaction
    assert sorted(side.settle(events, 2)) == sorted([(EventType.CHANGED, path), (EventType.CHILD, path)])


SCENARIOS = [
    _data_watch_fires_once_on_set,
    _exists_watch_on_missing_node_fires_on_create,
    _child_watch_rules,
    _versions_and_errors,
    _transaction_all_or_nothing,
]


@pytest.fixture(params=["fake", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "fake":
        link = FakeEnsemble().link()
        made = Side(lambda: link(ClientOptions("fake:2181", 10.0)), f"/tests/{next(_ids)}", real=False)
    else:
        hosts: str = request.getfixturevalue("zk_hosts")
        made = Side(lambda: KazooClient(hosts=hosts, timeout=10.0), request.getfixturevalue("zk_chroot"), real=True)
    try:
        yield made
    finally:
        for client in made.clients:
            client.stop()
            client.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__.strip("_"))
def test_semantics(side: Side, scenario: Callable[[Side], None]) -> None:
    scenario(side)


# -- sessions and connection faults (the fake's controls; the real server's are in test_zookeeper_store.py) --


def test_expiry_deletes_ephemerals_fires_watches_and_reconnects_with_a_new_session() -> None:
    ensemble = FakeEnsemble()
    link, watcher_link = ensemble.link(), ensemble.link()
    c = link(ClientOptions("fake:2181", 10.0))
    w = watcher_link(ClientOptions("fake:2181", 10.0))
    states: list[str] = []
    c.add_listener(states.append)
    c.start()
    w.start()
    c.create("/e", b"", ephemeral=True)
    events: Events = []
    w.exists("/e", watch=recorder(events))
    old = c.client_id[0]
    ensemble.expire(old)
    assert events == [(EventType.DELETED, "/e")]
    assert states == [KazooState.CONNECTED, KazooState.SUSPENDED, KazooState.LOST, KazooState.CONNECTED]
    assert c.client_id[0] != old and c.exists("/e") is None


def test_cut_link_suspends_keeps_the_session_and_expires_it_on_the_ensembles_clock() -> None:
    now = [100.0]
    ensemble = FakeEnsemble(clock=lambda: now[0])
    link = ensemble.link()
    c = link(ClientOptions("fake:2181", 10.0))
    states: list[str] = []
    c.add_listener(states.append)
    c.start()
    c.create("/e", b"", ephemeral=True)
    events: Events = []
    c.get("/e", watch=recorder(events))
    session = c.client_id[0]
    link.cut()
    assert states[-1] == KazooState.SUSPENDED
    assert events == [(EventType.NONE, None)]  # kazoo tells and drops its watchers on a connection loss
    with pytest.raises(ConnectionLoss):
        c.get("/e")
    link.restore()
    assert states[-1] == KazooState.CONNECTED and c.client_id[0] == session and c.exists("/e") is not None
    link.cut()
    now[0] += 9.0
    assert ensemble.expire_silent() == [] and ensemble.get("/e") is not None
    now[0] += 1.0
    assert ensemble.expire_silent() == [session] and ensemble.get("/e") is None
    link.restore()
    assert states[-2:] == [KazooState.LOST, KazooState.CONNECTED] and c.client_id[0] != session


def test_granted_session_timeout_is_what_the_ensemble_grants() -> None:
    from coordinator.store.zookeeper import ZooKeeperStore

    ensemble = FakeEnsemble()
    ensemble.granted_session = 20.0
    store = ZooKeeperStore("fake:2181", "/coordinator", "alpha", session_timeout=30.0, client_factory=ensemble.link())
    store.start()
    try:
        assert store.granted_session_timeout == 20.0
    finally:
        store.stop()
