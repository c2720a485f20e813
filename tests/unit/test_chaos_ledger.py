"""The long chaos run's file, made in parts: ``--resume`` plays only the seeds the file lacks, and only on
the code and configuration that made it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import cli
from tests.chaos.ledger import Ledger, LedgerError, code_identity
from tests.chaos.result import RunResult

CONFIG = {"vms": ["vm0", "vm1", "vm2"], "duration": 30.0}


def _package(root: Path, body: str) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "sub" / "b.py").write_text(body)
    return root / "pkg"


def _result(seed: int, *, violations: int = 0, error: str | None = None) -> dict[str, Any]:
    verdict = None if error else {"ok": not violations, "stats": {"events": 3, "approved_early": 2, "requests": 100},
                                  "violations": [{"invariant": "S1"}] * violations}
    return {"seed": seed, "wall_seconds": 60.0, "faults": {"sigkill": 1}, "tick_time_ms": 500, "error": error,
            "verdict": verdict}


def test_the_digest_follows_the_source_and_nothing_else(tmp_path: Path) -> None:
    one = code_identity(_package(tmp_path / "one", "B = 2\n"))
    same = code_identity(_package(tmp_path / "same", "B = 2\n"))
    other = code_identity(_package(tmp_path / "other", "B = 3\n"))
    assert one["digest"] == same["digest"] != other["digest"]
    assert one["commit"] is None and one["uncommitted_changes"] is None  # not a git checkout


def test_a_resumed_file_keeps_its_runs_and_adds_up_all_of_them(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    code = {"digest": "abc", "commit": "c1", "uncommitted_changes": False}
    first = Ledger.resume(path, CONFIG, code)
    assert first.done() == set()
    part = first.start_part(code)
    first.add(_result(2), part, 60.0)
    first.add(_result(1, violations=1), part, 120.0)
    first.write(path)
    assert [p.name for p in tmp_path.iterdir()] == ["runs.json"]  # written by rename: no temporary left

    again = Ledger.resume(path, CONFIG, code)
    assert again.done() == {1, 2}
    part = again.start_part(code)
    again.add(_result(3, error="zookeeper did not start"), part, 5.0)
    body = again.to_json()
    assert [r["seed"] for r in body["results"]] == [1, 2, 3]
    assert (body["runs"], body["violations"], body["runs_not_completed"]) == (3, 1, 1)
    assert body["totals"] == {"events": 6, "approved_early": 4, "requests": 200, "started_at_not_before": 0,
                              "started_without_notice": 0, "requests_failed": 0,
                              "requests_failed_without_notice": 0, "requests_failed_other": 0}
    assert body["faults"] == {"sigkill": 3} and body["runs_by_tick_time_ms"] == {"500": 3}
    assert [(p["seeds"], p["runs"], p["wall_seconds"]) for p in body["parts"]] == [([1, 2], 2, 120.0), ([3, 3], 1, 5.0)]
    assert body["wall_seconds"] == 125.0


def test_a_file_made_by_other_code_or_settings_is_refused_with_what_differs(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    ledger = Ledger(dict(CONFIG), {"digest": "abc", "commit": "c1"})
    ledger.start_part(ledger.code)
    ledger.write(path)
    with pytest.raises(LedgerError, match=r"other code \(commit c1, source digest abc; now def\)"):
        Ledger.resume(path, CONFIG, {"digest": "def", "commit": "c2"})
    with pytest.raises(LedgerError, match=r"another configuration: duration 30.0 \(now 60.0\)"):
        Ledger.resume(path, {**CONFIG, "duration": 60.0}, {"digest": "abc"})
    path.write_text("{\"runs\": 3}")
    with pytest.raises(LedgerError, match="not a file of this command's runs"):
        Ledger.resume(path, CONFIG, {"digest": "abc"})


def test_the_command_plays_only_the_seeds_the_file_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    played: list[int] = []

    def run_chaos(seed: int, config: object, **_: object) -> RunResult:
        played.append(seed)
        return RunResult(seed=seed, steps=[], origin=0.0, wall_seconds=1.0, verdict=None, error="not carried out")

    monkeypatch.setattr(cli, "run_chaos", run_chaos)
    monkeypatch.setattr(cli, "_check_prerequisites", lambda: None)
    path = tmp_path / "runs.json"
    assert cli.main(["--seed", "1", "--runs", "2", "--vms", "3", "--json", str(path)]) == 2
    assert cli.main(["--seed", "1", "--runs", "4", "--vms", "3", "--json", str(path), "--resume"]) == 2
    assert played == [1, 2, 3, 4]
    body = json.loads(path.read_text())
    assert [r["seed"] for r in body["results"]] == [1, 2, 3, 4] and len(body["parts"]) == 2
    assert "2 of seeds 1-4 already in" in capsys.readouterr().out
    assert cli.main(["--seed", "1", "--runs", "4", "--vms", "4", "--json", str(path), "--resume"]) == 2
    assert "another configuration: vms" in capsys.readouterr().err and played == [1, 2, 3, 4]
    with pytest.raises(SystemExit):
        cli.main(["--seed", "1", "--resume"])


def test_the_reported_table_counts_what_the_file_holds(tmp_path: Path) -> None:
    import subprocess
    import sys

    ledger = Ledger(dict(CONFIG), {"digest": "abc", "commit": "c1d2e3f4a5"})
    part = ledger.start_part(ledger.code)
    for seed in (1, 2):
        run = _result(seed, violations=seed - 1)
        run["link_faults"] = [{"kind": "zk_link_cut", "longer_than_session": seed == 1, "named_by_an_event": True}]
        run["verdict"]["stats"].update({"requests_failed_other_no_server_up": 3, "cancelled": 1,
                                        "zk_blind_seconds": 2.5, "approval_posts_while_zk_blind": seed - 1,
                                        "failed_no_server_up_why": {"agent not running x2": seed,
                                                                    "agent not running x1; probe unanswered x1":
                                                                    3 - seed},
                                        "requests_failed_other_in_handover": seed,
                                        "failed_in_handover_why": {"drained for an event naming it x1": seed},
                                        "liveness": {
                                            "outcomes": {"allowable": 2, "approved in time": 1, "miss": 1},
                                            "held_by": {"the budget": seed},
                                            "misses_by_cause": {"L2 agent killed": 1}, "misses_unexplained": 0,
                                            "misses": [{"law": "L2", "cause": "agent killed"}],
                                            "allowable_to_approved_seconds": [float(seed), 2.0 * seed + 1],
                                            "allowable_to_approved_with_faults_seconds": [9.0] * seed}})
        ledger.add(run, part, 100.0 * seed)
    ledger.add(_result(3, error="HAProxy did not start"), part, 205.0)
    path = tmp_path / "runs.json"
    ledger.write(path)
    script = Path(__file__).resolve().parents[2] / "scripts" / "chaos_summary.py"
    out = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=True).stdout
    assert "Source digest `abc` (commit c1d2e3f); seeds 1-3, 3 runs, 3 min 25 s of runs" in out
    assert "| runs judged | 2 (not carried out: seed 3: HAProxy did not start) |" in out
    assert "| violations | S1: 1 |" in out and "| tickTime | 500 ms in 3 |" in out
    assert "| ZooKeeper recorder blind | 5.0 s in all; 1 approval POSTs fell in it (their acks not checked) |" in out
    assert "| link faults | 2: 2 cuts; 1 longer than the session; 2 on a VM an event named |" in out
    assert "| events | 6: 4 approved early, 0 started at their NotBefore, 0 without notice, 2 cancelled |" in out
    assert "200; 0 failed from events without notice, 6 while HAProxy had no server UP (in 2 runs)" in out
    assert "| agent not running | 6 | 2 |\n| probe unanswered | 3 | 2 |" in out
    assert "| agent not running x2 | 3 |\n| agent not running x1; probe unanswered x1 | 3 |" in out
    assert "(in 2 runs), 3 in a handover (no server UP in both of HAProxy's samples around it)" in out
    assert "| drained for an event naming it x1 | 3 |" in out
    # Liveness, pooled over the runs: the times 1, 3 (seed 1) and 2, 5 (seed 2), nearest rank.
    assert "| approved in time | 2 |\n| miss | 2 |" in out
    assert "| L2: agent killed | 2 | 2 |" in out and "| the budget | 3 |" in out
    assert "| no fault on its path between | 4 | 2.00 s | 5.00 s | 5.00 s |" in out
    assert "| a fault on its path between | 3 | 9.00 s | 9.00 s | 9.00 s |" in out
    path.write_text("[]")
    failed = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True)
    assert failed.returncode == 2 and "chaos_summary:" in failed.stderr


def test_the_command_stops_after_three_runs_in_a_row_that_could_not_start_and_keeps_paths_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.chaos import cli

    played: list[tuple[int, Path | None]] = []

    def run_chaos(seed: int, config: object, *, workdir: Path | None = None, **_: object) -> RunResult:
        played.append((seed, workdir))
        return RunResult(seed=seed, steps=[], origin=0.0, wall_seconds=1.0, verdict=None,
                         error="the group did not start: haproxy -c rejected its configuration")

    monkeypatch.setattr(cli, "run_chaos", run_chaos)
    monkeypatch.setattr(cli, "_check_prerequisites", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--seed", "1", "--runs", "10", "--workdir", "runs", "--json", "runs.json"]) == 2
    assert [seed for seed, _ in played] == [1, 2, 3]
    assert all(workdir is not None and workdir.is_absolute() and workdir == tmp_path / "runs" / f"seed-{seed}"
               for seed, workdir in played)
    assert "3 runs in a row could not be carried out" in capsys.readouterr().err
    assert [r["seed"] for r in json.loads((tmp_path / "runs.json").read_text())["results"]] == [1, 2, 3]


def _part_file(path: Path, seeds: range, code: dict[str, Any], config: dict[str, Any] = CONFIG) -> Path:
    ledger = Ledger.resume(path, config, code)
    part = ledger.start_part(code)
    for seed in seeds:
        ledger.add(_result(seed, violations=1 if seed == 3 else 0), part, 60.0 * (seed - seeds.start + 1))
    ledger.write(path)
    return path


def test_parts_played_side_by_side_join_into_one_file_of_all_their_seeds(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from chaos_join import join, main

    code = {"digest": "abc", "commit": "c1", "uncommitted_changes": False}
    low = _part_file(tmp_path / "low.json", range(1, 4), code)
    high = _part_file(tmp_path / "high.json", range(101, 103), code)
    assert main([str(tmp_path / "all.json"), str(high), str(low)]) == 0
    body = json.loads((tmp_path / "all.json").read_text())
    assert [r["seed"] for r in body["results"]] == [1, 2, 3, 101, 102]
    assert (body["runs"], body["violations"], len(body["parts"]), body["wall_seconds"]) == (5, 1, 2, 300.0)
    # The joined file is one that --resume goes on with, on the same code.
    assert Ledger.resume(tmp_path / "all.json", CONFIG, code).done() == {1, 2, 3, 101, 102}
    # Refused: a seed twice, other code, another configuration.
    with pytest.raises(LedgerError, match="seeds already joined"):
        join([low, _part_file(tmp_path / "again.json", range(3, 5), code)])
    with pytest.raises(LedgerError, match="other code"):
        join([low, _part_file(tmp_path / "other.json", range(201, 202), {**code, "digest": "def"})])
    with pytest.raises(LedgerError, match="another configuration"):
        join([low, _part_file(tmp_path / "config.json", range(301, 302), code, {**CONFIG, "duration": 60.0})])
    assert main([str(tmp_path / "none.json"), str(low), str(tmp_path / "again.json")]) == 1
