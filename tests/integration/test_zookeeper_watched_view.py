"""The watched view of the ZooKeeper store (coordinator.store.zk_watch), against a real ZooKeeper.

Requests are counted by the server itself: ``cons`` shows, per session, the xid of the last request it
answered (``lcxid``); pings do not move it, so its growth is the number of requests the client sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import Callback

from coordinator.errors import DuplicateMember, StoreUnavailable, StoreUnknownOutcome
from coordinator.store.base import ApprovalOutcome, ClusterView, ConnectionState, EventRecord, WriteResult
from coordinator.store.zookeeper import ClientOptions, ZooKeeperStore
from coordinator.testbed.zookeeper import ConnectionStats, LocalZooKeeper
from tests.doubles import member_identity
from tests.plugins.zookeeper import StoreMaker, expire_session, wait_until

EVENT = "3F2A9C51-7B1D-4E8A-9C2B-5D6E7F8A9B01"
OTHER = "3F2A9C51-7B1D-4E8A-9C2B-5D6E7F8A9B02"
T0 = 1_700_000_000.0
SEEN_WITHIN = 5.0  # seconds for a watch to reach the reader: a round trip on the loopback, under load


def record(event_id: str = EVENT, resources: tuple[str, ...] = ("vm-a", "vm-b")) -> EventRecord:
    return EventRecord(
        event_id=event_id,
        event_type="Reboot",
        resources=resources,
        not_before=T0 + 900,
        published_by="vm-b",
        published_at=T0,
    )


def stats(server: LocalZooKeeper, store: ZooKeeperStore) -> ConnectionStats:
    """What the server says of this store's connection."""
    session_id = store.session_id
    assert session_id is not None
    return server.connection_stats()[session_id]


def requests_sent(server: LocalZooKeeper, store: ZooKeeperStore) -> int:
    """The xid of the last request the server answered for this store's session (see module docstring)."""
    return stats(server, store).lcxid


def cycle(store: ZooKeeperStore, vm: str, info: dict[str, object]) -> ClusterView:
    """What the agent loop asks of the store every cycle (the member info as a leader's peer probes do)."""
    store.join(vm, info)
    store.campaign(vm)
    view = store.read_view(vm)
    store.member_info(view.members - {vm})
    return view


def all_told(store: ZooKeeperStore) -> None:
    """Every watch event the server sent this store before now has been handed to its watchers: a ``sync``
    on the store's own connection is answered after them. A change that fires two watches (a deleted ack
    fires the ack's and its list's) can otherwise be read between the two events; the read then finds the
    list it took from the cache stale and is made again, one request more than the change's cost (the rule
    of ``coordinator/store/zk_nodes.py``, as meant)."""
    client = store._session.client
    assert client is not None
    client.sync("/")
    store._session.watch_events_delivered(store._session.deadline())


def eventually(store: ZooKeeperStore, vm: str, condition: Callable[[ClusterView], bool], what: str) -> ClusterView:
    """The first view of ``store`` for which ``condition`` holds, polled until ``SEEN_WITHIN``."""
    view: ClusterView = wait_until(
        lambda: (lambda v: v if condition(v) else None)(store.read_view(vm)), timeout=SEEN_WITHIN, message=what
    )
    return view


# -- an idle agent ------------------------------------------------------------------------------------


def test_an_idle_agent_sends_no_request_at_all(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b = make_store(zk_server.hosts, zk_chroot), make_store(zk_server.hosts, zk_chroot)
    b.join("vm-b", {"probe": "http://10.0.0.5:8090/health"})
    b.publish_event(record())
    b.acknowledge(EVENT, "vm-b", T0)
    b.mark_out("vm-b", (EVENT,), T0)
    b.mark_absent("vm-c", T0)
    info: dict[str, object] = {"probe": "http://10.0.0.4:8090/health", "version": "1"}
    cycle(a, "vm-a", info)  # joins and campaigns: writes, then one full read
    cycle(a, "vm-a", info)

    before = stats(zk_server, a)
    views = []
    for _ in range(20):
        views.append(cycle(a, "vm-a", info))
        time.sleep(0.25)
    after = stats(zk_server, a)

    assert after.lcxid - before.lcxid == 0, f"{after.lcxid - before.lcxid} requests in 20 idle rounds"
    assert after.recved > before.recved  # the measure is live: kazoo's pings reached the server meanwhile
    assert after.lop == "PING"
    view = views[-1]
    assert (view.members, view.leader, view.i_am_leader) == ({"vm-a", "vm-b"}, "vm-a", True)
    assert view.connection is ConnectionState.CONNECTED
    assert set(view.records[EVENT].acks) == {"vm-b"}
    assert view.out["vm-b"].events == (EVENT,)
    assert view.absent_since == {"vm-c": T0}
    assert a.join("vm-a", {}) is WriteResult.EXISTS
    assert a.campaign("vm-a") is True
    assert a.member_info(["vm-b"]) == {"vm-b": {"vm": "vm-b", "probe": "http://10.0.0.5:8090/health"}}
    assert requests_sent(zk_server, a) == after.lcxid

    # The same count moves as soon as something changes: one read, then idle again.
    b.acknowledge(EVENT, "vm-a", T0 + 1)
    eventually(a, "vm-a", lambda v: "vm-a" in v.records[EVENT].acks, "the new ack")
    reread = requests_sent(zk_server, a)
    assert reread > after.lcxid
    for _ in range(5):
        cycle(a, "vm-a", info)
    assert requests_sent(zk_server, a) == reread


def test_a_change_outside_membership_costs_one_view_read_and_no_write(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    """Another VM's ack makes the next cycle read the view again, but join and campaign still answer
    from what they saw: no request of theirs, and no write at all (a create that fails on an existing
    node would still cost the ensemble a transaction, as ``srvr``'s zxid shows)."""
    a, b = make_store(zk_server.hosts, zk_chroot), make_store(zk_server.hosts, zk_chroot)
    b.join("vm-b", {})
    b.publish_event(record())
    info: dict[str, object] = {"version": "1"}
    cycle(a, "vm-a", info)
    cycle(a, "vm-a", info)
    a.read_view("vm-a")
    reads_only_view = requests_sent(zk_server, a)
    a.join("vm-a", info)
    a.campaign("vm-a")
    assert requests_sent(zk_server, a) == reads_only_view

    woken = threading.Event()
    a.set_wakeup(woken.set)
    b.acknowledge(EVENT, "vm-b", T0)
    assert woken.wait(SEEN_WITHIN), "the ack's watch never reached a"  # a's view is stale now
    before, zxid = requests_sent(zk_server, a), zk_server.zxid()
    assert a.join("vm-a", info) is WriteResult.EXISTS
    assert a.campaign("vm-a") is True
    assert requests_sent(zk_server, a) == before
    view = a.read_view("vm-a")
    assert view.members == {"vm-a", "vm-b"} and "vm-b" in view.records[EVENT].acks
    assert requests_sent(zk_server, a) > before  # the view itself was read again
    assert zk_server.zxid() == zxid  # nothing written by a's cycle


def test_a_returned_view_is_not_shared_member_info_either(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a = make_store(zk_hosts, zk_chroot)
    a.join("vm-a", {"probe": "http://10.0.0.4:8090/health", "placement": {"zone": "1"}})
    first = a.member_info(["vm-a"])
    first["vm-a"]["probe"] = "changed by the caller"
    placement = first["vm-a"]["placement"]
    assert isinstance(placement, dict)
    placement["zone"] = "2"
    assert a.member_info(["vm-a"]) == {
        "vm-a": {"vm": "vm-a", "probe": "http://10.0.0.4:8090/health", "placement": {"zone": "1"}}
    }


# -- changes made by others ---------------------------------------------------------------------------


def test_every_change_by_another_store_is_seen_by_the_next_read_after_its_watch(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b, c = (make_store(zk_hosts, zk_chroot) for _ in range(3))
    a.join("vm-a", {})
    b.join("vm-b", {"probe": "http://10.0.0.5:8090/health"})
    assert b.campaign("vm-b") is True
    view = a.read_view("vm-a")
    assert (view.members, view.leader) == ({"vm-a", "vm-b"}, "vm-b")
    assert a.member_info(["vm-b"])["vm-b"]["probe"] == "http://10.0.0.5:8090/health"

    b.publish_event(record())
    eventually(a, "vm-a", lambda v: EVENT in v.records, "a new event record")
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    eventually(a, "vm-a", lambda v: set(v.records[EVENT].acks) == {"vm-b"}, "an ack")
    b.admit(EVENT, "vm-b", T0 + 2)
    eventually(a, "vm-a", lambda v: v.records[EVENT].admitted_at == T0 + 2, "an admission")
    b.withdraw_ack(EVENT, "vm-b")
    eventually(a, "vm-a", lambda v: v.records[EVENT].acks == {}, "a withdrawn ack")
    b.acknowledge(EVENT, "vm-b", T0 + 3)
    a.acknowledge(EVENT, "vm-a", T0 + 3)  # a's own session: it outlives b
    assert b.approve(EVENT, "vm-b", ["vm-a", "vm-b"], as_leader=True, at=T0 + 4).outcome is ApprovalOutcome.APPROVED
    eventually(a, "vm-a", lambda v: v.records[EVENT].approval is not None, "an approval")
    b.mark_done(EVENT, T0 + 5)  # rewrites the record's data, deletes approval and admitted
    eventually(a, "vm-a", lambda v: v.records[EVENT].done_at == T0 + 5 and v.records[EVENT].approval is None,
               "a record marked done")
    b.reopen(EVENT)
    eventually(a, "vm-a", lambda v: v.records[EVENT].done_at is None, "a record reopened")

    b.mark_out("vm-b", (EVENT,), T0 + 6)
    eventually(a, "vm-a", lambda v: "vm-b" in v.out and v.out["vm-b"].events == (EVENT,), "an out node")
    b.mark_out("vm-b", (EVENT, OTHER), T0 + 7)  # the same node, rewritten
    eventually(a, "vm-a", lambda v: v.out["vm-b"].events == (EVENT, OTHER), "an out node rewritten")
    b.clear_out("vm-b")
    eventually(a, "vm-a", lambda v: v.out == {}, "an out node cleared")

    b.mark_absent("vm-z", T0 + 8)
    eventually(a, "vm-a", lambda v: v.absent_since == {"vm-z": T0 + 8}, "an absence")
    b.clear_absent("vm-z")
    eventually(a, "vm-a", lambda v: v.absent_since == {}, "an absence cleared")

    c.join("vm-c", {})
    eventually(a, "vm-a", lambda v: v.members == {"vm-a", "vm-b", "vm-c"} and "vm-c" in v.known, "a new member")
    b.stop()  # the leader and a member leave; its acks go with its session
    view = eventually(a, "vm-a", lambda v: v.members == {"vm-a", "vm-c"} and v.leader is None, "a member leaving")
    assert set(view.records[EVENT].acks) == {"vm-a"}
    assert view.known == {"vm-a", "vm-b", "vm-c"}
    assert c.campaign("vm-c") is True
    eventually(a, "vm-a", lambda v: v.leader == "vm-c" and not v.i_am_leader, "a new leader")
    assert a.campaign("vm-a") is False  # answered from the view: vm-c leads

    # vm-b comes back elsewhere: its new member info replaces what was kept.
    b_again = make_store(zk_hosts, zk_chroot)
    b_again.join("vm-b", {"probe": "http://10.0.0.9:8090/health"})
    wait_until(lambda: a.member_info(["vm-b"]).get("vm-b", {}).get("probe") == "http://10.0.0.9:8090/health",
               timeout=SEEN_WITHIN, message="the new member info of vm-b")


def a_sees_b_acked(a: ZooKeeperStore, b: ZooKeeperStore) -> None:
    """vm-a and vm-b join, b publishes EVENT and acks it, and a's view shows the ack (kept in its cache)."""
    a.join("vm-a", {})
    b.join("vm-b", {})
    b.publish_event(record())
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    eventually(a, "vm-a", lambda v: set(v.records[EVENT].acks) == {"vm-b"} if EVENT in v.records else False,
               "b's ack")


def test_a_kept_record_whose_watch_event_is_still_on_its_way_is_read_again(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """kazoo answers reads on its connection thread and runs watchers on another: a read can be answered
    before the watcher has counted an event the server sent earlier. A record kept from an older read
    must not then be served beside lists that are newer than it."""
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    a_sees_b_acked(a, b)
    session = a._session  # the test holds a's watcher thread, as a busy machine can
    client, _ = session.connected(write=False)
    held = threading.Event()
    client.handler.dispatch_callback(Callback("watch", held.wait, (10.0,)))
    try:
        b.withdraw_ack(EVENT, "vm-b")
        time.sleep(0.5)  # the watch event has reached a's client and waits behind the held watcher thread
        session.changed()  # something else moved, so the next read_view reads the lists again
        threading.Timer(0.5, held.set).start()
        view = a.read_view("vm-a")
    finally:
        held.set()
    assert view.records[EVENT].acks == {}


def test_a_leader_taken_from_a_store_is_seen_by_its_campaign(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    assert a.campaign("vm-a") is True
    assert a.read_view("vm-a").i_am_leader is True
    assert a.campaign("vm-a") is True  # answered from the view
    a_client = a.client
    assert a_client is not None
    a_client.delete(f"{a.base_path}/leader")  # by hand, behind the store's back
    b.campaign("vm-b")
    wait_until(lambda: a.campaign("vm-a") is False, timeout=SEEN_WITHIN, message="a to see that vm-b leads")
    view = a.read_view("vm-a")
    assert (view.leader, view.i_am_leader) == ("vm-b", False)


def test_join_sees_that_another_session_took_the_member_node(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The VM's agent restarted while its old session lingers (both stores say they are processes of this
    host that have ended, the new one started later): the new one takes the node. The old store's view
    still lists the VM, but the node is not this session's any more, so join does its work again, and is
    refused: the node is not its predecessor's (it started later), so it is not taken back."""
    a, a_again = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    a_info = member_identity(T0, process="gone")
    assert a.join("vm-a", a_info) is WriteResult.DONE
    assert a.read_view("vm-a").members == {"vm-a"}
    assert a.join("vm-a", a_info) is WriteResult.EXISTS  # from the view
    woken = threading.Event()
    a.set_wakeup(woken.set)
    assert a_again.join("vm-a", member_identity(T0 + 10, process="gone")) is WriteResult.DONE  # replaces a's node
    assert woken.wait(SEEN_WITHIN), "no watch fired for a when its member node was replaced"
    client = a_again.client
    assert client is not None
    path = f"{a.base_path}/members/vm-a"

    def owner() -> int | None:
        stat = client.exists(path)
        return stat.ephemeralOwner if stat is not None else None

    assert owner() == a_again.session_id
    # The replacement deleted a's node: a's watch fired, and its next read shows vm-a (a_again's node).
    assert a.read_view("vm-a").members == {"vm-a"}
    with pytest.raises(DuplicateMember):  # not EXISTS from a view of another's node, and not taken back
        a.join("vm-a", a_info)
    assert owner() == a_again.session_id
    assert a.read_view("vm-a").members == frozenset()  # not a member in its own view
    assert a_again.join("vm-a", {}) is WriteResult.EXISTS


def test_an_observer_sees_the_layout_created_after_its_first_read(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """A store that creates nothing (a dry run) may read before any agent created the lists: it must
    still hear of the first member."""
    observer = ZooKeeperStore(zk_hosts, zk_chroot, "alpha", session_timeout=4.0, operation_timeout=3.0,
                              create_layout=False)
    observer.start()
    try:
        assert observer.read_view("vm-o").members == frozenset()
        assert observer.read_view("vm-o").members == frozenset()
        agent = make_store(zk_hosts, zk_chroot)
        agent.join("vm-a", {})
        eventually(observer, "vm-o", lambda v: v.members == {"vm-a"}, "the first member")
    finally:
        observer.stop()


# -- a change while a read is under way ---------------------------------------------------------------


class InterleavingClient(KazooClient):
    """Runs ``hook`` once, right after the server answered the read of ``path`` (and set its watch), as
    if another agent wrote at that moment, before the rest of the read is sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = ""
        self.hook: Callable[[], None] | None = None

    def _interleave(self, path: str, result: IAsyncResult[Any]) -> None:
        hook = self.hook
        if hook is not None and path == self.path:
            self.hook = None
            result.get(timeout=5)
            hook()

    def get_children_async(self, path: str, watch: Any = None, include_data: bool = False) -> Any:
        result = super().get_children_async(path, watch=watch, include_data=include_data)
        self._interleave(path, result)
        return result

    def get_async(self, path: str, watch: Any = None) -> Any:
        result = super().get_async(path, watch=watch)
        self._interleave(path, result)
        return result


def interleaving_store(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> tuple[ZooKeeperStore, InterleavingClient, threading.Event]:
    clients: list[InterleavingClient] = []

    def factory(options: ClientOptions) -> KazooClient:
        client = InterleavingClient(hosts=options.hosts, timeout=options.session_timeout)
        clients.append(client)
        return client

    store = make_store(zk_hosts, zk_chroot, client_factory=factory)
    woken = threading.Event()
    store.set_wakeup(woken.set)
    return store, clients[0], woken


def test_a_watch_firing_during_a_read_makes_the_next_read_read_again(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, client, woken = interleaving_store(zk_server.hosts, zk_chroot, make_store)
    b = make_store(zk_server.hosts, zk_chroot)
    a.join("vm-a", {})

    def b_joins_and_a_is_told() -> None:
        woken.clear()
        b.join("vm-b", {})
        assert woken.wait(5), "the watch on /members did not fire"

    client.path, client.hook = f"{a.base_path}/members", b_joins_and_a_is_told
    during = a.read_view("vm-a")
    assert client.hook is None, "the read did not go through the interleaving"
    assert during.members == {"vm-a"}  # the list was read before vm-b joined

    sent = requests_sent(zk_server, a)
    after = a.read_view("vm-a")
    assert after.members == {"vm-a", "vm-b"}, "the read made during the change was served again"
    assert requests_sent(zk_server, a) > sent
    settled = requests_sent(zk_server, a)
    assert a.read_view("vm-a").members == {"vm-a", "vm-b"}
    assert requests_sent(zk_server, a) == settled


def test_a_member_leaving_during_a_member_info_read_is_not_served_from_the_cache(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, client, woken = interleaving_store(zk_hosts, zk_chroot, make_store)
    b = make_store(zk_hosts, zk_chroot)
    b.join("vm-b", {"probe": "http://10.0.0.5:8090/health"})

    def b_leaves_and_a_is_told() -> None:
        woken.clear()
        b.stop()
        assert woken.wait(5), "the watch on /members/vm-b did not fire"

    client.path, client.hook = f"{a.base_path}/members/vm-b", b_leaves_and_a_is_told
    assert set(a.member_info(["vm-b"])) == {"vm-b"}  # read before vm-b left
    assert client.hook is None
    assert a.member_info(["vm-b"]) == {}


# -- sessions and connection --------------------------------------------------------------------------


def test_nothing_is_served_from_a_session_that_expired(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    a = make_store(zk_server.hosts, zk_chroot)
    for _ in range(2):
        cycle(a, "vm-a", {})
    kept = a.read_view("vm-a")
    assert ("vm-a" in kept.members, kept.i_am_leader) == (True, True)

    old_session = expire_session(a)
    # Between the expiry and the new session nothing is served; once the new session is there, the view
    # is read again and shows that the member and leader nodes went with the old session.
    try:
        early = a.read_view("vm-a")
    except StoreUnavailable:
        pass
    else:
        assert a.session_id != old_session
        assert ("vm-a" in early.members, early.i_am_leader) == (False, False)
    wait_until(lambda: a.connection_state is ConnectionState.CONNECTED, message="a new session")
    assert a.session_id not in (None, old_session)
    fresh = a.read_view("vm-a")
    assert "vm-a" not in fresh.members
    assert (fresh.leader, fresh.i_am_leader) == (None, False)
    assert requests_sent(zk_server, a) > 0

    assert a.join("vm-a", {}) is WriteResult.DONE  # created again, not EXISTS from the old session's view
    assert a.campaign("vm-a") is True
    view = a.read_view("vm-a")
    assert ("vm-a" in view.members, view.i_am_leader) == (True, True)
    assert a.client is not None and a.client.exists(f"{a.base_path}/members/vm-a").ephemeralOwner == a.session_id


def test_nothing_is_served_while_the_connection_is_suspended(
    zk_server_factory: Callable[[], LocalZooKeeper], make_store: StoreMaker
) -> None:
    server = zk_server_factory()
    store = make_store(server.hosts, "/suspended", session_timeout=3.0, operation_timeout=0.5)
    store.join("vm-a", {"probe": "http://10.0.0.4:8090/health"})
    store.campaign("vm-a")
    store.read_view("vm-a")
    store.member_info(["vm-a"])
    idle = requests_sent(server, store)
    assert store.read_view("vm-a").i_am_leader is True
    assert requests_sent(server, store) == idle

    server.pause()
    try:
        # No request is sent, so only kazoo's ping finds the server frozen.
        wait_until(lambda: store.connection_state is not ConnectionState.CONNECTED, timeout=10,
                   message="the client to notice the frozen server")
        with pytest.raises(StoreUnavailable):
            store.read_view("vm-a")
        with pytest.raises(StoreUnavailable):
            store.campaign("vm-a")
        with pytest.raises(StoreUnavailable):
            store.member_info(["vm-a"])
        with pytest.raises(StoreUnknownOutcome):
            store.join("vm-a", {})
    finally:
        server.resume()
    wait_until(lambda: store.connection_state is ConnectionState.CONNECTED, timeout=15, message="reconnected")
    # The session may or may not have outlived the freeze (the server's clock ran on): either way the
    # view is read again, and a cycle leaves the agent a member and the leader.
    view = cycle(store, "vm-a", {"probe": "http://10.0.0.4:8090/health"})
    assert (view.members, view.i_am_leader) == ({"vm-a"}, True)
    assert view.connection is ConnectionState.CONNECTED


def test_a_change_to_one_record_reads_that_record_again_not_every_record(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    """Done records stay for days; the view read after a change must not cost a request per record."""
    a, b = make_store(zk_server.hosts, zk_chroot), make_store(zk_server.hosts, zk_chroot)
    b.join("vm-b", {})
    kept = [f"3F2A9C51-7B1D-4E8A-9C2B-5D6E7F8A{n:04X}" for n in range(30)]
    for event_id in kept:
        b.publish_event(record(event_id))
        b.mark_done(event_id, T0)
    b.publish_event(record())
    info: dict[str, object] = {"version": "1"}
    cycle(a, "vm-a", info)
    first = a.read_view("vm-a")
    assert set(kept) <= set(first.records)

    woken = threading.Event()
    a.set_wakeup(woken.set)
    b.acknowledge(EVENT, "vm-b", T0)
    assert woken.wait(SEEN_WITHIN)
    before = requests_sent(zk_server, a)
    view = eventually(a, "vm-a", lambda v: "vm-b" in v.records[EVENT].acks, "vm-b's ack")
    sent = requests_sent(zk_server, a) - before
    assert sent < 30, f"{sent} requests to see one ack among {len(view.records)} records"
    assert {k: view.records[k] for k in kept} == {k: first.records[k] for k in kept}

    a.acknowledge(kept[0], "vm-a", T0)  # a write of its own to a kept record: read again, at once
    assert "vm-a" in a.read_view("vm-a").records[kept[0]].acks
    b.reopen(kept[1])  # another store's write to a kept record: read again once its watch fires
    eventually(a, "vm-a", lambda v: v.records[kept[1]].done_at is None, "the reopened record")


# -- what a change costs ------------------------------------------------------------------------------


def test_a_change_costs_a_reader_the_nodes_it_touched_not_the_groups_lists(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    """Each change by another agent costs the reader's next view exactly the requests for the nodes the
    change touched (the list whose watch fired, and the data of the new names only), however large the
    group and however many records it keeps."""
    a, b = make_store(zk_server.hosts, zk_chroot), make_store(zk_server.hosts, zk_chroot)
    others = [make_store(zk_server.hosts, zk_chroot) for _ in range(8)]
    for n, store in enumerate(others):
        store.join(f"vm-{n:02d}", {"probe": f"http://10.0.1.{n}:8090/health"})
        store.mark_out(f"vm-{n:02d}", (), T0)
    b.join("vm-b", {})
    for n in range(20):
        b.publish_event(record(f"3F2A9C51-7B1D-4E8A-9C2B-5D6E7F8A{n:04X}"))
    b.publish_event(record())
    info: dict[str, object] = {"version": "1"}
    cycle(a, "vm-a", info)
    cycle(a, "vm-a", info)

    def cost(change: Callable[[], object], seen: Callable[[ClusterView], bool], what: str) -> int:
        change()
        all_told(a)
        before = requests_sent(zk_server, a)
        eventually(a, "vm-a", seen, what)
        sent = requests_sent(zk_server, a) - before
        settled = requests_sent(zk_server, a)
        a.read_view("vm-a")
        assert requests_sent(zk_server, a) == settled, f"{what}: the view was not current after it was seen"
        return sent

    c = make_store(zk_server.hosts, zk_chroot)
    costs = {
        "an ack": cost(lambda: b.acknowledge(EVENT, "vm-b", T0), lambda v: "vm-b" in v.records[EVENT].acks,
                       "the ack"),
        "an ack withdrawn": cost(lambda: b.withdraw_ack(EVENT, "vm-b"), lambda v: not v.records[EVENT].acks,
                                 "the withdrawal"),
        "a VM out of rotation": cost(lambda: b.mark_out("vm-b", (EVENT,), T0), lambda v: "vm-b" in v.out,
                                     "the out mark"),
        "a VM back in rotation": cost(lambda: b.clear_out("vm-b"), lambda v: "vm-b" not in v.out, "the return"),
        "an absence": cost(lambda: b.mark_absent("vm-x", T0), lambda v: "vm-x" in v.absent_since, "the absence"),
        "an absence cleared": cost(lambda: b.clear_absent("vm-x"), lambda v: not v.absent_since, "the clearing"),
        "a new member": cost(lambda: c.join("vm-c", {}), lambda v: "vm-c" in v.members and "vm-c" in v.known,
                             "vm-c's membership"),
        "a new record": cost(lambda: b.publish_event(record(OTHER)), lambda v: OTHER in v.records, "the record"),
        "an admission": cost(lambda: b.admit(OTHER, "vm-b", T0), lambda v: v.records[OTHER].admitted_at == T0,
                             "the admission"),
        "a record marked done": cost(lambda: b.mark_done(OTHER, T0), lambda v: v.records[OTHER].done_at == T0,
                                     "the done mark"),
    }
    assert costs == {
        "an ack": 1,  # the acks list (an agent lists acks by name: the gate reads what each one says)
        "an ack withdrawn": 1,  # the acks list
        "a VM out of rotation": 2,  # /out, the new node
        "a VM back in rotation": 1,  # /out
        "an absence": 2,  # /absent, the new node
        "an absence cleared": 1,  # /absent
        "a new member": 2,  # /members, /registry
        "a new record": 3,  # /events, then the record's node and its acks
        "an admission": 1,  # the record's node, which holds a copy of its admission and approval
        "a record marked done": 1,  # the record's node
    }
    before = requests_sent(zk_server, a)
    assert set(a.member_info(["vm-c", "vm-00"])) == {"vm-c", "vm-00"}
    assert requests_sent(zk_server, a) - before == 1  # vm-c's node; vm-00's was kept from the cycles
    assert set(a.member_info(["vm-c", "vm-00"])) == {"vm-c", "vm-00"}
    assert requests_sent(zk_server, a) - before == 1  # then vm-c's too, with its watch


def test_a_kept_record_whose_watch_event_comes_during_the_read_is_read_again(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """A read that takes a record from the cache while the watch event announcing its change is on its
    way (the server sent it before the read's answers; kazoo's watcher thread has not run it yet) must
    not serve that record beside the lists read after the change: it waits for the watch events that came
    before its answers and reads again."""
    a, client, woken = interleaving_store(zk_hosts, zk_chroot, make_store)
    b, c = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    a_sees_b_acked(a, b)
    woken.clear()
    c.join("vm-c", {})  # the members list changes: the next read sends a request for it
    assert woken.wait(SEEN_WITHIN)
    session = a._session
    kazoo_client, _ = session.connected(write=False)
    held = threading.Event()

    def b_withdraws_while_a_watcher_thread_is_busy() -> None:
        kazoo_client.handler.dispatch_callback(Callback("watch", held.wait, (10.0,)))
        b.withdraw_ack(EVENT, "vm-b")
        time.sleep(0.5)  # the watch event has reached a's client and waits behind the held watcher thread
        threading.Timer(0.5, held.set).start()

    client.path, client.hook = f"{a.base_path}/members", b_withdraws_while_a_watcher_thread_is_busy
    try:
        view = a.read_view("vm-a")
    finally:
        held.set()
    assert client.hook is None, "the read did not go through the interleaving"
    assert "vm-c" in view.members
    assert view.records[EVENT].acks == {}


def test_a_read_found_stale_is_made_again_from_the_cache_and_only_the_last_attempt_reads_everything(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under churn a read is often found stale (a watch fired on an answer it took from the cache): it is
    made again with what the cache still keeps, which costs the requests for what fired; only the last of
    ``READ_ATTEMPTS`` reads everything, so that a read always ends."""
    a, b = make_store(zk_server.hosts, zk_chroot), make_store(zk_server.hosts, zk_chroot)
    b.join("vm-b", {})
    for n in range(10):
        b.publish_event(record(f"3F2A9C51-7B1D-4E8A-9C2B-5D6E7F8A{n:04X}"))
    cycle(a, "vm-a", {})
    watched = a._watched
    found_stale = {"left": 0}

    def stale(answers: object, memos: object, fired: object) -> bool:
        found_stale["left"] -= 1
        return found_stale["left"] >= 0

    monkeypatch.setattr("coordinator.store.zk_watch.stale", stale)
    attempts = watched.READ_ATTEMPTS
    assert attempts >= 5

    def read_after_a_change(stale_times: int, change: Callable[[], object]) -> int:
        change()
        all_told(a)
        found_stale["left"] = stale_times
        before = watched.requests_sent
        a.read_view("vm-a")
        return watched.requests_sent - before

    b.publish_event(record())
    cycle(a, "vm-a", {})
    # Every attempt but the last two found stale: made again from the cache.
    made_again = read_after_a_change(attempts - 2, lambda: b.acknowledge(EVENT, "vm-b", T0))
    # Every attempt but the last found stale: the last one reads everything.
    everything = read_after_a_change(attempts - 1, lambda: b.withdraw_ack(EVENT, "vm-b"))
    # The change costs 2 requests (the acks list, the new ack); a notification that reaches the reader
    # during an attempt keeps that answer out of the cache, and the next attempt asks again: a few more.
    assert everything > 20, f"the last attempt read only {everything} requests: not everything"
    assert made_again * 4 < everything, f"{made_again} requests for one change read {attempts - 1} times, " \
        f"{everything} for everything"
