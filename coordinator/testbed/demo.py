"""``coordinator demo``: a whole group on this machine, one maintenance event, under load, narrated.

Starts ZooKeeper, the IMDS simulator, one app server per VM behind a real HAProxy (whose health check
of each server is that VM's agent probe), and the three agents. A load generator sends requests
through HAProxy all along. The demo schedules a Freeze on vm0 and vm1 with the full 15 minutes of
notice and prints, every second, each VM's phase and probe, where the traffic went and how many
requests failed, until the Freeze has started early (approved once both VMs drained), ended, and
both VMs serve again. It ends with a verdict read from the simulator's log and the load's outcome.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from coordinator.testbed.cluster import LocalCluster

__all__ = ["LoadGenerator", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where logs and configuration go (default: a new temporary directory)")
    parser.add_argument("--drain-wait", type=float, default=3.0,
                        help="seconds each VM waits after failing its probe (HAProxy checks every 0.5 s)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second sent through HAProxy")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave the cluster running after the scenario (Ctrl-C to stop)")


class LoadGenerator:
    """Sends GET requests at a fixed rate on its own thread; counts who answered and what failed."""

    def __init__(self, url: str, rate: float) -> None:
        self._url = url
        self._interval = 1.0 / rate
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._window: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def take_window(self) -> Counter[str]:
        """What happened since the last call: answers per server, and ``error`` for failures."""
        with self._lock:
            window, self._window = self._window, Counter()
        return window

    def _run(self) -> None:
        with httpx.Client(timeout=3.0, trust_env=False) as client:
            while not self._stop.wait(self._interval):
                try:
                    response = client.get(self._url)
                    ok = response.status_code == 200
                    key = response.headers.get("X-Served-By", "?") if ok else f"http {response.status_code}"
                except httpx.HTTPError as exc:
                    key = f"error {type(exc).__name__}"
                with self._lock:
                    (self.served if not key.startswith(("http ", "error ")) else self.failed)[key] += 1
                    self._window["error" if key.startswith(("http ", "error ")) else key] += 1


def _line(cluster: LocalCluster, started: float, traffic: Counter[str]) -> str:
    statuses = cluster.statuses()
    cells = [f"{vm} {(statuses[vm] or {}).get('phase', '?'):<10} probe {agent.probe()}"
             for vm, agent in cluster.agents.items()]
    assert cluster.sim is not None
    events = cluster.sim.events().get("events", [])
    ev = "; ".join(f"{e['event_type']} {e['status']}" for e in events) or "no event"
    some = next((s for s in statuses.values() if s and s.get("events")), None)
    extra = ""
    if some:
        e = some["events"][0]
        extra = f", acks {','.join(e['acks']) or '-'}"
        if e["approved_by"]:
            extra += f", approved by {e['approved_by']}"
        if e["waiting_for"]:
            extra += f", waiting: {'; '.join(e['waiting_for'])}"
    load = " ".join(f"{vm}={traffic.get(vm, 0)}" for vm in cluster.vms) + f" errors={traffic.get('error', 0)}"
    return f"[{time.monotonic() - started:5.1f}s] {' | '.join(cells)} | IMDS: {ev}{extra} | requests/s: {load}"


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="coordinator-demo-"))
    print(f"demo: working directory {workdir} (agent, simulator, HAProxy and ZooKeeper logs)")
    cluster = LocalCluster(workdir, drain_wait=args.drain_wait, with_haproxy=True)
    cluster.start(on_step=lambda step: print(f"demo: {step}"))
    assert cluster.haproxy is not None and cluster.sim is not None
    load = LoadGenerator(cluster.haproxy.frontend_url, args.rate)
    try:
        cluster.wait(lambda: all(a.probe() == 200 for a in cluster.agents.values()), 30, "every VM serving")
        load.start()
        print(f"demo: sending {args.rate:g} requests/s through HAProxy at {cluster.haproxy.frontend_url}")
        time.sleep(2)  # show a little steady state first
        created = cluster.sim.schedule(event_type="Freeze", resources=["vm0", "vm1"], duration_in_seconds=5)
        event_id = created["event_id"]
        print(f"demo: scheduled Freeze {event_id} on vm0 and vm1 (NotBefore in 15 minutes)")
        started = time.monotonic()
        seen_started = False
        deadline = started + args.timeout
        load.take_window()
        while time.monotonic() < deadline:
            time.sleep(1)
            print(_line(cluster, started, load.take_window()), flush=True)
            events = cluster.sim.events().get("events", [])
            seen_started = seen_started or any(e["status"] == "Started" for e in events)
            if seen_started and not events and all(a.probe() == 200 for a in cluster.agents.values()):
                break
        else:
            print("demo: FAILED: the scenario did not complete in time", file=sys.stderr)
            return 1
        time.sleep(2)  # traffic back on every VM
        print(_line(cluster, started, load.take_window()), flush=True)
        load.stop()
        ok, verdict = _verdict(cluster.sim.log(), event_id, created.get("not_before"), load)
        print(verdict)
        if args.keep_running:
            print("demo: cluster left running; Ctrl-C to stop")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if ok else 1
    finally:
        load.stop()
        cluster.stop()
        print("demo: stopped every process it started")


def _verdict(log: list[dict[str, Any]], event_id: str, not_before: float | None,
             load: LoadGenerator) -> tuple[bool, str]:
    """Judge the run from the simulator's log (one approval, then the start) and the load's outcome."""
    approvals = [e for e in log if e["kind"] == "approval" and event_id in e.get("accepted", [])]
    started = [e for e in log if e["kind"] == "transition" and e.get("event_id") == event_id
               and e.get("to") == "Started"]
    if len(approvals) != 1 or not started or started[0].get("reason") != "approved":
        return False, f"demo: FAILED: expected one approval then an approved start; log: {approvals} {started}"
    failed = sum(load.failed.values())
    served = ", ".join(f"{vm} {n}" for vm, n in sorted(load.served.items()))
    saved = f"{(not_before - started[0]['t']) / 60:.1f} minutes before its NotBefore" if not_before else "early"
    verdict = (
        f"demo: approved once, by {approvals[0]['vm']}, after vm0 and vm1 had drained; the Freeze started "
        f"{saved}.\ndemo: requests answered: {served}; failed: {failed}"
        + (f" ({dict(load.failed)})" if failed else "")
    )
    return failed == 0, ("demo: OK: " if failed == 0 else "demo: FAILED: ") + verdict.removeprefix("demo: ")
