"""The shipped alert rules, run for real: a Prometheus server scrapes a live group, a drain that fails on one
VM fires ``CoordinatorDrainFailed``, and an Alertmanager delivers it to a webhook receiver this test runs.

The fault is the one that fires fastest with the rules as shipped: ``CoordinatorDrainFailed`` has no
``for:`` (every other rule waits a minute or more), so ``deploy/prometheus/alerts.yml`` is used unchanged.
Prometheus scrapes and evaluates every second; Alertmanager's group_wait is 0 s. Both are Debian's packages
(``scripts/setup.sh`` installs them), started here on loopback ports; a missing one fails the test.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from coordinator.support.quiethttp import QuietThreadingHTTPServer
from coordinator.testbed.monitoring import LocalAlertmanager, LocalPrometheus, Scraped
from tests.e2e.support import ClusterFactory, sim

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"

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
        alertmanager.start()
        prometheus.alertmanager = f"127.0.0.1:{alertmanager.port}"
        prometheus.start()
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
