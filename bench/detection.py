"""Detection: from an event appearing in the simulator to the last affected VM's health probe failing.

For each group size, one group with staggered polls (``imds.stagger: true``: polls spread over the
second by rank, and an early read when a peer publishes an event the VM's own document does not show
yet) and one without (each agent polls on its own schedule and reads only on its own polls), one after
the other in the same run. The event's appearance is the simulator's log entry; each affected VM's
probe is asked every 2 ms from outside, as a load balancer would (far more often than one does).
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.zookeeper import LocalZooKeeper

from .group import percentiles, wait_for

__all__ = ["bench_detection"]


def bench_detection(zk: LocalZooKeeper, *, sizes: tuple[int, ...], events: int, seed: int = 1,
                    progress: Any = print) -> list[dict[str, Any]]:
    rows = []
    rng = random.Random(seed)
    for n in sizes:
        for stagger in (True, False):
            progress(f"bench: detection with {n} agents, stagger {'on' if stagger else 'off'}")
            samples = _one_group(zk, n, stagger, events, rng)
            rows.append({"agents": n, "stagger": stagger, **percentiles(samples)})
    return rows


def _one_group(zk: LocalZooKeeper, n: int, stagger: bool, events: int, rng: random.Random) -> list[float]:
    vms = [f"vm{i}" for i in range(n)]
    samples: list[float] = []
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-det-") as tmp, \
            httpx.Client(timeout=1.0, trust_env=False) as http:
        cluster = LocalCluster(Path(tmp), vms, cluster=f"d{uuid.uuid4().hex[:8]}", zk_hosts=zk.hosts,
                               drain_wait=0.2, poll_interval=1.0, started_for=0.3, session_timeout=15.0,
                               extra_config={"imds": {"stagger": stagger},
                                             "drain": {"return_wait_seconds": 0.5, "gone_after_seconds": 1.0}})
        cluster.start(wait_joined=False)
        try:
            cluster.wait_members(n, timeout=30 + 3 * n)
            assert cluster.sim is not None
            sim = cluster.sim
            wait_for(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 120, "every VM serving")
            time.sleep(3)  # a few polls: the staggered schedule settles on the ranks
            for k in range(events):
                pair = [vms[(2 * k) % n], vms[(2 * k + 1) % n]]
                time.sleep(rng.uniform(0.0, 1.0))  # the event lands at a random point of the polls' second
                eid = sim.schedule("Freeze", pair)["event_id"]
                failed: dict[str, float] = {}
                deadline = time.monotonic() + 30
                while len(failed) < len(pair) and time.monotonic() < deadline:
                    for vm in pair:
                        if vm not in failed and _status(http, cluster.agents[vm].probe_url) != 200:
                            failed[vm] = time.time()
                    time.sleep(0.002)
                if len(failed) < len(pair):
                    raise TimeoutError(f"event {eid}: the probes of {sorted(set(pair) - set(failed))} never failed")
                created = next(e["t"] for e in sim.log(kind="transition") if e["event_id"] == eid and e["from"] is None)
                samples.append((max(failed.values()) - created) * 1e3)
                wait_for(lambda eid=eid: sim.event(eid) is None, 60, "the event to end")  # type: ignore[misc]
                # Serving again by the budget's count too (the return wait over, out of rotation no more):
                # the next event is then admitted at once, and what is measured is detection alone.
                wait_for(lambda: all((a.status() or {}).get("phase") == "serving" for a in cluster.agents.values()),
                         60, "every VM serving")
        finally:
            cluster.stop()
    return samples


def _status(http: httpx.Client, url: str) -> int | None:
    try:
        return http.get(url).status_code
    except httpx.HTTPError:
        return None

