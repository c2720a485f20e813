"""End-to-end measurements on real processes: a group of agents, the IMDS simulator and ZooKeeper.

Every number is taken outside the agents: acknowledgement times are ZooKeeper's ``ctime`` of the ack
nodes, approvals and IMDS requests are the simulator's log, ZooKeeper's requests and writes are the
server's own statistics (``cons`` per connection, ``srvr``'s zxid), CPU and memory are ``/proc``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.waiting import wait_until
from coordinator.testbed.zookeeper import LocalZooKeeper

__all__ = ["GroupResult", "bench_group", "gate_hops", "percentiles", "wait_for"]

ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0, "p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "max": float("nan")}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1]}


@dataclass
class GroupResult:
    events: int = 0
    gate_ms: list[float] = field(default_factory=list)  # last ack's ctime -> the approval POST
    # The gate in hops (ms), from the approver's JSON log lines and the simulator's log: see ``gate_hops``.
    gate_hops_ms: dict[str, list[float]] = field(default_factory=dict)
    schedule_to_start_s: list[float] = field(default_factory=list)
    event_resources: int = 2
    zk_writes_per_event: float = 0.0
    imds_max_per_window: dict[str, int] = field(default_factory=dict)  # requests in any 1 s window, per VM
    imds_rate: dict[str, float] = field(default_factory=dict)  # mean requests per second, per VM
    imds_posts: int = 0
    zk_requests_per_agent_per_event: dict[str, float] = field(default_factory=dict)  # `cons` lcxid advance
    storm_seconds: float = 0.0
    storm_reads: dict[str, int] = field(default_factory=dict)  # IMDS requests per VM during the storm
    storm_min_gap_s: dict[str, float] = field(default_factory=dict)  # closest two requests of a VM
    storm_watch_events: int = 0
    idle_seconds: float = 0.0
    idle_zk_requests: dict[str, int] = field(default_factory=dict)  # per agent session, over the idle window
    idle_cpu_s_per_hour: dict[str, float] = field(default_factory=dict)  # agents and the reference loop
    idle_rss_mib: dict[str, float] = field(default_factory=dict)
    rss_floor_mib: dict[str, float] = field(default_factory=dict)  # an interpreter that only imports
    notes: list[str] = field(default_factory=list)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _requests_by_session(zk: LocalZooKeeper) -> dict[int, int]:
    """ZooKeeper's count of requests per session: the last client xid (pings do not advance it)."""
    return {sid: stats.lcxid for sid, stats in zk.connection_stats().items()}


def _max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def _imds_requests(log: list[dict[str, Any]], since_t: float, until_t: float) -> dict[str, list[float]]:
    by_vm: dict[str, list[float]] = defaultdict(list)
    for entry in log:
        if entry["kind"] == "request" and since_t <= entry["t"] <= until_t and "scheduledevents" in entry["path"]:
            by_vm[entry["vm"]].append(entry["t"])
    return by_vm


def bench_group(zk: LocalZooKeeper, *, events: int, idle_seconds: float, storm_seconds: float = 10.0,
                progress: Any = print) -> GroupResult:
    result = GroupResult()
    vms = ("vm0", "vm1", "vm2")
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-") as tmp:
        cluster = LocalCluster(Path(tmp), vms, cluster=f"b{uuid.uuid4().hex[:8]}", zk_hosts=zk.hosts,
                               drain_wait=0.2, poll_interval=1.0, started_for=0.3, session_timeout=10.0,
                               extra_config={"drain": {"return_wait_seconds": 0.5, "gone_after_seconds": 1.0},
                                             "logging": {"format": "json"}})
        cluster.start()
        observer = KazooClient(hosts=f"{zk.hosts}/azure-maintenance/{cluster.cluster}")
        observer.start(timeout=10)
        sample: subprocess.Popen[bytes] | None = None
        try:
            assert cluster.sim is not None
            sim = cluster.sim
            _wait_serving(cluster)
            gated: list[tuple[str, float, float]] = []  # (event id, last ack's ctime, POST in the simulator's log)
            began_t, zxid0 = time.time(), zk.zxid()
            sessions_before = _requests_by_session(zk)
            observer_sid = observer.client_id[0] if observer.client_id else None
            for i in range(events):
                pair = [vms[i % 3], vms[(i + 1) % 3]]
                scheduled = time.time()
                eid = sim.schedule("Freeze", pair)["event_id"]
                acks = _await_approval(observer, sim, eid, pair)
                log = sim.log(kind="approval")
                post = next(e["t"] for e in log if eid in e.get("event_ids", ()) and e.get("status") == 200)
                result.gate_ms.append((post - max(acks.values())) * 1e3)
                gated.append((eid, max(acks.values()), post))
                wait_for(lambda eid=eid: sim.event(eid) is None, 60, "the event to end")  # type: ignore[misc]
                start = next(e["t"] for e in sim.log(kind="transition")
                             if e["event_id"] == eid and e["to"] == "Started")
                result.schedule_to_start_s.append(start - scheduled)
                _wait_serving(cluster)
                if (i + 1) % 20 == 0:
                    gate = percentiles(result.gate_ms)
                    progress(f"bench: {i + 1}/{events} events, gate p50 {gate['p50']:.1f} ms p99 {gate['p99']:.1f} ms")
            ended_t = time.time()
            result.events = events
            result.zk_writes_per_event = (zk.zxid() - zxid0) / max(events, 1)
            sessions_after = _requests_by_session(zk)
            result.zk_requests_per_agent_per_event = {
                f"0x{sid:x}": (sessions_after[sid] - sessions_before[sid]) / max(events, 1)
                for sid in sessions_after if sid in sessions_before and sid != observer_sid}
            requests = sim.log(kind="request")
            result.gate_hops_ms = gate_hops(gated, {vm: a.log_path for vm, a in cluster.agents.items()}, requests)
            by_vm = _imds_requests(requests, began_t, ended_t)
            for vm in vms:
                times = sorted(by_vm.get(vm, []))
                result.imds_max_per_window[vm] = _max_in_window(times)
                result.imds_rate[vm] = len(times) / (ended_t - began_t)
            result.imds_posts = sum(1 for e in requests if e["kind"] == "request" and e["method"] == "POST"
                                    and began_t <= e["t"] <= ended_t)

            # A watch storm: another client changes watched nodes 50 times a second.
            progress(f"bench: watch storm for {storm_seconds:.0f} s")
            storm_began = time.time()
            path = "/absent/storm"
            while time.time() - storm_began < storm_seconds:
                observer.create(path, b'{"vm": "storm", "since": 0}')
                observer.delete(path)
                result.storm_watch_events += 2
                time.sleep(0.04)
            storm_ended = time.time()
            time.sleep(1.5)
            by_vm = _imds_requests(sim.log(kind="request"), storm_began, storm_ended)
            result.storm_seconds = storm_ended - storm_began
            result.storm_reads = {vm: len(by_vm.get(vm, [])) for vm in vms}
            result.storm_min_gap_s = {vm: min((b - a for a, b in itertools.pairwise(sorted(by_vm.get(vm, [])))),
                                              default=float("nan")) for vm in vms}

            # Idle: no event; the agents against Microsoft's sample loop polling vm0's IMDS in the same window.
            progress(f"bench: idle for {idle_seconds:.0f} s, beside Microsoft's sample loop")
            sample = subprocess.Popen([sys.executable, str(ROOT / "bench" / "ms_sample.py"), cluster.imds_urls["vm0"]],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(3)  # past its imports
            pids = {vm: a.pid for vm, a in cluster.agents.items() if a.pid is not None}
            pids["reference"] = sample.pid
            cpu0 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            sessions0 = _requests_by_session(zk)
            time.sleep(idle_seconds)
            sessions1 = _requests_by_session(zk)
            cpu1 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            result.idle_seconds = idle_seconds
            result.idle_cpu_s_per_hour = {n: (cpu1[n] - cpu0[n]) * 3600 / idle_seconds for n in pids}
            result.idle_rss_mib = {n: _rss_mib(pid) for n, pid in pids.items()}
            result.idle_zk_requests = {f"0x{sid:x}": sessions1[sid] - sessions0[sid]
                                       for sid in sessions1 if sid in sessions0 and sid != observer_sid}
        finally:
            if sample is not None:
                sample.terminate()
                sample.wait(10)
            observer.stop()
            observer.close()
            cluster.stop()
    result.rss_floor_mib = _rss_floor()
    return result


_HOPS = ("ack -> approver decided", "decided -> fresh IMDS read sent", "read sent -> approval recorded in ZooKeeper",
         "recorded -> POST in the simulator's log")


def gate_hops(gated: Sequence[tuple[str, float, float]], logs: dict[str, Path],
              requests: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Where the gate's time goes, event by event, from the approver's log (JSON lines, millisecond stamps)
    and the simulator's request log: the last ack's ctime -> the approver's first cycle line naming the
    event after it (it holds the approval for a fresh read, or approves) -> its next IMDS GET -> its
    "approval recorded" line (the read, a cycle, the peers probed again, the gate) -> the POST. An event
    approved on a read already fresh enough has no hold: its middle hops are left out."""
    lines: dict[str, list[tuple[float, str]]] = {}
    for vm, path in logs.items():
        entries = []
        for raw in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(raw)
                when = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            entries.append((when, str(entry.get("message", ""))))
        lines[vm] = entries
    hops: dict[str, list[float]] = {name: [] for name in _HOPS}
    for event_id, acked, posted in gated:
        approver = next((vm for vm, entries in lines.items() for _, m in entries
                         if f"event {event_id}: approval recorded by {vm}" in m), None)
        if approver is None:
            continue
        mine = lines[approver]
        recorded = next(t for t, m in mine if f"event {event_id}: approval recorded" in m)
        # Log stamps have millisecond resolution, ack ctimes too: a line may carry the ack's own millisecond.
        decided = next((t for t, m in mine if t >= acked - 0.001 and m.startswith("cycle (") and event_id in m), None)
        held = decided is not None and decided < recorded
        if decided is None:
            continue
        hops[_HOPS[0]].append(max(decided - acked, 0.0) * 1e3)
        read = next((e["t"] for e in requests if e["vm"] == approver and e["method"] == "GET" and e["t"] >= decided),
                    None)
        if held and read is not None and read <= recorded:
            hops[_HOPS[1]].append((read - decided) * 1e3)
            hops[_HOPS[2]].append((recorded - read) * 1e3)
        hops[_HOPS[3]].append(max(posted - recorded, 0.0) * 1e3)
    return hops


def _rss_floor() -> dict[str, float]:
    """Resident memory of interpreters that only import: bare, the four core dependencies, the agent."""
    floors = {}
    core = ("import httpx, kazoo.client, prometheus_client\nfrom pydantic import BaseModel\n"
            "class M(BaseModel):\n    x: int")  # pydantic's cost shows with the first model
    for name, imports in (("python", "pass"), ("core dependencies", core),
                          ("agent modules", "import coordinator.cli, coordinator.runtime")):
        code = f"{imports}\nimport re\nprint(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        floors[name] = int(out.stdout.strip()) / 1024
    return floors


def _await_approval(observer: KazooClient, sim: Any, eid: str, vms: Sequence[str]) -> dict[str, float]:
    """Record each ack's ctime as it appears (acks are withdrawn once the event is over), until the
    simulator has the approval."""
    acks: dict[str, float] = {}
    deadline = time.monotonic() + 60
    since = 0
    while time.monotonic() < deadline:
        entries = sim.log(since=since, kind="approval")
        if entries:
            since = entries[-1]["seq"]
        approved = any(eid in e.get("event_ids", ()) for e in entries)
        for vm in vms:  # after the log: an approval seen means every ack it rested on is there now
            if vm not in acks:
                stat = observer.exists(f"/events/{eid}/acks/{vm}")
                if stat is not None:
                    acks[vm] = stat.ctime / 1000
        if approved:
            if len(acks) != len(vms):
                raise RuntimeError(f"event {eid} approved with acks only from {sorted(acks)}")
            return acks
        time.sleep(0.01)
    raise TimeoutError(f"event {eid} was not approved within 60 s")


def _wait_serving(cluster: LocalCluster) -> None:
    wait_for(lambda: all(a.probe() == 200 and (a.status() or {}).get("phase") == "serving"
                      for a in cluster.agents.values()), 60, "every VM serving")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> None:
    """``wait_until``, raising ``TimeoutError`` naming ``what`` when the time is up."""
    if not wait_until(predicate, timeout, interval=interval):
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
