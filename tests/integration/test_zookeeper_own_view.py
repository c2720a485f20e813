"""A VM that follows only its own part of the group (``read_view(vm, part=Part.OWN)``), against a real
ZooKeeper: it reads what ``own_view`` keeps of the whole view, and another VM's event (its record, acks,
admission, approval, ``/out`` marks, done mark and purge) and the absences neither cost it a request nor wake
it. A VM an event names that neither approves nor closes it (``part=Part.NAMED``) reads what ``named_view``
keeps: every record with its own ack only, and another VM's ack or mark costs it nothing.

Requests are counted by the server (``cons``: the last xid it answered for the session); wake-ups by the
store's watch counter (``generation``), after a ``sync`` on the reader's own connection has let every watch
event sent to it arrive.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.store.base import ApprovalOutcome, ClusterView, Part, named_view, own_view
from coordinator.store.zookeeper import ZooKeeperStore
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.integration.test_zookeeper_watched_view import (
    EVENT,
    OTHER,
    SEEN_WITHIN,
    T0,
    all_told,
    eventually,
    record,
    requests_sent,
)
from tests.plugins.zookeeper import StoreMaker, wait_until


def woken(store: ZooKeeperStore) -> int:
    """How many watch events (and connection changes) have reached ``store`` so far."""
    all_told(store)
    return store._session.generation


def own(store: ZooKeeperStore, condition: Callable[[ClusterView], bool], what: str) -> ClusterView:
    """The first own view of vm-a for which ``condition`` holds (only own views read: no whole view's
    watches are set)."""
    view: ClusterView = wait_until(
        lambda: (lambda v: v if condition(v) else None)(store.read_view("vm-a", part=Part.OWN)),
        timeout=SEEN_WITHIN, message=what)
    return view


def busy_group(a: ZooKeeperStore, b: ZooKeeperStore, c: ZooKeeperStore) -> None:
    """vm-a, vm-b and vm-c joined; b leads; EVENT names vm-b and vm-c (both acked, admitted, approved, both
    out of rotation); OTHER names vm-a, which acked it; vm-z is marked absent."""
    for store, vm in ((a, "vm-a"), (b, "vm-b"), (c, "vm-c")):
        store.join(vm, {})
    assert b.campaign("vm-b") is True
    b.publish_event(record(EVENT, ("vm-b", "vm-c")))
    b.publish_event(record(OTHER, ("vm-a",)))
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    c.acknowledge(EVENT, "vm-c", T0 + 2)
    a.acknowledge(OTHER, "vm-a", T0 + 3)
    b.admit(EVENT, "vm-b", T0 + 4)
    assert b.approve(EVENT, "vm-b", ["vm-b", "vm-c"], as_leader=True, at=T0 + 5).outcome is ApprovalOutcome.APPROVED
    b.mark_out("vm-b", (EVENT,), T0 + 6)
    c.mark_out("vm-c", (EVENT,), T0 + 6)
    a.mark_out("vm-a", (OTHER,), T0 + 7)
    b.mark_absent("vm-z", T0 + 8)


def busy_whole_view(make_store: StoreMaker, hosts: str, chroot: str, reader: str) -> tuple[list[ZooKeeperStore],
                                                                                           ClusterView]:
    """The busy group's stores (vm-a, vm-b, vm-c) and its whole view as ``reader`` reads it."""
    stores = [make_store(hosts, chroot) for _ in range(3)]
    busy_group(*stores)
    store = stores["abc".index(reader[-1])]
    return stores, eventually(store, reader, lambda v: "vm-z" in v.absent_since and len(v.out) == 3, "the busy group")


def test_an_own_view_is_the_whole_view_cut_down_to_the_reading_vm(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    (a, _, _), whole = busy_whole_view(make_store, zk_hosts, zk_chroot, "vm-a")
    assert whole.complete and whole.records[EVENT].approval is not None and whole.records[EVENT].acks
    expected = own_view(whole, "vm-a")
    assert expected.records == {} and set(expected.out) == {"vm-a"}

    # Read cold by a store that never read the whole view, and cut down from what a's cache keeps.
    a_again = make_store(zk_hosts, zk_chroot)
    cold = a_again.read_view("vm-a", part=Part.OWN)
    from_cache = a.read_view("vm-a", part=Part.OWN)
    for view in (cold, from_cache):
        assert not view.complete
        assert view.records == expected.records
        assert (view.out, view.absent_since) == (expected.out, {})
        assert (view.members, view.known, view.leader, view.paused) == (whole.members, whole.known, "vm-b", None)
    assert a.read_view("vm-a") == whole  # and back to the whole view


def test_a_vm_following_its_own_part_is_not_told_of_another_vms_event_at_all(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b, c = (make_store(zk_server.hosts, zk_chroot) for _ in range(3))
    for store, vm in ((a, "vm-a"), (b, "vm-b"), (c, "vm-c")):
        store.join(vm, {})
    assert b.campaign("vm-b") is True
    view = own(a, lambda v: v.leader == "vm-b" and len(v.members) == 3, "the group")
    woken_before = woken(a)
    sent_before = requests_sent(zk_server, a)

    # An event's whole life for the VMs it names and the leader: none of it reaches vm-a.
    b.publish_event(record(EVENT, ("vm-b", "vm-c")))
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    c.acknowledge(EVENT, "vm-c", T0 + 1)
    b.mark_out("vm-b", (EVENT,), T0 + 1)
    c.mark_out("vm-c", (EVENT,), T0 + 1)
    b.admit(EVENT, "vm-b", T0 + 2)
    assert b.approve(EVENT, "vm-b", ["vm-b", "vm-c"], as_leader=True, at=T0 + 3).outcome is ApprovalOutcome.APPROVED
    b.mark_absent("vm-z", T0 + 4)
    c.withdraw_ack(EVENT, "vm-c")
    b.withdraw_ack(EVENT, "vm-b")
    c.clear_out("vm-c")
    b.clear_out("vm-b")
    b.clear_absent("vm-z")
    b.mark_done(EVENT, T0 + 5)
    assert b.purge_done(T0 + 6) == 1
    sent_after = requests_sent(zk_server, a)
    assert woken(a) == woken_before  # (its sync is one request of vm-a's own)
    assert sent_after == sent_before
    sent_before = requests_sent(zk_server, a)
    assert a.read_view("vm-a", part=Part.OWN) == view
    assert requests_sent(zk_server, a) == sent_before  # answered from what it keeps: nothing changed for it

    # What it follows does reach it: its own mark, a member joining.
    a.mark_out("vm-a", (), T0 + 7)  # its own write: read again next time
    assert set(a.read_view("vm-a", part=Part.OWN).out) == {"vm-a"}
    d = make_store(zk_server.hosts, zk_chroot)
    d.join("vm-d", {})
    seen = own(a, lambda v: "vm-d" in v.members, "a new member")
    assert seen.records == {} and not seen.complete


def test_a_named_view_is_the_whole_view_with_the_reading_vms_own_ack_and_mark_only(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    (_, _, c), whole = busy_whole_view(make_store, zk_hosts, zk_chroot, "vm-c")
    expected = named_view(whole, "vm-c")
    assert set(expected.records) == {EVENT, OTHER} and set(expected.records[EVENT].acks) == {"vm-c"}
    assert expected.records[EVENT].approval is not None and expected.records[EVENT].admitted_at == T0 + 4
    c_again = make_store(zk_hosts, zk_chroot)
    for view in (c_again.read_view("vm-c", part=Part.NAMED), c.read_view("vm-c", part=Part.NAMED)):
        assert view == expected
    assert c.read_view("vm-c") == whole  # and back to the whole view


def test_a_vm_named_second_is_told_of_its_own_part_of_the_event_only(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    """vm-c, named after vm-b: vm-b's ack, its withdrawal and vm-b's ``/out`` mark neither cost vm-c a
    request nor wake it; the admission, the approval and its own ack do reach it."""
    a, b, c = (make_store(zk_server.hosts, zk_chroot) for _ in range(3))
    for store, vm in ((a, "vm-a"), (b, "vm-b"), (c, "vm-c")):
        store.join(vm, {})
    assert a.campaign("vm-a") is True
    b.publish_event(record(EVENT, ("vm-b", "vm-c")))

    def named(condition: Callable[[ClusterView], bool], what: str) -> ClusterView:
        found: ClusterView = wait_until(
            lambda: (lambda v: v if condition(v) else None)(c.read_view("vm-c", part=Part.NAMED)),
            timeout=SEEN_WITHIN, message=what)
        return found

    view = named(lambda v: EVENT in v.records and len(v.members) == 3, "the record")
    woken_before, sent_before = woken(c), requests_sent(zk_server, c)
    b.mark_out("vm-b", (EVENT,), T0 + 1)
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    b.withdraw_ack(EVENT, "vm-b")
    b.clear_out("vm-b")
    b.mark_absent("vm-z", T0 + 1)
    sent_after = requests_sent(zk_server, c)
    assert woken(c) == woken_before  # (its sync is one request of vm-c's own)
    assert sent_after == sent_before
    sent_before = requests_sent(zk_server, c)
    assert c.read_view("vm-c", part=Part.NAMED) == view
    assert requests_sent(zk_server, c) == sent_before  # nothing it follows changed

    c.acknowledge(EVENT, "vm-c", T0 + 2)
    c.mark_out("vm-c", (EVENT,), T0 + 2)
    a.admit(EVENT, "vm-a", T0 + 3)
    seen = named(lambda v: v.records[EVENT].admitted_at is not None and "vm-c" in v.out, "the admission")
    assert set(seen.records[EVENT].acks) == {"vm-c"} and seen.records[EVENT].acks
    b.acknowledge(EVENT, "vm-b", T0 + 4)
    assert b.approve(EVENT, "vm-b", ["vm-b", "vm-c"], as_leader=False, at=T0 + 5).outcome is ApprovalOutcome.APPROVED
    seen = named(lambda v: v.records[EVENT].approval is not None, "the approval")
    assert set(seen.records[EVENT].acks) == {"vm-c"} and set(seen.out) == {"vm-c"}
    c.withdraw_ack(EVENT, "vm-c")
    assert named(lambda v: not v.records[EVENT].acks, "its ack withdrawn").records[EVENT].approval is not None
