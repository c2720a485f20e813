"""End to end for the operator's controls: a group-wide pause through ZooKeeper, and maintenance windows."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from coordinator.testbed.cluster import LocalCluster
from tests.e2e.support import ClusterFactory, approvals, gone, transitions, waiting_for

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def _control(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    config = cluster.agents["vm2"].config_path  # any agent's file names the group
    return subprocess.run([sys.executable, "-m", "coordinator", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)


def _acked_by(cluster: LocalCluster, vm: str, event_id: str) -> bool:
    """Whether ``vm``'s own ack of the event stands, by its agent's account (a VM named after the first reads
    its own ack only: its ``acks`` are null)."""
    status = cluster.agents[vm].status() or {}
    return any(e["event_id"] == event_id and e["acked_here"] for e in status.get("events", []))


def test_pause_holds_every_early_approval_while_drains_go_on_and_resume_releases_them(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(drain_wait=0.5)
    assert cluster.sim is not None
    paused = _control(cluster, "pause", "--reason", "incident 4711: keep capacity")
    assert paused.returncode == 0, paused.stderr
    assert "paused" in paused.stdout
    again = _control(cluster, "pause", "--reason", "a second pause")
    assert again.returncode == 0 and "already paused" in again.stdout and "incident 4711" in again.stdout

    event_id = cluster.sim.schedule("Reboot", ["vm0", "vm1"], not_before_in=600)["event_id"]
    # Drains and acknowledgements go on: both VMs drain and acknowledge...
    cluster.wait(lambda: _acked_by(cluster, "vm0", event_id) and _acked_by(cluster, "vm1", event_id), 20,
                 "both VMs to drain and acknowledge while paused")
    assert cluster.agents["vm0"].probe() == 503 and cluster.agents["vm1"].probe() == 503
    # ...but the approver holds the approval, says why, and shows the pause.
    cluster.wait(lambda: waiting_for(cluster, "vm0", "approvals paused by"), 10, "the approver to name the pause")
    status = cluster.agents["vm0"].status() or {}
    assert status["cluster"]["paused"]["reason"] == "incident 4711: keep capacity"
    assert "coordinator_paused 1.0" in cluster.agents["vm0"].metrics()
    assert approvals(cluster, event_id) == []

    resumed = _control(cluster, "resume")
    assert resumed.returncode == 0 and "lifted" in resumed.stdout, resumed.stderr
    cluster.wait(lambda: approvals(cluster, event_id) != [], 15, "the approval once the pause is lifted")
    cluster.wait(lambda: gone(cluster, event_id), 30, "the event to run and end")
    assert ("Scheduled", "Started", "approved") in transitions(cluster, event_id)
    assert _control(cluster, "resume").stdout.strip().endswith("was not paused")


def test_an_event_outside_the_maintenance_windows_starts_at_not_before(make_cluster: ClusterFactory) -> None:
    # A window that closed an hour ago and opens again in a day: now is outside it.
    now = dt.datetime.now(dt.UTC)
    start, end = (now - dt.timedelta(hours=3)).strftime("%H:%M"), (now - dt.timedelta(hours=1)).strftime("%H:%M")
    window = {"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "start": start, "end": end}
    cluster = make_cluster(drain_wait=0.5, extra_config={
        "policy": {"maintenance_windows": [window]},
        "drain": {"latest_start_seconds": 3, "wait_seconds_by_type": {"Preempt": 0.5}},  # every wait within 3 s
    })
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Reboot", ["vm0"], not_before_in=8)["event_id"]
    cluster.wait(lambda: waiting_for(cluster, "vm0", "outside the maintenance windows"), 10,
                 "the approver to say the event waits for a window")
    cluster.wait(lambda: gone(cluster, event_id), 40, "the event to start at NotBefore and end")
    assert approvals(cluster, event_id) == []
    assert ("Scheduled", "Started", "not_before") in transitions(cluster, event_id)


def test_an_event_inside_a_maintenance_window_is_approved_early(make_cluster: ClusterFactory) -> None:
    now = dt.datetime.now(dt.UTC)
    start, end = (now - dt.timedelta(hours=1)).strftime("%H:%M"), (now + dt.timedelta(hours=1)).strftime("%H:%M")
    cluster = make_cluster(drain_wait=0.5, extra_config={
        "policy": {"maintenance_windows": [{"start": start, "end": end, "timezone": "UTC"}]}})
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Reboot", ["vm0"], not_before_in=600)["event_id"]
    cluster.wait(lambda: approvals(cluster, event_id) != [], 20, "an early approval inside the window")


def _probe_is(cluster: LocalCluster, vm: str, code: int) -> bool:
    return cluster.agents[vm].probe() == code


def test_a_drain_by_hand_waits_for_the_budget_lasts_across_a_restart_and_undrain_puts_the_vm_back(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(drain_wait=0.5, extra_config={"policy": {"max_vms_in_maintenance": 1}})
    first = _control(cluster, "drain", "vm1", "--reason", "disk swap [CHG-7]", "--wait", "30")
    assert first.returncode == 0 and "vm1 to be drained by hand (disk swap [CHG-7])" in first.stdout, first.stderr
    assert first.stdout.rstrip().endswith("vm1: drained: out of rotation, its drain actions done"), first.stdout
    assert _probe_is(cluster, "vm1", 503)
    assert (cluster.agents["vm1"].status() or {}).get("phase") == "drained"

    # A second drain waits: one VM at most may be out, and vm1 is. --wait says why, and gives up in time.
    second = _control(cluster, "drain", "vm0", "--reason", "kernel debugging", "--wait", "4")
    assert second.returncode == 1, second.stdout
    assert "vm0: waiting for the maintenance budget: " in second.stdout, second.stdout
    assert second.stderr.strip() == ("coordinator: vm0: not drained within 4 s (--wait); the request stands: "
                                     "coordinator status shows it")

    def by_hand() -> dict[str, dict[str, object]]:
        run = subprocess.run([sys.executable, "-m", "coordinator", "status", "--json", "--config",
                              str(cluster.agents["vm2"].config_path)], capture_output=True, text=True, timeout=30,
                             check=False)
        assert run.returncode == 0, run.stderr
        return {d["vm"]: d for d in json.loads(run.stdout)["drained_by_hand"]}

    cluster.wait(lambda: (by_hand().get("vm0") or {}).get("waiting") == (
        "maintenance budget: 1 VM(s) in maintenance, at most 1"), 15, "vm0's drain to wait for the budget")
    assert _probe_is(cluster, "vm0", 200)
    drained = by_hand()["vm1"]
    assert drained["out"] is True and drained["phase"] == "drained" and drained["admitted_by"] in cluster.vms

    # vm1's agent restarts: its VM stays out, without a moment back in rotation.
    cluster.stop_agent("vm1")
    cluster.start_agent("vm1")
    cluster.wait(lambda: (cluster.agents["vm1"].status() or {}).get("phase") == "drained", 20,
                 "vm1 drained again after its restart")
    assert _probe_is(cluster, "vm1", 503)

    # Undone: vm1 comes back, and then vm0's drain is admitted.
    undone = _control(cluster, "undrain", "vm1", "--wait", "30")
    assert undone.returncode == 0 and "undone" in undone.stdout, undone.stderr
    assert undone.stdout.rstrip().endswith("vm1: back in rotation: serving"), undone.stdout
    assert _probe_is(cluster, "vm1", 200)
    cluster.wait(lambda: _probe_is(cluster, "vm0", 503), 20, "vm0 drained once vm1 is back")
    assert _probe_is(cluster, "vm1", 200)
    assert _control(cluster, "undrain", "vm0").returncode == 0
    cluster.wait(lambda: _probe_is(cluster, "vm0", 200), 20, "vm0 back in rotation")
