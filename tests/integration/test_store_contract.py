"""The ``Store`` contract (coordinator.store.base), run against every implementation.

``zookeeper`` runs against the real server of the test session, each test in its own root path; ``fake``
runs the ZooKeeper store in-process over ``tests.fakezk``, the fake ZooKeeper that every in-process test
of the agent runs it over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from coordinator import control
from coordinator.errors import DuplicateMember, InvalidName, StoreError, StoreUnavailable, StoreUnknownOutcome
from coordinator.store.base import (
    Approval,
    ApprovalOutcome,
    Closed,
    ClusterView,
    ConnectionState,
    EventRecord,
    Store,
    Vouch,
    WriteResult,
)
from coordinator.store.zookeeper import ZooKeeperStore
from tests.doubles import member_identity
from tests.fakezk import FakeEnsemble
from tests.fakezk_group import FakeGroup
from tests.plugins.zookeeper import expire_session, wait_until

EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
T0 = 1_700_000_000.0


def record(event_id: str = EVENT, *, by: str = "vm-a", resources: tuple[str, ...] = ("vm-a", "vm-b")) -> EventRecord:
    return EventRecord(
        event_id=event_id,
        event_type="Reboot",
        resources=resources,
        not_before=T0 + 900,
        published_by=by,
        published_at=T0,
    )


@dataclass
class Harness:
    kind: str
    make: Callable[..., Store]
    expire: Callable[[Store], None]
    drain: Callable[[str, str], None]  # an operator's ``coordinator drain VM --reason``
    undrain: Callable[[str], None]
    pause: Callable[[str], None]  # ``coordinator pause --reason``
    resume: Callable[[], None]


@pytest.fixture(params=["fake", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    stores: list[Store] = []

    if request.param == "fake":
        ensemble = FakeEnsemble(clock=lambda: T0)
        group = control.GroupAddress("fake-zookeeper:2181", "/coordinator", "alpha", client_factory=ensemble.link())

        def make(cluster: str = "alpha") -> Store:
            store = ZooKeeperStore("fake-zookeeper:2181", "/coordinator", cluster, session_timeout=4.0,
                                   operation_timeout=3.0, clock=lambda: T0, client_factory=ensemble.link())
            store.start()
            stores.append(store)
            return store

        def expire(store: Store) -> None:
            assert isinstance(store, ZooKeeperStore) and store.session_id is not None
            ensemble.expire(store.session_id)
            assert store.connection_state is ConnectionState.CONNECTED

        def drain(vm: str, reason: str) -> None:
            control.drain(group, vm, reason, by="ops", at=T0)

        def undrain(vm: str) -> None:
            control.undrain(group, vm)

        def pause(reason: str) -> None:
            control.pause(group, reason)

        def resume() -> None:
            control.resume(group)

    else:
        hosts: str = request.getfixturevalue("zk_hosts")
        root: str = request.getfixturevalue("zk_chroot")

        def make(cluster: str = "alpha") -> Store:
            store = ZooKeeperStore(hosts, root, cluster, session_timeout=4.0, operation_timeout=3.0, clock=lambda: T0)
            store.start()
            stores.append(store)
            return store

        def expire(store: Store) -> None:
            assert isinstance(store, ZooKeeperStore)
            expire_session(store)
            wait_until(lambda: store.connection_state is ConnectionState.CONNECTED, message="reconnected")

        def drain(vm: str, reason: str) -> None:
            control.drain(control.GroupAddress(hosts, root, "alpha"), vm, reason, by="ops", at=T0)

        def undrain(vm: str) -> None:
            control.undrain(control.GroupAddress(hosts, root, "alpha"), vm)

        def pause(reason: str) -> None:
            control.pause(control.GroupAddress(hosts, root, "alpha"), reason)

        def resume() -> None:
            control.resume(control.GroupAddress(hosts, root, "alpha"))

    try:
        yield Harness(request.param, make, expire, drain, undrain, pause, resume)
    finally:
        for store in stores:
            store.stop()


def test_publish_once_second_publisher_finds_it(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.publish_event(record(by="vm-a")) is WriteResult.DONE
    assert b.publish_event(record(by="vm-b")) is WriteResult.EXISTS

    stored = b.read_view("vm-b").records[EVENT]
    assert stored.published_by == "vm-a"
    assert stored.event_type == "Reboot"
    assert stored.resources == ("vm-a", "vm-b")
    assert stored.not_before == T0 + 900
    assert stored.published_at == T0
    assert stored.acks == {}
    assert stored.approval is None
    assert stored.done_at is None


def test_event_ids_are_stored_upper_case_and_vm_names_lower_case(harness: Harness) -> None:
    a = harness.make()
    assert a.publish_event(record(EVENT.lower(), by="VM-A")) is WriteResult.DONE
    assert a.publish_event(record(EVENT)) is WriteResult.EXISTS
    assert a.acknowledge(EVENT.lower(), "VM-B", T0) is WriteResult.DONE
    assert a.join("VM-A", {}) is WriteResult.DONE

    view = a.read_view("vm-a")
    assert set(view.records) == {EVENT}
    assert view.records[EVENT].published_by == "vm-a"
    assert set(view.records[EVENT].acks) == {"vm-b"}
    assert view.members == {"vm-a"}


def test_acknowledge_and_withdraw(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.acknowledge(EVENT, "vm-a", T0) is WriteResult.MISSING  # no record yet
    a.publish_event(record())

    assert a.acknowledge(EVENT, "vm-a", T0 + 1) is WriteResult.DONE
    assert a.acknowledge(EVENT, "vm-a", T0 + 2) is WriteResult.EXISTS
    assert b.acknowledge(EVENT, "vm-b", T0 + 3) is WriteResult.DONE
    # Another client's write reaches a's view once its watch has fired: ZooKeeper orders each client's
    # view, it does not make one client's write visible to another at once (the gate syncs for that).
    wait_until(lambda: set(a.read_view("vm-a").records[EVENT].acks) == {"vm-a", "vm-b"},
               timeout=5, message="b's ack in a's view")

    assert b.withdraw_ack(EVENT, "vm-b") is WriteResult.DONE
    assert b.withdraw_ack(EVENT, "vm-b") is WriteResult.MISSING
    wait_until(lambda: set(a.read_view("vm-a").records[EVENT].acks) == {"vm-a"}, timeout=5,
               message="b's withdrawal in a's view")


def test_approval_is_written_once_and_found_by_a_second_approver(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    assert a.campaign("vm-a") is True
    a.publish_event(record())
    a.acknowledge(EVENT, "vm-a", T0)
    b.acknowledge(EVENT, "vm-b", T0)

    first = a.approve(EVENT, "vm-a", ["vm-a", "VM-B"], as_leader=True, at=T0 + 10)
    assert first.outcome is ApprovalOutcome.APPROVED, first.reason
    assert first.record is not None
    assert (first.record.by, first.record.at, first.record.as_leader) == ("vm-a", T0 + 10, True)

    second = b.approve(EVENT, "vm-b", ["vm-a", "vm-b"], as_leader=False, at=T0 + 20)
    assert second.outcome is ApprovalOutcome.APPROVED, second.reason
    assert second.record == first.record

    assert b.read_view("vm-b").records[EVENT].approval == first.record


def test_approve_refused_while_acks_are_missing(harness: Harness) -> None:
    a = harness.make()
    a.join("vm-a", {})
    assert a.campaign("vm-a")
    a.publish_event(record(resources=("vm-a", "vm-b", "vm-c")))
    a.acknowledge(EVENT, "vm-a", T0)
    a.acknowledge(EVENT, "vm-c", T0)

    result = a.approve(EVENT, "vm-a", ["vm-a", "vm-b", "vm-c"], as_leader=True, at=T0)
    assert result.outcome is ApprovalOutcome.REFUSED
    assert "vm-b" in result.reason
    assert "vm-c" not in result.reason
    assert result.record is None
    assert a.read_view("vm-a").records[EVENT].approval is None


def test_approve_refused_without_a_record(harness: Harness) -> None:
    a = harness.make()
    a.join("vm-a", {})
    a.campaign("vm-a")
    result = a.approve(EVENT, "vm-a", [], as_leader=True, at=T0)
    assert result.outcome is ApprovalOutcome.REFUSED
    assert EVENT in result.reason


def test_approve_refused_when_not_the_leader(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    assert b.campaign("vm-b") is True
    assert a.campaign("vm-a") is False
    a.publish_event(record())
    a.acknowledge(EVENT, "vm-a", T0)
    a.acknowledge(EVENT, "vm-b", T0)

    result = a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=True, at=T0)
    assert result.outcome is ApprovalOutcome.REFUSED
    assert "leader" in result.reason
    assert a.read_view("vm-a").records[EVENT].approval is None


def test_approve_refused_when_the_member_node_is_not_ours(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    a.publish_event(record(resources=("vm-a",)))
    a.acknowledge(EVENT, "vm-a", T0)

    never_joined = a.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert never_joined.outcome is ApprovalOutcome.REFUSED
    assert "members/vm-a" in never_joined.reason

    b.join("vm-a", {})  # another session holds the member node of vm-a
    other_session = a.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert other_session.outcome is ApprovalOutcome.REFUSED
    assert "members/vm-a" in other_session.reason
    assert a.read_view("vm-a").records[EVENT].approval is None


def test_mark_done_and_purge_done(harness: Harness) -> None:
    a = harness.make()
    other = "D2D3B1F4-0000-4000-8000-000000000001"
    assert a.mark_done(EVENT, T0) is WriteResult.MISSING
    a.publish_event(record())
    a.publish_event(record(other))
    a.acknowledge(EVENT, "vm-a", T0)
    a.acknowledge(EVENT, "vm-b", T0)
    a.join("vm-a", {})
    a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0)

    assert a.mark_done(EVENT, T0 + 100) is WriteResult.DONE
    assert a.mark_done(EVENT, T0 + 200) is WriteResult.EXISTS
    done = a.read_view("vm-a").records[EVENT]
    assert done.done_at == T0 + 100
    # Marking done drops the approval (and any admission) in the same transaction, so that an event
    # coming back (a flap, a reused EventId) inherits neither; the rest of the record stays.
    assert done.approval is None
    assert set(done.acks) == {"vm-a", "vm-b"}
    assert done.resources == ("vm-a", "vm-b")

    assert a.purge_done(older_than=T0 + 100) == 0  # not older
    assert a.purge_done(older_than=T0 + 101) == 1
    assert a.purge_done(older_than=T0 + 101) == 0
    assert set(a.read_view("vm-a").records) == {other}  # the record not done is kept


def test_a_done_record_moves_out_of_the_view_and_an_open_one_stays(harness: Harness) -> None:
    a = harness.make()
    a.join("vm-a", {})
    other = "D2D3B1F4-0000-4000-8000-000000000001"
    a.publish_event(record())
    a.publish_event(record(other))
    a.acknowledge(EVENT, "vm-a", T0)
    assert a.mark_done(EVENT, T0 + 100) is WriteResult.DONE
    assert a.archive_done([EVENT, other], older_than=T0) == 1  # the open one stays
    assert set(a.read_view("vm-a").records) == {other}
    assert a.archive_done([EVENT], older_than=T0) == 0  # moved already
    # An event seen again once its record moved is published as a new record.
    assert a.publish_event(record()) is WriteResult.DONE
    assert a.read_view("vm-a").records[EVENT].done_at is None


def test_the_history_of_a_record_marked_done_is_kept_in_it_until_it_is_reopened(harness: Harness) -> None:
    """``status --history``'s facts, the same in both stores: the acks the approval was released on, and, once
    marked done, what its admission and approval held and when the closing agent saw it Started."""
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    assert a.campaign("vm-a") is True
    a.publish_event(record())
    assert a.admit(EVENT, "vm-a", T0 + 1) is WriteResult.DONE
    a.acknowledge(EVENT, "vm-a", T0 + 2)
    b.acknowledge(EVENT, "vm-b", T0 + 3)
    approved = a.approve(EVENT, "vm-a", ["vm-b", "vm-a"], as_leader=True, at=T0 + 4, admission=True)
    assert approved.outcome is ApprovalOutcome.APPROVED, approved.reason
    released = Approval(by="vm-a", at=T0 + 4, as_leader=True, acks=("vm-a", "vm-b"),
                        acked_at={"vm-a": T0 + 2, "vm-b": T0 + 3})
    assert approved.record == released
    wait_until(lambda: b.read_view("vm-b").records[EVENT].approval == released, timeout=5,
               message="the approval with its acks in b's view")
    assert a.read_view("vm-a").records[EVENT].closed is None  # open: no history yet

    assert a.mark_done(EVENT, T0 + 9, started_at=T0 + 6) is WriteResult.DONE
    done = a.read_view("vm-a").records[EVENT]
    assert (done.done_at, done.started_at, done.approval, done.admitted_at) == (T0 + 9, T0 + 6, None, None)
    assert done.closed == Closed(admitted_at=T0 + 1, admitted_by="vm-a", approval=released)
    assert a.mark_done(EVENT, T0 + 10, started_at=T0 + 7) is WriteResult.EXISTS
    assert a.read_view("vm-a").records[EVENT].started_at == T0 + 6  # the first done mark's

    assert a.reopen(EVENT) is WriteResult.DONE  # back: nothing of before, not even in the history
    reopened = a.read_view("vm-a").records[EVENT]
    assert (reopened.started_at, reopened.closed) == (None, None)
    assert a.mark_done(EVENT, T0 + 20) is WriteResult.DONE  # closed by an agent that never saw it Started
    again = a.read_view("vm-a").records[EVENT]
    assert (again.started_at, again.closed) == (None, Closed())


def test_admission_is_written_once(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.admit(EVENT, "vm-a", T0) is WriteResult.MISSING  # no record yet
    a.publish_event(record())
    assert a.read_view("vm-a").records[EVENT].admitted_at is None

    assert a.admit(EVENT, "vm-a", T0 + 1) is WriteResult.DONE
    assert b.admit(EVENT, "vm-b", T0 + 2) is WriteResult.EXISTS
    assert b.read_view("vm-b").records[EVENT].admitted_at == T0 + 1

    a.mark_done(EVENT, T0 + 3)
    assert a.read_view("vm-a").records[EVENT].admitted_at is None  # dropped when done
    assert a.reopen(EVENT) is WriteResult.DONE  # the event came back: admitted afresh, if ever
    assert a.reopen(EVENT) is WriteResult.EXISTS
    assert a.read_view("vm-a").records[EVENT].done_at is None
    assert a.read_view("vm-a").records[EVENT].admitted_at is None
    assert a.admit(EVENT, "vm-a", T0 + 3.5) is WriteResult.DONE
    a.mark_done(EVENT, T0 + 3)
    assert a.purge_done(T0 + 4) == 1  # and purged with the record
    assert a.read_view("vm-a").records == {}
    with pytest.raises(InvalidName):
        a.admit("../x", "vm-a", T0)


def test_a_record_marked_done_is_admitted_no_more(harness: Harness) -> None:
    """An admission lands only on a record not marked done: a reused EventId is reopened first, and then
    admitted afresh (``tests/integration/test_zookeeper_store.py`` interleaves the two on ZooKeeper)."""
    a = harness.make()
    a.publish_event(record())
    assert a.mark_done(EVENT, T0) is WriteResult.DONE
    assert a.admit(EVENT, "vm-a", T0 + 1) is WriteResult.MISSING
    assert a.read_view("vm-a").records[EVENT].admitted_at is None
    assert a.reopen(EVENT) is WriteResult.DONE
    assert a.read_view("vm-a").records[EVENT].admitted_at is None
    assert a.admit(EVENT, "vm-a", T0 + 2) is WriteResult.DONE
    assert a.read_view("vm-a").records[EVENT].admitted_at == T0 + 2


def test_registry_remembers_every_vm_that_ever_joined(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.read_view("vm-a").known == frozenset()
    a.join("VM-A", {})
    b.join("vm-b", {})
    assert a.read_view("vm-a").known == {"vm-a", "vm-b"}

    b.stop()

    def b_left() -> ClusterView | None:
        view = a.read_view("vm-a")
        return view if view.members == {"vm-a"} else None

    view = wait_until(b_left, message="b to leave")
    assert view is not None
    assert view.known == {"vm-a", "vm-b"}  # persistent: b is known though not a member

    harness.expire(a)
    assert a.join("vm-a", {}) is WriteResult.DONE  # the registry entry already exists: still DONE
    assert a.read_view("vm-a").known == {"vm-a", "vm-b"}


def test_absence_is_marked_once_and_cleared(harness: Harness) -> None:
    a = harness.make()
    assert a.read_view("vm-a").absent_since == {}
    assert a.mark_absent("VM-B", T0) is WriteResult.DONE
    assert a.mark_absent("vm-b", T0 + 5) is WriteResult.EXISTS  # the first observation is kept
    assert a.read_view("vm-a").absent_since == {"vm-b": T0}
    assert a.clear_absent("vm-b") is WriteResult.DONE
    assert a.clear_absent("vm-b") is WriteResult.MISSING
    assert a.read_view("vm-a").absent_since == {}
    with pytest.raises(InvalidName):
        a.mark_absent("../x", T0)


def test_read_view_content(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.join("vm-a", {"started_at": T0, "version": "0.1.0", "admin": "http://vm-a:9100"}) is WriteResult.DONE
    assert a.join("vm-a", {}) is WriteResult.EXISTS
    assert b.join("vm-b", {}) is WriteResult.DONE
    assert a.campaign("vm-a") is True
    assert a.campaign("vm-a") is True  # still ours
    a.publish_event(record())
    b.acknowledge(EVENT, "vm-b", T0 + 5)

    view_a = a.read_view("vm-a")
    view_b = b.read_view("vm-b")
    for view in (view_a, view_b):
        assert view.members == {"vm-a", "vm-b"}
        assert view.leader == "vm-a"
        assert view.connection is ConnectionState.CONNECTED
        assert set(view.records) == {EVENT}
        assert set(view.records[EVENT].acks) == {"vm-b"}
    assert view_a.i_am_leader is True
    assert view_b.i_am_leader is False


def test_invalid_names_are_refused(harness: Harness) -> None:
    a = harness.make()
    a.publish_event(record())
    with pytest.raises(InvalidName):
        a.join("../vm-a", {})
    with pytest.raises(InvalidName):
        a.campaign("vm a")
    with pytest.raises(InvalidName):
        a.read_view("")
    with pytest.raises(InvalidName):
        a.publish_event(dataclasses.replace(record(), event_id="../../leader"))
    with pytest.raises(InvalidName):
        a.publish_event(record(by="vm/a"))
    with pytest.raises(InvalidName):
        a.acknowledge("A/B", "vm-a", T0)
    with pytest.raises(InvalidName):
        a.acknowledge(EVENT, "vm-a/../x", T0)
    with pytest.raises(InvalidName):
        a.withdraw_ack(EVENT, "..")
    with pytest.raises(InvalidName):
        a.approve(EVENT, "vm-a", ["vm-b/x"], as_leader=False, at=T0)
    with pytest.raises(InvalidName):
        a.mark_done("..", T0)
    view = a.read_view("vm-a")
    assert set(view.records) == {EVENT}
    assert view.members == frozenset()
    assert view.leader is None


def test_clusters_are_isolated(harness: Harness) -> None:
    alpha, beta = harness.make("alpha"), harness.make("beta")
    alpha.join("vm-a", {})
    beta.join("vm-a", {})  # same VM name, other cluster: no conflict
    assert alpha.campaign("vm-a") is True
    assert beta.campaign("vm-a") is True
    alpha.publish_event(record())
    alpha.acknowledge(EVENT, "vm-a", T0)

    view = beta.read_view("vm-a")
    assert view.records == {}
    assert view.members == {"vm-a"}
    assert view.i_am_leader is True
    assert beta.acknowledge(EVENT, "vm-a", T0) is WriteResult.MISSING
    assert beta.publish_event(record()) is WriteResult.DONE  # its own copy
    assert set(alpha.read_view("vm-a").records[EVENT].acks) == {"vm-a"}
    assert beta.read_view("vm-a").records[EVENT].acks == {}


def test_session_loss_drops_ephemerals_and_join_recreates(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    assert a.campaign("vm-a") is True
    a.publish_event(record())
    a.acknowledge(EVENT, "vm-a", T0)

    harness.expire(a)

    def ephemerals_gone() -> ClusterView | None:
        view = b.read_view("vm-b")
        return view if view.members == {"vm-b"} and view.leader is None else None

    view = wait_until(ephemerals_gone, message="vm-a's member and leader nodes to vanish")
    assert view is not None
    # Acks are ephemeral: an ack never outlives the session of the agent that stands behind it.
    assert view.records[EVENT].acks == {}
    assert EVENT in view.records  # the record, a persistent node, survives
    assert a.read_view("vm-a").i_am_leader is False
    assert a.join("vm-a", {}) is WriteResult.DONE
    assert a.join("vm-a", {}) is WriteResult.EXISTS
    assert b.campaign("vm-b") is True
    assert a.campaign("vm-a") is False
    assert b.read_view("vm-b").members == {"vm-a", "vm-b"}


def test_a_fake_groups_store_suspends_and_resumes() -> None:
    """The test control of ``tests.fakezk_group.GroupStore`` (its link cut, then restored); the ZooKeeper
    store is suspended for real in test_zookeeper_store.py."""
    a = FakeGroup(lambda: T0).store(lambda: T0)
    a.start()
    a.join("vm-a", {})
    a.campaign("vm-a")
    a.publish_event(record(resources=("vm-a",)))
    a.acknowledge(EVENT, "vm-a", T0)
    wakeups: list[ConnectionState] = []
    a.set_wakeup(lambda: wakeups.append(a.connection_state))

    a.suspend()
    assert a.connection_state is ConnectionState.SUSPENDED
    result = a.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0)
    assert result.outcome is ApprovalOutcome.REFUSED
    assert "suspended" in result.reason
    with pytest.raises(StoreUnavailable):
        a.read_view("vm-a")
    with pytest.raises(StoreUnavailable):
        a.campaign("vm-a")
    with pytest.raises(StoreUnknownOutcome):
        a.acknowledge(EVENT, "vm-b", T0)

    a.resume()
    assert wakeups == [ConnectionState.SUSPENDED, ConnectionState.CONNECTED]
    assert a.read_view("vm-a").i_am_leader is True  # the session survived the suspension
    assert a.approve(EVENT, "vm-a", ["vm-a"], as_leader=True, at=T0).outcome is ApprovalOutcome.APPROVED
    a.stop()
    assert a.connection_state in (ConnectionState.LOST,)
    with pytest.raises(StoreUnavailable):
        a.read_view("vm-a")


def test_out_of_rotation_marks(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.read_view("vm-a").out == {}
    assert a.mark_out("vm-a", (), T0) is WriteResult.DONE  # out at start-up, for no event
    assert a.mark_out("vm-a", (), T0 + 1) is WriteResult.EXISTS
    assert a.mark_out("vm-a", (EVENT,), T0 + 2) is WriteResult.DONE  # now for an event; since is kept
    mark = b.read_view("vm-b").out["vm-a"]
    assert (mark.since, mark.events) == (T0, (EVENT,))
    harness.expire(a)  # persistent: survives the session, until the VM is back in rotation
    assert "vm-a" in b.read_view("vm-b").out
    assert b.clear_out("vm-a") is WriteResult.DONE
    assert b.clear_out("vm-a") is WriteResult.MISSING
    assert b.read_view("vm-b").out == {}


def test_final_check_refuses_a_done_or_unadmitted_event(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    a.publish_event(record())
    a.acknowledge(EVENT, "vm-a", T0)
    b.acknowledge(EVENT, "vm-b", T0)
    refused = a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0, admission=True)
    assert refused.outcome is ApprovalOutcome.REFUSED and "not admitted" in refused.reason
    a.admit(EVENT, "vm-a", T0)
    a.mark_done(EVENT, T0 + 1)
    done = a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0)
    assert done.outcome is ApprovalOutcome.REFUSED and "marked done" in done.reason
    a.reopen(EVENT)
    a.admit(EVENT, "vm-a", T0 + 2)
    ok = a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0 + 2, admission=True)
    assert ok.outcome is ApprovalOutcome.APPROVED


def test_final_check_counts_only_acks_held_by_the_vms_own_live_session(harness: Harness) -> None:
    """An ack another session wrote for vm-b (vm-a's here: the store lets it, as a hostile or buggy
    client could) is no acknowledgement, nor is one left by a session that no longer holds vm-b's
    member node."""
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    a.publish_event(record())
    a.acknowledge(EVENT, "vm-a", T0)
    a.acknowledge(EVENT, "vm-b", T0)  # not vm-b's own session
    refused = a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0)
    assert refused.outcome is ApprovalOutcome.REFUSED and "not held by vm-b's own live session" in refused.reason
    assert a.withdraw_ack(EVENT, "vm-b") is WriteResult.DONE
    b.acknowledge(EVENT, "vm-b", T0)
    assert a.approve(EVENT, "vm-a", ["vm-a", "vm-b"], as_leader=False, at=T0).outcome is ApprovalOutcome.APPROVED


def test_member_info_returns_what_each_live_member_joined_with(harness: Harness) -> None:
    a, b = harness.make(), harness.make()
    assert a.join("vm-a", {"probe": "http://10.0.0.4:8090/health", "version": "1"}) is WriteResult.DONE
    assert b.join("VM-B", {"probe": "http://10.0.0.5:8090/health"}) is WriteResult.DONE
    info = a.member_info(["vm-a", "vm-b", "vm-c"])
    assert set(info) == {"vm-a", "vm-b"}  # vm-c never joined
    assert info["vm-a"]["probe"] == "http://10.0.0.4:8090/health" and info["vm-a"]["version"] == "1"
    assert info["vm-b"] == {"vm": "vm-b", "probe": "http://10.0.0.5:8090/health"}
    b.stop()
    wait_until(lambda: "vm-b" not in a.member_info(["vm-a", "vm-b"]), message="vm-b's member node gone")


# -- two agents with one VM name ---------------------------------------------------------------------------


def joins(store: Store, vm: str, info: dict[str, object]) -> bool:
    try:
        return store.join(vm, info) in (WriteResult.DONE, WriteResult.EXISTS)
    except DuplicateMember:
        return False


def test_a_second_agent_with_the_same_vm_name_is_refused_and_the_first_keeps_its_node(harness: Harness) -> None:
    """Two live agents configured with one vm_name: the second never takes the first's member node; it is
    told why in one line, is not a member in its own view, neither leads nor approves, and joins once the
    first is gone."""
    first, second = harness.make(), harness.make()
    mine = member_identity(T0)  # this very process: it runs
    assert first.join("vm-a", mine) is WriteResult.DONE
    assert second.campaign("vm-a") is True  # it led before it learnt of the other agent
    for _ in range(20):
        with pytest.raises(DuplicateMember) as refused:
            second.join("vm-a", member_identity(T0 + 10))
    message = str(refused.value)
    assert isinstance(refused.value, StoreError)
    assert message.startswith("another agent runs as vm-a (member node held by session 0x")
    assert f" from host {mine['host']} pid {mine['pid']} since " in message
    assert message.endswith(
        "): this agent stays out of rotation until it is gone; check vm_name in the configuration")
    assert "\n" not in message
    assert second.duplicate is not None and str(second.duplicate) == message
    assert first.duplicate is None

    assert first.member_info(["vm-a"])["vm-a"]["started_at"] == T0  # the first's node, as it wrote it
    assert first.join("vm-a", mine) is WriteResult.EXISTS
    assert first.read_view("vm-a").members == {"vm-a"}
    assert "vm-a" not in second.read_view("vm-a").members
    with pytest.raises(DuplicateMember):
        second.campaign("vm-a")
    assert second.read_view("vm-a").leader is None  # it gave up /leader
    assert first.campaign("vm-a") is True
    first.publish_event(record(resources=("vm-a",)))
    first.acknowledge(EVENT, "vm-a", T0)
    stale = second.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert stale.outcome is ApprovalOutcome.REFUSED and "another agent runs as vm-a" in stale.reason

    first.stop()
    wait_until(lambda: joins(second, "vm-a", member_identity(T0 + 10)), message="second to join once first is gone")
    assert second.duplicate is None
    assert second.read_view("vm-a").members == {"vm-a"}
    assert second.campaign("vm-a") is True


@pytest.mark.parametrize("left_by", ["a process that has ended", "an earlier boot"])
def test_a_node_left_by_this_hosts_previous_agent_process_is_replaced(harness: Harness, left_by: str) -> None:
    """The agent restarted (or the VM rebooted) before its old session expired: the new process takes the
    node, and the old session can no longer approve in the VM's name."""
    before, after = harness.make(), harness.make()
    old = (member_identity(T0, process="gone") if left_by == "a process that has ended"
           else member_identity(T0, boot_id="an-earlier-boot"))
    assert before.join("vm-a", old) is WriteResult.DONE
    assert after.join("vm-a", member_identity(T0 + 10)) is WriteResult.DONE
    assert after.duplicate is None
    assert after.member_info(["vm-a"])["vm-a"]["started_at"] == T0 + 10
    assert after.read_view("vm-a").members == {"vm-a"}
    after.publish_event(record(resources=("vm-a",)))
    after.acknowledge(EVENT, "vm-a", T0)
    stale = before.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0)
    assert stale.outcome is ApprovalOutcome.REFUSED
    assert after.approve(EVENT, "vm-a", ["vm-a"], as_leader=False, at=T0).outcome is ApprovalOutcome.APPROVED


@pytest.mark.parametrize("theirs", ["another host", "started later", "says nothing of its process"])
def test_a_node_not_provably_this_vms_previous_agent_is_never_replaced(harness: Harness, theirs: str) -> None:
    """Even with its process gone (as seen from here), a node from another host, or from an agent that
    started after this one (of two agents that pass the rest, only one can take the other's node: they
    never take it back and forth), or one that does not say who wrote it, is another agent's."""
    first, second = harness.make(), harness.make()
    info = {
        "another host": lambda: member_identity(T0, process="gone", host="another-host"),
        "started later": lambda: member_identity(T0 + 20, process="gone"),
        "says nothing of its process": lambda: {"version": "1", "started_at": T0},
    }[theirs]()
    assert first.join("vm-a", info) is WriteResult.DONE
    with pytest.raises(DuplicateMember):
        second.join("vm-a", member_identity(T0 + 10))
    assert second.duplicate is not None
    assert first.join("vm-a", info) is WriteResult.EXISTS


def test_a_drain_by_hand_is_admitted_once_and_an_undone_ones_admission_admits_no_later_drain(
    harness: Harness,
) -> None:
    leader = harness.make()
    leader.join("vm-a", {})
    harness.drain("vm-a", "disk swap")
    asked = wait_until(lambda: leader.read_view("vm-a").drains.get("vm-a"), message="the drain in the view")
    assert (asked.reason, asked.by, asked.at, asked.admitted_at) == ("disk swap", "ops", T0, None)
    assert leader.admit_drain("vm-a", asked.asked + 1, "vm-a", T0 + 1) is WriteResult.MISSING  # another drain
    assert leader.admit_drain("vm-a", asked.asked, "vm-a", T0 + 1) is WriteResult.DONE
    assert leader.admit_drain("vm-a", asked.asked, "vm-a", T0 + 2) is WriteResult.EXISTS
    admitted = wait_until(lambda: leader.read_view("vm-a").drains["vm-a"].admitted_at, message="admitted")
    assert admitted == T0 + 1 and leader.read_view("vm-a").drains["vm-a"].admitted_by == "vm-a"
    assert leader.forget_drain_admission("vm-a") is WriteResult.EXISTS

    harness.undrain("vm-a")
    wait_until(lambda: leader.read_view("vm-a").stale_admissions == frozenset({"vm-a"}), message="stale")
    assert leader.read_view("vm-a").drains == {}
    harness.drain("vm-a", "asked again")
    again = wait_until(lambda: leader.read_view("vm-a").drains.get("vm-a"), message="asked again")
    assert again.admitted_at is None and again.asked != asked.asked  # the old admission admits it not
    assert leader.admit_drain("vm-a", again.asked, "vm-a", T0 + 3) is WriteResult.DONE  # replacing the old one
    wait_until(lambda: leader.read_view("vm-a").drains["vm-a"].admitted_at == T0 + 3, message="admitted again")
    assert leader.read_view("vm-a").stale_admissions == frozenset()
    harness.undrain("vm-a")
    wait_until(lambda: "vm-a" in leader.read_view("vm-a").stale_admissions, message="stale again")
    assert leader.forget_drain_admission("vm-a") is WriteResult.DONE
    assert leader.forget_drain_admission("vm-a") is WriteResult.MISSING
    wait_until(lambda: leader.read_view("vm-a").stale_admissions == frozenset(), message="forgotten")


def test_an_operators_approval_vouches_only_for_named_vms_without_an_agent_and_waits_for_every_other_ack(
    harness: Harness,
) -> None:
    """``coordinator approve``: the gate's checks from the store itself, each VM vouched for standing in for
    its ack only while it runs no agent, every other VM the event names acknowledged."""
    a, b = harness.make(), harness.make()
    a.join("vm-a", {})
    b.join("vm-b", {})
    a.publish_event(record(resources=("vm-a", "vm-b", "vm-z")))
    a.acknowledge(EVENT, "vm-a", T0 + 1)

    def vouch(required: tuple[str, ...], vouched: tuple[str, ...]) -> str:
        result = a.approve_vouched(EVENT, "ops@bastion", required, vouched, reason="vm-z is gone [INC-9]", at=T0 + 5)
        assert result.outcome is ApprovalOutcome.REFUSED
        return result.reason

    assert vouch(("vm-a", "vm-b"), ()) == "no VM to vouch for: every VM it names runs an agent, and the group " \
                                          "approves it itself"
    assert vouch(("vm-a",), ("vm-b", "vm-z")) == "vm-b runs an agent now: its agent acknowledges for itself"
    assert vouch(("vm-a", "vm-b"), ("vm-q",)) == f"event {EVENT} does not name vm-q"
    assert vouch(("vm-a", "vm-b"), ("vm-z",)) == f"event {EVENT}: no ack yet from vm-b"
    assert vouch(("vm-a",), ("vm-z",)) == f"event {EVENT} names vm-b, neither acknowledged nor vouched for"
    b.acknowledge(EVENT, "vm-b", T0 + 2)
    approved = a.approve_vouched(EVENT, "ops@bastion", ("vm-a", "vm-b"), ("vm-z",), reason="vm-z is gone [INC-9]",
                                 at=T0 + 5)
    assert approved.outcome is ApprovalOutcome.APPROVED, approved.reason
    expected = Approval(by="ops@bastion", at=T0 + 5, as_leader=False, acks=("vm-a", "vm-b"),
                        acked_at={"vm-a": T0 + 1, "vm-b": T0 + 2}, vouched=("vm-z",), reason="vm-z is gone [INC-9]",
                        vouched_by="ops@bastion")
    assert approved.record == expected
    wait_until(lambda: b.read_view("vm-b").records[EVENT].approval == expected, timeout=5,
               message="the operator's approval in b's view")
    again = a.approve_vouched(EVENT, "someone@else", ("vm-a", "vm-b"), ("vm-z",), reason="again", at=T0 + 6)
    assert again.outcome is ApprovalOutcome.APPROVED and again.record == expected  # written once


def test_an_operators_approval_is_refused_while_paused_or_once_done(harness: Harness) -> None:
    a = harness.make()
    a.join("vm-a", {})
    a.publish_event(record(resources=("vm-a", "vm-z")))
    a.acknowledge(EVENT, "vm-a", T0 + 1)
    harness.pause("incident")
    refused = a.approve_vouched(EVENT, "ops", ("vm-a",), ("vm-z",), reason="r", at=T0 + 2)
    assert refused.reason == "approvals are paused for the group (coordinator resume lifts it)"
    harness.resume()
    assert a.mark_done(EVENT, T0 + 3) is WriteResult.DONE
    assert a.approve_vouched(EVENT, "ops", ("vm-a",), ("vm-z",), reason="r", at=T0 + 4).reason == (
        f"event {EVENT} is marked done")


def test_an_operators_word_is_written_once_into_the_open_record_and_the_approval_keeps_it(harness: Harness) -> None:
    a = harness.make()
    a.join("vm-a", {})
    assert a.vouch(EVENT, ("vm-z",), by="ops", reason="gone", at=T0) is WriteResult.MISSING  # no record yet
    a.publish_event(record(resources=("vm-a", "vm-z")))
    assert a.vouch(EVENT, ("VM-Z",), by="ops@bastion", reason="vm-z is gone [INC-9]", at=T0 + 1) is WriteResult.DONE
    assert a.vouch(EVENT, ("vm-z",), by="someone", reason="again", at=T0 + 2) is WriteResult.EXISTS
    word = Vouch(by="ops@bastion", at=T0 + 1, reason="vm-z is gone [INC-9]", vms=("vm-z",))
    wait_until(lambda: a.read_view("vm-a").records[EVENT].vouched == word, timeout=5, message="the word in the view")
    # The record keeps what it holds: an ack and an admission written around the word stay.
    a.acknowledge(EVENT, "vm-a", T0 + 3)
    assert a.campaign("vm-a") is True
    assert a.admit(EVENT, "vm-a", T0 + 4) is WriteResult.DONE
    approved = a.approve(EVENT, "vm-a", ("vm-a",), as_leader=False, at=T0 + 5, admission=True)
    assert approved.outcome is ApprovalOutcome.APPROVED, approved.reason
    assert approved.record is not None
    assert (approved.record.by, approved.record.vouched, approved.record.reason, approved.record.vouched_by) == (
        "vm-a", ("vm-z",), "vm-z is gone [INC-9]", "ops@bastion")
    held = a.read_view("vm-a").records[EVENT]
    assert held.vouched == word and held.admitted_at == T0 + 4 and held.approval == approved.record
    # Marked done, and reopened: the word held for the event as it was.
    assert a.mark_done(EVENT, T0 + 9) is WriteResult.DONE
    assert a.read_view("vm-a").records[EVENT].vouched is None
    assert a.vouch(EVENT, ("vm-z",), by="ops", reason="late", at=T0 + 10) is WriteResult.MISSING
    assert a.reopen(EVENT) is WriteResult.DONE
    assert a.read_view("vm-a").records[EVENT].vouched is None
