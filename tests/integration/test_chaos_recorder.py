"""The chaos run's ZooKeeper recorder on a real server: it says when it could read nothing, so that the
oracle does not take a node it never saw for a node that never was."""

from __future__ import annotations

import time
from collections.abc import Callable

from kazoo.client import KazooClient

from coordinator.testbed.waiting import wait_until
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.chaos.observers import ZooKeeperRecorder


def test_the_recorder_marks_the_time_it_could_read_nothing(zk_server_factory: Callable[[], LocalZooKeeper]) -> None:
    server = zk_server_factory()
    writer = KazooClient(hosts=server.hosts)
    writer.start(timeout=15)
    writer.ensure_path("/g/events/E1/acks")
    writer.stop()
    writer.close()
    recorder = ZooKeeperRecorder(server.hosts, "/g", interval=0.05)
    recorder.start()
    try:
        time.sleep(0.5)
        assert recorder.blind() == []
        server.kill()
        down_at = time.time()
        time.sleep(3.0)
        up_at = time.time()  # the server cannot answer before it is started (it may before start() returns)
        server.start()
        writer = KazooClient(hosts=server.hosts)
        writer.start(timeout=15)
        writer.create("/g/events/E1/acks/vm1")
        writer.stop()
        writer.close()
        assert wait_until(lambda: any(n.kind == "ack" for n in recorder.sightings()), timeout=20), (
            "the recorder never read again after the server came back")
    finally:
        recorder.stop()
    blind = recorder.blind()
    assert len(blind) == 1, blind
    start, end = blind[0]
    assert start <= down_at and end >= up_at  # the whole outage, from the last read before to the first after
