"""``coordinator doctor`` run as an operator runs it (a process of its own) on a VM of a real group: two agents
on a real ZooKeeper (with digest credentials, so that the group's nodes are closed) and the IMDS simulator.
Its lines as the checks complete, its JSON, its exit status; and the FAILs of a VM whose ZooKeeper cannot
be reached and whose clock is two minutes behind IMDS's (the simulator's ``--date-skew``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.plugins.simulator import SimulatorFactory

ROOT = Path(__file__).parent.parent.parent
CHECKS = ["config", "actions", "imds-proxy", "imds", "clock", "zookeeper", "zookeeper-acl", "session-timeout", "probe",
          "members", "delivery", "azure", "azure-probe", "azure-repairs", "azure-terminate", "azure-approve",
          "azure-spot", "azure-lb"]
AZURE = ("azure-probe", "azure-repairs", "azure-terminate", "azure-approve", "azure-spot")


def doctor(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COORDINATOR__") and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "coordinator", "doctor", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)


def statuses(output: str) -> dict[str, str]:
    """check name -> status, from the lines the command printed."""
    found = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("PASS", "WARN", "FAIL", "SKIP") and words[1] in CHECKS:
            found[words[1]] = words[0]
    return found


@pytest.fixture
def group(tmp_path: Path, zk_server_factory: Callable[[], LocalZooKeeper]) -> Iterator[LocalCluster]:
    # A server of its own: the agents close the ACL of every node they create on the way to their root,
    # which would shut the other tests out of a shared server's /tests.
    server = zk_server_factory()
    cluster = LocalCluster(
        tmp_path / "group", ("vm0", "vm1"), cluster="doctor", zk_hosts=server.hosts, session_timeout=6.0,
        extra_config={"zookeeper": {"root": "/doctor/groups",
                                    "auth": {"username": "agent", "password": "doctor-secret"}},
                      # No load balancer here: a probe timing the testbed's 2 s drain wait covers, or the
                      # config check would warn that the wait is shorter than Azure's default 15 s x 2.
                      "drain": {"probe_interval_seconds": 1, "probe_threshold": 1}},
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_doctor_on_a_vm_of_a_healthy_group_passes_all_but_its_loopback_probe(group: LocalCluster) -> None:
    config = group.agents["vm0"].config_path
    run = doctor(config)
    lines = run.stdout.splitlines()
    assert lines[0].startswith("coordinator doctor ") and str(config) in lines[0]
    # One line per check, in order, then the summary.
    assert [line.split()[1] for line in lines[1:-1]] == CHECKS, run.stdout
    assert statuses(run.stdout) == {
        "config": "PASS", "actions": "PASS", "imds-proxy": "PASS", "imds": "PASS", "clock": "PASS", "zookeeper": "PASS",
        "zookeeper-acl": "PASS", "session-timeout": "PASS",
        "probe": "WARN",  # every agent of this group listens on loopback: fine on one machine, not on Azure
        "members": "PASS", "delivery": "PASS", "azure": "SKIP", **dict.fromkeys(AZURE, "SKIP"), "azure-lb": "SKIP",
    }, run.stdout + run.stderr
    by_name = {line.split()[1]: line for line in lines[1:-1]}
    assert "this VM is vm0" in by_name["imds"]
    assert "over TLS" not in by_name["zookeeper"] and "as agent" in by_name["zookeeper"]
    assert "none writable by world:anyone" in by_name["zookeeper-acl"]
    assert "loopback" in by_name["probe"] and "| fix: on Azure, set probe.advertise" in by_name["probe"]
    assert "2 member(s) (vm0 " in by_name["members"] and "1 peer probe(s) answer" in by_name["members"]
    # No azure-lb action and no --arm: ARM is not read, and nothing is said about it beyond one SKIP each.
    assert "not asked: no azure-lb action, and no --arm" in by_name["azure"]
    assert all("ARM was not read (see the azure check)" in by_name[name] for name in AZURE)
    assert lines[-1].startswith("WARN: ") and lines[-1].endswith("exit status 1")
    assert run.returncode == 1

    as_json = doctor(config, "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert {"version", "config", "cluster", "vm", "status", "exit_status", "seconds", "counts", "checks"} <= set(report)
    assert (report["vm"], report["cluster"], report["status"], report["exit_status"]) == ("vm0", "doctor", "WARN", 1)
    assert report["counts"] == {"PASS": 10, "WARN": 1, "FAIL": 0, "SKIP": 7}
    assert [c["name"] for c in report["checks"]] == CHECKS
    for check in report["checks"]:
        assert set(check) == {"name", "title", "status", "summary", "fix", "seconds", "details"}
        assert (check["fix"] is None) == (check["status"] in ("PASS", "SKIP")), check
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["zookeeper"]["details"]["granted_session_timeout"] == 6.0
    assert set(checks["members"]["details"]["members"]) == {"vm0", "vm1"}
    assert checks["probe"]["details"]["url"] == group.agents["vm0"].probe_url
    assert abs(checks["clock"]["details"]["offset_seconds"]) < 5


def test_doctor_on_a_peer_warns_of_a_vm_named_by_an_open_event_whose_agent_is_stopped(group: LocalCluster) -> None:
    group.stop_agent("vm1")
    assert group.sim is not None
    event = group.sim.schedule("Reboot", ["vm1"], not_before_in=900)
    members: dict[str, object] = {}

    def warned() -> bool:  # once vm0 has published the Reboot's record
        nonlocal members
        run = doctor(group.agents["vm0"].config_path, "--json")
        members = {c["name"]: c for c in json.loads(run.stdout)["checks"]}["members"]
        return members["status"] == "WARN"

    group.wait(warned, 40, "the members check warns")
    assert f"named by an open event but running no agent: vm1 ({event['event_id']})" in str(members["summary"])
    assert "start the agent on vm1" in str(members["fix"])
    details = members["details"]
    assert isinstance(details, dict) and details["named_without_agent"] == {"vm1": [event["event_id"]]}


def test_doctor_fails_an_unreachable_zookeeper_and_a_clock_two_minutes_behind(
    tmp_path: Path, imds_sim: SimulatorFactory
) -> None:
    sim = imds_sim(vms=("vm0",), extra_args=["--date-skew", "120"])
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "doctor", "vm_name": "vm0", "imds": {"url": sim.urls["vm0"]},
        "zookeeper": {"hosts": f"127.0.0.1:{free_port()}", "session_timeout": 6, "operation_timeout": 2},
        "probe": {"listen": f"127.0.0.1:{free_port()}"}, "http": {"listen": f"127.0.0.1:{free_port()}"},
        "state_file": str(tmp_path / "state.json"),
    }))
    began = time.monotonic()
    run = doctor(config, "--json", "--timeout", "20")
    assert time.monotonic() - began < 20
    assert run.returncode == 2, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert (report["status"], report["exit_status"]) == ("FAIL", 2)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["imds"]["status"] == "PASS"
    assert checks["clock"]["status"] == "FAIL"
    assert "this clock is 120 s behind IMDS's Date" in checks["clock"]["summary"]
    assert 115 < checks["clock"]["details"]["offset_seconds"] < 125
    assert checks["zookeeper"]["status"] == "FAIL" and "cannot reach ZooKeeper" in checks["zookeeper"]["summary"]
    assert checks["members"]["status"] == "SKIP"
    # Without zookeeper.auth the agents create open nodes: known without reading them.
    acl = checks["zookeeper-acl"]
    assert acl["status"] == "FAIL" and "zookeeper.auth is not set" in acl["summary"]
    # No agent runs here, and nothing answers on its probe port: not a member, so a WARN.
    assert checks["probe"]["status"] == "WARN" and "nothing answers" in checks["probe"]["summary"]
