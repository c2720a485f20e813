"""The benchmark report states each target next to what was measured, met or not, from the numbers alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.group import _max_in_window  # noqa: E402
from bench.run import render  # noqa: E402


def _group(gate_ms: list[float], idle_reads: int, cpu: float) -> dict[str, Any]:
    return {"date": "2026-01-01", "command": "bench/run.py", "machine": "test", "notes": [], "result": {
        "events": len(gate_ms), "gate_ms": gate_ms, "schedule_to_start_s": [1.0] * len(gate_ms),
        "event_resources": 2, "zk_writes_per_event": 12.0, "imds_max_per_window": {"vm0": 3},
        "imds_rate": {"vm0": 1.2}, "imds_posts": len(gate_ms), "zk_requests_per_agent_per_event": {"0x1": 20.0},
        "storm_seconds": 10.0, "storm_reads": {"vm0": 10}, "storm_min_gap_s": {"vm0": 0.99},
        "storm_watch_events": 400, "idle_seconds": 300.0, "idle_zk_requests": {"0x1": idle_reads},
        "idle_cpu_s_per_hour": {"vm0": cpu, "reference": 10.0}, "idle_rss_mib": {"vm0": 47.0, "reference": 27.0},
        "rss_floor_mib": {"python": 10.6, "core dependencies": 35.2, "agent modules": 40.7}}}


def test_targets_are_judged_from_the_measured_numbers() -> None:
    good = render({"group": _group([5.0] * 200, 0, 9.0)})
    assert "p99 < 20 ms: met" in good and "0: met" in good and "at most 1: met" in good
    assert "at most 7: not met" in good and "under 40: not met" in good  # 12 writes, 47 MiB
    bad = render({"group": _group([5.0] * 190 + [50.0] * 10, 3, 20.0)})
    assert "p99 < 20 ms: not met" in bad and "0: not met" in bad and "at most 1: not met" in bad


def test_detection_targets_depend_on_the_group_size() -> None:
    rows = [{"agents": 3, "stagger": True, "n": 20, "p50": 300.0, "p90": 400.0, "p99": 450.0, "max": 450.0},
            {"agents": 30, "stagger": True, "n": 20, "p50": 300.0, "p90": 400.0, "p99": 450.0, "max": 450.0},
            {"agents": 30, "stagger": False, "n": 20, "p50": 900.0, "p90": 990.0, "p99": 999.0, "max": 999.0}]
    text = render({"detection": {"date": "2026-01-01", "command": "c", "machine": "m", "rows": rows}})
    assert "p50 <= 383 ms: met" in text and "p50 <= 83 ms: not met" in text and "baseline" in text


def test_most_requests_in_any_one_second_window() -> None:
    assert _max_in_window([0.0, 0.5, 0.99, 1.0, 1.2, 3.0]) == 4  # 0.5, 0.99, 1.0 and 1.2 are within 1 s
    assert _max_in_window([]) == 0


def test_the_headline_says_what_held_each_event_that_waited_for_its_notbefore() -> None:
    from bench.headline import _late_notes

    def run(held_by: str | None) -> dict[str, Any]:
        events = [{"event_id": "E1", "step": "Freeze", "start_reason": "approved", "held_by": None},
                  {"event_id": "E2", "step": "Redeploy", "start_reason": "not_before", "held_by": held_by}]
        return {"strategy": "coordinated", "events": events, "drained_before_start": {"E1": True, "E2": True}}

    notes = _late_notes([run("vm2 (approver): maintenance budget: 1 event(s) in maintenance"), run(None)], {})
    assert notes == ["`coordinated`: events that started at NotBefore though their notice left time to drain: "
                     "Redeploy in 2 of 2 runs (held by: vm2 (approver): maintenance budget: 1 event(s) in "
                     "maintenance / nothing recorded)."]
    assert _late_notes([run(None) | {"events": run(None)["events"][:1]}], {}) == []


def test_the_event_cost_section_shows_each_size_before_and_now_against_the_target() -> None:
    from bench.event_cost import render_event_cost

    def group(size: int, requests: list[int], sending: list[int]) -> dict[str, object]:
        runs = [{"requests": r, "sessions_sending": s, "writes": 12} for r, s in zip(requests, sending, strict=True)]
        return {"size": size, "idle": {"requests": 0}, "events": {"2": runs}}

    entry = {"sizes": [group(10, [55, 58], [3, 3]), group(30, [55, 70], [3, 4])],
             "before": {"stamp": "on the code before.", "sizes": [group(10, [165, 168], [10, 10])]}}
    text = render_event_cost(entry, "Measured today.")
    assert "| 10 | 2 | 165, 168 | 55, 58 | 10, 10 | 3, 3 | 12, 12 | at most 60: met |" in text
    assert "| 30 | 2 | - | 55, 70 | - | 3, 4 | 12, 12 | at most 60: not met |" in text  # 70 > 60; nothing before
    assert "Measured today. Before: on the code before." in text
    assert "requests of the whole group: 10: 0, 30: 0" in text
