"""Garbage in the group's ZooKeeper nodes, on a real server (see ``tests.hostile.zk_bench``): random bytes,
text that is not JSON, JSON of the wrong shape, payloads near ZooKeeper's 1 MB limit, payloads that claim
other VMs or events, and names that are not canonical. The agent must keep cycling, write nothing outside
its namespace, and POST no approval for an event whose VMs did not all drain: a garbage ack is no ack.

This is garbage, not forgery: a well-formed node written by someone who may write the group's nodes is
kept out by ZooKeeper ACLs, not by these checks. Hypothesis runs ``HOSTILE_ZK_EXAMPLES`` examples
(default 8), derandomized.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from coordinator.store.base import ApprovalOutcome, EventRecord
from coordinator.store.zk_paths import ZooKeeperPaths
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.hostile.imds_bench import ImdsBench
from tests.hostile.inputs import EVENT_ID, payloads
from tests.hostile.zk_bench import TARGETS, Garbage, ZkBench
from tests.plugins.zookeeper import StoreMaker

pytestmark = pytest.mark.zookeeper

EXAMPLES = int(os.environ.get("HOSTILE_ZK_EXAMPLES", "8"))

FIXED = {
    "bytes": b"\x00\xff\xfe garbage \x80",
    "not-json": b"{vm: vm1, at: now",
    "wrong-shape": b'[{"vm": "vm1"}, 1, null]',
    "wrong-types": b'{"vm": 7, "at": "yesterday", "since": [], "events": "E", "by": null, "as_leader": "yes"}',
    "empty": b"",
}


@pytest.fixture(scope="module")
def bench(zk_server: LocalZooKeeper) -> Iterator[ZkBench]:
    prefix = f"/tests/hostile-{os.getpid()}"
    with ImdsBench() as imds:
        running = ZkBench(zk_server.hosts, prefix, imds)
        try:
            yield running
        finally:
            running.client.delete(prefix, recursive=True)
            running.close()


def _clean(trial: object) -> None:
    assert trial.crashes == []  # type: ignore[attr-defined]
    assert trial.unsafe == []  # type: ignore[attr-defined]
    assert trial.outside == []  # type: ignore[attr-defined]


def test_control_a_real_ack_of_vm1_is_approved(bench: ZkBench) -> None:
    """The judge is not vacuous: with vm1's agent really acknowledging, vm0 approves."""
    trial = bench.trial([], vm1_acks=True)
    assert trial.crashes == [] and trial.outside == []
    assert trial.posts == 1


# Each node gets two of the fixed payloads, in turn (the generated test mixes the rest).
_EACH = [(target, sorted(FIXED)[(n + k) % len(FIXED)]) for n, target in enumerate(sorted(TARGETS)) for k in (0, 1)]


@pytest.mark.parametrize(("target", "payload"), _EACH)
def test_garbage_in_each_node_is_ignored_or_taken_on_the_safe_side(bench: ZkBench, target: str, payload: str) -> None:
    _clean(bench.trial([Garbage(target, FIXED[payload])]))


@pytest.mark.parametrize("target", ["ack-vm1", "record", "member-vm1", "out-vm1"])
def test_payloads_near_the_node_size_limit(bench: ZkBench, target: str) -> None:
    _clean(bench.trial([Garbage(target, b'{"vm": "' + b"x" * 1_000_000 + b'"}')]))


def test_a_garbage_ack_is_no_ack(bench: ZkBench) -> None:
    """Before the fix the view counted an undecodable ack as given (at the node's creation time) and the
    gate checked only that the node existed: vm0 approved an event vm1 never drained for."""
    _clean(bench.trial([Garbage("ack-vm1", b"\xffgarbage")]))


def test_an_ack_that_names_another_vm_is_no_ack(bench: ZkBench) -> None:
    _clean(bench.trial([Garbage("ack-vm1", b'{"vm": "vm0", "at": 1.0}')]))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_generated_garbage_neither_crashes_nor_approves(bench: ZkBench, data: st.DataObject) -> None:
    targets = data.draw(st.lists(st.sampled_from(sorted(TARGETS)), min_size=1, max_size=4, unique=True))
    garbage = [Garbage(target, data.draw(payloads(TARGETS[target][2]))) for target in targets]
    _clean(bench.trial(garbage))


def test_the_gate_refuses_an_approval_over_a_garbage_ack(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """``Store.approve`` reads every required ack: a node there that does not parse, or names another VM,
    is no ack (before the fix, its existence was enough). The garbage is written by vm1's own session
    (a buggy agent), so that only the reading of the node can refuse it."""
    store = make_store(zk_hosts, zk_chroot, "gate")
    store.join("vm0", {})
    store.publish_event(EventRecord(event_id=EVENT_ID, event_type="Reboot", resources=("vm0", "vm1"),
                                    not_before=None, published_by="vm0", published_at=1.0))
    store.acknowledge(EVENT_ID, "vm0", 1.0)
    paths = ZooKeeperPaths(store.base_path)
    vm1 = make_store(zk_hosts, zk_chroot, "gate")
    vm1.join("vm1", {})
    client = vm1.client
    assert client is not None
    for garbage in (b"\xffnot json", b'{"vm": "vm0", "at": 2.0}'):
        client.create(paths.ack(EVENT_ID, "vm1"), garbage, ephemeral=True)
        result = store.approve(EVENT_ID, "vm0", ["vm0", "vm1"], as_leader=False, at=3.0, admission=False)
        assert result.outcome is ApprovalOutcome.REFUSED
        assert "the ack of vm1 does not count" in result.reason
        client.delete(paths.ack(EVENT_ID, "vm1"))
    vm1.acknowledge(EVENT_ID, "vm1", 2.0)  # the control: a real ack of vm1's own session counts
    result = store.approve(EVENT_ID, "vm0", ["vm0", "vm1"], as_leader=False, at=3.0, admission=False)
    assert result.outcome is ApprovalOutcome.APPROVED


def test_the_gate_refuses_a_well_formed_ack_that_vm1s_own_session_does_not_hold(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    """Where ACLs do not keep other clients out, a forged ack that parses (persistent, or ephemeral of
    another session) must not count, even while vm1 is a live member that never drained."""
    store = make_store(zk_hosts, zk_chroot, "forged")
    store.join("vm0", {})
    store.publish_event(EventRecord(event_id=EVENT_ID, event_type="Reboot", resources=("vm0", "vm1"),
                                    not_before=None, published_by="vm0", published_at=1.0))
    store.acknowledge(EVENT_ID, "vm0", 1.0)
    vm1 = make_store(zk_hosts, zk_chroot, "forged")
    vm1.join("vm1", {})
    paths = ZooKeeperPaths(store.base_path)
    client = KazooClient(hosts=zk_hosts, timeout=5.0)
    client.start(timeout=5.0)
    try:
        for ephemeral in (False, True):
            client.create(paths.ack(EVENT_ID, "vm1"), b'{"vm": "vm1", "at": 2.0}', ephemeral=ephemeral)
            result = store.approve(EVENT_ID, "vm0", ["vm0", "vm1"], as_leader=False, at=3.0, admission=False)
            assert result.outcome is ApprovalOutcome.REFUSED
            assert "not held by vm1's own live session" in result.reason
            client.delete(paths.ack(EVENT_ID, "vm1"))
        vm1.acknowledge(EVENT_ID, "vm1", 2.0)
        result = store.approve(EVENT_ID, "vm0", ["vm0", "vm1"], as_leader=False, at=3.0, admission=False)
        assert result.outcome is ApprovalOutcome.APPROVED
    finally:
        client.stop()
        client.close()


def test_the_view_does_not_count_a_garbage_ack(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    """Before the fix an ack that did not parse counted, timed by the node's creation. The view that reads
    the acks' data (``coordinator status``) leaves it out. An agent's view lists the acks by name only and
    so counts it, on the safe side only (its record stays open, its VM counts out of rotation): whether it
    is an ack is the gate's to judge (``test_the_gate_refuses_an_approval_over_a_garbage_ack``)."""
    store = make_store(zk_hosts, zk_chroot, "view", ack_times=True)
    agent = make_store(zk_hosts, zk_chroot, "view")
    store.join("vm0", {})
    store.publish_event(EventRecord(event_id=EVENT_ID, event_type="Reboot", resources=("vm0", "vm1", "vm2"),
                                    not_before=None, published_by="vm0", published_at=1.0))
    store.acknowledge(EVENT_ID, "vm0", 1.0)
    paths = ZooKeeperPaths(store.base_path)
    client = KazooClient(hosts=zk_hosts, timeout=5.0)
    client.start(timeout=5.0)
    try:
        client.create(paths.ack(EVENT_ID, "vm1"), b"\xffnot json")
        client.create(paths.ack(EVENT_ID, "vm2"), b'{"vm": "vm0", "at": 2.0}')
        acks = store.read_view("vm0").records[EVENT_ID].acks
        assert set(acks) == {"vm0"}
        assert set(agent.read_view("vm9").records[EVENT_ID].acks) == {"vm0", "vm1", "vm2"}
        refused = store.approve(EVENT_ID, "vm0", ["vm0", "vm1", "vm2"], as_leader=False, at=3.0, admission=False)
        assert refused.outcome is ApprovalOutcome.REFUSED
    finally:
        client.stop()
        client.close()
