"""The demo's story several times in a row, each run judged as ``make demo`` judges it.

One run is ``coordinator demo``'s maintenance story under the coordinated strategy at the demo's time scale:
the simulator, ZooKeeper, HAProxy, four app servers and their agents, 20 requests/s through HAProxy, a
Freeze of two VMs, a Reboot rolling through the group (each VM's agent restarted as it comes back), a user
Redeploy and a Preempt with 30 s of notice. A run passes when no request failed during an event with time
to drain, and every such event that the policy let start early was approved early
(``coordinator.testbed.demo.verdict``); an event that waited for its NotBefore is listed with what its
approver said held it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator.testbed.demo import DEMO_TIME_SCALE, verdict
from coordinator.testbed.story import StoryConfig, run_story

__all__ = ["bench_demo_runs", "render_demo_runs"]


def bench_demo_runs(runs: int, workdir: Path | None = None) -> dict[str, Any]:
    """Play the demo's story ``runs`` times in a row; one entry per run (a run that timed out says so)."""
    root = workdir or Path(tempfile.mkdtemp(prefix="coordinator-demo-runs-"))
    config = StoryConfig(time_scale=DEMO_TIME_SCALE)
    entries: list[dict[str, Any]] = []
    for n in range(1, runs + 1):
        run_dir = root / f"run{n}"
        run_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            outcome = run_story(run_dir, "coordinated", config)
        except TimeoutError as exc:
            entries.append({"run": n, "ok": False, "error": str(exc)})
            continue
        ok, _ = verdict(outcome, config)
        entries.append({
            "run": n,
            "ok": ok,
            "events": len(outcome.events),
            "approved_early": sum(1 for e in outcome.events if e.start_reason == "approved"),
            "sent": outcome.sent,
            "failed": outcome.failed,
            "story_seconds": round(outcome.story_real_seconds or 0.0, 1),
            "wall_seconds": round(time.monotonic() - started, 1),
            "waited": [f"{e.event_type} {e.event_id}: {e.held_by}"
                       for e in outcome.events if e.start_reason == "not_before"],
        })
        print(f"bench: demo run {n}: {'ok' if ok else 'FAILED'}", flush=True)
    return {"runs": entries, "time_scale": DEMO_TIME_SCALE}


def render_demo_runs(entry: dict[str, Any], stamp: str) -> str:
    """The section of docs/benchmarks.md: one row per run."""
    runs = entry["runs"]
    passed = sum(1 for r in runs if r["ok"])
    rows = []
    for r in runs:
        if "error" in r:
            rows.append(f"| {r['run']} | FAILED: {r['error']} | | | | |")
            continue
        waited = "; ".join(r["waited"]) or "none"
        rows.append(f"| {r['run']} | {'ok' if r['ok'] else 'FAILED'} | {r['approved_early']} of {r['events']} | "
                    f"{r['failed']} of {r['sent']} | {r['story_seconds']:.0f} s | {waited} |")
    table = "\n".join(rows)
    return f"""## The demo, {len(runs)} times in a row

`make demo`'s story (coordinated, notices {entry['time_scale']:g} times faster than real time, each Reboot
restarting its VM's agent, so that leadership moves), judged as the demo judges it: no request failed during
an event with time to drain, and every event the policy let start early approved early. {passed} of
{len(runs)} runs passed. {stamp}

| run | verdict | events approved early | requests failed | story | started at NotBefore (what held it) |
|---|---|---|---|---|---|
{table}
"""
