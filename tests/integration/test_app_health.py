"""The application health endpoint of a real agent (its own process, the IMDS simulator, a real ZooKeeper):
Healthy while the VM is drained for planned maintenance and its load-balancer probe answers 503, IMDS
refusing it included; Unhealthy once its recovery has kept failing past the bound after the event is
gone; Healthy again once the recovery succeeds."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coordinator.httpserver import APP_HEALTH_REASON_HEADER
from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.processes import free_port

# The recover hook of a local service that does not come back while ``marker`` exists.
RECOVER = "import os, sys; sys.exit('service did not start' if os.path.exists(sys.argv[1]) else 0)"
FAILING_AFTER = 2.0


@pytest.fixture
def group(tmp_path: Path, zk_hosts: str, zk_chroot: str) -> Iterator[tuple[LocalCluster, Path, int]]:
    marker = tmp_path / "service-broken"
    health_port = free_port()
    # vm1 runs no agent: it blocks the early approval, so vm0 stays drained until the event goes away.
    cluster = LocalCluster(
        tmp_path / "group", ("vm0", "vm1"), cluster="apphealth", zk_hosts=zk_hosts, with_agents=False,
        extra_config={"zookeeper": {"root": zk_chroot}},
        per_vm_config={"vm0": {
            "actions": [{"type": "command", "name": "app-service",
                         "recover": [sys.executable, "-c", RECOVER, str(marker)], "timeout_seconds": 10}],
            "drain": {"unapprovable": "at-once"},
            "app_health": {"listen": f"127.0.0.1:{health_port}", "recover_failing_after_seconds": FAILING_AFTER},
        }},
    )
    cluster.start()
    try:
        cluster.start_agent("vm0")
        cluster.wait(lambda: (cluster.agents["vm0"].status() or {}).get("phase") == "serving", 30, "vm0 serving")
        yield cluster, marker, health_port
    finally:
        cluster.stop()


def health(client: httpx.Client, url: str) -> tuple[str, str]:
    """(ApplicationHealthState, reason); the status must be 2xx for the extension to read the body."""
    answer = client.get(url)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert list(body) == ["ApplicationHealthState"], body
    return str(body["ApplicationHealthState"]), answer.headers[APP_HEALTH_REASON_HEADER]


def test_healthy_while_drained_for_maintenance_unhealthy_when_recovery_keeps_failing(
        group: tuple[LocalCluster, Path, int]) -> None:
    cluster, marker, health_port = group
    agent = cluster.agents["vm0"]
    sim = cluster.sim
    assert sim is not None
    urls = (agent.admin_url + "/apphealth", f"http://127.0.0.1:{health_port}/apphealth")
    with httpx.Client(trust_env=False, timeout=5) as client:
        for url in urls:
            assert health(client, url)[0] == "Healthy"
        assert agent.probe() == 200

        marker.touch()  # the service will not come back after the maintenance
        event = sim.schedule("Freeze", ["vm0", "vm1"], not_before_in=900, impact="none")
        cluster.wait(lambda: (agent.status() or {}).get("phase") == "drained", 30, "vm0 drained")

        # Drained (probe 503) well past the recovery bound, IMDS refusing this VM for part of it: Healthy.
        sim.refuse("vm0", 3)
        deadline = time.monotonic() + 2 * FAILING_AFTER + 1
        seen = 0
        while time.monotonic() < deadline:
            assert agent.probe() == 503
            for url in urls:
                state, reason = health(client, url)
                assert state == "Healthy", reason
                assert "planned maintenance" in reason, reason
            seen += 1
            time.sleep(0.2)
        assert seen >= 10
        assert sim.event(event["event_id"]) is not None  # still blocked by vm1: the drain goes on

        # The event goes away; the recovery fails, is retried, keeps failing: Unhealthy past the bound.
        sim.cancel(event["event_id"])
        cluster.wait(lambda: str((agent.status() or {}).get("action_error")).startswith("recover failed"), 30,
                     "the recovery to fail")
        assert health(client, urls[1])[0] == "Healthy"  # failing, not yet for long
        cluster.wait(lambda: health(client, urls[1])[0] == "Unhealthy", 30, "Unhealthy")
        state, reason = health(client, urls[0])
        assert state == "Unhealthy" and "recover failed" in reason and "service did not start" in reason, reason
        assert agent.probe() == 503  # the hook recovers before the probe: the VM is still out of rotation

        # Fixed: the next retry succeeds, the probe serves again, the signal is Healthy again.
        marker.unlink()
        cluster.wait(lambda: agent.probe() == 200, 30, "the probe to serve again")
        for url in urls:
            assert health(client, url)[0] == "Healthy"
    log = agent.log_path.read_text()
    assert "application health: Unhealthy, automatic repairs may act on this VM" in log
