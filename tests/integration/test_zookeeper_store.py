"""ZooKeeperStore against a real ZooKeeper: sessions, leadership, suspension and watches.

Session expiry is real (server side, see ``expire_session``); suspension is real too: the server process
is stopped with SIGSTOP, as an Azure Freeze would stop it.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from coordinator.errors import ConfigError, StoreUnavailable, StoreUnknownOutcome
from coordinator.store.base import (
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    WriteResult,
)
from coordinator.store.zookeeper import ClientOptions, ZooKeeperStore
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper
from tests.plugins.zookeeper import StoreMaker, expire_session, wait_until

EVENT = "5AA1A3F2-3C39-4E5B-9C4B-9E3E5D2B1A01"
T0 = 1_700_000_000.0


def record(resources: tuple[str, ...] = ("vm-a", "vm-b")) -> EventRecord:
    return EventRecord(
        event_id=EVENT,
        event_type="Freeze",
        resources=resources,
        not_before=T0 + 60,
        published_by="vm-a",
        published_at=T0,
    )


def connected(store: ZooKeeperStore) -> bool:
    return store.connection_state is ConnectionState.CONNECTED


# -- membership -------------------------------------------------------------------------------------


def test_member_node_vanishes_after_server_side_expiry_and_join_recreates_it(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    assert a.join("vm-a", {"version": "0.1.0"}) is WriteResult.DONE
    assert b.join("vm-b", {}) is WriteResult.DONE
    assert b.read_view("vm-b").members == {"vm-a", "vm-b"}

    old_session = expire_session(a)

    wait_until(lambda: b.read_view("vm-b").members == {"vm-b"}, message="vm-a's member node to vanish")
    wait_until(lambda: connected(a), message="a to open a new session")
    assert a.session_id not in (None, old_session)
    assert a.join("vm-a", {"version": "0.1.0"}) is WriteResult.DONE
    assert a.join("vm-a", {}) is WriteResult.EXISTS
    assert b.read_view("vm-b").members == {"vm-a", "vm-b"}


def test_member_node_disappears_on_stop(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    a.join("vm-a", {})
    assert b.read_view("vm-b").members == {"vm-a"}
    a.stop()
    assert a.connection_state is ConnectionState.LOST
    wait_until(lambda: b.read_view("vm-b").members == frozenset(), message="vm-a to leave")


def test_join_replaces_a_node_left_by_an_older_session_of_the_same_vm(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    before_restart = make_store(zk_hosts, zk_chroot)
    assert before_restart.join("vm-a", {"version": "old"}) is WriteResult.DONE
    after_restart = make_store(zk_hosts, zk_chroot)  # the agent restarted; the old session lingers

    assert after_restart.join("vm-a", {"version": "new"}) is WriteResult.DONE
    assert after_restart.client is not None
    stat = after_restart.client.exists(f"{after_restart.base_path}/members/vm-a")
    assert stat is not None
    assert stat.ephemeralOwner == after_restart.session_id
    assert after_restart.join("vm-a", {}) is WriteResult.EXISTS

    after_restart.publish_event(record(resources=("vm-a",)))
    after_restart.acknowledge(EVENT, "vm-a", T0)
    stale = before_restart.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert stale.outcome is ApprovalOutcome.REFUSED
    assert "session" in stale.reason
    current = after_restart.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert current.outcome is ApprovalOutcome.APPROVED


# -- leadership -------------------------------------------------------------------------------------


def test_leadership_moves_when_the_leader_session_expires(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    assert a.campaign("vm-a") is True
    assert b.campaign("vm-b") is False
    assert b.read_view("vm-b").leader == "vm-a"

    old_session = expire_session(a)

    wait_until(lambda: b.campaign("vm-b"), message="b to take over /leader")
    wait_until(lambda: connected(a), message="a to open a new session")
    assert a.session_id not in (None, old_session)
    assert a.campaign("vm-a") is False
    view = a.read_view("vm-a")
    assert (view.leader, view.i_am_leader) == ("vm-b", False)
    assert b.read_view("vm-b").i_am_leader is True

    a.publish_event(record(resources=()))
    refused = a.approve(EVENT, "vm-a", [], as_leader=True, at=T0)
    assert refused.outcome is ApprovalOutcome.REFUSED
    assert "leader" in refused.reason

    b.stop()
    wait_until(lambda: a.campaign("vm-a"), message="a to lead again with its new session")
    assert a.read_view("vm-a").i_am_leader is True
    assert a.approve(EVENT, "vm-a", [], as_leader=True, at=T0).outcome is ApprovalOutcome.APPROVED


# -- a paused (frozen) server -----------------------------------------------------------------------

PAUSE_OPERATION_TIMEOUT = 0.5
# Generous margin over the operation timeout for a loaded two-core machine; a hang would be seconds.
SLACK = 0.5


def timed(call: Callable[[], object]) -> tuple[float, object]:
    start = time.monotonic()
    try:
        outcome: object = call()
    except (StoreUnavailable, StoreUnknownOutcome) as exc:
        outcome = exc
    return time.monotonic() - start, outcome


def prepared_leader(server: LocalZooKeeper, make_store: StoreMaker) -> ZooKeeperStore:
    store = make_store(server.hosts, "/paused", session_timeout=3.0, operation_timeout=PAUSE_OPERATION_TIMEOUT)
    store.join("vm-a", {})
    assert store.campaign("vm-a") is True
    store.publish_event(record(resources=("vm-a",)))
    store.acknowledge(EVENT, "vm-a", T0)
    return store


def test_approve_is_never_granted_while_the_server_is_paused(
    zk_server_factory: Callable[[], LocalZooKeeper], make_store: StoreMaker
) -> None:
    server = zk_server_factory()
    store = prepared_leader(server, make_store)
    states: list[ConnectionState] = []
    store.set_wakeup(lambda: states.append(store.connection_state))

    def approve() -> object:
        return store.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0)

    server.pause()
    try:
        # The client has not noticed yet: the synced read hangs and the outcome is unknown.
        elapsed, outcome = timed(approve)
        assert elapsed < PAUSE_OPERATION_TIMEOUT + SLACK
        assert isinstance(outcome, StoreUnknownOutcome) or (
            isinstance(outcome, ApprovalResult) and outcome.outcome is ApprovalOutcome.REFUSED
        ), outcome

        wait_until(
            lambda: store.connection_state is ConnectionState.SUSPENDED,
            timeout=10,
            message="the client to notice the frozen server",
        )
        elapsed, outcome = timed(approve)
        assert elapsed < PAUSE_OPERATION_TIMEOUT + SLACK
        assert isinstance(outcome, ApprovalResult)
        assert outcome.outcome is ApprovalOutcome.REFUSED
        assert "suspended" in outcome.reason
    finally:
        server.resume()

    wait_until(lambda: connected(store), timeout=15, message="the client to reconnect")
    assert ConnectionState.SUSPENDED in states
    assert store.read_view("vm-a").records[EVENT].approval is None


def test_every_call_returns_within_the_operation_timeout_while_the_server_is_paused(
    zk_server_factory: Callable[[], LocalZooKeeper], make_store: StoreMaker
) -> None:
    server = zk_server_factory()
    store = prepared_leader(server, make_store)
    calls: dict[str, Callable[[], object]] = {
        "approve": lambda: store.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0),
        "read_view": lambda: store.read_view("vm-a"),
        "campaign": lambda: store.campaign("vm-a"),
        "join": lambda: store.join("vm-a", {}),
        "publish_event": lambda: store.publish_event(record()),
        "acknowledge": lambda: store.acknowledge(EVENT, "vm-b", T0),
        "withdraw_ack": lambda: store.withdraw_ack(EVENT, "vm-a"),
        "mark_done": lambda: store.mark_done(EVENT, T0),
        "purge_done": lambda: store.purge_done(T0),
    }

    def check_all() -> list[str]:
        outcomes = []
        for name, call in calls.items():
            elapsed, outcome = timed(call)
            assert elapsed < PAUSE_OPERATION_TIMEOUT + SLACK, f"{name} took {elapsed:.2f}s"
            if isinstance(outcome, ApprovalResult):
                assert outcome.outcome is ApprovalOutcome.REFUSED, f"{name}: {outcome}"
            else:
                assert isinstance(outcome, StoreUnavailable | StoreUnknownOutcome), f"{name}: {outcome!r}"
            outcomes.append(type(outcome).__name__)
        return outcomes

    server.pause()
    try:
        hung = check_all()  # connection still believed up: requests are sent and never answered
        assert hung[0] in ("StoreUnknownOutcome", "ApprovalResult")
        wait_until(lambda: store.connection_state is ConnectionState.SUSPENDED, timeout=10, message="suspended")
        check_all()  # known to be down: nothing is sent
    finally:
        server.resume()
    wait_until(lambda: connected(store), timeout=15, message="the client to reconnect")
    assert store.read_view("vm-a").records[EVENT].published_by == "vm-a"


def test_a_late_answer_ends_the_suspension_early(
    zk_server_factory: Callable[[], LocalZooKeeper], make_store: StoreMaker
) -> None:
    """A server that is only slow (paused for less than kazoo's ping timeout) answers after all: the
    store is usable again at once, not after its quiet period of 2/3 of the session timeout."""
    server = zk_server_factory()
    store = prepared_leader(server, make_store)
    server.pause()
    try:
        with pytest.raises(StoreUnavailable, match="no answer"):
            store.read_view("vm-a")
        assert store.connection_state is ConnectionState.SUSPENDED
        with pytest.raises(StoreUnavailable, match="suspended"):
            store.read_view("vm-a")  # nothing is sent during the quiet period
    finally:
        server.resume()
    resumed = time.monotonic()
    wait_until(lambda: connected(store), timeout=5, message="the late answer to end the suspension")
    assert time.monotonic() - resumed < 1.0  # the quiet period would last 2.5 s
    assert store.read_view("vm-a").i_am_leader is True


def test_a_frozen_server_is_left_for_another_server_of_the_ensemble(
    zk_ensemble: LocalEnsemble, make_store: StoreMaker
) -> None:
    """An agent polling faster than kazoo's ping interval must still notice a frozen server and move
    on: each request it sends postpones kazoo's ping, the only way kazoo detects a dead connection."""
    leader = wait_until(zk_ensemble.leader_index, message="an ensemble leader")
    frozen = next(i for i in range(3) if i != leader)  # a follower: the ensemble keeps its quorum
    hosts = ",".join(s.hosts for i, s in sorted(enumerate(zk_ensemble.servers), key=lambda p: p[0] != frozen))

    def frozen_server_first(options: ClientOptions) -> KazooClient:
        return KazooClient(
            hosts=options.hosts,
            timeout=options.session_timeout,
            randomize_hosts=False,  # connect to the first host: the one that will freeze
            connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
        )

    store = make_store(
        hosts, "/ensemble", session_timeout=6.0, operation_timeout=0.5, client_factory=frozen_server_first
    )
    store.join("vm-a", {})
    session = store.session_id

    def poll() -> ClusterView | None:
        try:
            return store.read_view("vm-a")
        except StoreUnavailable:
            return None

    zk_ensemble.pause(frozen)
    try:
        view = wait_until(poll, timeout=15, interval=0.1, message="the store to reach another server")
    finally:
        zk_ensemble.resume(frozen)
    assert view is not None
    assert view.members == {"vm-a"}
    assert store.session_id == session  # moved within the session timeout: no membership flap


# -- watches ----------------------------------------------------------------------------------------


def test_wakeup_fires_on_a_new_member_a_new_leader_and_a_new_ack(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    woken = threading.Event()
    a.set_wakeup(woken.set)

    def armed() -> None:
        """Read (which sets the watches), then forget earlier wakeups."""
        a.read_view("vm-a")
        woken.clear()

    armed()
    b.join("vm-b", {})
    assert woken.wait(5), "no wakeup for a new member"

    armed()
    b.campaign("vm-b")
    assert woken.wait(5), "no wakeup for a new leader"

    armed()
    b.publish_event(record())
    assert woken.wait(5), "no wakeup for a new event"

    armed()
    b.acknowledge(EVENT, "vm-b", T0)
    assert woken.wait(5), "no wakeup for a new ack"

    a.join("vm-a", {})  # an ack counts only when held by the session of the VM's member node
    a.acknowledge(EVENT, "vm-a", T0)
    armed()
    assert b.approve(EVENT, "vm-b", ["vm-a", "vm-b"], as_leader=True, at=T0).outcome is ApprovalOutcome.APPROVED
    assert woken.wait(5), "no wakeup for an approval"
    assert a.read_view("vm-a").records[EVENT].approval is not None


def test_wakeup_fires_on_connection_state_changes(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    a = make_store(zk_hosts, zk_chroot)
    states: list[ConnectionState] = []
    a.set_wakeup(lambda: states.append(a.connection_state))
    expire_session(a)
    wait_until(lambda: ConnectionState.CONNECTED in states, message="wakeup on reconnection")
    assert ConnectionState.LOST in states


# -- construction and connection --------------------------------------------------------------------


def test_client_factory_is_injected(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    built: list[tuple[ClientOptions, KazooClient]] = []

    def factory(options: ClientOptions) -> KazooClient:
        client = KazooClient(hosts=options.hosts, timeout=options.session_timeout)
        built.append((options, client))
        return client

    store = make_store(zk_hosts, zk_chroot, session_timeout=5.0, client_factory=factory)
    assert len(built) == 1
    options, client = built[0]
    assert (options.hosts, options.session_timeout) == (zk_hosts, 5.0)
    assert store.client is client
    assert store.join("vm-a", {}) is WriteResult.DONE
    assert client.exists(f"{zk_chroot}/alpha/members/vm-a") is not None


def test_start_is_bounded_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = ZooKeeperStore(f"127.0.0.1:{port}", "/x", "alpha", session_timeout=2.0, operation_timeout=0.5)
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no ZooKeeper connection"):
        store.start()
    assert time.monotonic() - start < 0.5 + SLACK
    assert store.connection_state is ConnectionState.LOST
    with pytest.raises(StoreUnavailable):
        store.read_view("vm-a")
    with pytest.raises(StoreUnknownOutcome):
        store.join("vm-a", {})


@pytest.mark.parametrize(
    ("hosts", "root", "cluster"),
    [
        ("127.0.0.1:2181/chroot", "/azure-maintenance", "alpha"),
        ("127.0.0.1:2181", "azure-maintenance", "alpha"),
        ("127.0.0.1:2181", "/azure/../maintenance", "alpha"),
        ("127.0.0.1:2181", "/azure-maintenance", "al/pha"),
        ("127.0.0.1:2181", "/azure-maintenance", ""),
    ],
)
def test_configuration_is_validated(hosts: str, root: str, cluster: str) -> None:
    with pytest.raises(ConfigError):
        ZooKeeperStore(hosts, root, cluster)


# -- node data: the previous format, extra fields, garbage ------------------------------------------

OTHER_EVENT = "0BB1A3F2-3C39-4E5B-9C4B-9E3E5D2B1A02"


def previous(value: dict[str, object]) -> bytes:
    """Node data as the previous version wrote it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def raw_client(store: ZooKeeperStore) -> KazooClient:
    assert store.client is not None
    return store.client


def test_nodes_of_the_previous_format_with_extra_fields_are_read(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    client, base = raw_client(store), store.base_path
    event = f"{base}/events/{EVENT}"
    client.create(f"{base}/leader", previous({"vm": "vm-a", "since": T0, "term": 3}), ephemeral=True)
    client.create(f"{base}/absent/vm-b", previous({"since": T0 + 1, "reason": "later"}))
    client.create(
        event,
        previous(
            {
                "event_id": EVENT,
                "event_type": "Freeze",
                "resources": ["vm-a", "vm-b"],
                "not_before": T0 + 60,
                "published_by": "vm-a",
                "published_at": T0,
                "done_at": None,
                "priority": "high",
            }
        ),
    )
    client.create(f"{event}/acks", b"")
    client.create(f"{event}/acks/vm-a", previous({"vm": "vm-a", "at": T0 + 2, "how": "drained"}), ephemeral=True)
    client.create(f"{event}/admitted", previous({"by": "vm-a", "at": T0 + 3, "budget": 1}))
    client.create(f"{event}/approval", previous({"by": "vm-a", "at": T0 + 4, "as_leader": True, "note": "x"}))

    view = store.read_view("vm-a")
    assert (view.leader, view.i_am_leader) == ("vm-a", True)
    assert view.absent_since == {"vm-b": T0 + 1}
    got = view.records[EVENT]
    assert (got.event_type, got.resources, got.not_before, got.published_by, got.published_at) == (
        "Freeze",
        ("vm-a", "vm-b"),
        T0 + 60,
        "vm-a",
        T0,
    )
    assert got.acks == {"vm-a": T0 + 2}
    assert got.admitted_at == T0 + 3
    assert got.approval is not None
    assert (got.approval.by, got.approval.at, got.approval.as_leader) == ("vm-a", T0 + 4, True)
    approved = store.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0 + 5)
    assert approved.outcome is ApprovalOutcome.APPROVED
    assert approved.reason == "approved before"

    # Marking done rewrites the record and keeps the field this version does not know.
    assert store.mark_done(EVENT, T0 + 6) is WriteResult.DONE
    stored = json.loads(client.get(event)[0])
    assert stored["priority"] == "high"
    assert stored["done_at"] == T0 + 6
    assert store.read_view("vm-a").records[EVENT].done_at == T0 + 6


def test_garbage_nodes_are_handled_as_before(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    client, base = raw_client(store), store.base_path
    good, bad = f"{base}/events/{EVENT}", f"{base}/events/{OTHER_EVENT}"
    client.create(f"{base}/leader", b"not json", ephemeral=True)
    client.create(f"{base}/absent/vm-b", previous({"since": "yesterday"}))
    assert store.publish_event(record()) is WriteResult.DONE
    client.create(f"{good}/acks/vm-a", b"\xff")
    client.create(f"{good}/admitted", previous({"by": "vm-a"}))
    client.create(f"{good}/approval", previous({"by": "vm-a", "at": T0}))
    client.create(bad, previous({"event_type": "Freeze", "published_by": "vm-a", "published_at": "now", "done_at": 1}))
    client.create(f"{bad}/acks", b"")

    with caplog.at_level(logging.WARNING, logger="coordinator.store"):
        view = store.read_view("vm-a")
    # The leader is unknown, the absence and the bad record are left out, with a warning naming the node.
    assert (view.leader, view.i_am_leader) == (None, False)
    assert view.absent_since == {}
    assert set(view.records) == {EVENT}
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{base}/leader: " in messages
    assert f"{base}/absent/vm-b: since: Input should be a valid number" in messages
    assert f"{bad}: published_at: Input should be a valid number" in messages
    assert f"{good}/approval: as_leader: Field required" in messages
    # An ack that does not parse is no ack (it cannot say that a drain holds); an admission that does not
    # parse counts from its node's creation time.
    got = view.records[EVENT]
    assert got.acks == {}
    assert f"undecodable ack, not counted: {good}/acks/vm-a: " in messages
    admitted_created = client.exists(f"{good}/admitted")
    assert admitted_created is not None
    assert got.admitted_at == admitted_created.ctime / 1000.0
    # The approval node exists: the event is approved, by someone unknown.
    assert got.approval is not None and got.approval.by == "?"

    refused = store.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0)
    assert refused.outcome is ApprovalOutcome.REFUSED
    assert "held by this session for None" in refused.reason
    refused = store.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert refused.outcome is ApprovalOutcome.REFUSED
    assert "the ack of vm-a does not count" in refused.reason
    with pytest.raises(StoreUnknownOutcome, match="undecodable approval record"):
        store.approve(EVENT, "vm-a", [], as_leader=False, at=T0)
    with pytest.raises(StoreUnknownOutcome, match="undecodable record"):
        store.mark_done(OTHER_EVENT, T0)
    assert store.mark_done(EVENT, T0) is WriteResult.DONE
    assert store.purge_done(T0 + 10) == 1  # the good record; the bad one stays
    assert client.exists(good) is None
    assert client.exists(bad) is not None
