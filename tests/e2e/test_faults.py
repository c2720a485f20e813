"""End to end under real faults: agents killed, paused and restarted, ZooKeeper down or losing a node.

Every test checks the same two safety properties from the outside (the simulator's log, ZooKeeper's
own timestamps, the probes as a load balancer sees them):
* no approval reaches IMDS before every VM named by the event has acknowledged;
* every VM that drained serves again once its event is gone.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper
from tests.e2e.observer import Observer
from tests.e2e.support import ClusterFactory, approvals, assert_acked_before_approval, gone, transitions, waiting_for

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def test_peer_without_agent_blocks_early_approval(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    cluster.stop_agent("vm1")  # vm1 runs no agent: nobody can drain it
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Freeze", ["vm0", "vm1"], not_before_in=6)["event_id"]
    cluster.wait(lambda: waiting_for(cluster, "vm0", "vm1 runs no agent"), 15, "vm0 to name vm1 as the blocker")
    cluster.wait(lambda: gone(cluster, event_id), 30, "the event to start at NotBefore and end")
    assert approvals(cluster, event_id) == []
    assert ("Scheduled", "Started", "not_before") in transitions(cluster, event_id)
    cluster.wait(lambda: cluster.agents["vm0"].probe() == 200, 10, "vm0 to serve again")


def test_paused_peer_holds_approval_until_it_resumes_and_acks(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    assert cluster.sim is not None
    vm1 = cluster.agents["vm1"]
    assert vm1.proc is not None
    with Observer(cluster) as observer:
        vm1.proc.send_signal(signal.SIGSTOP)  # frozen before it could drain and acknowledge
        try:
            event_id = cluster.sim.schedule("Reboot", ["vm0", "vm1"], not_before_in=120)["event_id"]
            # vm0 drains and acks; the approver (vm0) must then wait for vm1, first as a silent member,
            # then, once vm1's session expired, as a VM that runs no agent.
            cluster.wait(lambda: (event_id.upper(), "vm0") in observer.seen.ack_ctime, 15, "vm0's ack")
            cluster.wait(lambda: waiting_for(cluster, "vm0", "vm1 runs no agent"), 20, "vm1's session to expire")
            assert approvals(cluster, event_id) == []
        finally:
            resumed_at = time.time()
            vm1.proc.send_signal(signal.SIGCONT)
        cluster.wait(lambda: gone(cluster, event_id), 30, "the event to be approved, start and end")
        posted = assert_acked_before_approval(observer, cluster, event_id, {"vm0", "vm1"})
        assert posted["t"] > resumed_at
        assert posted["vm"] == "vm0"
        assert ("Scheduled", "Started", "approved") in transitions(cluster, event_id)
    cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 15, "everyone serving")


def test_agent_killed_mid_drain_comes_back_drained(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(drain_wait=3.0)
    assert cluster.sim is not None
    with Observer(cluster) as observer:
        event_id = cluster.sim.schedule("Redeploy", ["vm0", "vm1"], not_before_in=120)["event_id"]
        # Killed before its ack (the drain wait is 3 s): the phase is draining for a cycle, then drained.
        cluster.wait(lambda: (cluster.agents["vm0"].status() or {}).get("phase") in ("draining", "drained"), 10,
                     "vm0 draining")
        cluster.stop_agent("vm0", signal.SIGKILL)
        assert approvals(cluster, event_id) == []
        restarted_at = time.time()
        cluster.start_agent("vm0")  # the VM's agent comes back (a reboot of the agent)
        cluster.wait(lambda: gone(cluster, event_id), 40, "the event to be approved, start and end")
        posted = assert_acked_before_approval(observer, cluster, event_id, {"vm0", "vm1"})
        assert posted["vm"] == "vm0"
        ended_at = [e["t"] for e in cluster.sim.log(kind="transition") if e["event_id"] == event_id][-1]
        cluster.wait(lambda: cluster.agents["vm0"].probe() == 200, 15, "vm0 to serve again")
    # From its restart until its event was gone, the restarted agent never told the LB to send traffic.
    during = [code for t, code in observer.seen.probes["vm0"] if restarted_at <= t <= ended_at]
    assert during and 200 not in during, during


def test_agent_restarted_after_its_event_ended_puts_the_vm_back(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Reboot", ["vm1"], not_before_in=120)["event_id"]
    cluster.wait(lambda: (cluster.sim.event(event_id) or {}).get("status") == "Started", 20, "the Reboot to start")  # type: ignore[union-attr]
    cluster.stop_agent("vm1", signal.SIGKILL)  # the VM reboots during its maintenance
    cluster.wait(lambda: gone(cluster, event_id), 20, "the event to end")
    cluster.start_agent("vm1")
    cluster.wait(lambda: cluster.agents["vm1"].probe() == 200, 15, "vm1 to serve again after the reboot")
    assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm1"]


def test_zookeeper_down_vms_drain_nothing_approved_then_recover(
    make_cluster: ClusterFactory, zk_server_factory: Callable[[], LocalZooKeeper]
) -> None:
    zk = zk_server_factory()
    cluster = make_cluster(zk_hosts=zk.hosts)
    assert cluster.sim is not None
    zk.kill()
    event_id = cluster.sim.schedule("Freeze", ["vm0", "vm1"], not_before_in=5)["event_id"]
    cluster.wait(lambda: cluster.agents["vm0"].probe() == 503 and cluster.agents["vm1"].probe() == 503, 10,
                 "vm0 and vm1 to drain without ZooKeeper")
    assert cluster.agents["vm2"].probe() == 200
    cluster.wait(lambda: gone(cluster, event_id), 30, "the event to start at NotBefore and end")
    assert approvals(cluster, event_id) == []
    assert ("Scheduled", "Started", "not_before") in transitions(cluster, event_id)
    cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 15,
                 "every VM serving again, ZooKeeper still down")
    zk.start()
    cluster.wait(lambda: all((s or {}).get("cluster") and len(s["cluster"]["members"]) == 3  # type: ignore[index]
                             for s in cluster.statuses().values()), 40, "the agents to rejoin")


def test_zookeeper_node_loss_during_an_event(make_cluster: ClusterFactory, tmp_path: Path) -> None:
    ensemble = LocalEnsemble(tmp_path / "ensemble")
    ensemble.start()
    try:
        cluster = make_cluster(zk_hosts=ensemble.hosts)
        assert cluster.sim is not None
        with Observer(cluster) as observer:
            event_id = cluster.sim.schedule("Freeze", ["vm1", "vm2"], not_before_in=120)["event_id"]
            # Draining lasts as long as the drain actions (a cycle here): drained counts as begun too.
            cluster.wait(lambda: (cluster.agents["vm1"].status() or {}).get("phase") in ("draining", "drained"), 10,
                         "vm1 draining")
            leader = ensemble.leader_index()
            assert leader is not None
            ensemble.kill(leader)
            cluster.wait(lambda: gone(cluster, event_id), 40, "the event to be approved, start and end")
            posted = assert_acked_before_approval(observer, cluster, event_id, {"vm1", "vm2"})
            assert posted["vm"] == "vm1"
        cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 15, "everyone serving")
        cluster.stop()
    finally:
        ensemble.stop()


def test_zookeeper_unreachable_at_start(tmp_path: Path) -> None:
    port = free_port()
    cluster = LocalCluster(tmp_path / "group", cluster="cold", zk_hosts=f"127.0.0.1:{port}", drain_wait=1.0,
                           poll_interval=0.3, started_for=2.0)
    zk = LocalZooKeeper(tmp_path / "zookeeper", client_port=port)
    try:
        cluster.start(wait_joined=False)
        assert cluster.sim is not None
        # No ZooKeeper: agents run, serve (no event names them), and report the store as unavailable.
        cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 30, "every VM serving")
        assert all(s is not None and s["cluster"] is None for s in cluster.statuses().values())
        event_id = cluster.sim.schedule("Freeze", ["vm0"], not_before_in=120)["event_id"]
        cluster.wait(lambda: cluster.agents["vm0"].probe() == 503, 10, "vm0 to drain without ZooKeeper")
        zk.start()
        cluster.wait(lambda: gone(cluster, event_id), 40, "the event to be approved once ZooKeeper is up")
        assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm0"]
        assert ("Scheduled", "Started", "approved") in transitions(cluster, event_id)
        cluster.wait(lambda: cluster.agents["vm0"].probe() == 200, 15, "vm0 to serve again")
    finally:
        cluster.stop()
        zk.stop()
