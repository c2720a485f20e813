"""The ceiling of a three-node ZooKeeper ensemble for the agents' own request mix.

    .venv/bin/python bench/run.py --only ceiling              # as docs/benchmarks.md
    .venv/bin/python bench/zk_ceiling.py --worker SPEC.json   # (internal) one Python process of sessions

A three-node ensemble on loopback (``LocalEnsemble``) holds groups laid out as the product lays them out
(``/members/{vm}`` ephemeral, ``/registry/{vm}``, ``/out/{vm}``, ``/leader``, ``/events/{ID}`` with
``acks/{vm}``, ``admitted`` and ``approval``; see docs/architecture.md). Many sessions (each one VM of one
group) send the agents' mix: mostly reads that set a watch (``getChildren`` of the lists and of an
event's ``acks``, ``getData`` of records, member nodes and ``/leader``, ``exists`` of ``/pause`` and of
the session's own member node), and small writes (an ack created as an ephemeral node and deleted, an
``/out/{vm}`` mark created as a persistent node and deleted, a record's data set). A write fires the
watches of every session of the group that has one armed on what it changes; those notifications are
counted.

The load generator (``generator``):

* ``java`` (the default): ``bench/zkload/ZkLoad.java``, every session in one JVM, ZooKeeper's own Java
  client and its asynchronous API; compiled with ``javac`` at run time against the jars the testbed's
  servers run from (``find_classpath``). About ten times cheaper per request than the Python workers,
  so that the ensemble, not the generator, is what bends.
* ``python``: kazoo sessions spread over a few worker processes (this module's ``--worker``), each
  group's sessions spread over every worker.

Both speak the same protocol (one JSON object a line: ``ready``, then ``start`` from the harness, then
one line per step) and send the same mix on the same layout.

The offered rate is raised in steps, open loop: each generator process sends its share on a fixed
schedule, whether or not earlier requests were answered (up to ``MAX_OUTSTANDING`` per process in
flight; beyond, a request is not sent and counts as such). Per step: requests offered, sent and answered
within the step (the achieved throughput), latency percentiles of the answers (from the request handed to
the client to its completion callback, so the generator's own queueing is in it), how late the schedule
ran, the CPU of every process (each ZooKeeper server's JVM, each generator process, this process) and
``/proc/loadavg``.

The ceiling (``ceiling_of``): the highest offered rate of a step whose p99 stays at or under
``p99_limit_ms`` and whose achieved rate is within ``tolerance`` (5 %) of the offered rate. The ramp
stops after two steps in a row that answer less than 90 % of their offered rate.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import json
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from coordinator.testbed.processes import stop_process  # noqa: E402
from coordinator.testbed.zookeeper import LocalEnsemble, find_classpath, four_letter_word  # noqa: E402

__all__ = ["GENERATORS", "MIX", "ZKLOAD_SOURCE", "Histogram", "bench_ceiling", "ceiling_of", "compile_zkload",
           "mix_ratio", "zkload_command"]

ZK_ROOT = "/ceiling"
EVENTS_PER_GROUP = 4
MAX_OUTSTANDING = 20_000  # requests in flight per worker before the schedule stops sending
# The sessions' timeout: 30 s, the product's default zookeeper.session_timeout when the ceiling was measured
# (20 s since). Pings are not in the load's mix, so the ceiling does not rest on it.
SESSION_TIMEOUT = 30.0
GENERATORS = ("java", "python")
ZKLOAD_SOURCE = ROOT / "bench" / "zkload" / "ZkLoad.java"
# The generator's JVM: a small heap collected by one thread (the servers' choice too), small stacks for its
# two threads per session.
ZKLOAD_JVM_OPTIONS = ("-Xms256m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xss256k")

# The mix, in requests per thousand. Reads with a watch, as the agent's view read sets them, then writes.
MIX: dict[str, int] = {
    "getChildren /members": 90,
    "getChildren /events": 90,
    "getChildren /out": 90,
    "getChildren /events/{id}": 90,
    "getChildren /events/{id}/acks": 150,
    "getData /events/{id}": 200,
    "getData /members/{vm}": 100,
    "getData /leader": 50,
    "exists /pause": 60,
    "exists /members/{me}": 50,
    "create/delete /events/{id}/acks/{me} (ephemeral)": 12,
    "create/delete /out/{me} (persistent)": 8,
    "setData /events/{id}": 10,
}
WRITES = frozenset(k for k in MIX if k.startswith(("create", "setData")))


def mix_ratio(counts: Mapping[str, int]) -> dict[str, float]:
    """The share of reads (with a watch) and of writes in ``counts`` (requests by kind of ``MIX``)."""
    total = sum(counts.values())
    writes = sum(n for k, n in counts.items() if k in WRITES)
    if not total:
        return {"reads": float("nan"), "writes": float("nan")}
    return {"reads": (total - writes) / total, "writes": writes / total}


# -- latency histograms ------------------------------------------------------------------------------------


class Histogram:
    """Latencies in logarithmic buckets (2 % wide), mergeable across processes. Values in ms."""

    RATIO = 1.02
    FLOOR_MS = 0.01

    def __init__(self, buckets: Mapping[int, int] | None = None) -> None:
        self.buckets: dict[int, int] = dict(buckets or {})

    def add(self, ms: float) -> None:
        index = 0 if ms <= self.FLOOR_MS else int(math.log(ms / self.FLOOR_MS) / math.log(self.RATIO)) + 1
        self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: Histogram) -> None:
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def percentile(self, q: float) -> float:
        """The upper bound of the bucket holding the ``q`` quantile (NaN when empty)."""
        total = self.count
        if not total:
            return float("nan")
        rank = max(1, math.ceil(q * total))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return self.FLOOR_MS * self.RATIO ** index
        raise AssertionError("unreachable")

    def to_json(self) -> dict[str, int]:
        return {str(k): v for k, v in self.buckets.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, int]) -> Histogram:
        return cls({int(k): v for k, v in data.items()})


def ceiling_of(steps: Sequence[Mapping[str, Any]], *, p99_limit_ms: float, tolerance: float = 0.05) -> float | None:
    """The highest ``offered`` rate of the steps whose ``p99_ms`` is at most ``p99_limit_ms`` and whose
    ``achieved`` rate is at least ``(1 - tolerance)`` of ``offered``; None when no step qualifies."""
    good = [s["offered"] for s in steps if passes(s, p99_limit_ms=p99_limit_ms, tolerance=tolerance)]
    return max(good) if good else None


def passes(step: Mapping[str, Any], *, p99_limit_ms: float, tolerance: float = 0.05) -> bool:
    return bool(step["p99_ms"] <= p99_limit_ms and step["achieved"] >= (1 - tolerance) * step["offered"])


# -- the layout ---------------------------------------------------------------------------------------------


def group_path(group: int, root: str = ZK_ROOT) -> str:
    return f"{root}/g{group}"


def event_id(group: int, k: int) -> str:
    return f"{group:04X}{k:04X}-0000-4000-8000-000000000000"


def _record(eid: str, vms: Sequence[str], at: float) -> bytes:
    return json.dumps({"event_id": eid, "event_type": "Freeze", "resources": list(vms), "not_before": None,
                       "first_seen_by": vms[0], "first_seen_at": at, "done_at": None}).encode()


def create_layout(client: KazooClient, groups: int, size: int, root: str = ZK_ROOT) -> None:
    """The persistent nodes of ``groups`` groups of ``size`` VMs under ``root`` (members are created by the
    sessions)."""
    now = time.time()
    for g in range(groups):
        base = group_path(g, root)
        for sub in ("members", "registry", "absent", "out", "events"):
            client.create(f"{base}/{sub}", makepath=True)
        client.create(f"{base}/leader", json.dumps({"vm": "vm0", "since": now}).encode())
        for i in range(size):
            client.create(f"{base}/registry/vm{i}", json.dumps({"since": now}).encode())
        for k in range(EVENTS_PER_GROUP):
            eid = event_id(g, k)
            vms = [f"vm{(2 * k) % size}", f"vm{(2 * k + 1) % size}"]
            client.create(f"{base}/events/{eid}", _record(eid, vms, now))
            client.create(f"{base}/events/{eid}/acks")
            client.create(f"{base}/events/{eid}/admitted", json.dumps({"by": "vm0", "at": now}).encode())
            if k % 2:
                client.create(f"{base}/events/{eid}/approval",
                              json.dumps({"by": "vm0", "at": now, "as_leader": True}).encode())


# -- a worker: many sessions in one process --------------------------------------------------------------


@dataclass
class _Window:
    """What one step's window saw. Written by the completion thread (answers) and the scheduler."""

    hist: Histogram = field(default_factory=Histogram)
    write_hist: Histogram = field(default_factory=Histogram)  # the writes' answers alone
    answered: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    not_sent: int = 0
    late_ms_max: float = 0.0


class _Session:
    def __init__(self, worker: _Worker, client: KazooClient, group: int, vm: str, size: int) -> None:
        self.worker, self.client, self.group, self.vm, self.size = worker, client, group, vm, size
        self.base = group_path(group, worker.spec.get("root", ZK_ROOT))
        self.ack: str | None = None  # the ack this session holds (or is creating)
        self.out = False
        self.busy = False  # a write of this session is in flight

    def watch(self, event: WatchedEvent) -> None:
        self.worker.watch_events += 1

    def write_done(self, result: IAsyncResult[Any]) -> None:
        self.busy = False


class _Worker:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.rng = random.Random(spec["seed"])
        self.handler = SequentialThreadingHandler()  # one completion thread for every session here
        self.sessions: list[_Session] = []
        self.window = _Window()
        self.watch_events = 0  # the watch callbacks run on one thread of the shared handler
        self.sent_total = 0  # by the scheduler thread only
        self.answered_total = 0  # by the completion thread only
        self.stop = threading.Event()
        names = list(MIX)
        self.kinds = names
        self.cumulative: list[int] = []
        total = 0
        for name in names:
            total += MIX[name]
            self.cumulative.append(total)

    def connect(self) -> None:
        for entry in self.spec["sessions"]:
            client = KazooClient(hosts=self.spec["hosts"], timeout=SESSION_TIMEOUT, handler=self.handler)
            client.start(timeout=30)
            session = _Session(self, client, entry["group"], entry["vm"], self.spec["size"])
            client.create(f"{session.base}/members/{session.vm}", json.dumps(
                {"vm": session.vm, "session": client.client_id[0] if client.client_id else 0,
                 "since": time.time()}).encode(), ephemeral=True)
            self.sessions.append(session)

    def close(self) -> None:
        for session in self.sessions:
            try:
                session.client.stop()
                session.client.close()
            except Exception:  # closing is best effort, the process ends next
                pass

    @property
    def outstanding(self) -> int:
        return self.sent_total - self.answered_total

    def _done(self, sent_at: float, write: bool) -> Callable[[IAsyncResult[Any]], None]:
        def callback(result: IAsyncResult[Any]) -> None:
            ms = (time.perf_counter() - sent_at) * 1e3
            self.answered_total += 1
            current = self.window
            current.answered += 1
            current.hist.add(ms)
            if write:
                current.write_hist.add(ms)
            exc = result.exception
            if exc is not None:
                name = type(exc).__name__
                current.errors[name] = current.errors.get(name, 0) + 1
        return callback

    def _send(self, window: _Window) -> None:
        kind = self.kinds[bisect.bisect_right(self.cumulative, self.rng.randrange(self.cumulative[-1]))]
        sent_at = time.perf_counter()
        s = self.sessions[self.rng.randrange(len(self.sessions))]
        c, base, w = s.client, s.base, s.watch
        eid = event_id(s.group, self.rng.randrange(EVENTS_PER_GROUP))
        result: IAsyncResult[Any]
        if kind in WRITES and s.busy:
            kind = "setData /events/{id}"  # one write of a session's own nodes at a time
        if kind == "getChildren /members":
            result = c.get_children_async(f"{base}/members", watch=w)
        elif kind == "getChildren /events":
            result = c.get_children_async(f"{base}/events", watch=w)
        elif kind == "getChildren /out":
            result = c.get_children_async(f"{base}/out", watch=w)
        elif kind == "getChildren /events/{id}":
            result = c.get_children_async(f"{base}/events/{eid}", watch=w)
        elif kind == "getChildren /events/{id}/acks":
            result = c.get_children_async(f"{base}/events/{eid}/acks", watch=w)
        elif kind == "getData /events/{id}":
            result = c.get_async(f"{base}/events/{eid}", watch=w)
        elif kind == "getData /members/{vm}":
            peer = self.sessions[self.rng.randrange(len(self.sessions))]
            result = c.get_async(f"{peer.base}/members/{peer.vm}", watch=w)
        elif kind == "getData /leader":
            result = c.get_async(f"{base}/leader", watch=w)
        elif kind == "exists /pause":
            result = c.exists_async(f"{base}/pause", watch=w)
        elif kind == "exists /members/{me}":
            result = c.exists_async(f"{base}/members/{s.vm}", watch=w)
        elif kind.startswith("create/delete /events"):
            s.busy = True
            if s.ack is None:
                s.ack = f"{base}/events/{eid}/acks/{s.vm}"
                result = c.create_async(s.ack, json.dumps({"vm": s.vm, "at": time.time()}).encode(), ephemeral=True)
            else:
                result = c.delete_async(s.ack)
                s.ack = None
            result.rawlink(s.write_done)
        elif kind.startswith("create/delete /out"):
            s.busy = True
            path = f"{base}/out/{s.vm}"
            if not s.out:
                result = c.create_async(path, json.dumps({"events": [eid], "at": time.time()}).encode())
            else:
                result = c.delete_async(path)
            s.out = not s.out
            result.rawlink(s.write_done)
        else:
            vms = [f"vm{self.rng.randrange(s.size)}", s.vm]
            result = c.set_async(f"{base}/events/{eid}", _record(eid, vms, time.time()))
        window.sent[kind] = window.sent.get(kind, 0) + 1
        self.sent_total += 1
        result.rawlink(self._done(sent_at, kind in WRITES))

    def run_step(self, rate: float, until: float) -> _Window:
        """Send at ``rate`` requests/s on a fixed schedule until ``until`` (perf_counter), then hand back
        the step's window (answers that arrived while it was current)."""
        window = _Window()
        self.window = window
        interval = 1.0 / rate
        due = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            if now >= until:
                break
            if due > now:
                time.sleep(min(due - now, until - now, 0.002))
                continue
            window.late_ms_max = max(window.late_ms_max, (now - due) * 1e3)
            while due <= now and due < until:
                if self.outstanding >= MAX_OUTSTANDING:
                    window.not_sent += 1
                else:
                    self._send(window)
                due += interval
        return window


def _stdin_lines(stream: IO[str]) -> Iterator[str]:
    for line in stream:
        yield line.strip()


def _worker(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    worker = _Worker(spec)
    # The generator's own pauses would show as the ensemble's latency: hand the GIL over more often than
    # every 5 ms (about 150 threads share it here), and keep the collector from walking every session's
    # objects (frozen once connected) in the middle of a step.
    sys.setswitchinterval(spec.get("switch_interval", 0.001))
    gc.set_threshold(50_000, 50, 1000)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    try:
        worker.connect()
        gc.collect()
        gc.freeze()
        print(json.dumps({"ready": len(worker.sessions)}), flush=True)
        lines = _stdin_lines(sys.stdin)
        start = json.loads(next(lines))["start"]  # wall clock

        def control() -> None:  # "stop", or the parent gone (end of input), ends the ramp
            for line in lines:
                if line == "stop":
                    break
            worker.stop.set()
        threading.Thread(target=control, name="control", daemon=True).start()
        begin = time.perf_counter() + max(0.0, start - time.time())
        steps = [(spec["warmup_rate"], spec["warmup_seconds"])] + [(r, spec["step_seconds"]) for r in spec["rates"]]
        while time.perf_counter() < begin and not worker.stop.is_set():
            time.sleep(0.01)
        at = begin
        for index, (rate, seconds) in enumerate(steps):
            if worker.stop.is_set():
                break
            at += seconds
            window = worker.run_step(rate * spec["share"], at)
            watch_events, worker.watch_events = worker.watch_events, 0
            if worker.stop.is_set() and time.perf_counter() < at - 0.5:
                break  # a step cut short is not reported
            print(json.dumps({"step": index - 1, "sent": window.sent, "not_sent": window.not_sent,
                              "answered": window.answered, "errors": window.errors, "hist": window.hist.to_json(),
                              "write_hist": window.write_hist.to_json(),
                              "late_ms_max": window.late_ms_max, "watch_events": watch_events,
                              "outstanding": worker.outstanding}), flush=True)
    finally:
        worker.close()
    print(json.dumps({"closed": True}), flush=True)
    return 0


# -- the Java generator -----------------------------------------------------------------------------------


def compile_zkload(dest: Path, *, javac: str = "javac", source: Path = ZKLOAD_SOURCE) -> Path:
    """Compile the Java generator into ``dest`` (created) against the testbed's ZooKeeper class path and
    return ``dest``. Raises ``RuntimeError`` when ``javac`` is missing (``scripts/setup.sh`` installs
    ``default-jdk-headless``) or the source does not compile."""
    found = shutil.which(javac)
    if found is None:
        raise RuntimeError(f"no {javac!r} on PATH: the Java generator needs a JDK "
                           "('apt-get install default-jdk-headless'; scripts/setup.sh installs it)")
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([found, "-encoding", "UTF-8", "-nowarn", "-cp", find_classpath(), "-d", str(dest),
                           str(source)], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"javac failed on {source.name}:\n{done.stdout}{done.stderr}")
    return dest


def zkload_command(classes: Path, *, hosts: str, sessions: int, group_size: int, rates: Sequence[float],
                   step_seconds: float, warmup_rate: float, warmup_seconds: float, root: str = ZK_ROOT,
                   seed: int = 0, max_outstanding: int = MAX_OUTSTANDING, mix: Mapping[str, int] = MIX,
                   log_config: Path | None = None, java: str = "java", classpath: str | None = None) -> list[str]:
    """The command line of the Java generator (``bench/zkload/ZkLoad.java``, compiled into ``classes``):
    ``sessions`` sessions, session i being ``vm{i % group_size}`` of group ``i // group_size``, sending
    ``mix`` (requests per thousand, by kind) at the warm-up rate, then at each of ``rates``."""
    cp = os.pathsep.join([str(classes), classpath if classpath is not None else find_classpath()])
    logging_option = [f"-Dlog4j.configuration={log_config.absolute().as_uri()}"] if log_config is not None else []
    command = [java, *ZKLOAD_JVM_OPTIONS, *logging_option, "-cp", cp, "ZkLoad",
               "--hosts", hosts, "--root", root, "--sessions", str(sessions), "--group-size", str(group_size),
               "--events-per-group", str(EVENTS_PER_GROUP), "--seed", str(seed),
               "--max-outstanding", str(max_outstanding), "--warmup-rate", repr(float(warmup_rate)),
               "--warmup-seconds", repr(float(warmup_seconds)), "--step-seconds", repr(float(step_seconds)),
               "--rates", ",".join(repr(float(r)) for r in rates)]
    for kind, weight in mix.items():
        command += ["--kind", f"{weight}:{kind}"]
    return command


_CLIENT_LOG4J = """\
log4j.rootLogger=WARN, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_file}
log4j.appender.FILE.Append=true
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""


def client_log_config(workdir: Path) -> Path:
    """A log4j configuration for the generator's client: warnings and errors to ``generator-client.log``."""
    path = workdir / "generator-log4j.properties"
    path.write_text(_CLIENT_LOG4J.format(log_file=workdir / "generator-client.log"))
    return path


def start_generators(commands: Sequence[Sequence[str]], workdir: Path, *, ready_timeout: float = 120.0,
                     lead: float = 2.0) -> tuple[list[subprocess.Popen[str]], float]:
    """Start one process per command (stderr to ``generator-N.log`` in ``workdir``), wait until each says
    ``ready``, then tell every one to start ``lead`` seconds from now. Returns the processes and that start
    (wall clock). On failure the processes started are stopped and ``RuntimeError`` is raised."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for index, command in enumerate(commands):
            log = open(workdir / f"generator-{index}.log", "ab")  # noqa: SIM115 - owned by the child
            procs.append(subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          text=True, cwd=ROOT))
            log.close()
        for index, proc in enumerate(procs):
            line = _read_line(proc, time.monotonic() + ready_timeout)
            if line is None or "ready" not in line:
                raise RuntimeError(f"a generator process (pid {proc.pid}) did not connect its sessions; see "
                                   f"generator-{index}.log")
        start = time.time() + lead
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"start": start}) + "\n")
            proc.stdin.flush()
    except BaseException:
        for proc in procs:
            stop_process(proc, timeout=20)  # type: ignore[arg-type]
        raise
    return procs, start


def finish_generators(procs: Sequence[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    """Tell every generator process to stop and wait for it to close its sessions and exit; a process
    still there after ``timeout`` is stopped by its PID (SIGTERM, then SIGKILL)."""
    for proc in procs:
        if proc.stdin is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write("stop\n")
            proc.stdin.flush()
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    for proc in procs:
        stop_process(proc, timeout=20)  # type: ignore[arg-type]


# -- the benchmark ----------------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (every process, every core) since boot: /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _mntr(port: int) -> dict[str, str]:
    try:
        text = four_letter_word("127.0.0.1", port, "mntr", timeout=2.0)
    except OSError:
        return {}
    return dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)


def _read_line(proc: subprocess.Popen[str], deadline: float) -> dict[str, Any] | None:
    """The next JSON line of ``proc``'s output, or None at the deadline or at the end of its output."""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        if ready:
            line = proc.stdout.readline()
            if not line:
                return None
            if line.startswith("{"):
                parsed: dict[str, Any] = json.loads(line)
                return parsed
    return None


def bench_ceiling(workdir: Path, *, generator: str = "java", workers: int = 4, sessions: int = 200,
                  group_size: int = 100,
                  rates: Sequence[float] = (500, 1000, 2000, 3000, 4000, 5000, 6000, 8000, 10000, 12000),
                  step_seconds: float = 15.0, warmup_seconds: float = 10.0, p99_limit_ms: float = 50.0,
                  tolerance: float = 0.05, progress: Callable[[str], object] = print) -> dict[str, Any]:
    """Run the ramp (see the module docstring) and return what it measured. ``workers``: the Python
    generator's processes (the Java generator is one process)."""
    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")
    groups = math.ceil(sessions / group_size)
    processes = 1 if generator == "java" else workers
    classes = compile_zkload(workdir / "zkload-classes") if generator == "java" else None
    ensemble = LocalEnsemble(workdir / "zk", 3)
    procs: list[subprocess.Popen[str]] = []
    steps: list[dict[str, Any]] = []
    stopped = ""
    try:
        progress("bench: ceiling: a three-node ensemble")
        ensemble.start(timeout=60)
        admin = KazooClient(hosts=ensemble.hosts, timeout=SESSION_TIMEOUT)
        admin.start(timeout=30)
        try:
            create_layout(admin, groups, group_size)
        finally:
            admin.stop()
            admin.close()
        leader = ensemble.leader_index()
        commands: list[list[str]] = []
        if classes is not None:
            commands.append(zkload_command(classes, hosts=ensemble.hosts, sessions=sessions, group_size=group_size,
                                           rates=rates, step_seconds=step_seconds, warmup_rate=rates[0],
                                           warmup_seconds=warmup_seconds, log_config=client_log_config(workdir)))
            progress(f"bench: ceiling: {sessions} sessions of the Java client in one JVM, groups of {group_size}")
        else:
            plan: list[list[dict[str, Any]]] = [[] for _ in range(workers)]
            for i in range(sessions):
                plan[i % workers].append({"group": i // group_size, "vm": f"vm{i % group_size}"})
            for w, entries in enumerate(plan):
                spec = workdir / f"worker-{w}.json"
                spec.write_text(json.dumps({
                    "hosts": ensemble.hosts, "sessions": entries, "size": group_size, "seed": w,
                    "share": 1 / workers, "rates": list(rates), "step_seconds": step_seconds,
                    "warmup_rate": rates[0], "warmup_seconds": warmup_seconds}))
                commands.append([sys.executable, str(Path(__file__)), "--worker", str(spec)])
            progress(f"bench: ceiling: {sessions} kazoo sessions in {workers} processes, groups of {group_size}")
        procs, start = start_generators(commands, workdir)
        names = ["generator (JVM)"] if classes is not None else [f"worker {w}" for w in range(workers)]
        pids = {**{f"zookeeper {i + 1}{' (leader)' if i == leader else ''}": s.pid for i, s in enumerate(
            ensemble.servers) if s.pid is not None}, **{name: p.pid for name, p in zip(names, procs, strict=True)},
                "harness": os.getpid()}
        progress(f"bench: ceiling: warm-up {warmup_seconds:.0f} s at {rates[0]:.0f}/s, then {len(rates)} steps "
                 f"of {step_seconds:.0f} s")
        boundary = start + warmup_seconds
        time.sleep(max(0.0, boundary - time.time()))
        warm = [_read_line(p, time.monotonic() + step_seconds + 30) for p in procs]
        if any(w is None for w in warm):
            raise RuntimeError("a generator process stopped during the warm-up; see its log")
        short = 0
        for index, rate in enumerate(rates):
            cpu0 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            busy0 = _machine_busy_seconds()
            mntr0 = [_mntr(s.port) for s in ensemble.servers]
            t0 = time.monotonic()
            loads: list[str] = []
            end = boundary + step_seconds
            while time.time() < end - 1:
                time.sleep(min(5.0, max(0.0, end - 1 - time.time())))
                loads.append(Path("/proc/loadavg").read_text().split(" ")[0])
            lines = [_read_line(p, time.monotonic() + step_seconds + 30) for p in procs]
            elapsed = time.monotonic() - t0
            cpu = {name: (_cpu_seconds(pid) - cpu0[name]) / elapsed for name, pid in pids.items()}
            cpu["machine (every process)"] = (_machine_busy_seconds() - busy0) / elapsed
            mntr1 = [_mntr(s.port) for s in ensemble.servers]
            boundary = end
            if any(line is None or "step" not in line for line in lines):
                stopped = f"a generator process stopped during step {index + 1}"
                break
            step = _aggregate(rate, step_seconds, [line for line in lines if line is not None], cpu, loads,
                              mntr0, mntr1, elapsed)
            steps.append(step)
            ok = passes(step, p99_limit_ms=p99_limit_ms, tolerance=tolerance)
            progress(f"bench: ceiling: offered {rate:.0f}/s achieved {step['achieved']:.0f}/s p50 "
                     f"{step['p50_ms']:.1f} ms p99 {step['p99_ms']:.1f} ms cpu "
                     + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()) + f" load {' '.join(loads)}"
                     + ("" if ok else " (misses)"))
            # p99 on a shared machine is noisy; the ramp ends on what cannot be noise: two steps in a row
            # that fall more than 10 % short of the offered rate.
            short = 0 if step["achieved"] >= 0.9 * rate else short + 1
            if short >= 2 and index + 1 < len(rates):
                stopped = f"after step {index + 1}: two steps in a row answered less than 90 % of the offered rate"
                break
        finish_generators(procs)
    finally:
        for proc in procs:
            stop_process(proc, timeout=20)  # type: ignore[arg-type]
        ensemble.stop()
    sent: dict[str, int] = {}
    for step in steps:
        for kind, n in step["sent"].items():
            sent[kind] = sent.get(kind, 0) + n
    return {"ensemble": 3, "generator": generator, "workers": processes, "sessions": sessions,
            "session_timeout": SESSION_TIMEOUT, "group_size": group_size, "groups": groups,
            "events_per_group": EVENTS_PER_GROUP,
            "step_seconds": step_seconds, "warmup_seconds": warmup_seconds, "rates": list(rates),
            "p99_limit_ms": p99_limit_ms, "tolerance": tolerance, "mix": MIX, "mix_sent": sent,
            "mix_ratio": mix_ratio(sent), "steps": steps, "stopped": stopped, "leader": leader,
            "ceiling": ceiling_of(steps, p99_limit_ms=p99_limit_ms, tolerance=tolerance)}


def _aggregate(rate: float, seconds: float, lines: Sequence[Mapping[str, Any]], cpu: Mapping[str, float],
               loads: Sequence[str], mntr0: Sequence[Mapping[str, str]], mntr1: Sequence[Mapping[str, str]],
               elapsed: float) -> dict[str, Any]:
    hist, write_hist = Histogram(), Histogram()
    sent: dict[str, int] = {}
    errors: dict[str, int] = {}
    for line in lines:
        hist.merge(Histogram.from_json(line["hist"]))
        write_hist.merge(Histogram.from_json(line["write_hist"]))
        for kind, n in line["sent"].items():
            sent[kind] = sent.get(kind, 0) + n
        for name, n in line["errors"].items():
            errors[name] = errors.get(name, 0) + n
    answered = sum(line["answered"] for line in lines)
    writes = sum(n for k, n in sent.items() if k in WRITES)
    # One process that sorted its latencies (the Java generator) gives exact percentiles; several give
    # their histograms, merged (each percentile then the upper bound of its 2 % bucket).
    exact = lines[0].get("percentiles") if len(lines) == 1 else None
    percentiles = exact if exact is not None else {
        "p50_ms": hist.percentile(0.5), "p90_ms": hist.percentile(0.9), "p99_ms": hist.percentile(0.99),
        "max_ms": hist.percentile(1.0), "write_p50_ms": write_hist.percentile(0.5),
        "write_p99_ms": write_hist.percentile(0.99)}

    def delta(key: str) -> float:
        return sum(float(b.get(key, "nan")) - float(a.get(key, "nan")) for a, b in zip(mntr0, mntr1, strict=True))
    return {
        "offered": rate, "achieved": answered / seconds, "sent": sent, "writes_sent": writes,
        "not_sent": sum(line["not_sent"] for line in lines), "answered": answered, "errors": errors,
        **{key: float(percentiles[key]) for key in
           ("p50_ms", "p90_ms", "p99_ms", "max_ms", "write_p50_ms", "write_p99_ms")},
        "late_ms_max": max(line["late_ms_max"] for line in lines),
        "outstanding_at_end": sum(line["outstanding"] for line in lines),
        "watch_events_per_s": sum(line["watch_events"] for line in lines) / seconds,
        "server_packets_received_per_s": delta("zk_packets_received") / elapsed,
        "server_packets_sent_per_s": delta("zk_packets_sent") / elapsed,
        "server_update_latency_mean_ms": delta("zk_sum_updatelatency") / max(1.0, delta("zk_cnt_updatelatency")),
        "server_watch_count": sum(float(m.get("zk_watch_count", "nan")) for m in mntr1),
        "cpu_cores": dict(cpu), "loadavg_1min": list(loads),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=Path, help="(internal) run one process of sessions from this spec")
    args = parser.parse_args()
    if args.worker is not None:
        return _worker(args.worker)
    parser.error("run the ramp with: .venv/bin/python bench/run.py --only ceiling")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
