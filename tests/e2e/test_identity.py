"""End to end: agents configured without a name learn it from IMDS instance metadata."""

from __future__ import annotations

import pytest

from tests.e2e.observer import Observer
from tests.e2e.support import ClusterFactory, assert_acked_before_approval, gone

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def test_scale_set_instances_learn_their_names_and_coordinate(make_cluster: ClusterFactory) -> None:
    vms = ("web_0", "web_1", "web_2")  # {scaleSetName}_{instanceId}, as Resources spells scale-set instances
    cluster = make_cluster(vms=vms, sim_args=["--scale-set", "web"],
                           per_vm_config={vm: {"vm_name": None} for vm in vms})
    assert cluster.sim is not None
    assert all("vm_name: null" in a.config_path.read_text() for a in cluster.agents.values())  # not told
    assert {(cluster.agents[vm].status() or {}).get("vm") for vm in vms} == set(vms)
    for vm in vms:
        assert f"this VM is {vm} according to IMDS" in cluster.agents[vm].log_path.read_text()
    with Observer(cluster) as observer:
        event_id = cluster.sim.schedule("Freeze", ["web_0", "web_1"], not_before_in=600)["event_id"]
        cluster.wait(lambda: gone(cluster, event_id), 30, "the Freeze to be approved, start and end")
        posted = assert_acked_before_approval(observer, cluster, event_id, {"web_0", "web_1"})
    assert posted["vm"] == "web_0"
