#!/usr/bin/env python3
"""The table `docs/reliability.md` reports for a long chaos run, from the file the run wrote.

    .venv/bin/python scripts/chaos_summary.py docs/chaos-results.json

Prints, as Markdown: the code and each part of the run (seeds, commit, time), then one row per figure:
runs judged, tickTime, delivery layouts, violations, link faults, other faults, events, requests through
HAProxy (with the failed ones split as the oracle splits them) and the liveness judgement; then the liveness
judgement as tables (each event with notice by outcome, each miss by law and the fault that explains it, what held the
events the policy held, the time from allowable to approved: p50, p99, max); then, for the requests
failed while HAProxy had no server UP, what kept each VM out. Everything is counted from the file; nothing is typed in.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LINK = {"zk_link_cut": "cuts", "zk_link_oneway": "one-way losses", "zk_link_delay": "delays"}
_OTHER = {"agent_kill": "agent kills", "agent_pause": "pauses", "zk_down": "single ZooKeeper servers down",
          "zk_down_no_quorum": "quorum losses", "cancel": "cancellations"}


def _count(pairs: Iterable[tuple[str, int]], names: Mapping[str, str]) -> str:
    return ", ".join(f"{n} {names[k]}" for k, n in pairs if n)


def _seconds(total: float) -> str:
    minutes, seconds = divmod(round(total), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds} s"


def _as_judged_again(body: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The results with each run's verdict as ``scripts/chaos_rejudge.py --write`` judged it again, when
    it did so for every run judged (else as written when the runs were made), and the line that says so."""
    results: Sequence[Mapping[str, Any]] = body["results"]
    by = body.get("rejudged_by")
    judged = [r for r in results if r.get("verdict") is not None]
    if not by or not judged or any(r.get("rejudged") is None for r in judged):
        return list(results), []
    again = [{**r, "verdict": r["rejudged"]} if r.get("verdict") is not None else r for r in results]
    commit = str(by.get("commit"))[:7]
    return again, ["", f"Verdicts and statistics as the oracle of source digest `{by['digest']}` (commit {commit}"
                       f"{' with uncommitted changes' if by.get('uncommitted_changes') else ''}) judged the "
                       f"{len(judged)} runs again from their kept observations (`scripts/chaos_rejudge.py "
                       "--write`); the runs' code is the digest above."]


def summary(body: Mapping[str, Any]) -> list[str]:
    results, rejudged = _as_judged_again(body)
    judged = [r for r in results if r.get("verdict") is not None]
    seeds = sorted(int(r["seed"]) for r in results)
    lines = [f"Source digest `{body['code']['digest']}` (commit {str(body['code'].get('commit'))[:7]}); "
             f"seeds {seeds[0]}-{seeds[-1]}, {len(results)} runs, {_seconds(float(body['wall_seconds']))} of runs "
             f"(mean {float(body['wall_seconds']) / max(len(results), 1):.0f} s a run, "
             f"longest {max(float(r['wall_seconds']) for r in results):.0f} s). Parts:", ""]
    for part in body["parts"]:
        lines.append(f"- started {part['started_at']}, commit {str(part['commit'])[:7]}"
                     f"{' (with uncommitted changes)' if part.get('uncommitted_changes') else ''}: {part['runs']} "
                     f"runs in {_seconds(float(part['wall_seconds']))}{', stopped' if part.get('interrupted') else ''}")
    link = [f for r in results for f in r.get("link_faults") or ()]
    kinds = Counter(f["kind"] for f in link)
    faults: Mapping[str, int] = body["faults"]  # totals the ledger writes beside the results
    imds = sum(n for k, n in faults.items() if k.startswith("imds_"))
    stats: Counter[str] = Counter()
    for r in judged:
        stats.update({k: int(v) for k, v in r["verdict"]["stats"].items() if isinstance(v, int)})
    violations = Counter(v["invariant"] for r in judged for v in r["verdict"]["violations"])
    no_server = sum(1 for r in judged if r["verdict"]["stats"].get("requests_failed_other_no_server_up"))
    not_done = [f"seed {r['seed']}: {r['error']}" for r in results if r.get("error")]
    carried = "; ".join(not_done)
    blind = sum(float(r["verdict"]["stats"].get("zk_blind_seconds", 0)) for r in judged)
    tick_text = ", ".join(f"{t} ms in {n}" for t, n in body["runs_by_tick_time_ms"].items())
    violation_text = ", ".join(f"{k}: {n}" for k, n in sorted(violations.items())) or "**0** (S1-S5, liveness)"
    with_one_up = stats["requests_failed_other_with_a_server_up"]
    if "requests_failed_other_in_handover" in stats:  # files judged before the oracle told handovers apart
        some_up = (f"{stats['requests_failed_other_in_handover']} in a handover (no server UP in both of "
                   f"HAProxy's samples around it), **{with_one_up}** while some server stayed UP")
    else:
        some_up = f"**{with_one_up}** while some server was UP"
    rows = {
        "runs judged": f"{len(judged)}" + (f" (not carried out: {carried})" if carried else ", all carried out"),
        "tickTime": tick_text,
        "delivery layout": _layouts(judged),
        "violations": violation_text,
        "link faults": f"{len(link)}: {_count(((k, kinds[k]) for k in _LINK), _LINK)}; "
                       f"{sum(1 for f in link if f.get('longer_than_session'))} longer than the session; "
                       f"{sum(1 for f in link if f.get('named_by_an_event'))} on a VM an event named",
        "other faults": f"{_count(((k, faults.get(k, 0)) for k in _OTHER), _OTHER)}, {imds} IMDS faults",
        "events": f"{stats['events']}: {stats['approved_early']} approved early, "
                  f"{stats['started_at_not_before']} started at their NotBefore, "
                  f"{stats['started_without_notice']} without notice, {stats['cancelled']} cancelled",
        "agent restarts": f"{stats['agent_restarts']}",
        "ZooKeeper recorder blind": f"{blind:.1f} s in all; {stats['approval_posts_while_zk_blind']} approval "
                                    "POSTs fell in it (their acks not checked)",
        "requests through HAProxy": f"{stats['requests']:,}; {stats['requests_failed_without_notice']} failed from "
                                    f"events without notice, {stats['requests_failed_other_no_server_up']} while "
                                    f"HAProxy had no server UP (in {no_server} runs), {some_up}",
    }
    pooled = _pool(judged)
    if pooled is not None:
        rows["liveness"] = _liveness(pooled)
    lines += [*rejudged, "", "| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows.items())]
    tables = _liveness_tables(pooled) if pooled is not None else []
    return lines + tables + _why_none_up(judged) + _why_handover(judged)


def _layouts(judged: Sequence[Mapping[str, Any]]) -> str:
    """The runs by delivery layout (``one-unit`` for a file made before runs had one), each with how many had
    their agents told their unit, its violations and its unexplained liveness misses."""
    runs: Counter[str] = Counter()
    told: Counter[str] = Counter()
    found: Counter[str] = Counter()
    unexplained: Counter[str] = Counter()
    for r in judged:
        layout = r.get("layout") or {}
        name = str(layout.get("name") or "one-unit")
        runs[name] += 1
        told[name] += bool(layout.get("told"))
        found[name] += len(r["verdict"]["violations"])
        unexplained[name] += int((r["verdict"]["stats"].get("liveness") or {}).get("misses_unexplained") or 0)
    return "; ".join(f"{name} in {n} ({told[name]} with the agents told their unit): {found[name]} violation(s), "
                     f"{unexplained[name]} unexplained liveness miss(es)" for name, n in sorted(runs.items()))


@dataclass
class _Liveness:
    """The oracle's ``liveness`` statistics pooled over every run judged (files judged before it have none)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    unexplained: int = 0
    misses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (law, cause) -> misses
    miss_runs: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    held: Counter[str] = field(default_factory=Counter)
    clean: list[float] = field(default_factory=list)  # allowable to approved, no fault on the path between
    faulted: list[float] = field(default_factory=list)  # the same with a fault between


def _pool(judged: Sequence[Mapping[str, Any]]) -> _Liveness | None:
    found = [(int(r["seed"]), r["verdict"]["stats"]["liveness"]) for r in judged
             if r["verdict"]["stats"].get("liveness")]
    if not found:
        return None
    pooled = _Liveness()
    for seed, judgement in found:
        pooled.outcomes.update(judgement.get("outcomes") or {})
        pooled.unexplained += int(judgement.get("misses_unexplained") or 0)
        for miss in judgement.get("misses") or ():
            key = (str(miss["law"]), str(miss.get("cause") or "unexplained"))
            pooled.misses[key] += 1
            pooled.miss_runs.setdefault(key, set()).add(seed)
        pooled.held.update(judgement.get("held_by") or {})
        pooled.clean += [float(x) for x in judgement.get("allowable_to_approved_seconds") or ()]
        pooled.faulted += [float(x) for x in judgement.get("allowable_to_approved_with_faults_seconds") or ()]
    pooled.clean.sort()
    pooled.faulted.sort()
    return pooled


def _liveness(pooled: _Liveness) -> str:
    """The liveness row: events allowable, approved within the bound, misses by cause, and the times from
    allowable to approved with no fault on the path between."""
    outcomes, times = pooled.outcomes, pooled.clean
    causes = Counter({f"{law} {cause}": n for (law, cause), n in pooled.misses.items()})  # "L1 agent killed" -> misses
    text = (f"{outcomes['allowable']} events allowable: {outcomes['approved in time']} approved within the bound, "
            f"{sum(causes.values())} misses ({pooled.unexplained} unexplained)")
    if causes:
        ordered = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
        text += "; by cause: " + ", ".join(f"{cause} {n}" for cause, n in ordered)
    if times:
        text += (f"; allowable to approved (no fault between, {len(times)} events): p50 {_rank(times, 0.5):.1f} s, "
                 f"p99 {_rank(times, 0.99):.1f} s, max {times[-1]:.1f} s")
    return text


def _rank(ordered: Sequence[float], q: float) -> float:
    """Nearest rank, as the oracle's per-run percentiles."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _liveness_tables(pooled: _Liveness) -> list[str]:
    """The liveness judgement as tables: each event with notice by its outcome; each miss by the law it
    missed and the fault that explains it (or none), with the runs it fell in; what held the events the
    policy held; and the time from allowable to approved, for events with no fault on their path between
    and for those with one."""
    outcomes = Counter({k: n for k, n in pooled.outcomes.items() if k != "allowable"})
    lines = ["", "| event with notice, as judged (L1) | events |", "|---|---|",
             *(f"| {outcome} | {n} |" for outcome, n in outcomes.most_common()),
             "", "| liveness miss (law: the fault that explains it) | misses | runs |", "|---|---|---|"]
    lines += [f"| {law}: {cause} | {n} | {len(pooled.miss_runs[(law, cause)])} |"
              for (law, cause), n in sorted(pooled.misses.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1]))]
    if not pooled.misses:
        lines.append("| none | 0 | 0 |")
    if pooled.held:
        lines += ["", "| held by the policy (never allowable, or not for a whole bound): what held it | events |",
                  "|---|---|",
                  *(f"| {why} | {n} |" for why, n in sorted(pooled.held.items(), key=lambda kv: (-kv[1], kv[0])))]
    lines += ["", "| allowable to approved | events | p50 | p99 | max |", "|---|---|---|---|---|"]
    paths = (("no fault on its path between", pooled.clean), ("a fault on its path between", pooled.faulted))
    for name, values in paths:
        lines.append(f"| {name} | {len(values)} | " + (
            f"{_rank(values, 0.5):.2f} s | {_rank(values, 0.99):.2f} s | {values[-1]:.2f} s |" if values
            else "- | - | - |"))
    return lines


def _why_handover(judged: Sequence[Mapping[str, Any]]) -> list[str]:
    """The requests failed in a handover, by what took out the servers UP before them (the oracle's
    ``failed_in_handover_why``)."""
    combos: Counter[str] = Counter()
    for r in judged:
        combos.update(r["verdict"]["stats"].get("failed_in_handover_why") or {})
    if not combos:
        return []
    return ["", "In a handover, what took out the servers UP before the request:", "",
            "| the servers gone out, together | requests failed |", "|---|---|",
            *(f"| {combo} | {n} |" for combo, n in combos.most_common())]


def _why_none_up(judged: Sequence[Mapping[str, Any]]) -> list[str]:
    """The requests failed while HAProxy had no server UP, by what kept each VM out (the oracle's
    ``failed_no_server_up_why``; files written before it was kept have none)."""
    requests: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    combos: Counter[str] = Counter()
    for r in judged:
        why: Mapping[str, int] = r["verdict"]["stats"].get("failed_no_server_up_why") or {}
        combos.update(why)
        reasons_of_run: set[str] = set()
        for combo, n in why.items():
            reasons = {part.rsplit(" x", 1)[0] for part in combo.split("; ")}
            requests.update(dict.fromkeys(reasons, n))
            reasons_of_run |= reasons
        runs.update(reasons_of_run)
    if not requests:
        return []
    return ["", "While HAProxy had no server UP, what kept the VMs out (a request counts under each reason that",
            "kept one of the VMs out), and the commonest combinations:", "",
            "| a VM out because | requests failed | runs |", "|---|---|---|",
            *(f"| {reason} | {n} | {runs[reason]} |" for reason, n in requests.most_common()), "",
            "| the VMs out, together | requests failed |", "|---|---|",
            *(f"| {combo} | {n} |" for combo, n in combos.most_common(5))]


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        body = json.loads(Path(argv[0]).read_text())
        print("\n".join(summary(body)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"chaos_summary: {argv[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
