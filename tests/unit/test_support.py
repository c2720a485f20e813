"""The shared utilities of ``coordinator.support``: atomic writes, the rate limiter, HTTP dates."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.support.files import atomic_write
from coordinator.support.httpdate import format_http_date, parse_http_date
from coordinator.support.ratelimit import RateLimiter


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- atomic_write ------------------------------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    atomic_write(path, "first\n")
    assert path.read_text() == "first\n"
    atomic_write(path, b"\x00second")
    assert path.read_bytes() == b"\x00second"
    atomic_write(path, "é")
    assert path.read_bytes() == "é".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_atomic_write_keeps_the_old_content_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "ready.json"
    path.write_text("old")

    def broken(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_interrupted_atomic_write_leaves_no_file_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.json", "data")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_syncs_the_file_and_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[bool, bool]] = []
    real_fsync = os.fsync
    target = tmp_path / "state.json"

    def recording_fsync(fd: int) -> None:
        synced.append((Path(f"/proc/self/fd/{fd}").resolve() == tmp_path.resolve(), target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    atomic_write(target, "data")
    # First the temporary file, before the rename; last the directory, after it.
    assert synced == [(False, False), (True, True)]


# -- RateLimiter -------------------------------------------------------------------------------------------


def _at_most(times: list[float], limit: int, window: float) -> bool:
    # In time order, any window holds at most `limit` times iff each time is at least `window` after the
    # one `limit` places before it.
    ordered = sorted(times)
    return all(later - earlier >= window - 1e-9 for earlier, later in zip(ordered, ordered[limit:], strict=False))


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=6),
    window=st.sampled_from([0.5, 1.0, 2.5]),
    steps=st.lists(st.floats(min_value=0.0, max_value=1.5, allow_nan=False), max_size=60),
)
def test_admit_never_admits_more_than_the_limit_in_any_window(limit: int, window: float, steps: list[float]) -> None:
    clock = FakeClock()
    limiter = RateLimiter(limit, window, clock=clock)
    admitted = []
    for step in steps:
        clock.now += step
        if limiter.admit():
            admitted.append(clock.now)
    assert _at_most(admitted, limit, window)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=6),
    steps=st.lists(st.floats(min_value=0.0, max_value=1.5, allow_nan=False), max_size=60),
)
def test_reserve_books_the_earliest_time_that_keeps_the_limit(limit: int, steps: list[float]) -> None:
    clock = FakeClock()
    limiter = RateLimiter(limit, clock=clock)
    booked: list[float] = []
    for step in steps:
        clock.now += step
        at = limiter.reserve()
        assert at >= clock.now
        assert not booked or at >= booked[-1]  # in call order
        booked.append(at)
    assert _at_most(booked, limit, 1.0)


def test_reserve_with_a_clock_that_stands_still_queues_by_whole_windows() -> None:
    limiter = RateLimiter(3, clock=FakeClock(10.0))
    assert [limiter.reserve() for _ in range(7)] == [10.0] * 3 + [11.0] * 3 + [12.0]


def test_refused_attempts_do_not_count() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter(2, clock=clock)
    assert [limiter.admit() for _ in range(3)] == [True, True, False]
    for _ in range(10):
        clock.now += 0.09
        assert limiter.admit() is False
    clock.now = 101.0
    assert [limiter.admit() for _ in range(3)] == [True, True, False]


def test_admit_respects_earlier_reservations() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter(1, clock=clock)
    assert limiter.reserve() == 0.0
    assert limiter.reserve() == 1.0
    clock.now = 1.5
    assert limiter.admit() is False  # the send booked at 1.0 is still in the window
    clock.now = 2.0
    assert limiter.admit() is True


def test_limit_zero_disables_the_limiter() -> None:
    clock = FakeClock(5.0)
    limiter = RateLimiter(0, clock=clock)
    assert all(limiter.admit() for _ in range(100))
    assert {limiter.reserve() for _ in range(100)} == {5.0}


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(5.0, [0.0] * 5 + [1.0]), (2.5, [0.0, 0.0, 1.0]), (0.5, [0.0, 2.0, 4.0])],
)
def test_per_second_rounds_fractional_rates_down(rate: float, expected: list[float]) -> None:
    limiter = RateLimiter.per_second(rate, clock=FakeClock(0.0))
    assert [limiter.reserve() for _ in expected] == expected


@pytest.mark.parametrize("arguments", [(-1, 1.0), (1, 0.0), (1, float("inf"))])
def test_limiter_refuses_nonsense(arguments: tuple[int, float]) -> None:
    with pytest.raises(ValueError):
        RateLimiter(*arguments)
    with pytest.raises(ValueError):
        RateLimiter.per_second(0.0)


# -- HTTP dates --------------------------------------------------------------------------------------------


def test_format_is_what_imds_serves() -> None:
    assert format_http_date(1474309787) == "Mon, 19 Sep 2016 18:29:47 GMT"
    assert format_http_date(1474309787.9) == "Mon, 19 Sep 2016 18:29:47 GMT"
    assert format_http_date(datetime(2016, 9, 19, 18, 29, 47)) == "Mon, 19 Sep 2016 18:29:47 GMT"
    plus_two = timezone(timedelta(hours=2))
    assert format_http_date(datetime(2016, 9, 19, 20, 29, 47, tzinfo=plus_two)) == "Mon, 19 Sep 2016 18:29:47 GMT"
    assert format_http_date(datetime(2022, 4, 1, 9, 5, 3, tzinfo=UTC)) == "Fri, 01 Apr 2022 09:05:03 GMT"


@given(st.integers(min_value=0, max_value=253402300799))  # up to 9999-12-31T23:59:59Z
def test_dates_round_trip(epoch: int) -> None:
    text = format_http_date(epoch)
    parsed = parse_http_date(text)
    assert parsed == datetime.fromtimestamp(epoch, UTC)
    assert parsed.tzinfo is UTC
    assert format_http_date(parsed) == text


def test_parse_ignores_a_wrong_weekday() -> None:
    # 19 Sep 2016 was a Monday; public examples of IMDS documents carry such mismatches.
    expected = datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert parse_http_date("Fri, 19 Sep 2016 18:29:47 GMT") == expected
    assert parse_http_date("Mon, 19 Sep 2016 18:29:47 GMT") == expected


def test_parse_converts_to_utc_and_takes_a_missing_zone_as_utc() -> None:
    assert parse_http_date("Mon, 19 Sep 2016 20:29:47 +0200") == datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert parse_http_date("Mon, 19 Sep 2016 18:29:47 -0000") == datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert parse_http_date("19 Sep 2016 18:29:47 UTC").tzinfo is UTC


@pytest.mark.parametrize(
    "text", ["", "tomorrow", "Mon, 31 Feb 2016 18:29:47 GMT", "Mon, 19 Foo 2016 18:29:47 GMT", "2016-09-19T18:29:47Z"]
)
def test_parse_refuses_what_is_not_a_date(text: str) -> None:
    with pytest.raises(ValueError):
        parse_http_date(text)
