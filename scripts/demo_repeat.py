#!/usr/bin/env python3
"""``make demo`` several times in a row, each judged as the demo judges it, and one line per run.

Each run starts a fresh group (the simulator, ZooKeeper, HAProxy, four app servers and agents), plays the
demo's maintenance story under the coordinated strategy at the demo's time scale, and stops every process
it started. A run passes when no request failed during an event with time to drain and every such event
that the policy let start early was approved early (``coordinator.testbed.demo.verdict``). Exit 1 if any run
failed. About 50 s a run on 2 cores.

    .venv/bin/python scripts/demo_repeat.py --runs 10 [--workdir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from coordinator.testbed.demo import DEMO_TIME_SCALE, verdict
from coordinator.testbed.story import StoryConfig, run_story


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=None, help="one directory per run under it (kept)")
    args = parser.parse_args(argv)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="coordinator-demo-runs-"))
    config = StoryConfig(time_scale=DEMO_TIME_SCALE)
    failures = 0
    print(f"demo runs: {args.runs}, logs under {root}", flush=True)
    for n in range(1, args.runs + 1):
        workdir = root / f"run{n}"
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            outcome = run_story(workdir, "coordinated", config)
        except TimeoutError as exc:
            failures += 1
            print(f"run {n}: FAILED: {exc}", flush=True)
            continue
        ok, _ = verdict(outcome, config)
        failures += not ok
        early = sum(1 for e in outcome.events if e.start_reason == "approved")
        missed = [f"{e.event_type} ({e.waited_for or 'no agent recorded why'})" for e in outcome.events if e.missed]
        print(f"run {n}: {'ok' if ok else 'FAILED'}: {early} of {len(outcome.events)} events approved early, "
              f"{outcome.failed} of {outcome.sent} requests failed, story {outcome.story_real_seconds or 0:.0f} s"
              f" ({time.monotonic() - started:.0f} s with start-up)"
              + (f"; started at NotBefore: {', '.join(missed)}" if missed else ""), flush=True)
    print(f"demo runs: {args.runs - failures} of {args.runs} passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
