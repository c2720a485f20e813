"""The command line: ``python -m coordinator.testbed.chaos --seed N [--runs K] [--duration S] [--json out.json]``.

``main`` checks that the real components are there (java with ZooKeeper's jars, HAProxy), plays the
runs one seed after the other, keeps the logs of a run that found something, writes every run's plan,
statistics and violations as JSON if asked, and turns SIGTERM into the same clean stop as Ctrl-C. Exit
status: 1 if any run found a violation, 2 if a run could not be carried out, 130 if interrupted, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from coordinator.testbed.chaos.planning import ChaosConfig
from coordinator.testbed.chaos.result import RunResult
from coordinator.testbed.chaos.run import run_chaos

__all__ = ["main"]


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the runs the way Ctrl-C does: through the cleanup of every process."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_prerequisites() -> str | None:
    from coordinator.testbed.zookeeper import find_classpath

    if shutil.which("java") is None:
        return "no 'java' on PATH (apt-get install zookeeper pulls in a Java runtime)"
    try:
        find_classpath()
    except RuntimeError as exc:
        return str(exc)
    if shutil.which("haproxy") is None:
        return "no 'haproxy' on PATH (apt-get install haproxy)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coordinator.testbed.chaos",
                                     description="Seeded chaos on real processes, judged by an independent oracle.")
    parser.add_argument("--seed", type=int, required=True, help="the first run's seed")
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds SEED, SEED+1, ... (default: 1)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of faults per run; a run lasts until every event is gone (default: 30)")
    parser.add_argument("--vms", type=int, default=4, help="VMs, each with an agent (at least 3; default: 4)")
    parser.add_argument("--json", type=Path, help="write every run's plan, statistics and violations here")
    parser.add_argument("--workdir", type=Path, help="keep every run's logs under this directory")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.vms < 3 or args.duration < 10:
        parser.error("--runs must be >= 1, --vms >= 3 and --duration >= 10")
    problem = _check_prerequisites()
    if problem:
        print(f"chaos: cannot run: {problem}", file=sys.stderr)
        return 2
    config = ChaosConfig(vms=tuple(f"vm{i}" for i in range(args.vms)), duration=args.duration)
    results: list[RunResult] = []
    started = time.monotonic()
    with _terminate_as_interrupt():
        try:
            for seed in range(args.seed, args.seed + args.runs):
                workdir = (args.workdir / f"seed-{seed}") if args.workdir else None
                result = run_chaos(seed, config, workdir=workdir, say=lambda line: print(line, flush=True))
                results.append(result)
                if workdir is None and result.ok and result.workdir is not None:
                    shutil.rmtree(result.workdir, ignore_errors=True)
                elif result.workdir is not None:
                    print(f"[seed {seed}] logs kept in {result.workdir}", flush=True)
                if args.json:
                    _write_json(args.json, results, config, time.monotonic() - started)
        except KeyboardInterrupt:
            print("chaos: interrupted; every process of the current run was stopped", file=sys.stderr)
            if args.json:
                _write_json(args.json, results, config, time.monotonic() - started)
            return 130
    violations = sum(len(r.verdict.violations) for r in results if r.verdict is not None)
    errors = sum(1 for r in results if r.error)
    print(f"chaos: {len(results)} run(s), {violations} violation(s), {errors} run(s) not completed")
    return 1 if violations else (2 if errors else 0)


def _write_json(path: Path, results: Sequence[RunResult], config: ChaosConfig, seconds: float) -> None:
    totals: dict[str, int] = {}
    faults: dict[str, int] = {}
    ticks: dict[str, int] = {}
    for result in results:
        for kind, n in result.faults.items():
            faults[kind] = faults.get(kind, 0) + n
        if result.tick_time_ms is not None:
            ticks[str(result.tick_time_ms)] = ticks.get(str(result.tick_time_ms), 0) + 1
        if result.verdict is None:
            continue
        for key in ("events", "approved_early", "started_at_not_before", "started_without_notice", "requests",
                    "requests_failed", "requests_failed_without_notice", "requests_failed_other"):
            totals[key] = totals.get(key, 0) + int(result.verdict.stats.get(key, 0))
    body = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()},
        "runs": len(results),
        "violations": sum(len(r.verdict.violations) for r in results if r.verdict is not None),
        "runs_not_completed": sum(1 for r in results if r.error),
        "wall_seconds": round(seconds, 1),
        "totals": totals,
        "faults": dict(sorted(faults.items())),
        "runs_by_tick_time_ms": ticks,
        "results": [r.to_json() for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1) + "\n")
