"""End to end: what an operator sees of real agent processes through one Freeze: /readyz and /livez, the
metrics of the drain and the approval, and JSON log lines with the VM, the event and the phase as fields."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.e2e.support import ClusterFactory, serving

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def sample(metrics: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return None


def test_a_freeze_seen_through_health_endpoints_metrics_and_json_logs(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(drain_wait=1.0, extra_config={"logging": {"format": "json"}})
    assert cluster.sim is not None
    for agent in cluster.agents.values():
        assert httpx.get(agent.admin_url + "/livez", trust_env=False).status_code == 200
        ready = agent.admin_url + "/readyz"
        cluster.wait(lambda url=ready: httpx.get(url, trust_env=False).status_code == 200, 10, f"{agent.vm} ready")
    event_id = cluster.sim.schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=5, not_before_in=600)["event_id"]
    cluster.wait(lambda: cluster.sim.event(event_id) is None and serving(cluster), 60,  # type: ignore[union-attr]
                 "the Freeze to start, end, and both VMs to recover")

    vm0, vm1 = cluster.agents["vm0"].metrics(), cluster.agents["vm1"].metrics()
    assert sample(vm0, "coordinator_approved_events_total", reason="after_drain") == 1
    assert sample(vm0, "coordinator_notice_reclaimed_seconds_count") == 1
    reclaimed = sample(vm0, "coordinator_notice_reclaimed_seconds_sum")
    assert reclaimed is not None and 560 < reclaimed <= 600
    for metrics in (vm0, vm1):
        assert sample(metrics, "coordinator_acknowledgements_total") == 1
        assert sample(metrics, "coordinator_job_duration_seconds_count", phase="drain", outcome="ok") == 1
        assert sample(metrics, "coordinator_events_started_unapproved_total") == 0
        requests = sample(metrics, "coordinator_imds_request_duration_seconds_count", method="GET")
        assert requests is not None and requests > 0
    assert sample(vm1, "coordinator_imds_request_duration_seconds_count", method="POST") == 0  # vm0 approved

    def lines(vm: str) -> list[dict[str, Any]]:
        text = cluster.agents[vm].log_path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    key = event_id.upper()
    [ack] = [line for line in lines("vm1") if line["message"].startswith("acknowledged")]
    assert (ack["vm"], ack["event_id"], ack["phase"]) == ("vm1", key, "drained")
    [approved] = [line for line in lines("vm0") if line["message"].startswith("approved")]
    assert (approved["vm"], approved["event_id"]) == ("vm0", event_id)
    # Lines from the threads that run no cycle (the poller, the ZooKeeper client) still name the VM.
    assert all(line.get("vm") == "vm2" for line in lines("vm2") if line["logger"] != "coordinator.runtime")
