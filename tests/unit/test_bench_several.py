"""``bench/several.py``: groups run together meet at each point before any goes on, the ensemble's counts
between the points leave the harness's observers out, and a failed group releases the others."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest

from bench.groups import MEETING_POINTS, Counters
from bench.several import Ensemble, Meetings, _ensemble_figures, render_several


class _Served:
    """What a fake ensemble has served: each session's last xid, the zxid, deliveries per session."""

    def __init__(self) -> None:
        self.xids: dict[int, int] = {}
        self.zxid = 0
        self.delivered: list[dict[int, int]] = []  # one entry per delivery batch; a mark is a length


class _FakeEnsemble:
    def __init__(self, served: _Served) -> None:
        self.served = served

    def zxid(self) -> int:
        return self.served.zxid

    def deliveries_mark(self) -> list[int]:
        return [len(self.served.delivered)]

    def deliveries_since(self, mark: Sequence[int]) -> tuple[dict[int, int], list[int]]:
        counts: dict[int, int] = {}
        for batch in self.served.delivered[mark[0]:]:
            for sid, n in batch.items():
                counts[sid] = counts.get(sid, 0) + n
        return counts, [len(self.served.delivered)]


class _FakeCounters:
    def __init__(self, served: _Served) -> None:
        self.served = served

    def mark(self) -> tuple[dict[int, int], set[int]]:
        return dict(self.served.xids), set(self.served.xids)


def _meetings(groups: int, served: _Served, timeout: float = 5.0) -> Meetings:
    return Meetings(groups, cast(Ensemble, _FakeEnsemble(served)), cast(Counters, _FakeCounters(served)), timeout)


def test_no_group_goes_on_before_every_group_arrived_and_the_point_was_counted() -> None:
    served = _Served()
    meetings = _meetings(3, served)
    passed: list[tuple[int, str, bool]] = []
    lock = threading.Lock()

    def group(index: int) -> None:
        for point in MEETING_POINTS:
            with lock:
                served.xids[index] = served.xids.get(index, 0) + 10  # requests before the point
            meetings.arrive(point)
            with lock:
                passed.append((index, point, point in meetings.marks))

    threads = [threading.Thread(target=group, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert list(meetings.marks) == list(MEETING_POINTS)
    assert all(marked for _, _, marked in passed) and len(passed) == 3 * len(MEETING_POINTS)
    # Each point was counted once every group had sent its requests before it: 10 more per group each time.
    for number, point in enumerate(MEETING_POINTS, 1):
        assert meetings.marks[point]["xids"] == {0: 10 * number, 1: 10 * number, 2: 10 * number}


def test_a_group_that_fails_releases_the_others_with_an_error() -> None:
    meetings = _meetings(2, _Served(), timeout=30.0)
    errors: list[BaseException] = []

    def waiting() -> None:
        try:
            meetings.arrive("story")
        except threading.BrokenBarrierError as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiting)
    thread.start()
    meetings.abort()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    with pytest.raises(threading.BrokenBarrierError):
        meetings.arrive("story")  # a group arriving later stops too


def test_the_ensembles_counts_are_the_agents_between_the_points_observers_left_out() -> None:
    served = _Served()
    ensemble = cast(Ensemble, _FakeEnsemble(served))
    marks: dict[str, dict[str, Any]] = {}

    def mark(point: str, t: float) -> None:
        marks[point] = {"t": t, "xids": dict(served.xids), "alive": set(served.xids), "zxid": served.zxid,
                        "deliveries": ensemble.deliveries_mark()}

    served.xids = {1: 100, 2: 50, 99: 1000}  # 99 is a harness observer
    mark("story", 0.0)
    served.xids = {1: 160, 2: 90, 3: 20, 99: 5000}  # session 3: an agent restarted during the story
    served.zxid = 40
    served.delivered.append({1: 7, 2: 3, 99: 100})
    mark("story over", 20.0)
    mark("idle", 25.0)
    served.delivered.append({99: 4})
    mark("idle over", 85.0)
    figures = _ensemble_figures(ensemble, marks, {99}, events=4)["ensemble"]
    assert figures["requests_per_event"] == (60 + 40 + 20) / 4
    assert figures["requests_per_second"] == 120 / 20
    assert figures["writes_per_event"] == 10
    assert figures["watch_events_per_event"] == 10 / 4
    assert figures["sessions"] == 3
    assert (figures["idle_requests"], figures["idle_watch_events"], figures["idle_seconds"]) == (0, 0, 60.0)
    # A run that stopped before every point has no counts to show, and says where the groups got to.
    assert _ensemble_figures(ensemble, {"story": marks["story"]}, {99}, 4) == {"ensemble": None, "met_at": ["story"]}


def test_the_section_shows_each_groups_verdict_and_the_totals() -> None:
    def run(violations: int, unexplained: int, error: str | None = None) -> dict[str, Any]:
        return {"events": 32, "approved_early": 30, "waited_for_not_before": 2, "back_in_rotation": 10,
                "oracle": {"violations": violations, "stats": {"liveness": {"misses_unexplained": unexplained}}},
                "detection_ms": {"p50": 200.0, "max": 900.0}, "gate_ms": {"p50": 60.0, "p99": 300.0},
                "notice_to_started_early_s": {"p50": 1.5, "max": 6.0}, "story_seconds": 400.0, "error": error}

    entry = {"date": "2026-12-03", "command": ".venv/bin/python bench/run.py --only several", "machine": "2 cores",
             "result": {"groups": 2, "size": 10, "servers": 3, "runs": [run(0, 0), run(1, 2, "RuntimeError: x")],
                        "ensemble": {"events": 64, "story_seconds": 400.0, "requests_per_event": 450.0,
                                     "requests_per_second": 72.0, "writes_per_event": 22.0,
                                     "watch_events_per_event": 30.0, "sessions": 20, "idle_seconds": 60.0,
                                     "idle_requests": 0, "idle_watch_events": 0},
                        "load_average_before": [0.5], "load_average_after": [6.0], "wall_seconds": 600.0}}
    text = render_several(entry)
    assert "| 0 | 32 | 30 | 2 | 0 | 0 | 10/10 | 200 / 900 | 60 / 300 | 1.50 / 6.00 | 400 |  |" in text
    assert "| 1 | 32 | 30 | 2 | 1 | 2 | 10/10 |" in text and "RuntimeError: x |" in text
    assert "| all | 64 | 60 | 4 | 1 | 2 | 20/20 |" in text and "1 failed |" in text
    words = " ".join(text.split())
    assert "450 requests per event" in words
    assert "While every group idled (60 s): 0 requests and 0 watch events" in words
