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
from typing import Any

import pytest
from kazoo.client import KazooClient

from coordinator.errors import ConfigError, DuplicateMember, StoreUnavailable, StoreUnknownOutcome
from coordinator.store.base import (
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    WriteResult,
)
from coordinator.store.payloads import EventNode
from coordinator.store.zookeeper import ClientOptions, ZooKeeperStore
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper
from tests.doubles import member_identity
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
    # b's view is served from its watched cache: the new node shows once the watch event has arrived.
    wait_until(lambda: b.read_view("vm-b").members == {"vm-a", "vm-b"}, message="vm-a's new member node")


def test_member_node_disappears_on_stop(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    a, b = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    a.join("vm-a", {})
    assert b.read_view("vm-b").members == {"vm-a"}
    a.stop()
    assert a.connection_state is ConnectionState.LOST
    wait_until(lambda: b.read_view("vm-b").members == frozenset(), message="vm-a to leave")


def test_join_replaces_a_node_left_by_this_vms_previous_agent_process(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    before_restart = make_store(zk_hosts, zk_chroot)
    # Written as the previous process did: this host and boot, a pid that has ended since.
    assert before_restart.join("vm-a", member_identity(T0, process="gone")) is WriteResult.DONE
    after_restart = make_store(zk_hosts, zk_chroot)  # the agent restarted; the old session lingers

    assert after_restart.join("vm-a", member_identity(T0 + 10)) is WriteResult.DONE
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


def test_a_restarted_agent_takes_back_leadership_from_its_previous_process_at_once(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The leader's VM is rebooted by maintenance (or its agent restarts): the old session lingers for its
    timeout, holding ``/leader`` while nobody acts through it, and nobody admitted anything meanwhile. The
    restarted agent, once ``join`` has proven that session its dead predecessor's, takes leadership back at
    once; the old session can no longer approve as leader. Another VM's agent never takes it so."""
    before_restart = make_store(zk_hosts, zk_chroot)
    assert before_restart.join("vm-a", member_identity(T0, process="gone")) is WriteResult.DONE
    assert before_restart.campaign("vm-a") is True
    other = make_store(zk_hosts, zk_chroot)
    other.join("vm-b", member_identity(T0 + 5))
    assert other.campaign("vm-b") is False  # another VM: it waits for the session to lapse

    after_restart = make_store(zk_hosts, zk_chroot)
    assert after_restart.campaign("vm-a") is False  # not before join has proven whose the old session is
    assert after_restart.join("vm-a", member_identity(T0 + 10)) is WriteResult.DONE
    assert after_restart.campaign("vm-a") is True
    assert after_restart.client is not None
    stat = after_restart.client.exists(f"{after_restart.base_path}/leader")
    assert stat is not None and stat.ephemeralOwner == after_restart.session_id
    assert after_restart.campaign("vm-a") is True
    assert other.campaign("vm-b") is False

    after_restart.publish_event(record(resources=("vm-b",)))
    other.acknowledge(EVENT, "vm-b", T0)
    stale = before_restart.approve(EVENT, "vm-a", ["vm-b"], as_leader=True, at=T0)
    assert stale.outcome is ApprovalOutcome.REFUSED
    assert after_restart.approve(EVENT, "vm-a", ["vm-b"], as_leader=True, at=T0).outcome is ApprovalOutcome.APPROVED


def test_a_second_agent_with_the_same_vm_name_leaves_the_first_ones_node_untouched(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """Before, two agents with one vm_name replaced each other's member node some 20 times a second. Now
    the node stays the first agent's: not deleted, not rewritten, however often the second tries; the
    second's refused join reads it with a watch, and is woken when it goes."""
    first, second = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    assert first.join("vm-a", member_identity(T0)) is WriteResult.DONE
    client = first.client
    assert client is not None
    path = f"{first.base_path}/members/vm-a"
    before = client.exists(path)
    assert before is not None and before.ephemeralOwner == first.session_id
    woken = threading.Event()
    second.set_wakeup(woken.set)
    for _ in range(50):
        with pytest.raises(DuplicateMember, match=f"held by session 0x{first.session_id:x} from host "):
            second.join("vm-a", member_identity(T0 + 10))
    after = client.exists(path)
    assert after is not None
    assert (after.czxid, after.mzxid, after.version, after.ephemeralOwner) == (
        before.czxid, before.mzxid, before.version, before.ephemeralOwner)
    assert first.join("vm-a", member_identity(T0)) is WriteResult.EXISTS
    assert first.duplicate is None

    woken.clear()
    first.stop()
    assert woken.wait(5.0), "the refused agent was not woken when the other agent's node went"
    assert second.join("vm-a", member_identity(T0 + 10)) is WriteResult.DONE
    assert second.duplicate is None


def test_a_member_node_that_does_not_parse_is_another_agents(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    other, agent = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    assert agent.join("vm-b", {}) is WriteResult.DONE  # creates the layout
    client = other.client
    assert client is not None
    path = f"{other.base_path}/members/vm-a"
    client.create(path, b"\xff not json", ephemeral=True)
    with pytest.raises(DuplicateMember, match=r"from host \? pid \? since "):
        agent.join("vm-a", member_identity(T0 + 10))
    assert client.get(path)[0] == b"\xff not json"


# -- done marks and what is written under a record ----------------------------------------------------


def _before_the_next_transaction(store: ZooKeeperStore, action: Callable[[], object]) -> list[object]:
    """Run ``action`` (another client's write) right before ``store`` next builds a transaction: after
    whatever it read to decide on it. Returns what ``action`` returned, once it ran."""
    client = store.client
    assert client is not None
    original = client.transaction
    ran: list[object] = []

    def transaction() -> Any:
        if not ran:
            ran.append(action())
        return original()

    client.transaction = transaction  # type: ignore[method-assign]
    return ran


def _children(store: ZooKeeperStore) -> list[str]:
    client = store.client
    assert client is not None
    return sorted(client.get_children(f"{store.base_path}/events/{EVENT}"))


def test_an_admission_created_while_mark_done_lists_the_children_does_not_survive_it(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """mark_done lists the record's children, then deletes admitted and approval with the done mark in one
    transaction: an admission another leader (one whose session is lapsing) creates in between must not
    survive on the done record, to be inherited when a reused EventId reopens it."""
    leader, old_leader = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    leader.publish_event(record())
    ran = _before_the_next_transaction(leader, lambda: old_leader.admit(EVENT, "vm-b", T0))
    assert leader.mark_done(EVENT, T0 + 1) is WriteResult.DONE
    assert ran == [WriteResult.DONE]  # the admission landed between the listing and the transaction
    view = leader.read_view("vm-a").records[EVENT]
    assert view.done_at == T0 + 1
    assert view.admitted_at is None
    assert _children(leader) == ["acks"]
    assert leader.reopen(EVENT) is WriteResult.DONE
    assert leader.read_view("vm-a").records[EVENT].admitted_at is None  # the new instance inherits nothing


def test_an_admission_decided_before_mark_done_landed_is_not_written_on_the_done_record(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    leader, other = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    leader.publish_event(record())
    ran = _before_the_next_transaction(leader, lambda: other.mark_done(EVENT, T0 + 1))
    assert leader.admit(EVENT, "vm-a", T0) is WriteResult.MISSING  # read again: marked done meanwhile
    assert ran == [WriteResult.DONE]
    assert _children(leader) == ["acks"]
    assert leader.read_view("vm-a").records[EVENT].done_at == T0 + 1


def test_an_approval_checked_before_mark_done_landed_is_not_written_on_the_done_record(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The approver's checks pass, then the leader marks the event done (it is gone): the approval must
    not be written (and no POST sent) on the done record, nor be found by a reused EventId later."""
    approver, leader = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    approver.join("vm-a", {})
    approver.publish_event(record(resources=("vm-a",)))
    approver.acknowledge(EVENT, "vm-a", T0)
    ran = _before_the_next_transaction(approver, lambda: leader.mark_done(EVENT, T0 + 1))
    result = approver.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert ran == [WriteResult.DONE]
    assert result.outcome is ApprovalOutcome.REFUSED and "marked done" in result.reason
    assert _children(approver) == ["acks"]
    assert approver.read_view("vm-a").records[EVENT].approval is None


def test_two_approvers_at_once_both_find_the_one_approval(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The approval moves the record's version: an approver whose checks read the record before another
    approval landed checks again, and finds that approval."""
    member, leader = make_store(zk_hosts, zk_chroot), make_store(zk_hosts, zk_chroot)
    member.join("vm-a", {})
    leader.campaign("vm-b")
    member.publish_event(record(resources=("vm-a",)))
    member.acknowledge(EVENT, "vm-a", T0)
    ran = _before_the_next_transaction(
        member, lambda: leader.approve(EVENT, "vm-b", ["vm-a"], as_leader=True, at=T0).outcome)
    result = member.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0 + 1)
    assert ran == [ApprovalOutcome.APPROVED]
    assert result.outcome is ApprovalOutcome.APPROVED
    assert result.record is not None and result.record.by == "vm-b"


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
    store = make_store(zk_hosts, zk_chroot, ack_times=True)  # as ``coordinator status`` reads, with the acks' times
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



def test_a_record_rewritten_by_a_version_that_keeps_no_copy_is_read_from_its_children(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """A record's data holds a copy of its admission and approval, valid at the data version and child
    count its writes made. An agent of an earlier version admits as it did (the record rewritten with the
    bytes it read, the child created, in one transaction): the copy no longer holds, the readers read the
    children and see the admission, and the next write of this version copies them again."""
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    client, base = raw_client(store), store.base_path
    event = f"{base}/events/{EVENT}"
    assert store.publish_event(record()) is WriteResult.DONE
    assert store.read_view("vm-a").records[EVENT].admitted_at is None
    data, stat = client.get(event)
    transaction = client.transaction()
    transaction.set_data(event, data, version=stat.version)
    transaction.create(f"{event}/admitted", previous({"by": "vm-a", "at": T0 + 3}))
    assert not any(isinstance(result, Exception) for result in transaction.commit())
    # Seen once the record's watch event has reached the store (kazoo runs watchers on a thread of its own).
    wait_until(lambda: store.read_view("vm-a").records[EVENT].admitted_at == T0 + 3, timeout=5,
               message="the admission an earlier version wrote")
    # An approval of this version copies the admission it found among the children, and its own approval.
    store.campaign("vm-a")
    store.acknowledge(EVENT, "vm-a", T0 + 4)
    assert store.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0 + 5).outcome is ApprovalOutcome.APPROVED
    stored = EventNode.from_bytes(client.get(event)[0], event)
    assert stored.mirrors(client.exists(event))
    assert stored.admitted is not None and stored.admitted.at == T0 + 3
    assert stored.approval is not None and stored.approval.at == T0 + 5
    got = store.read_view("vm-a").records[EVENT]
    assert (got.admitted_at, got.approval.at if got.approval else None) == (T0 + 3, T0 + 5)
    # Marked done: both children go, and with them their copies.
    assert store.mark_done(EVENT, T0 + 6) is WriteResult.DONE
    assert client.get_children(event) == ["acks"]
    done = EventNode.from_bytes(client.get(event)[0], event)
    assert done.mirrors(client.exists(event)) and done.admitted is None and done.approval is None

def test_the_gate_reads_the_admission_from_the_record_while_its_copy_holds_and_else_from_the_child(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """The gate learns that the event is admitted from the record's copy of ``admitted`` while the copy holds
    (no request more); an admission created or deleted by hand moves the record's ``cversion``, so the copy
    no longer holds and the gate reads the child itself, after the sync, as it did before."""
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    store.campaign("vm-a")
    client, base = raw_client(store), store.base_path
    event = f"{base}/events/{EVENT}"
    assert store.publish_event(record()) is WriteResult.DONE
    assert store.acknowledge(EVENT, "vm-a", T0 + 1) is WriteResult.DONE
    assert store.admit(EVENT, "vm-a", T0 + 2) is WriteResult.DONE
    # Deleted by hand: the copy says admitted, but the record's cversion moved, so the child is read.
    client.delete(f"{event}/admitted")
    refused = store.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0 + 3, admission=True)
    assert refused.outcome is ApprovalOutcome.REFUSED and "not admitted" in refused.reason
    # Created by hand (as an earlier version admits): read from the child, and approved.
    client.create(f"{event}/admitted", previous({"by": "vm-a", "at": T0 + 4}))
    approved = store.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0 + 5, admission=True)
    assert approved.outcome is ApprovalOutcome.APPROVED, approved.reason


def test_garbage_nodes_are_handled_as_before(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(zk_hosts, zk_chroot, ack_times=True)  # as ``coordinator status`` reads, with the acks' data
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
    # An agent's view lists the acks by name, as the gate's to judge: it counts the node (the record stays
    # open, the VM out of rotation), and the gate below refuses it.
    agent = make_store(zk_hosts, zk_chroot)
    assert set(agent.read_view("vm-b").records[EVENT].acks) == {"vm-a"}
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
