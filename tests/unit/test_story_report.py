"""The headline report: medians and ranges per strategy, per step, and ratios to ``coordinated``."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.testbed.story import drain_report, report, summarize


def run(strategy: str, failed: int, story: float, to_start: float, reclaimed: float) -> dict[str, Any]:
    event = {"step": "freeze", "event_id": "E", "failed": failed, "to_start": to_start, "notice": 900.0,
             "reclaimed": reclaimed, "start_reason": "approved" if reclaimed else "not_before"}
    return {"strategy": strategy, "sent": 100, "failed": failed, "story_sim_seconds": story,
            "story_real_seconds": story / 60, "events": [event]}


def test_summary_takes_medians_and_ranges_and_report_gives_ratios_to_coordinated() -> None:
    runs = [run("coordinated", 0, 600.0, 120.0, 780.0), run("coordinated", 0, 720.0, 150.0, 750.0),
            run("coordinated", 0, 660.0, 130.0, 770.0),
            run("wait", 0, 1800.0, 900.0, 0.0), run("self-approve", 20, 300.0, 5.0, 895.0)]
    summary = summarize(runs)
    assert summary["coordinated"]["story_sim_seconds"] == {"median": 660.0, "min": 600.0, "max": 720.0}
    assert summary["coordinated"]["steps"]["freeze"]["to_start"]["median"] == 130.0
    assert summary["wait"]["approved_early"]["median"] == 0
    table = report(summary, ("freeze",))
    main = table.split("Ratios to `coordinated`")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in main.splitlines() if line.startswith("| ")}
    assert "| 3 | 100 | 0 | 0 |" in rows["coordinated"]
    assert "11.0 (10.0-12.0)" in rows["coordinated"]  # simulated minutes
    ratios = table.split("Ratios to `coordinated`")[1]
    assert "| wait | - | 2.7 x | 0.0 x |" in ratios
    assert "| self-approve | ∞ | 0.5 x |" in ratios


def drained_run(strategy: str, to_drained: float | None, by: str, left_down: list[str]) -> dict[str, Any]:
    base = run(strategy, 0, 600.0, 120.0, 780.0)
    base["events"][0].update({"to_drained": to_drained, "to_start_real": 2.0, "drained_by": [by, by]})
    base["left_down"] = left_down
    return base


def test_drain_report_compares_notice_to_drained_and_to_start_per_strategy() -> None:
    runs = [drained_run("coordinated", 1.2, "DOWN", []), drained_run("coordinated", 1.4, "DOWN", []),
            drained_run("admin-state", 0.6, "DRAIN", []), drained_run("admin-state", None, "DRAIN", ["vm1"])]
    summary = summarize(runs)
    assert summary["coordinated"]["to_drained"] == pytest.approx({"median": 1.3, "min": 1.2, "max": 1.4})
    assert summary["admin-state"]["drained_events"] == 1 and summary["admin-state"]["all_events"] == 2
    assert summary["admin-state"]["drained_by"] == {"DRAIN": 2}
    rows = {line.split(" | ")[0].strip("| "): line for line in drain_report(summary).splitlines()
            if line.startswith("| ")}
    assert "| 2 of 2 | 1.30 (1.20-1.40) | 2.00 | 0.70 (0.60-0.80) | DOWN 4 | - |" in rows["coordinated"]
    assert "| 1 of 2 | 0.60 | 2.00 | 1.40 | DRAIN 2 | vm1 |" in rows["admin-state"]


def test_runs_recorded_before_the_drain_figures_report_none_of_them() -> None:
    summary = summarize([run("wait", 0, 1800.0, 900.0, 0.0)])
    assert summary["wait"]["drained_events"] == 0
    assert "| 0 of 1 | - | - | - | - | - |" in drain_report(summary)
