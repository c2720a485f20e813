"""The headline report: medians and ranges per strategy, per step, and ratios to ``coordinated``."""

from __future__ import annotations

from typing import Any

from coordinator.testbed.story import report, summarize


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
