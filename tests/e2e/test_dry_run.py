"""End to end for ``coordinator run --dry-run``: it observes only. It serves no health probe (the load
balancer keeps seeing what the VM's real agent answers, or nothing), runs beside the real agent without a
port clash, decides from what the group's agents read (membership as it is, the operator's pause) and says
what it would do, and what holds each event, once per change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from coordinator.testbed.cluster import LocalCluster
from tests.e2e.support import ClusterFactory, approvals, gone, waiting_for

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def _control(cluster: LocalCluster, *args: str) -> None:
    config = cluster.agents["vm2"].config_path  # any agent's file names the group
    subprocess.run([sys.executable, "-m", "coordinator", *args, "--config", str(config)],
                   capture_output=True, text=True, timeout=30, check=True)


def _no_placeholders(log: str) -> None:
    for line in log.splitlines():
        if "dry-run:" in line:
            assert " for -" not in line and ": -" not in line and "None" not in line, line


def test_a_dry_run_where_the_agent_is_stopped_leaves_the_vm_out_of_rotation_and_says_why(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster()
    assert cluster.sim is not None
    cluster.stop_agent("vm1")  # the load balancer's probe of vm1 gets no answer: vm1 is out of rotation
    assert cluster.agents["vm1"].probe() is None
    event_id = cluster.sim.schedule("Reboot", ["vm1"], not_before_in=10)["event_id"]
    dry = cluster.start_dry_run("vm1")
    seen: set[int | None] = set()

    def said(text: str) -> bool:
        seen.add(cluster.agents["vm1"].probe())
        return text in dry.log_path.read_text()

    cluster.wait(lambda: said("dry-run: would drain vm1"), 10, "the dry run to say it would drain vm1")
    # What holds the event, in the group's words: vm1 runs no agent (the dry run does not count itself).
    cluster.wait(lambda: said(f"event {event_id} held: ") and said("vm1 runs no agent"), 10,
                 "the dry run to say what holds the event")
    assert "vm1" not in ((dry.status() or {}).get("cluster") or {}).get("members", ["vm1"])
    assert waiting_for(cluster, "vm0", "vm1 runs no agent") or waiting_for(cluster, "vm2", "vm1 runs no agent")
    cluster.wait(lambda: said("") and gone(cluster, event_id), 30, "the event to start at NotBefore")
    # Nothing answered the load balancer for vm1 at any point: the dry run never put it back in rotation.
    assert seen == {None}
    assert approvals(cluster, event_id) == []
    log = dry.log_path.read_text()
    assert "no health probe" in log
    assert log.count(f"event {event_id} held: ") == len(set(
        line.split(" held: ", 1)[1] for line in log.splitlines() if f"event {event_id} held: " in line))
    _no_placeholders(log)


def test_a_dry_run_beside_the_agent_sees_the_pause_then_says_it_would_approve(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(drain_wait=0.5)
    assert cluster.sim is not None
    dry = cluster.start_dry_run("vm1")  # beside vm1's agent: its own admin port, no probe of its own
    assert cluster.agents["vm1"].alive() and cluster.agents["vm1"].probe() == 200
    _control(cluster, "pause", "--reason", "change freeze")
    event_id = cluster.sim.schedule("Reboot", ["vm1"], not_before_in=600)["event_id"]
    cluster.wait(lambda: "paused" in dry.log_path.read_text().split(f"event {event_id} held: ", 1)[-1], 15,
                 "the dry run to say the pause holds the event")
    cluster.wait(lambda: waiting_for(cluster, "vm1", "paused"), 10, "vm1's agent to hold it for the pause")
    assert "would approve" not in dry.log_path.read_text()
    # vm1's agent, drained and acknowledged, is stopped (its session and ack stand until its session
    # timeout), then approvals resume: the dry run, reading the same group, says it would approve now.
    agent_pid = cluster.agents["vm1"].pid
    assert agent_pid is not None
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        _control(cluster, "resume")
        cluster.wait(lambda: f"dry-run: would approve event {event_id} (required acks: vm1)"
                     in dry.log_path.read_text(), 5, "the dry run to say it would approve")
        assert approvals(cluster, event_id) == []
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    cluster.wait(lambda: gone(cluster, event_id), 40, "vm1's agent to approve the event")
    assert [e["vm"] for e in approvals(cluster, event_id)] == ["vm1"]
    _no_placeholders(dry.log_path.read_text())
