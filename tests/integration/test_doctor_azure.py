"""``coordinator doctor``'s ARM checks, run as a process of its own against the IMDS simulator with its
simulated ARM (``--arm``): a scale set whose load balancer probe, automatic repairs, terminate
notifications, scheduledEventsPolicy and priority are right, one with a 10-minute repair grace period on
the drain probe and Spot priority, an identity without the Reader role, and one with no identity at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from coordinator.testbed.processes import free_port
from tests.integration.test_doctor import doctor, statuses
from tests.plugins.simulator import RunningSimulator, SimulatorFactory

SUB = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/maintenance-sim/providers"
LB = f"{SUB}/Microsoft.Network/loadBalancers/web-lb"
POOL = f"{LB}/backendAddressPools/web-pool"
SCALE_SET = f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web"  # what IMDS's compute.resourceId names
BAD_SCALE_SET = f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/batch"
AVSET_VM = f"{SUB}/Microsoft.Compute/virtualMachines/spot-vm"
AVSET = f"{SUB}/Microsoft.Compute/availabilitySets/avset-web"
LAX_AVSET = f"{SUB}/Microsoft.Compute/availabilitySets/avset-lax"  # auto-approves user redeploys
LAX_AVSET_VM = f"{SUB}/Microsoft.Compute/virtualMachines/lax-vm"
SKIP = ("--skip", "zookeeper,zookeeper-acl,session-timeout,probe,members")  # no ZooKeeper here: ARM only
AZURE = ["azure", "azure-probe", "azure-repairs", "azure-terminate", "azure-approve", "azure-spot"]


@pytest.fixture
def sim(imds_sim: SimulatorFactory) -> RunningSimulator:
    sim = imds_sim(("web_0", "web_1"), extra_args=["--arm", "127.0.0.1:0", "--scale-set", "web"])
    assert sim.arm_url
    return sim


def _config(tmp_path: Path, sim: RunningSimulator, probe_port: int) -> Path:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "web", "imds": {"url": sim.urls["web_0"]},
        "zookeeper": {"hosts": f"127.0.0.1:{free_port()}"},
        "probe": {"listen": f"127.0.0.1:{probe_port}", "path": "/health"},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "drain": {"probe_interval_seconds": 5, "probe_threshold": 2, "wait_seconds": 20},
        "actions": [{"type": "azure-lb", "backend_pools": [POOL], "backend_address": "web_0",
                     "arm_url": sim.arm_url, "imds_url": sim.urls["web_0"]}],
        "state_file": str(tmp_path / "state.json"),
    }))
    return config


def _setup(sim: RunningSimulator, probe_port: int) -> None:
    control = sim.control
    control.add_pool(POOL, [{"name": "web_0", "ip_address": "10.0.1.4"}, {"name": "web_1", "ip_address": "10.0.1.5"}])
    control.add_load_balancer(LB, [{"name": "drain-probe", "protocol": "Http", "port": probe_port,
                                    "interval_in_seconds": 5, "probe_threshold": 2, "request_path": "/health"}])
    control.add_scale_set(SCALE_SET, automatic_repairs={"enabled": True, "grace_period": "PT30M"},
                          health_probe=f"{LB}/probes/drain-probe",
                          terminate_notification={"enable": True, "not_before_timeout": "PT10M"},
                          scheduled_events_policy={"user_initiated_reboot": False, "user_initiated_redeploy": False},
                          priority="Regular")
    control.add_scale_set(BAD_SCALE_SET, automatic_repairs={"enabled": True, "grace_period": "PT10M"},
                          health_probe=f"{LB}/probes/drain-probe", priority="Spot",
                          scheduled_events_policy={"user_initiated_reboot": True})
    control.add_availability_set(AVSET, scheduled_events_policy={"user_initiated_reboot": False,
                                                                 "all_instances_down": True})
    control.add_vm_resource(AVSET_VM, priority="Spot", scheduled_events_policy={"user_initiated_redeploy": False},
                            availability_set=AVSET)
    control.add_availability_set(LAX_AVSET, scheduled_events_policy={"user_initiated_redeploy": True,
                                                                     "all_instances_down": False})
    control.add_vm_resource(LAX_AVSET_VM, availability_set=LAX_AVSET)
    # Network Contributor on the load balancer (the azure-lb action) and Reader (doctor).
    control.set_role("web_0", roles=["network-contributor", "reader"])


def _lines(output: str) -> dict[str, str]:
    return {line.split()[1]: line for line in output.splitlines() if line.split()[:1] in (["PASS"], ["WARN"],
                                                                                             ["FAIL"], ["SKIP"])}


def test_a_well_set_scale_set_passes_every_arm_check(tmp_path: Path, sim: RunningSimulator) -> None:
    probe_port = free_port()
    _setup(sim, probe_port)
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP)
    found = statuses(run.stdout)
    assert {name: found.get(name) for name in AZURE} == dict.fromkeys(AZURE, "PASS"), run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert "read load balancer web-lb, scale set web with the system-assigned identity" in lines["azure"]
    assert "drain-probe: Http port" in lines["azure-probe"] and "new flows stop 10 s after the probe fails" \
        in lines["azure-probe"] and "fallback wait (15 s) covers it" in lines["azure-probe"]
    assert "grace period of 30 min, longer than the longest drain (15 min)" in lines["azure-repairs"]
    assert "terminate notifications are on, 10 min of notice" in lines["azure-terminate"]
    assert "wait for approval" in lines["azure-approve"] and "Regular priority" in lines["azure-spot"]
    assert run.returncode == 0, run.stdout + run.stderr
    calls = sim.control.arm_calls()
    # Read only: a token, and one GET each of the load balancer and the scale set; no pool written.
    assert calls["calls"].get("resource_get") == 2 and "pool_put" not in calls["calls"], calls


def test_a_ten_minute_repair_grace_on_the_drain_probe_fails_and_spot_warns(
    tmp_path: Path, sim: RunningSimulator
) -> None:
    probe_port = free_port()
    _setup(sim, probe_port)
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP, "--resource-id", BAD_SCALE_SET, "--json")
    assert run.returncode == 2, run.stdout + run.stderr
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    repairs = checks["azure-repairs"]
    assert repairs["status"] == "FAIL", repairs
    assert "grace period of 10 min" in repairs["summary"] and "replaced in the middle of planned maintenance" \
        in repairs["summary"]
    assert "gracePeriod=PT20M" in repairs["fix"]
    assert checks["azure-spot"]["status"] == "WARN" and "Preempt with 30 s of notice" in checks["azure-spot"]["summary"]
    approve = checks["azure-approve"]
    assert approve["status"] == "FAIL" and "user-initiated reboots are approved by Azure at once" \
        in approve["summary"] and "hit a VM while it serves" in approve["summary"], approve
    assert approve["fix"] == (f"az vmss update --ids {BAD_SCALE_SET} --set "
                              "scheduledEventsPolicy.userInitiatedReboot.automaticallyApprove=false")
    terminate = checks["azure-terminate"]
    assert terminate["status"] == "WARN" and "terminate notifications are off" in terminate["summary"]
    assert checks["azure"]["status"] == "PASS" and checks["azure-probe"]["status"] == "PASS"


def test_an_availability_set_vm_has_no_scale_set_checks_and_spot_warns(tmp_path: Path, sim: RunningSimulator) -> None:
    probe_port = free_port()
    _setup(sim, probe_port)
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP, "--resource-id", AVSET_VM)
    found = statuses(run.stdout)
    assert (found["azure-repairs"], found["azure-terminate"]) == ("SKIP", "SKIP"), run.stdout
    assert "not a scale set" in _lines(run.stdout)["azure-repairs"]
    assert (found["azure-approve"], found["azure-spot"]) == ("PASS", "WARN"), run.stdout
    approve = _lines(run.stdout)["azure-approve"]
    assert "in availability set avset-web" in approve and "allInstancesDown, the default" in approve, approve
    assert run.returncode == 1


def test_an_availability_set_that_auto_approves_redeploys_fails_its_vm_and_says_how_to_turn_it_off(
    tmp_path: Path, sim: RunningSimulator,
) -> None:
    probe_port = free_port()
    _setup(sim, probe_port)
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP, "--resource-id", LAX_AVSET_VM, "--json")
    checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
    approve = checks["azure-approve"]
    assert approve["status"] == "FAIL", approve
    assert "availability set avset-lax: user-initiated redeploys are approved by Azure at once" in approve["summary"]
    assert approve["fix"] == (f"az vm availability-set update --ids {LAX_AVSET} --set "
                              "scheduledEventsPolicy.userInitiatedRedeploy.automaticallyApprove=false")
    assert approve["details"]["all_instances_down"] is False
    assert run.returncode == 2


def test_without_the_reader_role_doctor_says_so_and_passes_nothing_it_did_not_read(
    tmp_path: Path, sim: RunningSimulator
) -> None:
    probe_port = free_port()
    _setup(sim, probe_port)
    sim.control.set_role("web_0", "network-contributor")  # enough for the action, not to read the scale set
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP)
    found = statuses(run.stdout)
    lines = _lines(run.stdout)
    assert found["azure"] == "WARN" and "403 AuthorizationFailed" in lines["azure"], run.stdout
    assert "| fix: give this VM's identity Reader" in lines["azure"]
    assert found["azure-probe"] == "PASS"  # the load balancer is readable with Network Contributor
    for name in ("azure-repairs", "azure-terminate", "azure-approve", "azure-spot"):
        assert found[name] == "SKIP" and "was not read (see the azure check)" in lines[name], run.stdout
    assert run.returncode == 1


def test_without_an_identity_doctor_says_so_in_one_line(tmp_path: Path, imds_sim: SimulatorFactory) -> None:
    sim = imds_sim(("web_0",), extra_args=["--arm", "127.0.0.1:0", "--scale-set", "web", "--no-system-identity"])
    probe_port = free_port()
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP)
    found = statuses(run.stdout)
    line = _lines(run.stdout)["azure"]
    assert found["azure"] == "WARN" and "no token for the system-assigned identity" in line, run.stdout
    assert "Identity not found" in line and "| fix: assign a managed identity to this VM" in line
    assert all(found[name] == "SKIP" for name in AZURE[1:]), run.stdout
    # The azure-lb action cannot drain without a token: that check fails, naming the identity.
    assert found["azure-lb"] == "FAIL" and "system-assigned identity" in _lines(run.stdout)["azure-lb"], run.stdout
    assert run.returncode == 2


def test_an_application_health_extension_asking_the_agent_for_a_path_it_does_not_serve_fails(
    tmp_path: Path, sim: RunningSimulator
) -> None:
    """The extension pointed at the agent's probe port with the default path ``/``: the agent answers 404
    there, so every VM reads Unhealthy and automatic repairs replace it once the grace runs out."""
    probe_port = free_port()
    _setup(sim, probe_port)
    lost = f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/lost"
    sim.control.add_scale_set(lost, automatic_repairs={"enabled": True, "grace_period": "PT30M"},
                              health_extension={"protocol": "http", "port": probe_port})
    run = doctor(_config(tmp_path, sim, probe_port), *SKIP, "--resource-id", lost, "--json")
    assert run.returncode == 2, run.stdout + run.stderr
    repairs = {c["name"]: c for c in json.loads(run.stdout)["checks"]}["azure-repairs"]
    assert repairs["status"] == "FAIL", repairs
    assert f"port {probe_port} /)" in repairs["summary"] and "not a health endpoint of the agent" \
        in repairs["summary"]
    assert "/apphealth" in repairs["fix"], repairs
