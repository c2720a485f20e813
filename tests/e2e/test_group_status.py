"""End to end: ``coordinator status`` on a live group of three agents (the simulator, a real ZooKeeper).

A Freeze names vm0 and vm1; vm1's drain wait is long, so vm0 drains and acknowledges while vm1 stays
drained without acknowledging: the status command must show the event, vm0's ack, the approver (vm0),
every member's phase as its agent reports it, and name vm1 as what blocks the approval; and it must
write nothing to ZooKeeper while doing so.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.e2e.support import ClusterFactory, waiting_for
from tests.integration.test_group_status import SESSION_TRANSACTIONS, bare_session_cost, status_command

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def test_status_names_the_vm_that_blocks_a_freeze(make_cluster: ClusterFactory, zk_server: LocalZooKeeper) -> None:
    slow = {"drain": {"wait_seconds": 300, "latest_start_seconds": 300, "return_wait_seconds": 0.5}}
    cluster = make_cluster(per_vm_config={"vm1": slow})
    assert cluster.sim is not None
    event_id = cluster.sim.schedule("Freeze", ["vm0", "vm1"])["event_id"]
    key = event_id.upper()

    def held() -> bool:
        statuses = cluster.statuses()
        events = (statuses["vm0"] or {}).get("events", [])
        return (any(e["event_id"] == event_id and e["acks"] == ["vm0"] for e in events)
                and waiting_for(cluster, "vm0", "vm1 has not acknowledged")
                and all((statuses[vm] or {}).get("phase") == "drained" for vm in ("vm0", "vm1")))

    cluster.wait(held, 30, "vm0 to acknowledge and wait for vm1, drained without acknowledging")

    # Nothing written: the zxid moves by the status command's own session (opened, closed) and no more.
    # An agent may write meanwhile (it should not, in this state); that shows in every try, a write of
    # the status command's own would show in every try too, so three tries tell them apart.
    assert bare_session_cost(zk_server) == SESSION_TRANSACTIONS
    config = str(cluster.agents["vm2"].config_path)
    runs: list[tuple[int, Any]] = []
    for _ in range(3):
        before = zk_server.zxid()
        run = status_command("--config", config, "--json")
        runs.append((zk_server.zxid() - before, run))
        assert run.returncode == 0, run.stderr
        if runs[-1][0] == SESSION_TRANSACTIONS:
            break
    assert runs[-1][0] == SESSION_TRANSACTIONS, [delta for delta, _ in runs]
    data = json.loads(runs[-1][1].stdout)

    assert data["cluster"] == cluster.cluster and data["paused"] is None
    assert data["leader"]["vm"] in cluster.vms
    phases = {m["vm"]: (m["agent"]["reachable"], m["agent"]["phase"]) for m in data["members"]}
    assert phases == {"vm0": (True, "drained"), "vm1": (True, "drained"), "vm2": (True, "serving")}
    assert all(m["agent"]["last_cycle"] and m["version"] and m["probe"] for m in data["members"])
    [event] = data["events"]
    assert (event["event_id"], event["type"], event["resources"]) == (key, "Freeze", ["vm0", "vm1"])
    assert (event["status"], event["status_reported_by"]) == ("Scheduled", "vm0")
    assert [a["vm"] for a in event["acks"]] == ["vm0"] and event["missing_acks"] == ["vm1"]
    assert event["admitted_at"] is not None and event["approval"] is None
    assert (event["approver"], event["approver_as_leader"], event["state"]) == ("vm0", False, "blocked")
    assert event["blockers"] == [{"kind": "not_acknowledged", "vm": "vm1", "reason": "vm1 has not acknowledged",
                                  "lasting": False}]
    assert event["approver_reports"] == ["vm1 has not acknowledged"]  # what vm0 itself says
    assert 800 < event["not_before_in_seconds"] <= 900
    assert {o["vm"] for o in data["out_of_rotation"]} == {"vm0", "vm1"}

    # The table, with --zookeeper and --cluster instead of a configuration file.
    assert cluster.zk_hosts is not None
    table = status_command("--zookeeper", cluster.zk_hosts, "--cluster", cluster.cluster)
    assert table.returncode == 0, table.stderr
    assert f"Freeze {key}" in table.stdout and "BLOCKED" in table.stdout
    assert "vm1 has not acknowledged" in table.stdout
    assert "vm0 acked" in table.stdout and "vm1 not acked" in table.stdout
    assert "approver vm0 (first live VM in Resources)" in table.stdout
