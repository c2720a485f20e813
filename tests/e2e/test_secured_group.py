"""End to end on a locked-down ensemble: a TLS-only ZooKeeper that requires client certificates, digest
authentication, and ACLs with operator and reader identities. The whole agent works over it; an agent
with the wrong password says so and stays out of rotation without blocking its peers' events or
releasing its own; a reader sees the group and cannot pause it; an operator can."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.store.zk_security import digest_identity
from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.e2e.support import approvals, gone, serving, transitions, waiting_for

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def _acked(cluster: LocalCluster, vm: str, event_id: str) -> bool:
    status = cluster.agents[vm].status() or {}
    return any(e["event_id"] == event_id and vm in e["acks"] for e in status.get("events", []))


def _command(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_locked_down_group_drains_and_approves_and_a_wrong_password_stays_safe(
    tmp_path: Path, zk_tls_server: LocalZooKeeper
) -> None:
    assert zk_tls_server.tls is not None
    pki = zk_tls_server.tls.pki
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name, text in (("agent", "agent-secret"), ("wrong", "not-the-password"), ("operator", "ops-secret")):
        (secrets / name).write_text(text + "\n")
        (secrets / name).chmod(0o600)

    def tls(who: str) -> dict[str, str]:
        return {"ca": str(pki.ca), "certfile": str(pki.cert(who)), "keyfile": str(pki.key(who))}

    operator = digest_identity("operator", "ops-secret")
    acl = {"operators": [f"digest:{operator.id}"], "readers": [pki.x509_identity("reader")]}
    zookeeper = {"hosts": zk_tls_server.hosts, "tls": tls("agent"), "acl": acl,
                 "auth": {"username": "coordinator", "password_file": str(secrets / "agent")}}
    wrong = {**zookeeper, "auth": {"username": "coordinator", "password_file": str(secrets / "wrong")}}
    cluster = LocalCluster(tmp_path / "group", ("vm0", "vm1", "vm2"), cluster=f"s{uuid.uuid4().hex[:8]}",
                           drain_wait=0.5, poll_interval=0.3, started_for=2.0, zk_hosts=zk_tls_server.hosts,
                           extra_config={"zookeeper": zookeeper}, per_vm_config={"vm2": {"zookeeper": wrong}})
    try:
        cluster.start(wait_joined=False)
        assert cluster.sim is not None
        cluster.wait(lambda: serving(cluster, ("vm0", "vm1")), 40, "vm0 and vm1 serving over TLS")
        vm2_log = cluster.agents["vm2"].log_path
        cluster.wait(lambda: "not authorised as coordinator" in vm2_log.read_text(), 20,
                     "vm2 to say ZooKeeper refuses its credentials")
        status = cluster.agents["vm0"].status() or {}
        assert status["cluster"]["members"] == ["vm0", "vm1"]
        assert cluster.agents["vm2"].probe() == 503  # out of rotation: it cannot coordinate

        # The whole protocol over TLS with ACLs: drain, acknowledge, approve, recover.
        first = cluster.sim.schedule("Reboot", ["vm0"], not_before_in=600)["event_id"]
        cluster.wait(lambda: approvals(cluster, first) != [], 30, "the approval of vm0's event")
        cluster.wait(lambda: gone(cluster, first), 30, "the event to run and end")
        assert ("Scheduled", "Started", "approved") in transitions(cluster, first)
        cluster.wait(lambda: serving(cluster, ("vm0", "vm1")), 30, "vm0 and vm1 serving again")

        # An event naming vm2 is not approved early: vm2 never joined, so it blocks the event (which
        # then drains just in time before NotBefore), and the approver says so.
        with_vm2 = cluster.sim.schedule("Reboot", ["vm1", "vm2"], not_before_in=600)["event_id"]
        cluster.wait(lambda: waiting_for(cluster, "vm1", "vm2"), 20, "the approver to name vm2 as the blocker")
        time.sleep(2.0)  # several cycles more
        assert approvals(cluster, with_vm2) == []
        assert not _acked(cluster, "vm2", with_vm2)

        # A reader sees the group and cannot pause it; an operator can, and can lift it.
        def config(name: str, zk: dict[str, Any]) -> Path:
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump({"cluster": cluster.cluster, "zookeeper": zk}))
            return path

        reader = config("reader", {"hosts": zk_tls_server.hosts, "tls": tls("reader")})
        read = _command(reader, "status", "--json", "--no-agents")
        assert read.returncode == 0, read.stderr
        group = json.loads(read.stdout)
        assert [m["vm"] if isinstance(m, dict) else m for m in group["members"]] == ["vm0", "vm1"]
        refused = _command(reader, "pause", "--reason", "should not work")
        assert refused.returncode == 1 and "not authorised" in refused.stderr, refused.stderr
        ops = config("operator", {"hosts": zk_tls_server.hosts, "tls": tls("operator"), "acl": acl,
                                  "auth": {"username": "operator", "password_file": str(secrets / "operator")}})
        paused = _command(ops, "pause", "--reason", "change freeze")
        assert paused.returncode == 0, paused.stderr
        cluster.wait(lambda: ((cluster.agents["vm0"].status() or {}).get("cluster") or {}).get("paused") is not None,
                     10, "the agents to see the pause")
        resumed = _command(ops, "resume")
        assert resumed.returncode == 0 and "lifted" in resumed.stdout, resumed.stderr
    finally:
        cluster.stop()
