"""A VM that follows only its own part of the group (``read_view(vm, complete=False)``), against a real
ZooKeeper: it reads what ``own_view`` keeps of the whole view, and the acks, admissions, approvals, other
VMs' ``/out`` marks and absences neither cost it a request nor wake it.

Requests are counted by the server (``cons``: the last xid it answered for the session); wake-ups by the
store's watch counter (``generation``), after a ``sync`` on the reader's own connection has let every watch
event sent to it arrive.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.store.base import ApprovalOutcome, ClusterView, own_view
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
        lambda: (lambda v: v if condition(v) else None)(store.read_view("vm-a", complete=False)),
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


def test_an_own_view_is_the_whole_view_cut_down_to_the_reading_vm(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b, c = (make_store(zk_hosts, zk_chroot) for _ in range(3))
    busy_group(a, b, c)
    whole = eventually(a, "vm-a", lambda v: "vm-z" in v.absent_since and len(v.out) == 3, "the busy group")
    assert whole.complete and whole.records[EVENT].approval is not None and whole.records[EVENT].acks
    expected = own_view(whole, "vm-a")
    assert expected.records[OTHER].acks == {"vm-a": T0 + 3} and set(expected.out) == {"vm-a"}

    # Read cold by a store that never read the whole view, and cut down from what a's cache keeps.
    a_again = make_store(zk_hosts, zk_chroot)
    cold = a_again.read_view("vm-a", complete=False)
    from_cache = a.read_view("vm-a", complete=False)
    for view in (cold, from_cache):
        assert not view.complete
        assert view.records == expected.records
        assert (view.out, view.absent_since) == (expected.out, {})
        assert (view.members, view.known, view.leader, view.paused) == (whole.members, whole.known, "vm-b", None)
    assert a.read_view("vm-a") == whole  # and back to the whole view


def test_a_vm_following_its_own_part_is_not_told_of_other_vms_acks_marks_admissions_or_approvals(
    zk_server: LocalZooKeeper, zk_chroot: str, make_store: StoreMaker
) -> None:
    a, b, c = (make_store(zk_server.hosts, zk_chroot) for _ in range(3))
    for store, vm in ((a, "vm-a"), (b, "vm-b"), (c, "vm-c")):
        store.join(vm, {})
    assert b.campaign("vm-b") is True
    b.publish_event(record(EVENT, ("vm-b", "vm-c")))
    view = own(a, lambda v: EVENT in v.records, "the record")
    woken_before = woken(a)

    # An event's life for the VMs it names and the leader: none of it reaches vm-a.
    b.acknowledge(EVENT, "vm-b", T0 + 1)
    c.acknowledge(EVENT, "vm-c", T0 + 1)
    b.mark_out("vm-b", (EVENT,), T0 + 1)
    c.mark_out("vm-c", (EVENT,), T0 + 1)
    b.admit(EVENT, "vm-b", T0 + 2)
    assert b.approve(EVENT, "vm-b", ["vm-b", "vm-c"], as_leader=True, at=T0 + 3).outcome is ApprovalOutcome.APPROVED
    b.mark_absent("vm-z", T0 + 4)
    c.withdraw_ack(EVENT, "vm-c")
    c.clear_out("vm-c")
    b.clear_absent("vm-z")
    # One watch event: the admission sets the record's node (its version check), as it does for every agent.
    assert woken(a) == woken_before + 1
    sent_before = requests_sent(zk_server, a)
    assert a.read_view("vm-a", complete=False) == view
    assert requests_sent(zk_server, a) == sent_before + 1  # that node

    # What it follows does reach it: a record's node rewritten (done), its own ack and mark, a new record.
    b.mark_done(EVENT, T0 + 5)
    own(a, lambda v: v.records[EVENT].done_at == T0 + 5, "the record marked done")
    a.acknowledge(EVENT, "vm-a", T0 + 6)  # its own write: read again next time
    assert a.read_view("vm-a", complete=False).records[EVENT].acks == {"vm-a": T0 + 6}
    b.publish_event(record(OTHER, ("vm-a",)))
    all_told(a)
    before = requests_sent(zk_server, a)
    seen = own(a, lambda v: OTHER in v.records, "a new record")
    assert seen.records[OTHER].acks == {} and not seen.complete
    assert requests_sent(zk_server, a) - before == 3  # /events, the record's node, exists of its own ack
