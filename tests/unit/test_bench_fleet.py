"""The fleet model is a pure function of the ensemble's ceiling and of what an event was measured to cost a
group; the ceiling is read off the ramp's steps by a stated rule."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fleet import SESSION_TIMEOUT, EventCost, fleet_inputs, fleet_model  # noqa: E402
from bench.run import render  # noqa: E402
from bench.zk_ceiling import Histogram, ceiling_of, mix_ratio  # noqa: E402
from coordinator.config.services import ZooKeeperConfig  # noqa: E402


def test_busiest_hour_of_groups_of_100() -> None:
    (row,) = fleet_model(10_000.0, [EventCost(100, 2, 120.0, 0.5, 2)])
    # 100 VMs, two per event, in one hour: 50 events of 120 requests each, and the idle cost beside them.
    assert row.groups == 100
    assert row.events_per_s_group == pytest.approx(50 / 3600)
    assert row.requests_per_s_group == pytest.approx(50 / 3600 * 120 + 0.5)
    assert row.requests_per_s_fleet == pytest.approx(100 * row.requests_per_s_group)
    assert row.pings_per_s_fleet == pytest.approx(10_000 / (20 / 3))  # a ping a third of 20 s apart, per VM
    assert row.fraction_of_ceiling == pytest.approx(row.requests_per_s_fleet / 10_000.0)


def test_the_model_pings_at_the_products_default_session_timeout() -> None:
    """The fleet runs the product's default ``zookeeper.session_timeout`` (20 s); another may be given."""
    assert SESSION_TIMEOUT == ZooKeeperConfig.model_fields["session_timeout"].default == 20.0
    (row,) = fleet_model(None, [EventCost(100, 2, 120.0, 0.0, 1)], session_timeout=30.0)
    assert row.pings_per_s_fleet == pytest.approx(10_000 / 10)


def test_an_event_of_ten_vms_makes_a_fifth_as_many_events() -> None:
    two, ten = fleet_model(1000.0, [EventCost(200, 2, 120.0, 0.0, 1), EventCost(200, 10, 400.0, 0.0, 1)])
    assert ten.events_per_s_group == pytest.approx(two.events_per_s_group / 5)
    assert ten.requests_per_s_group == pytest.approx(200 / 10 / 3600 * 400)


def test_without_a_ceiling_there_is_no_fraction() -> None:
    assert all(row.fraction_of_ceiling is None for row in fleet_model(None, [EventCost(10, 2, 100.0, 0.0, 1)]))


def test_inputs_are_the_measured_costs_only_the_largest_of_each() -> None:
    results: dict[str, Any] = {"cost": {"sizes": [
        {"size": 100, "idle": {"seconds": 6.0, "requests": 3}, "events": {
            "2": [{"requests": 117}, {"requests": 129}], "10": [{"requests": 400}]}},
        {"size": 10, "idle": {"seconds": 6.0, "requests": 0}, "events": {"2": [{"requests": 110}], "10": []}}]}}
    assert fleet_inputs(results) == [EventCost(10, 2, 110.0, 0.0, 1), EventCost(100, 2, 129.0, 0.5, 2),
                                     EventCost(100, 10, 400.0, 0.5, 1)]
    assert fleet_inputs({}) == []  # nothing measured, nothing assumed


def test_the_ceiling_is_the_highest_step_with_a_low_p99_and_the_offered_rate_achieved() -> None:
    steps = [{"offered": 500, "achieved": 500, "p99_ms": 20.0},
             {"offered": 1000, "achieved": 990, "p99_ms": 60.0},
             {"offered": 2000, "achieved": 1800, "p99_ms": 40.0},  # 10 % short of the offered rate
             {"offered": 3000, "achieved": 3000, "p99_ms": 400.0}]
    assert ceiling_of(steps, p99_limit_ms=100.0) == 1000
    assert ceiling_of(steps, p99_limit_ms=50.0) == 500
    assert ceiling_of(steps[3:], p99_limit_ms=100.0) is None


def test_histogram_percentiles_are_within_a_bucket_and_merge() -> None:
    a, b = Histogram(), Histogram()
    for ms in range(1, 101):
        (a if ms % 2 else b).add(float(ms))
    merged = Histogram.from_json(a.to_json())
    merged.merge(b)
    assert merged.count == 100
    assert merged.percentile(0.5) == pytest.approx(50.0, rel=0.021)
    assert merged.percentile(0.99) == pytest.approx(99.0, rel=0.021)
    assert math.isnan(Histogram().percentile(0.5))


def test_mix_ratio() -> None:
    ratio = mix_ratio({"getData /events/{id}": 97, "setData /events/{id}": 3})
    assert ratio == {"reads": 0.97, "writes": 0.03}


def test_the_report_says_the_ceiling_and_the_fraction() -> None:
    step = {"offered": 1000.0, "sent": {"getData /events/{id}": 15_000},
            "achieved": 1000.0, "p50_ms": 2.0, "p99_ms": 30.0, "write_p50_ms": 5.0,
            "write_p99_ms": 40.0, "watch_events_per_s": 300.0, "loadavg_1min": ["1.50"],
            "cpu_cores": {"zookeeper 1 (leader)": 0.2, "worker 0": 0.3, "machine (every process)": 1.0}}
    ceiling = {"date": "2026-01-01", "command": "c", "machine": "m", "result": {
        "ensemble": 3, "workers": 4, "sessions": 200, "group_size": 100, "groups": 2, "events_per_group": 4,
        "step_seconds": 15.0, "warmup_seconds": 10.0, "p99_limit_ms": 100.0, "tolerance": 0.05,
        "mix": {"getData /events/{id}": 970, "setData /events/{id}": 30},
        "mix_sent": {"getData /events/{id}": 97, "setData /events/{id}": 3},
        "mix_ratio": {"reads": 0.97, "writes": 0.03}, "steps": [step], "stopped": "", "ceiling": 1000.0}}
    text = render({"ceiling": ceiling})
    assert "**1000 requests/s**" in text and "200 kazoo sessions in 4 worker processes" in text
    assert "not measured (`bench/run.py --only cost`)" in text  # no event cost measured: no row of the model
    cost = {"date": "2026-01-01", "command": "c", "machine": "m", "before": {}, "sizes": [
        {"size": 100, "idle": {"seconds": 6.0, "requests": 0}, "events": {"2": [
            {"requests": 120, "sessions_sending": 3, "writes": 12}]}}]}
    text = render({"ceiling": ceiling, "cost": cost})
    assert "| 2 | 100 | 120 (largest of 1) | 0.0 | 100 | 0.0139 | 1.7 | 167 | 1500 | 16.7 % | not met | 1667 |" in text
