"""``coordinator demo``: a whole group on this machine, one maintenance event, narrated.

Starts ZooKeeper, the IMDS simulator and three agents, schedules a Freeze on vm0 and vm1 with the
full 15 minutes of notice, and shows every second what each VM's health probe answers and what the
cluster has recorded, until the event has started early (approved once both VMs drained), ended,
and both VMs are back. Ends by checking, from the simulator's log, that the approval came after
both acknowledgements.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator.localcluster import LocalCluster

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where logs and configuration go (default: a new temporary directory)")
    parser.add_argument("--drain-wait", type=float, default=3.0, help="seconds each VM waits after failing its probe")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave the cluster running after the scenario (Ctrl-C to stop)")


def _line(cluster: LocalCluster, started: float) -> str:
    cells = []
    for vm, agent in cluster.agents.items():
        st = agent.status() or {}
        code = agent.probe()
        cells.append(f"{vm}:{st.get('phase', '?'):<10} probe={code}")
    assert cluster.sim is not None
    events = cluster.sim.events().get("events", [])
    ev = "; ".join(f"{e['event_type']} {e['status']}" for e in events) or "no event"
    some = next((s for s in cluster.statuses().values() if s and s.get("events")), None)
    extra = ""
    if some:
        e = some["events"][0]
        extra = f" acks={e['acks']} approved_by={e['approved_by']}"
        if e["waiting_for"]:
            extra += f" waiting: {'; '.join(e['waiting_for'])}"
    return f"[{time.monotonic() - started:5.1f}s] {' | '.join(cells)} | IMDS: {ev}{extra}"


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="coordinator-demo-"))
    print(f"demo: working directory {workdir} (agent logs, simulator log, ZooKeeper data)")
    cluster = LocalCluster(workdir, drain_wait=args.drain_wait)
    cluster.start(on_step=lambda step: print(f"demo: {step}"))
    try:
        assert cluster.sim is not None
        created = cluster.sim.schedule(event_type="Freeze", resources=["vm0", "vm1"], duration_in_seconds=5)
        event_id = created["event_id"]
        print(f"demo: scheduled Freeze {event_id} on vm0, vm1 (NotBefore in 15 min)")
        started = time.monotonic()
        seen_started = False
        deadline = started + args.timeout
        while time.monotonic() < deadline:
            print(_line(cluster, started), flush=True)
            events = cluster.sim.events().get("events", [])
            seen_started = seen_started or any(e["status"] == "Started" for e in events)
            back = all(a.probe() == 200 for a in cluster.agents.values())
            if seen_started and not events and back:
                break
            time.sleep(1)
        else:
            print("demo: FAILED: the scenario did not complete in time", file=sys.stderr)
            return 1
        verdict = _verdict(cluster.sim.log(), event_id, created.get("not_before"))
        print(verdict[1])
        if args.keep_running:
            print("demo: cluster left running; Ctrl-C to stop")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if verdict[0] else 1
    finally:
        cluster.stop()
        print("demo: stopped every process it started")


def _verdict(log: list[dict[str, Any]], event_id: str, not_before: float | None) -> tuple[bool, str]:
    """Judge the run from the simulator's log alone: one approval, then the start."""
    approvals = [e for e in log if e["kind"] == "approval" and event_id in e.get("accepted", [])]
    started = [e for e in log if e["kind"] == "transition" and e.get("event_id") == event_id
               and e.get("to") == "Started"]
    if len(approvals) != 1 or not started or started[0].get("reason") != "approved":
        return False, f"demo: FAILED: expected one approval then an approved start; log: {approvals} {started}"
    saved = f"{(not_before - started[0]['t']) / 60:.1f} minutes before its NotBefore" if not_before else "early"
    return True, (
        f"demo: OK: approved once, by {approvals[0]['vm']}, after vm0 and vm1 had drained; the Freeze "
        f"started {saved}, vm2 kept serving, and vm0 and vm1 are serving again"
    )
