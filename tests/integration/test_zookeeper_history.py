"""The move of finished records to ``/history`` on a real ZooKeeper server (``coordinator.store.zk_history``):
what moves, what stays, and what the history keeps."""

from __future__ import annotations

import time

from coordinator.store.base import EventRecord, WriteResult
from coordinator.store.payloads import EventNode
from coordinator.store.zk_history import LIST_EVERY
from coordinator.store.zk_paths import history_name
from tests.integration.test_zookeeper_store import raw_client as raw
from tests.plugins.zookeeper import StoreMaker

EVENT = "C7E9D5B4-7F3A-4E2B-9D1C-0A1B2C3D4E5F"
OTHER = "D8FAE6C5-803B-4F3C-AE2D-1B2C3D4E5F60"
T0 = 1_700_000_000.0


def record(event_id: str = EVENT) -> EventRecord:
    return EventRecord(event_id=event_id, event_type="Freeze", resources=("vm-a", "vm-b"), not_before=T0 + 60,
                       published_by="vm-a", published_at=T0)


def test_a_done_record_moves_with_its_data_and_takes_an_orphan_ack_along(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The record leaves ``/events`` whole (an ack another session still holds goes with it: no ``/out``
    mark names the event, so its VM serves already) and is kept in ``/history`` as it was, named by when it
    was done; the agents' view no longer lists it, ``read_history`` does."""
    leader, other = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    leader.join("vm-a", {})
    other.join("vm-b", {})
    assert leader.publish_event(record()) is WriteResult.DONE
    assert other.acknowledge(EVENT, "vm-b", T0 + 1) is WriteResult.DONE
    assert leader.admit(EVENT, "vm-a", T0 + 2) is WriteResult.DONE
    assert leader.mark_done(EVENT, T0 + 30, started_at=T0 + 10) is WriteResult.DONE
    assert EVENT in leader.read_view("vm-a").records  # the view the move starts from
    data_before = raw(leader).get(f"{leader.base_path}/events/{EVENT}")[0]

    assert leader.archive_done([EVENT.lower()], older_than=T0 - 1) == 1
    client, base = raw(leader), leader.base_path
    assert client.exists(f"{base}/events/{EVENT}") is None
    assert client.get_children(f"{base}/history") == [history_name(T0 + 30, EVENT)]
    assert client.get(f"{base}/history/{history_name(T0 + 30, EVENT)}")[0] == data_before
    assert EVENT not in leader.read_view("vm-a").records
    kept = leader.read_history()[EVENT]
    assert (kept.done_at, kept.started_at, kept.resources) == (T0 + 30, T0 + 10, ("vm-a", "vm-b"))
    assert kept.closed is not None and (kept.closed.admitted_at, kept.closed.admitted_by) == (T0 + 2, "vm-a")
    # Moved already: asking again moves nothing.
    assert leader.archive_done([EVENT], older_than=T0 - 1) == 0


def test_an_open_or_reopened_record_stays_and_the_history_forgets_what_is_past_the_retention(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    for event_id in (EVENT, OTHER):
        assert store.publish_event(record(event_id)) is WriteResult.DONE
    assert store.mark_done(OTHER, T0 + 5) is WriteResult.DONE
    store.read_view("vm-a")
    assert store.reopen(OTHER) is WriteResult.DONE  # it came back after the leader's view had it done
    assert store.archive_done([EVENT, OTHER], older_than=T0 - 1) == 0
    assert set(store.read_view("vm-a").records) == {EVENT, OTHER}

    assert store.mark_done(OTHER, T0 + 6) is WriteResult.DONE
    assert store.archive_done([OTHER], older_than=T0 - 1) == 1
    assert store.mark_done(EVENT, T0 + 100) is WriteResult.DONE
    # The entries done before ``older_than`` go, told by their names, when the history is next listed: at
    # most every ``LIST_EVERY`` seconds (the first move listed it), so not with this move but an hour on.
    assert store.archive_done([EVENT], older_than=T0 + 50) == 1
    assert len(raw(store).get_children(f"{store.base_path}/history")) == 2
    store._keeping.listed_at = time.monotonic() - LIST_EVERY
    assert store.archive_done([], older_than=T0 + 50) == 0
    assert raw(store).get_children(f"{store.base_path}/history") == [history_name(T0 + 100, EVENT)]
    assert set(store.read_history()) == {EVENT}
    assert store.read_history(since=T0 + 101) == {}


def test_an_event_done_twice_is_kept_twice_and_read_as_its_latest(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """An event id seen again (a flap after its record was moved: published again as a new record) keeps
    one entry per time it was done; the history reads the latest; the group made by an earlier version,
    without ``/history``, gets it with the first move."""
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    raw(store).delete(f"{store.base_path}/history")
    for done_at in (T0 + 10, T0 + 20):
        assert store.publish_event(record()) is WriteResult.DONE
        assert store.mark_done(EVENT, done_at) is WriteResult.DONE
        assert store.archive_done([EVENT], older_than=T0 - 1) == 1
    assert sorted(raw(store).get_children(f"{store.base_path}/history")) == [
        history_name(T0 + 10, EVENT), history_name(T0 + 20, EVENT)]
    assert store.read_history()[EVENT].done_at == T0 + 20
    node = EventNode.from_bytes(raw(store).get(f"{store.base_path}/history/{history_name(T0 + 10, EVENT)}")[0], "h")
    assert node.done_at == T0 + 10
