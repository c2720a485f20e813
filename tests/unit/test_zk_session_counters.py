"""The change counters of the ZooKeeper session (coordinator.store.zk_session), which the watched view relies
on: what moves ``generation`` and ``epoch``, and in which order with the wakeup. No server needed."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from coordinator.errors import StoreUnavailable, StoreUnknownOutcome
from coordinator.store import zk_session
from coordinator.store.base import ConnectionState
from coordinator.store.zk_session import ClientOptions, ZooKeeperSession


def session() -> ZooKeeperSession:
    def no_client(options: ClientOptions) -> Any:
        raise AssertionError("no client is built by these tests")

    return ZooKeeperSession(ClientOptions(hosts="127.0.0.1:1", session_timeout=3.0), 1.0, no_client)


class Unanswered:
    """A request that was never answered (what ``_start_quiet_period`` is given)."""

    def __init__(self) -> None:
        self.linked: list[Any] = []

    def rawlink(self, callback: Any) -> None:
        self.linked.append(callback)


def test_a_write_counts_as_a_change_however_it_ends_and_a_read_does_not() -> None:
    s = session()
    before = (s.generation, s.epoch)
    with s.reading("read"):
        pass
    with pytest.raises(StoreUnavailable), s.reading("read"):
        raise ConnectionLoss()
    assert (s.generation, s.epoch) == before

    with s.writing("write"):
        pass
    assert (s.generation, s.epoch) == (before[0] + 1, before[1])
    with pytest.raises(StoreUnknownOutcome), s.writing("write"):
        raise ConnectionLoss()
    assert (s.generation, s.epoch) == (before[0] + 2, before[1])


def test_a_watch_moves_the_generation_before_the_wakeup_runs() -> None:
    s = session()
    seen: list[tuple[int, int]] = []
    s.set_wakeup(lambda: seen.append((s.generation, s.epoch)))
    generation, epoch = s.generation, s.epoch
    s.watch(WatchedEvent(EventType.CHILD, KeeperState.CONNECTED, "/x"))
    assert seen == [(generation + 1, epoch)]


def test_a_connection_change_moves_both_counters() -> None:
    s = session()
    generation, epoch = s.generation, s.epoch
    s.changed(connection=True)
    assert (s.generation, s.epoch) == (generation + 1, epoch + 1)
    s.close()  # closing is a connection change too
    assert (s.generation, s.epoch) == (generation + 2, epoch + 2)


def test_the_quiet_period_counts_at_its_start_and_once_at_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    s = session()
    s._state = ConnectionState.CONNECTED  # as after connect(), without a server
    now = [1000.0]
    monkeypatch.setattr(zk_session.time, "monotonic", lambda: now[0])
    generation, epoch = s.generation, s.epoch

    s._start_quiet_period(Unanswered())  # type: ignore[arg-type]  # a stand-in: only rawlink is used
    assert s.connection_state is ConnectionState.SUSPENDED
    assert (s.generation, s.epoch) == (generation + 1, epoch + 1)

    now[0] += 3.0  # past 2/3 of the session timeout plus 0.5 s
    assert s.connection_state is ConnectionState.CONNECTED
    assert (s.generation, s.epoch) == (generation + 2, epoch + 2)
    assert s.connection_state is ConnectionState.CONNECTED
    assert (s.generation, s.epoch) == (generation + 2, epoch + 2)
