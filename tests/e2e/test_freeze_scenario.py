"""End to end: three agent processes, the simulator over HTTP and a real ZooKeeper.

The scenario of the product: a Freeze on vm0 and vm1 with 15 minutes of notice starts early, only
after both VMs drained, approved once by vm0; vm2 never drains; both come back.
"""

from __future__ import annotations

import json

import pytest
from kazoo.client import KazooClient

from tests.e2e.observer import Observer
from tests.e2e.support import ClusterFactory, serving

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def test_freeze_is_approved_once_after_both_acks_and_everyone_recovers(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(drain_wait=1.5)
    assert cluster.sim is not None
    cluster.wait(lambda: serving(cluster), 30, "every VM serving before the event")
    with Observer(cluster) as observer:
        event_id = cluster.sim.schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=5)["event_id"]
        cluster.wait(lambda: cluster.sim.event(event_id) is None and serving(cluster), 60,  # type: ignore[union-attr]
                     "the Freeze to start, end, and both VMs to recover")
        cluster.wait(lambda: len(observer.seen.probes["vm2"]) > 5, 5, "probe samples")
    log = cluster.sim.log()
    approvals = [e for e in log if e["kind"] == "approval" and event_id in e.get("event_ids", [])]
    transitions = [(e["from"], e["to"], e["reason"]) for e in log
                   if e["kind"] == "transition" and e["event_id"] == event_id]

    # Approved exactly once, by vm0 (first live agent in Resources), through vm0's own IMDS port.
    assert [a["vm"] for a in approvals] == ["vm0"], approvals
    # It started because of that approval, long before NotBefore, then went away.
    assert transitions == [(None, "Scheduled", "scheduled"), ("Scheduled", "Started", "approved"),
                           ("Started", None, "started_for_elapsed")], transitions

    # The approval came after both acknowledgements, as ZooKeeper timed them.
    key = event_id.upper()
    ack_times = {vm: t for (eid, vm), t in observer.seen.ack_ctime.items() if eid == key}
    assert set(ack_times) == {"vm0", "vm1"}, observer.seen.ack_ctime
    assert approvals[0]["t"] >= max(ack_times.values())
    record_time, record = observer.seen.approval[key]
    assert record_time >= max(ack_times.values())
    assert json.loads(record)["by"] == "vm0"

    # vm0 and vm1 drained (probe 503 seen); vm2 never did.
    assert 503 in observer.seen.probe_codes("vm0")
    assert 503 in observer.seen.probe_codes("vm1")
    assert observer.seen.probe_codes("vm2") == {200}

    # After the event: acknowledgements withdrawn, event recorded as done, every agent serving.
    zk = KazooClient(hosts=f"{cluster.zk_hosts}/azure-maintenance/{cluster.cluster}")
    zk.start(timeout=10)
    try:
        def cleaned() -> bool:
            data, _ = zk.get(f"/events/{key}")
            return zk.get_children(f"/events/{key}/acks") == [] and json.loads(data).get("done_at") is not None

        cluster.wait(cleaned, 10, "acks withdrawn and the event marked done")
    finally:
        zk.stop()
        zk.close()
    cluster.wait(lambda: all(s and s["phase"] == "serving" for s in cluster.statuses().values()), 10,
                 "every agent to report serving")
