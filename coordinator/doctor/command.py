"""``coordinator doctor --config FILE``: run the checks of ``coordinator.doctor.checks`` in order, one line
each as it completes (or one JSON object with ``--json``), within ``--timeout`` for the whole run.

Exit status: 0 when every check passed (or was skipped), 1 when the worst is a WARN, 2 when a check
FAILed, and 2 too when the configuration cannot be loaded or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from coordinator import __version__
from coordinator.doctor.azure import ArmOptions
from coordinator.doctor.checks import CHECKS, Check, Context
from coordinator.doctor.verdicts import Status, Verdict, exit_status, worst

__all__ = ["CheckResult", "run", "run_checks"]

_WIDTH = max(len(check.name) for check in CHECKS)


@dataclass(frozen=True)
class CheckResult:
    check: Check
    verdict: Verdict
    seconds: float

    def line(self) -> str:
        verdict = self.verdict
        text = f"{verdict.status.value} {self.check.name:<{_WIDTH}}  {verdict.summary}"
        return text + (f" | fix: {verdict.fix}" if verdict.fix else "")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.check.name, "title": self.check.title, "status": self.verdict.status.value,
                "summary": self.verdict.summary, "fix": self.verdict.fix or None,
                "seconds": round(self.seconds, 3), "details": dict(self.verdict.details)}


def _run_one(check: Check, ctx: Context) -> Verdict | None:
    """The check's verdict, or None if it did not finish before the deadline (its thread is left to end
    on its own: every request it makes is bounded too). A check that raises is a FAIL naming the error."""
    outcome: list[Verdict] = []

    def target() -> None:
        try:
            outcome.append(check.run(ctx))
        except Exception as exc:  # a bug or an unforeseen failure of one check must not end the run
            outcome.append(Verdict(Status.FAIL, f"the check failed: {type(exc).__name__}: {exc}",
                                   "report this as a bug of coordinator doctor"))

    worker = threading.Thread(target=target, name=f"doctor-{check.name}", daemon=True)
    worker.start()
    worker.join(max(0.0, ctx.deadline - time.monotonic()))
    return outcome[0] if outcome else None


def run_checks(ctx: Context, checks: tuple[Check, ...], skip: set[str], timeout: float,
               on_result: Any = None) -> list[CheckResult]:
    """Run ``checks`` in order against ``ctx``, calling ``on_result`` with each result as it completes."""
    results: list[CheckResult] = []
    late = False
    for check in checks:
        began = time.monotonic()
        verdict: Verdict | None
        if check.name in skip:
            verdict = Verdict(Status.SKIP, "skipped (--skip)")
        elif late:
            verdict = Verdict(Status.SKIP, f"not run: the --timeout of {timeout:g} s was reached")
        else:
            verdict = _run_one(check, ctx)
            if verdict is None:
                late = True
                verdict = Verdict(Status.FAIL, f"no result within the --timeout of {timeout:g} s",
                                  "run again with a longer --timeout, or skip this check (--skip) to see the others")
        result = CheckResult(check, verdict, time.monotonic() - began)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def run(args: argparse.Namespace) -> int:
    from coordinator.config import load_settings
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.command import quiet_logging

    if not 0 < args.timeout <= 3600:
        print("coordinator: doctor: --timeout must be between 0 and 3600 seconds", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    skip = {name for names in args.skip for name in names}
    began = time.monotonic()
    arm_url = args.arm_url.rstrip("/") if args.arm_url else None
    if arm_url is not None and not arm_url.startswith(("https://", "http://127.0.0.1", "http://localhost",
                                                         "http://[::1]")):
        print("coordinator: doctor: --arm-url must start with https:// (plain http:// only to a loopback address): "
              "the requests carry this VM's bearer token", file=sys.stderr)
        return 2
    arm = ArmOptions(enabled=bool(args.arm or arm_url or args.resource_id or args.load_balancer), arm_url=arm_url,
                     resource_id=args.resource_id, load_balancers=tuple(args.load_balancer),
                     client_id=args.client_id)
    ctx = Context(settings=settings, config_path=args.config, deadline=began + args.timeout, arm=arm)
    progress: TextIO | None = sys.stdout if not args.json else (sys.stderr if sys.stderr.isatty() else None)
    if progress is not None:
        print(f"coordinator doctor {__version__}: {args.config}, cluster {settings.cluster}, "
              f"timeout {args.timeout:g} s", file=progress, flush=True)

    def show(result: CheckResult) -> None:
        if progress is not None:
            print(result.line(), file=progress, flush=True)

    try:
        with quiet_logging(args.verbose):
            results = run_checks(ctx, CHECKS, skip, args.timeout, show)
    finally:
        ctx.close()
    statuses = [r.verdict.status for r in results]
    code = exit_status(statuses)
    overall = worst(statuses)
    counts = {status: statuses.count(status) for status in Status}
    if args.json:
        print(json.dumps({
            "version": __version__, "config": str(args.config), "cluster": settings.cluster, "vm": ctx.vm,
            "status": overall.value, "exit_status": code, "seconds": round(time.monotonic() - began, 3),
            "counts": {status.value: n for status, n in counts.items()},
            "checks": [r.to_json() for r in results],
        }, indent=2))
    elif progress is not None:
        print(f"{overall.value}: " + ", ".join(f"{n} {status.value}" for status, n in counts.items())
              + f" in {time.monotonic() - began:.1f} s; exit status {code}", file=progress)
    return code
