#!/usr/bin/env python3
"""Judge kept chaos runs again with the oracle as it is now.

    .venv/bin/python scripts/chaos_rejudge.py chaos-runs            # every DIR/seed-N/observations.json
    .venv/bin/python scripts/chaos_rejudge.py /tmp/chaos-20-abc123   # one run's directory
    .venv/bin/python scripts/chaos_rejudge.py chaos-runs --write docs/chaos-results.json

The oracle is a pure function of a run's observations (`tests.oracle.check`), and every
run keeps them in its directory (`make chaos` keeps every run's under `chaos-runs/`). A change to the
oracle can so be checked against runs already made: this prints, per run, the verdict written when it
ran (`verdict.txt`, its first line) and the verdict now, and says which runs changed. Exit status 1 if
any run has a violation now (an unexplained liveness miss included), 2 if nothing could be read, else 0.
Before the last line, the liveness judgement over every run (events allowable, approved within the bound,
misses by cause) and the load's failed requests as the oracle counts them now (the runs' statistics,
`oracle/stats.py`).

Where the run kept its ZooKeeper data (`DIR/zookeeper`, or `zookeeper/` beside a group benchmark's
`group-N/`), the node history is taken from ZooKeeper's transaction log, the observer's first sightings
kept (`tests.oracle.history`); `--observer-only` judges by the observer's sightings alone.
A record written already from the log is judged as it is.

With `--write FILE` (the file `make chaos` wrote), each run of FILE whose directory was judged gets the
new verdict beside the one written when it ran (`rejudged`), and the file says which oracle judged them
again (`rejudged_by`: the package's digest and commit now, and how many runs); `scripts/chaos_summary.py`
then counts from those verdicts. The runs' own verdicts and the code they ran stay as they were.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# The chaos harness and its oracle are test tools (tests/), run from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.ledger import code_identity
from tests.oracle import Observations, check, load
from tests.oracle.history import TXN_LOG, from_txn_log
from tests.oracle.txnlog import server_logs


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


def _seed_of(run: Path) -> int | None:
    number = re.fullmatch(r"seed-(\d+)", run.name)
    return int(number.group(1)) if number else None


def _zookeeper_of(run: Path) -> Path | None:
    """The ZooKeeper data a kept run has: its own ``zookeeper/`` (a chaos run's ensemble), or the one beside
    it (a group benchmark's ``group-N/`` next to its server's)."""
    for candidate in (run / "zookeeper", run.parent / "zookeeper"):
        if server_logs(candidate):
            return candidate
    return None


def _with_log(run: Path, observations: Observations, observer_only: bool) -> tuple[Observations, str]:
    """The observations to judge, and where their nodes come from in a few words (nothing: from the
    observer's sightings, no log kept or ``--observer-only``)."""
    if observations.nodes_from == TXN_LOG:
        return observations, "nodes from the txn log (as recorded)"
    data = None if observer_only else _zookeeper_of(run)
    if data is None:
        return observations, ""
    merged = from_txn_log(observations, data)
    if merged.nodes_from != TXN_LOG:
        why = merged.nodes_from if merged is not observations else "the log holds none of its nodes"
        return merged, f"nodes from the observer ({data}: {why})"
    counts = merged.nodes_from_counts
    return merged, (f"nodes from the txn log of {data}: {counts.get('log', 0)} node(s), {counts.get('unseen', 0)} "
                    f"the observer never saw, {counts.get('seen_gone_late', 0)} it saw go over 1 s late")


def _write(path: Path, verdicts: dict[int, dict[str, object]]) -> int:
    """Put each re-judged verdict beside its run's in the results file; how many runs got one."""
    body = json.loads(path.read_text())
    written = 0
    for result in body["results"]:
        verdict = verdicts.get(int(result["seed"]))
        if verdict is not None and result.get("verdict") is not None:
            result["rejudged"] = verdict
            written += 1
    code = code_identity()
    body["rejudged_by"] = {"digest": code["digest"], "commit": code["commit"],
                           "uncommitted_changes": code["uncommitted_changes"], "runs": written}
    temporary = path.with_name(f".{path.name}.rejudged.tmp")
    temporary.write_text(json.dumps(body, indent=1) + "\n")
    temporary.replace(path)
    return written


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="chaos_rejudge", description=__doc__.strip().splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories, or directories of them")
    parser.add_argument("--write", type=Path, metavar="FILE", help="the results file to add the verdicts to")
    parser.add_argument("--observer-only", action="store_true",
                        help="judge by the observer's node sightings even where ZooKeeper's transaction log was kept")
    args = parser.parse_args(argv)
    write: Path | None = args.write
    runs = _runs(args.paths)
    if not runs:
        print(f"chaos_rejudge: no observations.json under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    changed = violations = unreadable = 0
    totals: Counter[str] = Counter()
    verdicts: dict[int, dict[str, object]] = {}
    handover_why: Counter[str] = Counter()
    live: Counter[str] = Counter()
    misses: Counter[str] = Counter()
    for run in runs:
        try:
            observations, nodes_from = _with_log(run, load((run / "observations.json").read_text()),
                                                 args.observer_only)
            verdict = check(observations)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{run.name}: cannot judge: {type(exc).__name__}: {exc}")
            unreadable += 1
            continue
        then_path = run / "verdict.txt"
        then = then_path.read_text().splitlines()[0].strip() if then_path.is_file() else "(no verdict.txt)"
        totals.update({k: v for k, v in verdict.stats.items() if k.startswith("requests") and isinstance(v, int)})
        handover_why.update(verdict.stats.get("failed_in_handover_why") or {})
        judged = verdict.stats.get("liveness") or {}
        live.update({k: v for k, v in (judged.get("outcomes") or {}).items() if k in ("allowable", "approved in time")})
        misses.update(judged.get("misses_by_cause") or {})
        seed = _seed_of(run)
        if seed is not None:
            verdicts[seed] = verdict.to_json(observations.started_at)
        now = "OK" if verdict.ok else f"{len(verdict.violations)} violation(s)"
        was_ok = then == "no violation"
        differs = was_ok != verdict.ok
        changed += differs
        violations += not verdict.ok
        print(f"{run.name}: then {then!r}; now {now}{'  <- changed' if differs else ''}")
        if nodes_from:
            print(f"    {nodes_from}")
        for violation in verdict.violations:
            print(f"    {violation.invariant}: {violation.summary}")
    causes = ", ".join(f"{cause} {n}" for cause, n in sorted(misses.items(), key=lambda kv: (-kv[1], kv[0])))
    print(f"liveness: {live['allowable']} event(s) allowable, {live['approved in time']} approved within the bound; "
          f"misses: {causes or 'none'}")
    why = ", ".join(f"{combo}: {n}" for combo, n in handover_why.most_common())
    print(f"requests through HAProxy: {totals['requests']:,}; failed: {totals['requests_failed_without_notice']} "
          f"from events without notice, {totals['requests_failed_other_no_server_up']} while no server was UP, "
          f"{totals['requests_failed_other_in_handover']} in a handover{f' ({why})' if why else ''}, "
          f"{totals['requests_failed_other_with_a_server_up']} while some server stayed UP")
    print(f"{len(runs) - unreadable} run(s) judged again: {violations} with a violation now, {changed} changed"
          + (f"; {unreadable} could not be read" if unreadable else ""))
    if write is not None:
        try:
            print(f"wrote {_write(write, verdicts)} re-judged verdict(s) into {write}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"chaos_rejudge: cannot write {write}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    return 1 if violations else 2 if unreadable == len(runs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
