"""``coordinator.store.zk_nodes``: which kept answers a watch makes stale, without a server."""

from __future__ import annotations

from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from coordinator.store.zk_nodes import NodeCache, stale

EVENTS = "/g/events"
RECORD = "/g/events/E1"
ACKS = "/g/events/E1/acks"


def test_a_kept_list_is_stale_only_by_a_watch_on_its_own_path() -> None:
    """The list of events taken from the cache is not made stale by an ack under one of its records (the
    read is not made again for it); a memo of a record is, by anything under it."""
    assert not stale({EVENTS}, set(), frozenset({ACKS}))
    assert stale({EVENTS}, set(), frozenset({EVENTS}))
    assert stale({ACKS}, set(), frozenset({ACKS}))
    assert stale(set(), {RECORD}, frozenset({ACKS}))
    assert stale(set(), {RECORD}, frozenset({RECORD}))
    assert not stale(set(), {RECORD}, frozenset({"/g/events/E2/acks"}))
    assert not stale({EVENTS}, {RECORD}, frozenset())


def test_an_event_without_a_path_makes_everything_stale() -> None:
    assert stale({EVENTS}, set(), frozenset({"/"}))
    assert stale(set(), {RECORD}, frozenset({"/"}))


def test_a_watch_drops_the_answers_of_its_path_and_the_memos_above_it() -> None:
    cache = NodeCache()
    cache.begin((1, 0))
    cache.keep(("children", EVENTS), ["E1"])
    cache.keep(("children", ACKS), ["vm0"])
    cache.keep_memo(RECORD, "record")
    assert cache.end() == frozenset()
    cache.on_watch(WatchedEvent(EventType.CHILD, KeeperState.CONNECTED, ACKS))
    assert cache.get(("children", ACKS)) == (False, None)
    assert cache.memo(RECORD) == (False, None)
    assert cache.get(("children", EVENTS)) == (True, ["E1"])
