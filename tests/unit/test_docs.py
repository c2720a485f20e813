"""The documents cite tests and files that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def test_every_test_cited_by_the_simulator_doc_exists() -> None:
    cited = set(re.findall(r"\b(test_\w+)\b", (ROOT / "docs/simulator.md").read_text()))
    modules = {path.stem for path in (ROOT / "tests").rglob("test_*.py")}
    assert len(cited) > 50
    missing = sorted(cited - _defined_tests() - modules)
    assert missing == [], f"docs/simulator.md cites tests that do not exist: {missing}"


def test_every_path_cited_by_the_docs_exists() -> None:
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for path in re.findall(r"`((?:coordinator|tests|docs|deploy|bench|scripts)/[\w./-]+\.(?:py|md|yaml|json))`",
                               doc.read_text()):
            assert (ROOT / path).exists(), f"{doc.name} cites {path}, which does not exist"


def test_every_test_cited_by_the_safety_doc_exists() -> None:
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / "docs/safety.md").read_text()))
    assert len(cited) > 10
    missing = sorted(cited - _defined_tests())
    assert missing == [], f"docs/safety.md cites tests that do not exist: {missing}"


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    from prometheus_client import CollectorRegistry

    from coordinator.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    served = {f"{family.name}_total" if family.type == "counter" else family.name for family in registry.collect()}
    documented = set(re.findall(r"^\| `(coordinator_\w+)`", (ROOT / "docs/metrics.md").read_text(), re.M))
    assert sorted(served - documented) == [], "served but not in docs/metrics.md"
    assert sorted(documented - served) == [], "in docs/metrics.md but not served"
