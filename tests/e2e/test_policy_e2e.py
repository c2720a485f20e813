"""End to end for the drain layer and the policy: a failing hook, the disruption budget, restarts
with persisted state, and HAProxy driven by the agents."""

from __future__ import annotations

import json
import signal
import sys

import httpx
import pytest

from tests.e2e.observer import Observer
from tests.e2e.support import (
    ClusterFactory,
    approvals,
    assert_acked_before_approval,
    gone,
    transitions,
    waiting_for,
)
from tests.plugins.haproxy import RunningHAProxy

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def test_failing_drain_hook_means_no_ack_and_the_event_waits_for_not_before(make_cluster: ClusterFactory) -> None:
    fail_on_vm1 = [sys.executable, "-c", "import os, sys; sys.exit(3 if os.environ['COORDINATOR_VM'] == 'vm1' else 0)"]
    cluster = make_cluster(extra_config={"actions": [{"type": "command", "name": "checkpoint", "drain": fail_on_vm1,
                                               "timeout_seconds": 10}]})
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Reboot", ["vm0", "vm1"], not_before_in=8)["event_id"]
    def failure_shown() -> bool:
        return "exited with status 3" in ((cluster.agents["vm1"].status() or {}).get("action_error") or "")

    cluster.wait(failure_shown, 10, "vm1's drain failure to show in its status")
    assert 'coordinator_errors_total{stage="action"} 1.0' in cluster.agents["vm1"].metrics()
    assert waiting_for(cluster, "vm0", "vm1 has not acknowledged")
    cluster.wait(lambda: gone(cluster, event_id), 30, "the event to start at NotBefore and end")
    assert approvals(cluster, event_id) == []
    assert ("Scheduled", "Started", "not_before") in transitions(cluster, event_id)
    cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 15, "every VM serving again")


def test_budget_holds_the_second_event_until_the_first_recovered(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(drain_wait=1.0, extra_config={"drain": {"latest_start_seconds": 5}})
    assert cluster.sim is not None
    with Observer(cluster) as observer:
        events = {cluster.sim.schedule("Reboot", ["vm0"], not_before_in=300)["event_id"]: "vm0",
                  cluster.sim.schedule("Reboot", ["vm1"], not_before_in=400)["event_id"]: "vm1"}
        cluster.wait(lambda: all(gone(cluster, e) for e in events), 60, "both events to run in turn")
        # Both are announced in the same second: which one the budget admits first is whichever record
        # the leader saw first. The other must wait until the first one's VM serves again.
        posted = {e: assert_acked_before_approval(observer, cluster, e, {vm}) for e, vm in events.items()}
        first, second = sorted(events, key=lambda e: posted[e]["t"])
        cluster.wait(lambda: cluster.agents[events[second]].probe() == 200, 15, "the second VM to serve again")
    first_end = next(e["t"] for e in cluster.sim.log(kind="transition") if e["event_id"] == first and e["to"] is None)
    first_back = min(t for t, code in observer.seen.probes[events[first]] if code == 200 and t > first_end)
    second_drained = min(t for t, code in observer.seen.probes[events[second]] if code == 503)
    # The second VM did not even start draining before the first served again; its event was approved
    # after that.
    assert second_drained > first_back - 0.2  # probe samples are 0.1 s apart
    assert posted[second]["t"] > first_back - 0.2
    assert observer.seen.probe_codes("vm2") == {200}


def test_restart_with_persisted_state_stays_drained_then_recovers(make_cluster: ClusterFactory) -> None:
    # vm1 never finishes its drain wait: the event stays Scheduled. The return wait (by default the drain
    # wait) is short, so that the VMs that just started count as back in rotation at once.
    cluster = make_cluster(drain_wait=60.0, extra_config={"drain": {"return_wait_seconds": 0.5}})
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Redeploy", ["vm1"], not_before_in=600)["event_id"]
    cluster.wait(lambda: cluster.agents["vm1"].probe() == 503, 10, "vm1 to drain")
    state = json.loads((cluster.workdir / "state-vm1.json").read_text())
    assert state["phase"] in ("draining", "drained") and state["draining_for"] == [event_id]
    cluster.stop_agent("vm1", signal.SIGKILL)
    cluster.start_agent("vm1")

    def decided() -> bool:
        status = cluster.agents["vm1"].status() or {}
        return bool((status.get("imds") or {}).get("fresh")) and status.get("phase") in ("draining", "drained")

    # The restarted agent has read a fresh document naming its VM: it is drained, never serving.
    cluster.wait(decided, 10, "the restarted agent to read IMDS and stay drained")
    assert cluster.agents["vm1"].probe() == 503
    cluster.sim.cancel(event_id)
    cluster.wait(lambda: cluster.agents["vm1"].probe() == 200, 10, "vm1 to serve once the event is cancelled")
    cluster.wait(lambda: json.loads((cluster.workdir / "state-vm1.json").read_text())["phase"] == "serving", 5,
                 "the serving state to be saved")


def test_haproxy_stops_routing_to_drained_vms_and_takes_them_back(
    make_cluster: ClusterFactory, haproxy: RunningHAProxy
) -> None:
    # HAProxy's two servers stand for vm0 and vm1; each agent drains its own server through the runtime API.
    served_by = {"vm0": haproxy.servers[0], "vm1": haproxy.servers[1]}
    per_vm = {vm: {"actions": [{"type": "haproxy", "runtime": str(haproxy.socket_path), "backend": haproxy.backend,
                                "server": server, "drain_timeout_seconds": 5}]} for vm, server in served_by.items()}
    cluster = make_cluster(per_vm_config=per_vm)
    assert cluster.sim is not None

    def answered(n: int = 20) -> set[str]:
        with httpx.Client(timeout=2, trust_env=False) as client:
            return {client.get(haproxy.frontend_url).text.strip() for _ in range(n)}

    cluster.wait(lambda: answered() == set(served_by.values()), 10, "HAProxy to route to both servers")
    event_id = cluster.sim.schedule("Freeze", ["vm0"], not_before_in=600)["event_id"]
    cluster.wait(lambda: haproxy.status(served_by["vm0"]).startswith(("DRAIN", "MAINT")), 10,
                 "vm0's agent to drain its HAProxy server")
    assert answered() == {served_by["vm1"]}
    cluster.wait(lambda: gone(cluster, event_id), 30, "the Freeze to be approved, start and end")
    cluster.wait(lambda: answered() == set(served_by.values()), 10, "HAProxy to route to vm0 again")
    assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm0"]
    assert haproxy.status(served_by["vm0"]).startswith("UP")


def test_status_command_shows_the_event_and_what_it_waits_for(make_cluster: ClusterFactory) -> None:
    import subprocess

    # A long drain wait keeps the event waiting for acks; a short return wait lets the VMs that just
    # started count as back in rotation at once.
    cluster = make_cluster(drain_wait=30.0, extra_config={"drain": {"return_wait_seconds": 0.5}})
    assert cluster.sim is not None
    cluster.sim.schedule("Reboot", ["vm0", "vm1"], not_before_in=600)
    cluster.wait(lambda: waiting_for(cluster, "vm0", "has not acknowledged")
                 and (cluster.agents["vm0"].status() or {}).get("phase") in ("draining", "drained"), 10,
                 "the event to wait for acks from draining VMs")
    result = subprocess.run([sys.executable, "-m", "coordinator", "status", "--url", cluster.agents["vm0"].admin_url],
                            capture_output=True, text=True, timeout=30, check=True)
    assert "vm vm0: draining" in result.stdout or "vm vm0: drained" in result.stdout
    assert "Reboot Scheduled on vm0, vm1" in result.stdout
    assert "waiting: vm0 has not acknowledged" in result.stdout or "waiting: vm1 has not acknowledged" in result.stdout
    assert "members: vm0, vm1, vm2" in result.stdout
