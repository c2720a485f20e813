"""The monitoring kit under deploy/: Prometheus's configuration and alert rules checked and unit-tested by
promtool, and every metric a rule (or a dashboard panel) queries exported by a live agent."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.support import ClusterFactory

ROOT = Path(__file__).resolve().parent.parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
METRIC = re.compile(r"\b(coordinator_[a-z0-9_]+)")
SUFFIXES = ("_bucket", "_sum", "_count", "_created")

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        message = "promtool is missing: scripts/setup.sh installs it (Debian's prometheus package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=PROMETHEUS)


def test_the_prometheus_configuration_and_its_rules_are_valid() -> None:
    config = _promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    rules = _promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_the_alertmanager_configuration_is_valid() -> None:
    tool = shutil.which("amtool")
    if tool is None:
        message = "amtool is missing: scripts/setup.sh installs it (Debian's prometheus-alertmanager package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([tool, "check-config", "alertmanager.yml"], capture_output=True, text=True, timeout=60,
                            check=False, cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_rule_passes_its_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROMETHEUS / "alerts.test.yml").read_text()))
    defined = set(re.findall(r"- alert: (\w+)", (PROMETHEUS / "alerts.yml").read_text()))
    assert defined and defined == tested, f"rules without a test: {sorted(defined - tested)}"


def test_a_broken_rule_fails_the_checks(tmp_path: Path) -> None:
    broken = tmp_path / "alerts.yml"
    broken.write_text((PROMETHEUS / "alerts.yml").read_text().replace("== 0", "== ==", 1))
    result = _promtool("check", "rules", str(broken))
    assert result.returncode != 0


def _queried_metrics() -> dict[str, set[str]]:
    """Metric family names queried by each file: the alert rules and every dashboard."""
    sources = [PROMETHEUS / "alerts.yml", *sorted(GRAFANA.rglob("*.json"))]
    queried: dict[str, set[str]] = {}
    for source in sources:
        text = source.read_text()
        if source.suffix == ".json":
            text = " ".join(target.get("expr", "") for panel in json.loads(text).get("panels", [])
                            for target in panel.get("targets", []))
        names = set()
        for name in METRIC.findall(text):
            for suffix in SUFFIXES:
                if name.endswith(suffix):
                    name = name.removesuffix(suffix)
            names.add(name)
        queried[source.relative_to(ROOT).as_posix()] = names
    return queried


def test_every_metric_the_rules_and_dashboards_query_is_exported_by_a_live_agent(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster()
    # Every family is declared (# TYPE) even before its first sample: a counter by labels that has not
    # counted yet is exported all the same.
    exported = set(re.findall(r"^# TYPE (\S+) ", cluster.agents["vm0"].metrics(), re.MULTILINE))
    queried = _queried_metrics()
    assert queried["deploy/prometheus/alerts.yml"], "the rules query no coordinator metric"
    missing = {source: sorted(names - exported) for source, names in queried.items() if names - exported}
    assert not missing, f"queried but not exported: {missing}"


def test_the_dashboard_is_provisioned_and_every_panel_queries_something() -> None:
    dashboards = sorted((GRAFANA / "dashboards").glob("*.json"))
    assert dashboards
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] and dashboard["title"]
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for panel in dashboard["panels"]:
            exprs = [target["expr"] for target in panel["targets"]]
            assert exprs and all(METRIC.search(e) for e in exprs), f"{path.name}: {panel['title']!r} queries nothing"
    assert _queried_metrics()["deploy/grafana/dashboards/coordinator.json"]
    provider = (GRAFANA / "provisioning" / "dashboards" / "coordinator.yml").read_text()
    assert "path: /var/lib/grafana/dashboards" in provider
