#!/usr/bin/env python3
"""Judge kept chaos runs again with the oracle as it is now.

    .venv/bin/python scripts/chaos_rejudge.py chaos-runs            # every DIR/seed-N/observations.json
    .venv/bin/python scripts/chaos_rejudge.py /tmp/chaos-20-abc123   # one run's directory

The oracle is a pure function of a run's observations (`coordinator.testbed.oracle.check`), and every
run keeps them in its directory (`make chaos` keeps every run's under `chaos-runs/`). A change to the
oracle can so be checked against runs already made: this prints, per run, the verdict written when it
ran (`verdict.txt`, its first line) and the verdict now, and says which runs changed. Exit status 1 if
any run has a violation now, 2 if nothing could be read, else 0. Before the last line, the load's failed
requests over every run as the oracle counts them now (the runs' statistics, `oracle/stats.py`).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from coordinator.testbed.oracle import check, load


def _runs(paths: Sequence[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if (path / "observations.json").is_file():
            found.append(path)
        else:
            found.extend(p.parent for p in path.glob("*/observations.json"))

    def seed(run: Path) -> tuple[int, str]:
        number = re.search(r"(\d+)", run.name)
        return (int(number.group(1)) if number else -1, run.name)

    return sorted(set(found), key=seed)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = _runs([Path(a) for a in argv])
    if not runs:
        print(f"chaos_rejudge: no observations.json under {', '.join(argv)}", file=sys.stderr)
        return 2
    changed = violations = unreadable = 0
    totals: Counter[str] = Counter()
    handover_why: Counter[str] = Counter()
    for run in runs:
        try:
            verdict = check(load((run / "observations.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{run.name}: cannot judge: {type(exc).__name__}: {exc}")
            unreadable += 1
            continue
        then_path = run / "verdict.txt"
        then = then_path.read_text().splitlines()[0].strip() if then_path.is_file() else "(no verdict.txt)"
        totals.update({k: v for k, v in verdict.stats.items() if k.startswith("requests") and isinstance(v, int)})
        handover_why.update(verdict.stats.get("failed_in_handover_why") or {})
        now = "OK" if verdict.ok else f"{len(verdict.violations)} violation(s)"
        was_ok = then == "no violation"
        differs = was_ok != verdict.ok
        changed += differs
        violations += not verdict.ok
        print(f"{run.name}: then {then!r}; now {now}{'  <- changed' if differs else ''}")
        for violation in verdict.violations:
            print(f"    {violation.invariant}: {violation.summary}")
    why = ", ".join(f"{combo}: {n}" for combo, n in handover_why.most_common())
    print(f"requests through HAProxy: {totals['requests']:,}; failed: {totals['requests_failed_without_notice']} "
          f"from events without notice, {totals['requests_failed_other_no_server_up']} while no server was UP, "
          f"{totals['requests_failed_other_in_handover']} in a handover{f' ({why})' if why else ''}, "
          f"{totals['requests_failed_other_with_a_server_up']} while some server stayed UP")
    print(f"{len(runs) - unreadable} run(s) judged again: {violations} with a violation now, {changed} changed"
          + (f"; {unreadable} could not be read" if unreadable else ""))
    return 1 if violations else 2 if unreadable == len(runs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
