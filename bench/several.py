"""Several groups on one ZooKeeper ensemble at once, each through the story of ``bench/groups.py`` and
each judged by the chaos oracle; what the ensemble serves them all, counted by its servers.

    .venv/bin/python bench/run.py --only several --several-groups 10 --several-size 10

K groups of N agent processes each (``coordinator run``, one process per VM as in production, started
through ``LocalCluster``), every group with an IMDS simulator of its own (a delivery unit of its own) and
its own cluster name, all on one ensemble of three ZooKeeper servers on this machine. Each group is a
``GroupRun``: it starts, and meets the others (``MEETING_POINTS``) so that every story starts at once and
every group idles only once every story is over. Per group: what ``GroupRun`` measures of its events
(approved early, started at NotBefore, detection, gate) and the oracle's verdict on its record (S1-S5,
L1, L2), the node history taken from the transaction log of the ensemble's first server. Over the
ensemble, from the meeting points: the requests of every agent session (each server's ``cons``, every
second; pings do not count), the writes (zxid) and the watch events delivered (each server's trace of
its deliveries), per event of all groups while the stories play, and while every group idles. The
observer sessions of the harness (one per group) are left out of the counts.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.groups import MEETING_POINTS, Counters, GroupConfig, GroupRun
from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper import ConnectionStats, LocalZooKeeper, QuorumPeer

__all__ = ["Ensemble", "Meetings", "render_several", "run_several"]


class Ensemble:
    """Three (``size``) ZooKeeper servers on 127.0.0.1, each tracing the watch events it delivers, seen
    as one for the counts: the union of their connections, the highest zxid, the deliveries of all."""

    def __init__(self, data_dir: Path, size: int = 3, *, max_session_timeout_ms: int = 60_000) -> None:
        peers = [QuorumPeer(i + 1, free_port(), free_port(), free_port()) for i in range(size)]
        self.servers = [LocalZooKeeper(data_dir / f"node{peer.server_id - 1}", peer.client_port,
                                       server_id=peer.server_id, peers=peers, trace_deliveries=True,
                                       max_session_timeout_ms=max_session_timeout_ms) for peer in peers]

    @property
    def hosts(self) -> str:
        return ",".join(server.hosts for server in self.servers)

    def start(self, timeout: float = 60.0) -> None:
        try:
            for server in self.servers:
                server.launch()
            deadline = time.monotonic() + timeout
            for server in self.servers:
                server.wait_ready(max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def connection_stats(self, timeout: float = 2.0) -> dict[int, ConnectionStats]:
        """Every server's client connections; a server that does not answer is left out (``OSError`` only
        when none answers)."""
        found: dict[int, ConnectionStats] = {}
        answered = 0
        for server in self.servers:
            with contextlib.suppress(OSError):
                found.update(server.connection_stats(timeout))
                answered += 1
        if not answered:
            raise OSError("no server of the ensemble answered cons")
        return found

    def zxid(self) -> int:
        return max(server.zxid() for server in self.servers)

    def deliveries_mark(self) -> list[int]:
        """Where each server's deliveries file ends now."""
        return [server.deliveries(0)[1] for server in self.servers]

    def deliveries_since(self, mark: Sequence[int]) -> tuple[dict[int, int], list[int]]:
        """The watch events delivered per session since ``mark`` (over every server), and the next mark."""
        counts: dict[int, int] = {}
        ends = []
        for server, since in zip(self.servers, mark, strict=True):
            told, end = server.deliveries(since)
            ends.append(end)
            for sid, n in told.items():
                counts[sid] = counts.get(sid, 0) + n
        return counts, ends


class Meetings:
    """The groups' meeting points (``MEETING_POINTS``): a barrier for all groups, and at each point, before
    any group goes on, what the ensemble has served so far (each session's requests, the zxid, where the
    deliveries end). ``abort`` breaks the barrier: every group waiting, or arriving later, stops."""

    def __init__(self, groups: int, ensemble: Ensemble, counters: Counters, timeout: float) -> None:
        self._ensemble, self._counters = ensemble, counters
        self._barrier = threading.Barrier(groups, action=self._mark, timeout=timeout)
        self.marks: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def arrive(self, point: str) -> None:
        if point not in MEETING_POINTS:
            raise ValueError(f"no meeting point {point!r}")
        self._barrier.wait()
        if point not in self.marks:
            raise RuntimeError(f"the groups met at {point!r} out of order (marked: {sorted(self.marks)})")

    def abort(self) -> None:
        self._barrier.abort()

    def _mark(self) -> None:
        """Run by the last group to arrive, before any goes on."""
        with self._lock:
            point = MEETING_POINTS[len(self.marks)]
            xids, alive = self._counters.mark()
            self.marks[point] = {"t": time.time(), "xids": xids, "alive": alive, "zxid": self._ensemble.zxid(),
                                 "deliveries": self._ensemble.deliveries_mark()}


def _say(line: str) -> None:
    print(line, flush=True)


def run_several(groups: int, size: int, config: GroupConfig, *, workdir: Path,
                say: Callable[[str], None] = _say, meeting_timeout: float = 3600.0) -> dict[str, Any]:
    """``groups`` groups of ``size`` agents on one three-server ensemble at once: each group's figures and
    verdict (``GroupRun.execute``, under ``"groups"``), and the ensemble's counts (see the module)."""
    ensemble = Ensemble(workdir / "zookeeper")
    say(f"several: starting a 3-server ZooKeeper ensemble for {groups} groups of {size} agents")
    ensemble.start()
    counters = Counters(ensemble)
    results: list[dict[str, Any]] = [{} for _ in range(groups)]
    runs: list[GroupRun] = []
    began = time.monotonic()
    load_before = os.getloadavg()
    try:
        counters.start()
        meetings = Meetings(groups, ensemble, counters, meeting_timeout)
        for index in range(groups):
            # Each group its own seed: its story's Freezes fall on other VMs than the next group's.
            group_config = replace(config, seed=config.seed + index)
            runs.append(GroupRun(size, group_config, workdir / f"group-{index}", ensemble.servers[0],
                                 lambda line, index=index: say(f"[group {index}] {line}"),  # type: ignore[misc]
                                 hosts=ensemble.hosts, together=meetings))

        def play(index: int) -> None:
            try:
                results[index] = runs[index].execute()
            except BaseException as exc:  # execute reports its own failures; this is one of the harness
                results[index] = {"error": f"{type(exc).__name__}: {exc}"}
                meetings.abort()

        threads = [threading.Thread(target=play, args=(index,), name=f"group-{index}") for index in range(groups)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        marks = meetings.marks
        # While every group idles, the ensemble's deliveries are read for the idle window too.
        observers = {run.nodes.session_id for run in runs if run.nodes is not None} - {None}
        figures = _ensemble_figures(ensemble, marks, observers, sum(int(r.get("events") or 0) for r in results))
    finally:
        counters.stop()
        ensemble.stop()
    return {"groups": groups, "size": size, "servers": len(ensemble.servers), "runs": results, **figures,
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "wall_seconds": time.monotonic() - began}


def _ensemble_figures(ensemble: Ensemble, marks: dict[str, dict[str, Any]], observers: set[int | None],
                      events: int) -> dict[str, Any]:
    """Requests, writes and watch events of the agents' sessions between the meeting points."""
    if not all(point in marks for point in MEETING_POINTS):
        return {"ensemble": None, "met_at": sorted(marks)}

    def requests(start: str, end: str) -> int:
        first, last = marks[start]["xids"], marks[end]["xids"]
        return sum(xid - first.get(sid, 0) for sid, xid in last.items() if sid not in observers)

    def told(start: str, end: str) -> int:
        counts, _ = ensemble.deliveries_since(marks[start]["deliveries"])
        upto, _ = ensemble.deliveries_since(marks[end]["deliveries"])
        return sum(n - upto.get(sid, 0) for sid, n in counts.items() if sid not in observers)

    story_seconds = marks["story over"]["t"] - marks["story"]["t"]
    story_requests = requests("story", "story over")
    return {"ensemble": {
        "events": events,
        "story_seconds": story_seconds,
        "requests_per_event": story_requests / events if events else None,
        "requests_per_second": story_requests / story_seconds if story_seconds > 0 else None,
        "writes_per_event": (marks["story over"]["zxid"] - marks["story"]["zxid"]) / events if events else None,
        "watch_events_per_event": told("story", "story over") / events if events else None,
        "sessions": len([sid for sid in marks["story over"]["alive"] if sid not in observers]),
        "idle_seconds": marks["idle over"]["t"] - marks["idle"]["t"],
        "idle_requests": requests("idle", "idle over"),
        "idle_watch_events": told("idle", "idle over"),
    }}


# -- the document ---------------------------------------------------------------------------------------------


def _cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _stat(stats: dict[str, Any] | None, key: str, digits: int = 0) -> str:
    return _cell((stats or {}).get(key), digits)


_HEAD = ("| group | events | approved early | at NotBefore (names the VM whose agent is down) | violations "
         "| unexplained misses | back in rotation | detection p50 / max (ms) | gate p50 / p99 (ms) "
         "| notice -> Started, early: p50 / max (s) | story (s) | error |\n" + "|---" * 12 + "|")


def render_several(entry: dict[str, Any]) -> str:
    """The section of ``docs/benchmarks.md``: a row per group, the ensemble's counts below."""
    r = entry["result"]
    rows = []
    totals = {"events": 0, "early": 0, "waited": 0, "violations": 0, "unexplained": 0, "back": 0, "vms": 0}
    for index, run in enumerate(r["runs"]):
        oracle = run.get("oracle") or {}
        liveness = (oracle.get("stats") or {}).get("liveness") or {}
        unexplained = liveness.get("misses_unexplained")
        totals["events"] += int(run.get("events") or 0)
        totals["early"] += int(run.get("approved_early") or 0)
        totals["waited"] += int(run.get("waited_for_not_before") or 0)
        totals["violations"] += int(oracle.get("violations") or 0) if oracle else 0
        totals["unexplained"] += int(unexplained or 0)
        totals["back"] += int(run.get("back_in_rotation") or 0)
        totals["vms"] += r["size"]
        rows.append(
            f"| {index} | {_cell(run.get('events'))} | {_cell(run.get('approved_early'))} | "
            f"{_cell(run.get('waited_for_not_before'))} | {_cell(oracle.get('violations') if oracle else None)} | "
            f"{_cell(unexplained)} | {_cell(run.get('back_in_rotation'))}/{r['size']} | "
            f"{_stat(run.get('detection_ms'), 'p50')} / {_stat(run.get('detection_ms'), 'max')} | "
            f"{_stat(run.get('gate_ms'), 'p50')} / {_stat(run.get('gate_ms'), 'p99')} | "
            f"{_stat(run.get('notice_to_started_early_s'), 'p50', 2)} / "
            f"{_stat(run.get('notice_to_started_early_s'), 'max', 2)} | "
            f"{_cell(run.get('story_seconds'))} | {run.get('error') or ''} |")
    e = r.get("ensemble") or {}
    errors = [run.get("error") for run in r["runs"] if run.get("error")]
    return f"""## Several groups on one ensemble, each judged by the chaos oracle

{r['groups']} groups of {r['size']} agent processes (`coordinator run`, one per VM), each group with an IMDS
simulator of its own (its own delivery unit) and its own cluster name, all on one ensemble of
{r['servers']} ZooKeeper servers on this machine (`bench/several.py`). Every group plays the story of the
next section (`bench/groups.py`, `build_story`: a rolling Reboot, Freezes, a Terminate batch, a Preempt, a
VM whose agent is down), each with a seed of its own; the stories start at once, and every group idles
once every story is over. Each group's record is judged by the chaos oracle (S1-S5, L1, L2), its node
history from the ensemble's transaction log.
Measured {entry['date']} with `{entry['command']}` on {entry['machine']}.

{_HEAD}
{chr(10).join(rows)}
| all | {totals['events']} | {totals['early']} | {totals['waited']} | {totals['violations']} | \
{totals['unexplained']} | {totals['back']}/{totals['vms']} | | | | | {len(errors)} failed |

What the ensemble served the agents of every group (each server's `cons` every second, pings not counted;
the writes from the zxid; the watch events from each server's trace of its deliveries; the harness's
observer sessions left out), while the {r['groups']} stories played together
({_cell(e.get('story_seconds'))} s, {_cell(e.get('events'))} events, {_cell(e.get('sessions'))} agent sessions
at the end): {_cell(e.get('requests_per_event'))} requests per event, {_cell(e.get('requests_per_second'))}
requests per second, {_cell(e.get('writes_per_event'), 1)} writes per event and
{_cell(e.get('watch_events_per_event'), 1)} watch events delivered per event. While every group idled
({_cell(e.get('idle_seconds'))} s): {_cell(e.get('idle_requests'))} requests and {_cell(e.get('idle_watch_events'))}
watch events. Load average (1 min) before / after: {_cell((r.get('load_average_before') or [None])[0], 1)} /
{_cell((r.get('load_average_after') or [None])[0], 1)}; the whole run took {_cell(r.get('wall_seconds'))} s.
"""

