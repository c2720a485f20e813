"""A real Prometheus and Alertmanager on loopback, scraping a local group: for the alerts test.

``LocalAlertmanager`` runs Debian's ``prometheus-alertmanager`` with one webhook receiver (its own routing,
or a given configuration's routes and inhibit rules, such as ``deploy/prometheus/alertmanager.yml``) and its
high availability cluster listener disabled (it would bind every interface); ``LocalPrometheus`` runs
``prometheus`` with the shipped alert rules (``deploy/prometheus/alerts.yml``, or any rule files given),
scraping the agents' admin ports every second and sending alerts to that Alertmanager. Both bind
127.0.0.1 only, keep their data in the directory given, and only the PID started here is ever
signalled. ``docs/operations.md`` ("Alerts, end to end") runs the same by hand.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from coordinator.testbed.processes import free_port, stop_process

__all__ = ["ALERTMANAGER", "PROMETHEUS", "LocalAlertmanager", "LocalPrometheus", "Scraped"]

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"  # Debian's name for the alertmanager binary


class _Daemon:
    binary = ""
    what = ""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = directory / f"{self.binary}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it says it is ready (``/-/ready``). Raises RuntimeError with its own
        words if it is missing, exits, or is not ready in time."""
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} is not installed: scripts/setup.sh installs it ({self.what})")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([self.binary, *self._args()], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if client.get(f"{self.url}/-/ready").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        last = self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"{self.binary} did not become ready within {timeout:g} s:\n{last}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=10)


class LocalAlertmanager(_Daemon):
    """Alertmanager delivering alerts to ``webhook_url``: every alert at once (group_wait 0 s), or, given
    ``routing`` (an Alertmanager configuration), as its routes and inhibit rules say, every receiver it
    names sending to the webhook instead, resolved alerts too where that receiver sends them (its first
    webhook's ``send_resolved``). Without ``routing``, resolved alerts are not sent."""

    binary = ALERTMANAGER
    what = "Debian's prometheus-alertmanager package"

    def __init__(self, directory: Path, webhook_url: str, routing: Mapping[str, Any] | None = None) -> None:
        super().__init__(directory)
        self.webhook_url = webhook_url
        self.routing = routing
        self.config_path = directory / "alertmanager.yml"

    def config(self) -> dict[str, Any]:
        webhook = {"webhook_configs": [{"url": self.webhook_url, "send_resolved": False}]}
        if self.routing is not None:
            config = copy.deepcopy(dict(self.routing))
            receivers = []
            for receiver in sorted(config.get("receivers", []), key=lambda r: str(r["name"])):
                hooks = receiver.get("webhook_configs") or [{}]
                resolved = bool(hooks[0].get("send_resolved", True))
                receivers.append({"name": str(receiver["name"]),
                                  "webhook_configs": [{"url": self.webhook_url, "send_resolved": resolved}]})
            config["receivers"] = receivers
            return config
        return {
            "route": {"receiver": "webhook", "group_by": ["alertname", "cluster", "vm"],
                      "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "webhook", **webhook}],
        }

    def alerts(self) -> list[Mapping[str, Any]]:
        """The alerts it holds now and has not seen resolved (inhibited and silenced ones too)."""
        answer = httpx.get(f"{self.url}/api/v2/alerts", timeout=5.0, trust_env=False)
        answer.raise_for_status()
        alerts: list[Mapping[str, Any]] = answer.json()
        return alerts

    def _args(self) -> list[str]:
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return [f"--config.file={self.config_path}", f"--storage.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="]


class Scraped:
    """One agent to scrape: its admin address (``host:port``) and the labels the rules group by."""

    def __init__(self, address: str, vm: str, cluster: str) -> None:
        self.address, self.vm, self.cluster = address, vm, cluster


class LocalPrometheus(_Daemon):
    """Prometheus scraping ``targets`` every ``interval``, evaluating ``rule_files`` as often, and
    sending alerts to ``alertmanager``."""

    binary = PROMETHEUS
    what = "Debian's prometheus package"

    def __init__(self, directory: Path, targets: Sequence[Scraped], rule_files: Sequence[Path],
                 alertmanager: str, interval: str = "1s") -> None:
        super().__init__(directory)
        self.targets = list(targets)
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.alertmanager = alertmanager
        self.interval = interval
        self.config_path = directory / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]},
            "scrape_configs": [{
                "job_name": "coordinator", "metrics_path": "/metrics",
                "static_configs": [{"targets": [t.address], "labels": {"vm": t.vm, "cluster": t.cluster}}
                                   for t in self.targets],
            }],
        }

    def _args(self) -> list[str]:
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return [f"--config.file={self.config_path}", f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5.0, trust_env=False)
        answer.raise_for_status()
        result: list[dict[str, Any]] = answer.json()["data"]["result"]
        return result

    def alerts(self) -> list[Mapping[str, Any]]:
        """The alerts its rules hold now (pending or firing)."""
        answer = httpx.get(f"{self.url}/api/v1/alerts", timeout=5.0, trust_env=False)
        answer.raise_for_status()
        alerts: list[Mapping[str, Any]] = answer.json()["data"]["alerts"]
        return alerts
