"""An independent observer for end-to-end tests.

It watches the cluster from outside the agents: a kazoo client of its own records when each
acknowledgement and approval node was created (ZooKeeper's ctime), and every agent's health probe is
sampled. Tests then check the simulator's log against these observations.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from coordinator.testbed.cluster import LocalCluster


@dataclass
class Observations:
    ack_ctime: dict[tuple[str, str], float] = field(default_factory=dict)  # (event id, vm) -> epoch s
    approval: dict[str, tuple[float, bytes]] = field(default_factory=dict)  # event id -> (epoch s, data)
    probes: dict[str, list[tuple[float, int | None]]] = field(default_factory=dict)

    def probe_codes(self, vm: str) -> set[int | None]:
        return {code for _, code in self.probes.get(vm, [])}


class Observer:
    def __init__(self, cluster: LocalCluster, root: str = "/azure-maintenance") -> None:
        self._cluster = cluster
        self._zk = KazooClient(hosts=f"{cluster.zk_hosts}{root}/{cluster.cluster}", timeout=10)
        self.seen = Observations()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch_store, daemon=True),
                         threading.Thread(target=self._watch_probes, daemon=True)]

    def __enter__(self) -> Observer:
        self._zk.start(timeout=10)
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._zk.stop()
        self._zk.close()

    def _watch_store(self) -> None:
        while not self._stop.is_set():
            try:
                for event_id in self._zk.get_children("/events"):
                    for vm in self._zk.get_children(f"/events/{event_id}/acks"):
                        if (event_id, vm) not in self.seen.ack_ctime:
                            _, stat = self._zk.get(f"/events/{event_id}/acks/{vm}")
                            self.seen.ack_ctime[(event_id, vm)] = stat.ctime / 1000.0
                    if event_id not in self.seen.approval and self._zk.exists(f"/events/{event_id}/approval"):
                        data, stat = self._zk.get(f"/events/{event_id}/approval")
                        self.seen.approval[event_id] = (stat.ctime / 1000.0, data)
            except KazooException:
                pass  # a node went away, or the connection did (an ensemble member killed): look again
            self._stop.wait(0.02)

    def _watch_probes(self) -> None:
        while not self._stop.is_set():
            for vm, agent in list(self._cluster.agents.items()):
                self.seen.probes.setdefault(vm, []).append((time.time(), agent.probe()))
            self._stop.wait(0.1)
