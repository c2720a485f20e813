"""The idle footprint of ``coordinator run``: resident memory, CPU and wake-ups of real agent processes.

A small group (three agent processes by default, one ZooKeeper server, the IMDS simulator, on loopback)
is started with the defaults a VM would run with (poll interval 1 s, ``zookeeper.session_timeout`` the
product's default, ``SESSION_TIMEOUT``; kept with the results, as older results were measured with 30 s),
left until every agent serves and has settled, and then watched over an idle window beside Microsoft's
sample Scheduled Events loop (``bench/ms_sample.py``), started in the same window against vm0's IMDS.
Everything is read from ``/proc``: CPU seconds (utime + stime), context switches summed over the
process's threads (each voluntary one is a thread going to sleep, so a wake-up), VmRSS, RssAnon,
RssFile and the thread count at the end of the window, and the load average along the window (other
work may share the machine). Also measured: the resident memory of interpreters that only import
what ``coordinator run`` imports, and the same with the core dependencies alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from coordinator.config.services import ZooKeeperConfig
from coordinator.testbed.cluster import LocalCluster
from coordinator.testbed.zookeeper import LocalZooKeeper

from .group import wait_for

SESSION_TIMEOUT = float(ZooKeeperConfig.model_fields["session_timeout"].default)  # the product's default
MEASURED_BEFORE = 30.0  # the session timeout of results that do not say theirs (the default until it changed)

__all__ = ["bench_footprint", "import_floors", "proc_sample"]

ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")
_MIB = 1024


def _status(pid: int, task: str | None = None) -> dict[str, str]:
    path = f"/proc/{pid}/task/{task}/status" if task else f"/proc/{pid}/status"
    fields = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _kib(value: str) -> float:
    return int(value.split()[0]) / _MIB


def proc_sample(pid: int) -> dict[str, Any]:
    """CPU seconds, context switches (summed over the threads, and per thread), memory and threads of ``pid``."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / _TICK  # utime, stime (fields 14 and 15)
    status = _status(pid)
    per_thread: dict[str, int] = {}
    involuntary = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = _status(pid, task)
        except FileNotFoundError:  # a thread that just ended
            continue
        per_thread[task] = int(fields["voluntary_ctxt_switches"])
        involuntary += int(fields["nonvoluntary_ctxt_switches"])
    return {
        "cpu_s": cpu,
        "voluntary": sum(per_thread.values()),
        "involuntary": involuntary,
        "per_thread": per_thread,
        "rss_mib": _kib(status["VmRSS"]),
        "rss_anon_mib": _kib(status["RssAnon"]),
        "rss_file_mib": _kib(status["RssFile"]),
        "hwm_mib": _kib(status["VmHWM"]),
        "threads": int(status["Threads"]),
    }


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


_RSS = "import re\nprint(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
_FLOORS = (
    ("python", "pass"),
    ("core dependencies", "import httpx, kazoo.client, prometheus_client, yaml\nfrom pydantic import BaseModel\n"
                          "class M(BaseModel):\n    x: int"),  # pydantic's cost shows with the first model
    # What `coordinator run` has imported when it reads its configuration and starts the agent.
    ("`coordinator run`'s imports", "import sys\nsys.argv = ['coordinator', 'run', '--config', 'x']\n"
                                    "from coordinator.cli import build_parser\nbuild_parser().parse_args()\n"
                                    "import coordinator.config, coordinator.logsetup, coordinator.runtime"),
)


def import_floors() -> dict[str, float]:
    """Resident memory (MiB) of interpreters that only import: bare, the core dependencies, the agent's path."""
    floors = {}
    for name, imports in _FLOORS:
        out = subprocess.run([sys.executable, "-c", f"{imports}\n{_RSS}"], capture_output=True, text=True,
                             check=True, cwd=ROOT)
        floors[name] = int(out.stdout.strip()) / _MIB
    return floors


# One interpreter importing these in turn; each step's VmRSS growth is what it adds to the ones above.
_STAGES = (
    ("the standard library the agent uses (logging, threading, json, socket, argparse)",
     "import logging, threading, json, socket, argparse"),
    ("pydantic_core (the compiled validator library)", "import pydantic_core"),
    ("pydantic, and its first model (it loads importlib.metadata for plugins and hashlib's OpenSSL)",
     "from pydantic import BaseModel\nclass M(BaseModel):\n    x: int"),
    ("PyYAML", "import yaml"),
    ("httpx (with ssl)", "import httpx"),
    ("kazoo", "import kazoo.client"),
    ("prometheus_client", "import prometheus_client"),
    ("the IMDS document's models", "import coordinator.models"),
    ("the configuration's models", "import coordinator.config"),
    ("the rest of `coordinator run` (decide, the agent, the store, HTTP, metrics)",
     "import coordinator.cli, coordinator.logsetup, coordinator.runtime, coordinator.support.memory"),
)


def import_stages() -> list[tuple[str, float]]:
    """VmRSS (MiB) of one interpreter after each step of ``_STAGES``, starting from a bare one."""
    code = ["import re", "def rss():", "    s = open('/proc/self/status').read()",
            "    return int(re.search(r'VmRSS:\\s+(\\d+)', s).group(1))", "print(rss())"]
    for _, step in _STAGES:
        code += [step, "print(rss())"]
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, check=True, cwd=ROOT)
    values = [int(x) / _MIB for x in out.stdout.split()]
    return [("python", values[0]), *((name, value) for (name, _), value in zip(_STAGES, values[1:], strict=True))]


def bench_footprint(zk: LocalZooKeeper, *, idle_seconds: float, agents: int = 3, settle_seconds: float = 20.0,
                    progress: Any = print) -> dict[str, Any]:
    vms = [f"vm{i}" for i in range(agents)]
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-fp-") as tmp:
        cluster = LocalCluster(Path(tmp), vms, cluster=f"f{uuid.uuid4().hex[:8]}", zk_hosts=zk.hosts,
                               poll_interval=1.0, session_timeout=SESSION_TIMEOUT, drain_wait=0.2)
        sample: subprocess.Popen[bytes] | None = None
        try:
            cluster.start()
            wait_for(lambda: all(a.probe() == 200 and (a.status() or {}).get("phase") == "serving"
                                 for a in cluster.agents.values()), 60, "every VM serving")
            sample = subprocess.Popen([sys.executable, str(ROOT / "bench" / "ms_sample.py"), cluster.imds_urls["vm0"]],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            progress(f"bench: footprint: {agents} agents serving; settling {settle_seconds:.0f} s, then idle for "
                     f"{idle_seconds:.0f} s beside Microsoft's sample loop")
            time.sleep(settle_seconds)  # past the sample's imports and the agents' first quiet cycles
            pids = {vm: a.pid for vm, a in cluster.agents.items() if a.pid is not None}
            pids["sample loop"] = sample.pid
            before = {name: proc_sample(pid) for name, pid in pids.items()}
            loads = [_loadavg()]
            began = time.monotonic()
            while (left := idle_seconds - (time.monotonic() - began)) > 0:
                time.sleep(min(10.0, left))
                loads.append(_loadavg())
            seconds = time.monotonic() - began
            after = {name: proc_sample(pid) for name, pid in pids.items()}
            # The agents stayed idle: every one still serving, no event in any document.
            serving = all(a.probe() == 200 and (a.status() or {}).get("phase") == "serving"
                          for a in cluster.agents.values())
        finally:
            if sample is not None:
                sample.terminate()
                sample.wait(10)
            cluster.stop()
    processes = {}
    for name in pids:
        b, a = before[name], after[name]
        threads = sorted(((a["per_thread"][t] - b["per_thread"].get(t, 0)) / seconds for t in a["per_thread"]),
                         reverse=True)
        processes[name] = {
            "cpu_s_per_hour": (a["cpu_s"] - b["cpu_s"]) * 3600 / seconds,
            "wakeups_per_s": (a["voluntary"] - b["voluntary"]) / seconds,
            "involuntary_per_s": (a["involuntary"] - b["involuntary"]) / seconds,
            "wakeups_per_s_by_thread": [round(x, 2) for x in threads],
            **{k: a[k] for k in ("rss_mib", "rss_anon_mib", "rss_file_mib", "hwm_mib", "threads")},
        }
    return {"agents": agents, "session_timeout": SESSION_TIMEOUT, "idle_seconds": seconds,
            "settle_seconds": settle_seconds, "still_serving": serving, "loadavg": loads, "processes": processes,
            "floors": import_floors(), "import_stages": import_stages()}


def session_words(measured: float) -> str:
    """``zookeeper.session_timeout`` as a measurement was taken with, and whether that is the default now."""
    if measured == SESSION_TIMEOUT:
        return f"`zookeeper.session_timeout` {measured:g} s (the default)"
    return f"`zookeeper.session_timeout` {measured:g} s (the default when measured; {SESSION_TIMEOUT:g} s now)"


def render_footprint(entry: dict[str, Any], stamp: str) -> str:
    procs = dict(entry["processes"])
    ref = procs.pop("sample loop")
    busiest = max(procs.values(), key=lambda p: p["cpu_s_per_hour"])
    ratio = busiest["cpu_s_per_hour"] / ref["cpu_s_per_hour"] if ref["cpu_s_per_hour"] else float("nan")
    worst_rss = max(p["rss_mib"] for p in procs.values())
    rows = []
    for name, p in [*sorted(procs.items()), ("sample loop", ref)]:
        rows.append(f"| {name} | {p['rss_mib']:.1f} | {p['rss_anon_mib']:.1f} | {p['rss_file_mib']:.1f} | "
                    f"{p['threads']} | {p['cpu_s_per_hour']:.1f} | {p['wakeups_per_s']:.1f} | "
                    f"{', '.join(f'{x:.1f}' for x in p['wakeups_per_s_by_thread'] if x >= 0.05) or '-'} |")
    loads = entry["loadavg"]
    busy = max(loads) >= 1.0
    load_note = (f"The 1-minute load average ran from {min(loads):.2f} to {max(loads):.2f} during the window "
                 f"(2 cores{'; other work shared the machine, CPU figures are noisy' if busy else ''}).")
    floors = entry["floors"]
    return f"""## The idle footprint of `coordinator run`

{entry['agents']} agent processes (`coordinator run`, poll interval 1 s,
{session_words(float(entry.get('session_timeout', MEASURED_BEFORE)))}, no action but the probe), one
ZooKeeper server and the IMDS simulator on loopback; once every agent served, a settling time of
{entry['settle_seconds']:.0f} s, then an idle window of {entry['idle_seconds']:.0f} s with Microsoft's
sample loop (`bench/ms_sample.py`, against vm0's IMDS) running beside them. Read from `/proc`:
CPU (utime + stime) over the window, voluntary context switches summed over the threads (a thread going to
sleep: one wake-up each) over the window, memory and threads at its end. {stamp} {load_note}

| process | VmRSS (MiB) | RssAnon | RssFile | threads | CPU s per hour | wake-ups/s | wake-ups/s by thread |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

| measure | result | target |
|---|---|---|
| resident memory, largest agent (VmRSS, MiB) | {worst_rss:.1f} | under 40: {"met" if worst_rss < 40 else "not met"} |
| idle CPU, busiest agent / sample loop | {ratio:.2f} | at most 1: {"met" if ratio <= 1 else "not met"} |
| resident memory of an interpreter that only imports (MiB): {', '.join(floors)} | \
{', '.join(f'{v:.1f}' for v in floors.values())} | |
{_render_stages(entry, worst_rss)}"""


def _render_stages(entry: dict[str, Any], worst_rss: float) -> str:
    stages = entry.get("import_stages")
    if not stages:
        return ""
    rows, before = [], 0.0
    for name, value in stages:
        rows.append(f"| {name} | {value:.1f} | {'' if not before else f'+{value - before:.1f}'} |")
        before = value
    floor = entry["floors"]["`coordinator run`'s imports"]
    values = dict(stages)
    names = [name for name, _ in stages]
    pydantic = values[names[3]] - values[names[1]]  # pydantic_core, pydantic and its first model
    others = sum(values[names[i]] - values[names[i - 1]] for i in (4, 5, 7))  # PyYAML, httpx, prometheus_client
    threads = max(p["threads"] for p in entry["processes"].values())
    return f"""
Where the resident memory goes: one interpreter importing, in turn, what `coordinator run` imports (the
same run; a step's growth is what it adds on top of the steps above it, shared libraries included):

| import | VmRSS (MiB) | added |
|---|---|---|
{chr(10).join(rows)}

A running agent holds {worst_rss - floor:+.1f} MiB over an interpreter that only imports what it imports
({floor:.1f} MiB): its {threads} threads' stacks, its connections and buffers, its readings and view. The
imports alone are over 40 MiB, so no setting brings the agent under it: that would take pydantic out of
the run path (its compiled core, its own modules and its first model add {pydantic:.1f} MiB; the
configuration and the IMDS document would be validated without it), or PyYAML, httpx and
prometheus_client together ({others:.1f} MiB) and more.
"""
