"""The command line: ``python -m tests.chaos --seed N [--runs K] [--duration S] [--json out.json
[--resume]] [--admin-state] [--layout one-unit|named|two-units|mixed] [--tell-unit drawn|yes|no]``.

``main`` checks that the real components are there (java with ZooKeeper's jars, HAProxy), plays the
runs one seed after the other, keeps the logs of a run that found something, writes every run's plan,
statistics and violations as JSON if asked (``ledger``: with ``--resume``, going on with the seeds a
previous part of the run left, on the same code only), and turns SIGTERM into the same clean stop as
Ctrl-C. Exit status: 1 if any run found a violation, 2 if a run could not be carried out (three in a
row that could not start their group stop the command), 130 if interrupted, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from tests.chaos.ledger import Ledger, LedgerError, code_identity
from tests.chaos.planning import LAYOUTS, ChaosConfig
from tests.chaos.run import run_chaos

# Runs in a row that could not be carried out (the group never started) after which the command stops:
# the cause is the machine or the harness, not the seed, and every further run would fail the same way.
STOP_AFTER_FAILED = 3

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
    parser = argparse.ArgumentParser(prog="python -m tests.chaos",
                                     description="Seeded chaos on real processes, judged by an independent oracle.")
    parser.add_argument("--seed", type=int, required=True, help="the first run's seed")
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds SEED, SEED+1, ... (default: 1)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of faults per run; a run lasts until every event is gone (default: 30)")
    parser.add_argument("--vms", type=int, default=4, help="VMs, each with an agent (at least 3; default: 4)")
    parser.add_argument("--json", type=Path, help="write every run's plan, statistics and violations here")
    parser.add_argument("--workdir", type=Path, help="keep every run's logs under this directory")
    parser.add_argument("--admin-state", action="store_true",
                        help="the agents drain through the load balancer's admin state (the simulated ARM, "
                             "applied to HAProxy) and their probe, without an HAProxy action of their own; the run "
                             "samples every VM's effective admin state and the plan adds ARM faults and stretches")
    parser.add_argument("--layout", choices=(*LAYOUTS, "mixed"), default="mixed",
                        help="which events IMDS shows each VM: one-unit (every VM every event), named (each VM only "
                             "the events naming it), two-units (two placement groups, pg0 and pg1, each VM every "
                             "event of its own), or mixed (one of them drawn from each seed; default)")
    parser.add_argument("--tell-unit", choices=("drawn", "yes", "no"), default="drawn",
                        help="whether the agents are told their unit and the delivery (imds.unit, imds.delivery) or "
                             "left at the default (auto, unit unknown): drawn from each seed (default), or always")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the runs in --json FILE: play only the seeds it does not hold (refused "
                             "if it was made by other code or with another configuration)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.vms < 3 or args.duration < 10:
        parser.error("--runs must be >= 1, --vms >= 3 and --duration >= 10")
    problem = _check_prerequisites()
    if problem:
        print(f"chaos: cannot run: {problem}", file=sys.stderr)
        return 2
    if args.resume and args.json is None:
        parser.error("--resume needs --json FILE (the file to go on with)")
    config = ChaosConfig(vms=tuple(f"vm{i}" for i in range(args.vms)), duration=args.duration,
                         admin_state=args.admin_state, layout=args.layout,
                         tell_unit={"drawn": None, "yes": True, "no": False}[args.tell_unit])
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.__dict__.items()}
    code = code_identity()
    try:
        ledger = Ledger.resume(args.json, settings, code) if args.resume else Ledger(settings, code)
    except LedgerError as exc:
        print(f"chaos: cannot resume: {exc}", file=sys.stderr)
        return 2
    wanted = range(args.seed, args.seed + args.runs)
    seeds = [seed for seed in wanted if seed not in ledger.done()]
    if len(seeds) < len(wanted):
        print(f"chaos: {len(wanted) - len(seeds)} of seeds {wanted[0]}-{wanted[-1]} already in {args.json}; "
              f"playing the {len(seeds)} others", flush=True)
    if code["uncommitted_changes"]:
        print(f"chaos: the package differs from commit {code['commit']} (uncommitted changes); the runs are "
              f"recorded under source digest {code['digest']}", flush=True)
    part = ledger.start_part(code)
    started = time.monotonic()
    # Absolute: the group's files name each other by path (HAProxy reads a relative socket path as an address).
    root = args.workdir.resolve() if args.workdir else None
    failed_in_a_row = 0
    with _terminate_as_interrupt():
        try:
            for seed in seeds:
                workdir = (root / f"seed-{seed}") if root else None
                result = run_chaos(seed, config, workdir=workdir, say=lambda line: print(line, flush=True))
                ledger.add(result.to_json(), part, time.monotonic() - started)
                failed_in_a_row = failed_in_a_row + 1 if result.error and result.verdict is None else 0
                if workdir is None and result.ok and result.workdir is not None:
                    shutil.rmtree(result.workdir, ignore_errors=True)
                elif result.workdir is not None:
                    print(f"[seed {seed}] logs kept in {result.workdir}", flush=True)
                if args.json:
                    ledger.write(args.json)
                if failed_in_a_row >= STOP_AFTER_FAILED:
                    print(f"chaos: {failed_in_a_row} runs in a row could not be carried out (the last: "
                          f"{result.error}); stopping rather than playing the other seeds the same way",
                          file=sys.stderr)
                    return 2
        except KeyboardInterrupt:
            print("chaos: interrupted; every process of the current run was stopped", file=sys.stderr)
            if args.json:
                part["interrupted"] = True
                part["wall_seconds"] = round(time.monotonic() - started, 1)
                ledger.write(args.json)
                print(f"chaos: {part['runs']} run(s) of this part kept in {args.json}; --resume goes on from "
                      "there", file=sys.stderr)
            return 130
    summary = ledger.to_json()
    scope = f" ({summary['runs']} in {args.json}: {summary['violations']} violation(s))" if args.resume else ""
    played = set(seeds)
    this_part = [r for r in ledger.results if int(r["seed"]) in played]
    violations = sum(len((r.get("verdict") or {}).get("violations") or ()) for r in this_part)
    errors = sum(1 for r in this_part if r.get("error"))
    print(f"chaos: {len(this_part)} run(s), {violations} violation(s), {errors} run(s) not completed{scope}")
    if summary["violations"]:
        return 1
    return 2 if errors or summary["runs_not_completed"] else 0
