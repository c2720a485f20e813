"""End to end: ``coordinator approve`` on a live group (agents, the simulator with its ARM, ZooKeeper): an event
that waits on a VM that runs no agent is approved early once an operator vouches for that VM, by the group
itself through its budget, drains and gate; and one that names only such VMs is approved by the command,
through this VM's IMDS or through the Maintenance API."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from coordinator.control import operator_name
from coordinator.testbed.cluster import LocalCluster
from tests.e2e.support import ClusterFactory, approvals, gone, transitions, waiting_for

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

VM4 = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/maintenance-sim/providers/" \
      "Microsoft.Compute/virtualMachines/vm4"


def _approve(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    config = cluster.agents["vm2"].config_path
    return subprocess.run([sys.executable, "-m", "coordinator", "approve", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)


def _status(cluster: LocalCluster, *, history: bool = True) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "coordinator", "status", "--json", *(["--history"] if history else []),
                          "--config", str(cluster.agents["vm2"].config_path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return dict(json.loads(run.stdout))


def test_a_vm_without_an_agent_vouched_for_lets_the_group_approve_its_event_early(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(vms=("vm0", "vm1", "vm2", "vm3"), drain_wait=0.5, sim_args=["--arm", "127.0.0.1:0"])
    assert cluster.sim is not None
    cluster.stop_agent("vm3")  # registered, and now runs no agent
    event_id = cluster.sim.schedule("Reboot", ["vm1", "vm3"], not_before_in=600)["event_id"]
    cluster.wait(lambda: waiting_for(cluster, "vm1", "vm3 runs no agent"), 20, "vm1 to wait for vm3")
    assert cluster.agents["vm1"].probe() == 200  # unapprovable: it drains just in time, not now

    vouched = _approve(cluster, event_id, "--reason", "vm3 is being rebuilt [CHG-12]")
    assert vouched.returncode == 0, vouched.stderr
    assert "vouches for vm3 (no agent): vm3 is being rebuilt [CHG-12]" in vouched.stdout
    assert "the group approves it once vm1 has drained and acknowledged" in vouched.stdout
    cluster.wait(lambda: approvals(cluster, event_id) != [], 30, "the group's approval")
    assert approvals(cluster, event_id)[0]["vm"] == "vm1"  # its own approver, through its IMDS
    assert ("Scheduled", "Started", "approved") in transitions(cluster, event_id)
    cluster.wait(lambda: gone(cluster, event_id), 30, "the Reboot to run and end")
    cluster.wait(lambda: any(e["event_id"] == event_id.upper() for e in _status(cluster)["events"]), 20,
                 "the finished event in the history")
    [entry] = [e for e in _status(cluster)["events"] if e["event_id"] == event_id.upper()]
    approval = entry["approval"]
    assert approval["by"] == "vm1" and approval["acks"] == ["vm1"]
    assert approval["vouched"] == ["vm3"] and approval["reason"] == "vm3 is being rebuilt [CHG-12]"
    assert approval["vouched_by"] == operator_name()
    # Refused in one line: an event already over, and one every VM of which runs an agent.
    again = _approve(cluster, event_id, "--reason", "again")
    assert again.returncode == 1 and "is over" in again.stderr, again.stderr
    covered = cluster.sim.schedule("Freeze", ["vm0", "vm1"], not_before_in=600)["event_id"]
    cluster.wait(lambda: any(e["event_id"] == covered and e["approver"] for e in
                             (cluster.agents["vm0"].status() or {}).get("events", [])), 20, "the Freeze's record")
    refused = _approve(cluster, covered, "--reason", "no need")
    assert refused.returncode == 1 and "every VM event" in refused.stderr and "names runs an agent" in refused.stderr


def test_an_event_of_vms_that_all_run_no_agent_is_approved_by_the_command_through_imds_or_the_maintenance_api(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(vms=("vm0", "vm1", "vm2", "vm3", "vm4", "vm5"), drain_wait=0.5,
                           sim_args=["--arm", "127.0.0.1:0", "--units", "vm0,vm1,vm2,vm3/vm4,vm5"])
    assert cluster.sim is not None
    for vm in ("vm3", "vm4"):
        cluster.stop_agent(vm)
    through_imds = cluster.sim.schedule("Reboot", ["vm3"], not_before_in=600)["event_id"]
    cluster.wait(lambda: any(e["event_id"] == through_imds and "vm3 runs no agent" in e["waiting_for"]
                             for e in (cluster.agents["vm0"].status() or {}).get("events", [])), 20,
                 "the leader to name vm3 as what holds it")
    done = _approve(cluster, through_imds, "--reason", "vm3 is gone for good")
    assert done.returncode == 0, done.stderr
    cluster.wait(lambda: approvals(cluster, through_imds) != [], 20, "the approval")
    assert ("Scheduled", "Started", "approved") in transitions(cluster, through_imds)

    # An event of a VM of another delivery unit, where no VM of the group but vm5 sees it: no VM it names runs
    # an agent, and this VM's IMDS does not show it. From outside: the Maintenance API, with vm2's managed
    # identity given the role it needs.
    far = cluster.sim.schedule("Redeploy", ["vm4"], not_before_in=600)["event_id"]
    cluster.wait(lambda: any(e["event_id"] == far for e in (cluster.agents["vm5"].status() or {}).get("events", [])),
                 20, "vm5 to see the Redeploy of vm4")
    cluster.wait(lambda: _published(cluster, far), 20, "its record, published by vm5")
    seen_here = _approve(cluster, far, "--reason", "vm4 is retired")
    assert seen_here.returncode == 1 and "this VM's IMDS document does not show event" in seen_here.stderr
    denied = _approve(cluster, far, "--reason", "vm4 is retired", "--via", "maintenance", "--resource", VM4,
                      "--arm-url", cluster.arm_url)
    assert denied.returncode == 1 and "Scheduled Event Contributor" in denied.stderr, denied.stderr
    cluster.sim.set_role("vm2", "scheduled-event-contributor")
    sent = _approve(cluster, far, "--reason", "vm4 is retired", "--via", "maintenance", "--resource", VM4,
                    "--arm-url", cluster.arm_url)
    assert sent.returncode == 0, sent.stderr
    assert "approved through the Maintenance API on" in sent.stdout, sent.stdout
    cluster.wait(lambda: approvals(cluster, far) != [], 20, "the approval through the Maintenance API")
    assert [e["vm"] for e in approvals(cluster, far)] == ["maintenance-api"]


def _published(cluster: LocalCluster, event_id: str) -> bool:
    return any(e["event_id"] == event_id.upper() for e in _status(cluster, history=False)["events"])
