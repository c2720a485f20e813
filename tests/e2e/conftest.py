"""The end-to-end cluster factory: three agent processes, the simulator, and the session's ZooKeeper
(or another ensemble given as ``zk_hosts``)."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.testbed.cluster import LocalCluster
from tests.e2e.support import ClusterFactory, serving


@pytest.fixture
def make_cluster(tmp_path: Path, zk_hosts: str) -> Iterator[ClusterFactory]:
    started: list[LocalCluster] = []

    def make(**options: Any) -> LocalCluster:
        params: dict[str, Any] = {"drain_wait": 1.0, "poll_interval": 0.3, "started_for": 2.0, "zk_hosts": zk_hosts}
        params.update(options)
        cluster = LocalCluster(tmp_path / f"group{len(started)}", cluster=f"e{uuid.uuid4().hex[:8]}", **params)
        started.append(cluster)
        cluster.start()
        cluster.wait(lambda: serving(cluster, tuple(cluster.vms)), 30, "every VM serving")
        return cluster

    yield make
    for cluster in started:
        # Ask every agent to stop at once (a paused one is continued first), then let the cluster
        # collect them: three agents stop in parallel rather than in turn.
        for agent in cluster.agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGCONT)
                agent.proc.send_signal(signal.SIGTERM)
        cluster.stop()
