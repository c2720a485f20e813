"""The shipped alert rules, run for real: a Prometheus server scrapes a live group, a drain that fails on one
VM fires ``CoordinatorDrainFailed``, and an Alertmanager delivers it to a webhook receiver this test runs.

The fault is the one that fires fastest with the rules as shipped: ``CoordinatorDrainFailed`` has no
``for:`` (every other rule waits a minute or more), so ``deploy/prometheus/alerts.yml`` is used unchanged.
Prometheus scrapes and evaluates every second; Alertmanager's group_wait is 0 s. Both are Debian's packages
(``scripts/setup.sh`` installs them), started here on loopback ports; a missing one fails the test.

A ZooKeeper outage runs the shipped rules with the shipped Alertmanager routing and inhibit rules
(``deploy/prometheus/alertmanager.yml``), every duration of both (``for:``, the scrape interval,
group_wait, group_interval, repeat_interval) divided by ``SCALE``, so that minutes take seconds with
the same proportions: what pages, how often, and what is held back.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.support.quiethttp import QuietThreadingHTTPServer
from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.e2e.support import ClusterFactory, sim
from tests.tools.monitoring import LocalAlertmanager, LocalPrometheus, Scraped

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTMANAGER = ROOT / "deploy" / "prometheus" / "alertmanager.yml"
SCALE = 10  # the shipped durations, ten times shorter
_DURATION = re.compile(r"\b(for|group_wait|group_interval|repeat_interval): (\d+)([smh])\b")
_SECONDS = {"s": 1, "m": 60, "h": 3600}
CONNECTED = 'coordinator_zookeeper_connection_state{state="connected"} == 1'

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


class Receiver:
    """A webhook receiver: keeps every notification Alertmanager POSTs."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.notifications.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.httpd = QuietThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [alert for n in self.notifications for alert in n.get("alerts", [])]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.stop()


def _scaled(text: str) -> str:
    """A shipped rule file or Alertmanager configuration with every ``for:`` and notification timing divided
    by ``SCALE`` (written in milliseconds, which both accept)."""
    return _DURATION.sub(lambda m: f"{m[1]}: {int(m[2]) * _SECONDS[m[3]] * 1000 // SCALE}ms", text)


def _seconds(text: str, key: str, where: str) -> float:
    """The ``key:`` duration that follows ``where`` in a scaled file, in seconds."""
    match = re.search(rf"{key}: (\d+)ms", text[text.index(where):])
    assert match is not None, f"no {key} after {where}"
    return int(match[1]) / 1000


def _shipped_monitoring(tmp_path: Path, cluster: LocalCluster,
                        receiver: Receiver) -> tuple[str, str, LocalAlertmanager, LocalPrometheus]:
    """The shipped rules and routing, scaled (``_scaled``), and an Alertmanager and a Prometheus (scraping
    every agent of ``cluster`` at the scaled interval) that run them, not started yet."""
    rules, routing = _scaled(RULES.read_text()), _scaled(ALERTMANAGER.read_text())
    (tmp_path / "alerts.yml").write_text(rules)
    alertmanager = LocalAlertmanager(tmp_path / "alertmanager", receiver.url, routing=yaml.safe_load(routing))
    prometheus = LocalPrometheus(
        tmp_path / "prometheus",
        [Scraped(agent.admin_url.removeprefix("http://"), vm, cluster.cluster) for vm, agent in cluster.agents.items()],
        [tmp_path / "alerts.yml"], alertmanager="", interval=f"{15000 // SCALE}ms",
    )
    return rules, routing, alertmanager, prometheus


def _start(alertmanager: LocalAlertmanager, prometheus: LocalPrometheus) -> None:
    """Alertmanager first: Prometheus is pointed at its port once it listens."""
    alertmanager.start()
    prometheus.alertmanager = f"127.0.0.1:{alertmanager.port}"
    prometheus.start()


def _wait(predicate: Any, timeout: float, what: str, detail: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{detail()}")
        time.sleep(0.2)


def test_a_failed_drain_fires_its_alert_and_alertmanager_delivers_it(
    make_cluster: ClusterFactory, receiver: Receiver, tmp_path: Path,
) -> None:
    began = time.monotonic()
    failing = {"actions": [{"type": "command", "name": "failing-drain",
                            "drain": [sys.executable, "-c", "import sys; sys.exit(3)"]}]}
    cluster = make_cluster(vms=("vm0", "vm1"), per_vm_config={"vm0": failing})
    alertmanager = LocalAlertmanager(tmp_path / "alertmanager", receiver.url)
    prometheus = LocalPrometheus(
        tmp_path / "prometheus",
        [Scraped(agent.admin_url.removeprefix("http://"), vm, cluster.cluster) for vm, agent in cluster.agents.items()],
        [RULES], alertmanager="",
    )
    try:
        _start(alertmanager, prometheus)
        # Every agent scraped, and the action errors seen at 0 before the fault.
        _wait(lambda: len([s for s in prometheus.query('up{job="coordinator"} == 1')]) == 2, 20,
              "Prometheus scraping both agents", lambda: prometheus.query("up"))
        _wait(lambda: bool(prometheus.query('coordinator_errors_total{stage="action",vm="vm0"} == 0')), 10,
              "a first sample of vm0's action errors")
        assert not receiver.alerts()

        event = sim(cluster).schedule("Freeze", ["vm0"])  # vm0 drains, and its drain command fails
        faulted = time.monotonic()
        _wait(lambda: any(a["labels"].get("alertname") == "CoordinatorDrainFailed" for a in receiver.alerts()), 30,
              "Alertmanager to deliver CoordinatorDrainFailed to the webhook",
              lambda: f"prometheus alerts: {prometheus.alerts()}\nagent vm0:\n"
                      + cluster.agents["vm0"].log_path.read_text()[-2000:])
        delivered = time.monotonic()
    finally:
        prometheus.stop()
        alertmanager.stop()

    alert = next(a for a in receiver.alerts() if a["labels"]["alertname"] == "CoordinatorDrainFailed")
    assert alert["status"] == "firing"
    assert alert["labels"]["vm"] == "vm0" and alert["labels"]["cluster"] == cluster.cluster
    assert alert["labels"]["severity"] == "warning"
    assert "vm0" in alert["annotations"]["summary"]
    assert {a["labels"]["alertname"] for a in receiver.alerts()} == {"CoordinatorDrainFailed"}  # nothing else
    status = cluster.agents["vm0"].status() or {}
    assert "failing-drain" in json.dumps(status), status  # the agent says which action failed
    assert event["event_id"]
    print(f"alert delivered {delivered - faulted:.1f} s after the fault; test {time.monotonic() - began:.1f} s")


def test_a_zookeeper_outage_pages_once_for_the_group_and_not_for_its_missing_leader(
    make_cluster: ClusterFactory, zk_server_factory: Callable[[], LocalZooKeeper], receiver: Receiver,
    tmp_path: Path,
) -> None:
    zk = zk_server_factory()
    cluster = make_cluster(zk_hosts=zk.hosts)  # three VMs, one of them leading
    rules, routing, alertmanager, prometheus = _shipped_monitoring(tmp_path, cluster, receiver)
    no_leader_for = _seconds(rules, "for", "alert: CoordinatorNoLeader")
    group_wait = _seconds(routing, "group_wait", "route:")
    resolve_within = _seconds(routing, "group_interval", 'alertname="CoordinatorZooKeeperDisconnected"')
    leader = f'max by (cluster) (coordinator_is_leader{{cluster="{cluster.cluster}"}}) == 1'
    try:
        _start(alertmanager, prometheus)
        _wait(lambda: len(prometheus.query(CONNECTED)) == 3 and bool(prometheus.query(leader)), 30,
              "Prometheus to see every agent connected and a leader", lambda: prometheus.query("up"))

        zk.kill()  # the whole ensemble, for every agent at once
        _wait(lambda: any(_names(n) == {"CoordinatorZooKeeperDisconnected"} for n in receiver.notifications), 60,
              "Alertmanager to deliver CoordinatorZooKeeperDisconnected",
              lambda: f"prometheus alerts: {prometheus.alerts()}\nalertmanager: {alertmanager.alerts()}")
        # Without a leader for longer than CoordinatorNoLeader waits before firing, and Alertmanager before
        # sending: the rule as it was paged here.
        window = int(no_leader_for + 2 * group_wait) + 2
        no_leader = (f'max_over_time((max by (cluster) (coordinator_is_leader{{cluster="{cluster.cluster}"}}))'
                     f'[{window}s:1s]) == 0')
        _wait(lambda: bool(prometheus.query(no_leader)), 60, f"{window} s without a leader in Prometheus")

        zk.start()
        _wait(lambda: len(prometheus.query(CONNECTED)) == 3 and bool(prometheus.query(leader)), 90,
              "the agents to reconnect and a leader again", lambda: prometheus.query("coordinator_is_leader"))
        back = time.monotonic()
        # The page is resolved within its route's group_interval of the agents reconnecting, not minutes on.
        _wait(lambda: any(n.get("status") == "resolved" for n in receiver.notifications), 3 * resolve_within + 30,
              "Alertmanager to deliver the resolution",
              lambda: f"prometheus alerts: {prometheus.alerts()}\nalertmanager: {alertmanager.alerts()}")
        resolved_after = time.monotonic() - back
        # Whatever was firing is resolved on both sides, and the outage, paged, is not ticketed as well.
        _wait(lambda: not prometheus.alerts() and not alertmanager.alerts(), 60,
              "every alert resolved in Prometheus and Alertmanager",
              lambda: f"prometheus alerts: {prometheus.alerts()}\nalertmanager: {alertmanager.alerts()}")
    finally:
        prometheus.stop()
        alertmanager.stop()

    notifications = list(receiver.notifications)
    assert {name for n in notifications for name in _names(n)} == {"CoordinatorZooKeeperDisconnected"}, notifications
    page, *later = notifications
    assert page["status"] == "firing"
    assert sorted(a["labels"]["vm"] for a in page["alerts"]) == ["vm0", "vm1", "vm2"]  # one page for the group
    assert {a["labels"]["cluster"] for a in page["alerts"]} == {cluster.cluster}
    assert [n["status"] for n in later][-1:] == ["resolved"], later
    assert resolved_after < 2 * resolve_within + 15, f"resolved {resolved_after:.1f} s after the agents reconnected"


def test_a_zookeeper_outage_shorter_than_the_pages_minute_is_one_ticket_once_the_agents_are_back(
    make_cluster: ClusterFactory, zk_server_factory: Callable[[], LocalZooKeeper], receiver: Receiver,
    tmp_path: Path,
) -> None:
    zk = zk_server_factory()
    cluster = make_cluster(zk_hosts=zk.hosts)
    rules, _, alertmanager, prometheus = _shipped_monitoring(tmp_path, cluster, receiver)
    page_for = _seconds(rules, "for", "alert: CoordinatorZooKeeperDisconnected")
    try:
        _start(alertmanager, prometheus)
        _wait(lambda: len(prometheus.query(CONNECTED)) == 3, 30, "Prometheus to see every agent connected",
              lambda: prometheus.query("up"))
        _wait(lambda: len(prometheus.query("coordinator_zookeeper_disconnects_total == 0")) == 3, 10,
              "a first sample of every agent's disconnections")

        zk.kill()
        _wait(lambda: len(prometheus.query("coordinator_zookeeper_disconnects_total > 0")) == 3, page_for / 2,
              "Prometheus to see every agent's disconnection")
        zk.start()
        _wait(lambda: len(prometheus.query(CONNECTED)) == 3, 60, "the agents to reconnect",
              lambda: prometheus.query("coordinator_zookeeper_connection_state"))
        _wait(lambda: any(_names(n) == {"CoordinatorZooKeeperInterrupted"} for n in receiver.notifications), 60,
              "Alertmanager to deliver CoordinatorZooKeeperInterrupted",
              lambda: f"prometheus alerts: {prometheus.alerts()}\nalertmanager: {alertmanager.alerts()}")
        time.sleep(page_for)  # long enough for a page that was pending to have fired
    finally:
        prometheus.stop()
        alertmanager.stop()

    notifications = list(receiver.notifications)
    assert {name for n in notifications for name in _names(n)} == {"CoordinatorZooKeeperInterrupted"}, notifications
    ticket = notifications[0]
    assert sorted(a["labels"]["vm"] for a in ticket["alerts"]) == ["vm0", "vm1", "vm2"]  # one for the group
    assert {a["labels"]["severity"] for a in ticket["alerts"]} == {"info"}


def _names(notification: dict[str, Any]) -> set[str]:
    return {alert["labels"]["alertname"] for alert in notification.get("alerts", [])}
