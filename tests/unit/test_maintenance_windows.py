"""Maintenance windows: which moments lie inside, when the next opens, and their configuration."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml

from coordinator.config import MaintenanceWindowConfig, Settings, load_settings
from coordinator.errors import ConfigError
from coordinator.maintenance_windows import Window, in_windows, next_opening

UTC = ZoneInfo("UTC")
AMS = ZoneInfo("Europe/Amsterdam")


def at(zone: ZoneInfo, *fields: int) -> float:
    return dt.datetime(*fields, tzinfo=zone).timestamp()  # type: ignore[misc]


def window(days: str, start: str, end: str, zone: str = "UTC") -> Window:
    return MaintenanceWindowConfig(days=days.split(), start=start, end=end, timezone=zone).to_window()  # type: ignore[arg-type]


def test_a_window_holds_its_span_on_its_days_only() -> None:
    office = window("mon tue wed thu fri", "09:00", "17:00")
    assert office.contains(at(UTC, 2026, 11, 23, 9, 0))  # a Monday, at the opening
    assert office.contains(at(UTC, 2026, 11, 23, 16, 59))
    assert not office.contains(at(UTC, 2026, 11, 23, 17, 0))  # the end is outside
    assert not office.contains(at(UTC, 2026, 11, 23, 8, 59))
    assert not office.contains(at(UTC, 2026, 11, 28, 12, 0))  # a Saturday


def test_a_window_whose_end_is_not_after_its_start_runs_past_midnight_into_the_next_day() -> None:
    night = window("sat", "22:00", "04:00")
    assert night.contains(at(UTC, 2026, 11, 28, 23, 0))  # Saturday night
    assert night.contains(at(UTC, 2026, 11, 29, 3, 59))  # Sunday morning: opened on Saturday
    assert not night.contains(at(UTC, 2026, 11, 29, 22, 30))  # Sunday night: it opens on Saturdays only
    assert not night.contains(at(UTC, 2026, 11, 28, 3, 0))  # Saturday morning: opened on Friday, not a day of it


def test_a_window_is_read_in_its_time_zone() -> None:
    office = window("mon", "09:00", "10:00", "Europe/Amsterdam")
    assert office.contains(at(AMS, 2026, 11, 23, 9, 30))
    assert not office.contains(at(UTC, 2026, 11, 23, 9, 30))  # 10:30 in Amsterdam (UTC+1 in November)


def test_no_window_means_always_and_the_next_opening_is_the_nearest_of_all() -> None:
    assert in_windows((), at(UTC, 2026, 11, 23, 3, 0))
    monday_night = window("mon", "22:00", "23:00")
    tuesday_morning = window("tue", "06:00", "07:00")
    now = at(UTC, 2026, 11, 23, 12, 0)  # Monday noon
    assert not in_windows((monday_night, tuesday_morning), now)
    assert next_opening((tuesday_morning, monday_night), now) == at(UTC, 2026, 11, 23, 22, 0)
    assert next_opening((), now) is None


@pytest.mark.parametrize(("entry", "field", "message"), [
    ({"start": "25:00", "end": "04:00"}, "policy.maintenance_windows.0.start", "HH:MM"),
    ({"start": "22:00", "end": "4"}, "policy.maintenance_windows.0.end", "HH:MM"),
    ({"start": "22:00", "end": "04:00", "timezone": "Mars/Olympus"}, "policy.maintenance_windows.0.timezone",
     "unknown time zone"),
    ({"start": "22:00", "end": "04:00", "days": ["someday"]}, "policy.maintenance_windows.0.days.0", "mon"),
    ({"start": "22:00", "end": "04:00", "days": []}, "policy.maintenance_windows.0.days", "at least one day"),
    ({"end": "04:00"}, "policy.maintenance_windows.0.start", "Field required"),
])
def test_a_bad_window_is_refused_naming_the_field(
    entry: dict[str, object], field: str, message: str, tmp_path: Path
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"cluster": "c", "policy": {"maintenance_windows": [entry]}}))
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    text = str(caught.value)
    assert field in text and message in text


def test_windows_reach_the_policy() -> None:
    from coordinator.runtime import policy_from

    settings = Settings.model_validate({"cluster": "c", "policy": {"maintenance_windows": [
        {"days": ["sat", "sun"], "start": "01:00", "end": "05:00", "timezone": "Europe/Amsterdam"}]}})
    (only,) = policy_from(settings).windows
    assert only.days == frozenset({5, 6}) and only.start == dt.time(1, 0) and only.zone == AMS
