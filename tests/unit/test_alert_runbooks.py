"""Every alert sends the engineer on call to a section of the runbook (docs/operations.md) that exists and
is about that alert; every other pointer into the runbook from the monitoring configuration resolves too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
RUNBOOK = ROOT / "docs" / "operations.md"
MONITORING = ROOT / "deploy" / "prometheus"
# `See docs/operations.md, "Section title".`, possibly broken over lines.
_POINTER = re.compile(r'docs/operations\.md,?\s+\(?"([^"]+)"')


def _sections() -> dict[str, str]:
    """Each heading of the runbook (outside code blocks), with its text up to the next heading."""
    sections: dict[str, str] = {}
    title: str | None = None
    fenced = False
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{2,4} (.+)$", line)
        if heading:
            title = heading.group(1).strip()
            sections[title] = ""
        elif title is not None:
            sections[title] += line + "\n"
    return sections


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_names_a_runbook_section_that_exists_and_is_about_it() -> None:
    sections = _sections()
    alerts = _alerts()
    assert len(alerts) >= 9
    for rule in alerts:
        name = str(rule["alert"])
        annotations: dict[str, str] = rule["annotations"]
        pointers = _POINTER.findall(" ".join(str(v) for v in annotations.values()))
        assert pointers, f"{name} does not say which section of docs/operations.md to read"
        for title in pointers:
            assert title in sections, f"{name} points at {title!r}, not a heading of docs/operations.md"
            assert name in sections[title], f"docs/operations.md, {title!r}, does not mention {name}"


def test_every_pointer_into_the_runbook_from_the_monitoring_configuration_resolves() -> None:
    sections = _sections()
    found = 0
    for path in sorted(MONITORING.glob("*.yml")):
        for title in _POINTER.findall(path.read_text()):
            found += 1
            assert title in sections, f"{path.name} points at {title!r}, not a heading of docs/operations.md"
    assert found >= 10
