"""The ceiling's Java load generator, from the Python side: its command line, the kinds of request it
knows (those of ``MIX``), how a step's answers are summed up, and how the report names it."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.run import render  # noqa: E402
from bench.zk_ceiling import (  # noqa: E402
    MIX,
    ZKLOAD_SOURCE,
    Histogram,
    _aggregate,
    compile_zkload,
    zkload_command,
)


def _options(command: list[str]) -> tuple[dict[str, str], list[str]]:
    start = command.index("ZkLoad") + 1
    options: dict[str, str] = {}
    kinds: list[str] = []
    for flag, value in zip(command[start::2], command[start + 1::2], strict=True):
        if flag == "--kind":
            kinds.append(value)
        else:
            options[flag.removeprefix("--")] = value
    return options, kinds


def test_the_command_carries_the_ramp_the_layout_and_the_mix_in_order(tmp_path: Path) -> None:
    command = zkload_command(tmp_path / "classes", hosts="127.0.0.1:1,127.0.0.1:2", sessions=200, group_size=100,
                             rates=(500, 1000.5), step_seconds=15, warmup_rate=500, warmup_seconds=10, root="/r",
                             seed=3, log_config=tmp_path / "log4j.properties", java="/opt/java",
                             classpath="a.jar:b.jar")
    assert command[0] == "/opt/java"
    assert command[command.index("-cp") + 1] == f"{tmp_path / 'classes'}:a.jar:b.jar"
    assert f"-Dlog4j.configuration={(tmp_path / 'log4j.properties').as_uri()}" in command
    options, kinds = _options(command)
    assert options == {"hosts": "127.0.0.1:1,127.0.0.1:2", "root": "/r", "sessions": "200", "group-size": "100",
                       "events-per-group": "4", "seed": "3", "max-outstanding": "20000", "warmup-rate": "500.0",
                       "warmup-seconds": "10.0", "step-seconds": "15.0", "rates": "500.0,1000.5"}
    assert kinds == [f"{weight}:{kind}" for kind, weight in MIX.items()]


def test_the_java_generator_knows_every_kind_of_the_mix_and_no_other() -> None:
    source = ZKLOAD_SOURCE.read_text()
    known = re.findall(r'^\s+[A-Z_]+\("([^"]+)"\)[,;]$', source, re.M)
    assert sorted(known) == sorted(MIX)
    writes = re.search(r"boolean write\(\) \{\s*return ([^;]+);", source)
    assert writes is not None and writes.group(1) == "this == ACK || this == OUT || this == SET_EVENT"


def test_a_missing_javac_is_an_error_that_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="default-jdk-headless"):
        compile_zkload(tmp_path, javac="no-such-javac-here")


def _line(answered: int, latencies: list[float], **extra: Any) -> dict[str, Any]:
    hist = Histogram()
    for ms in latencies:
        hist.add(ms)
    return {"sent": {"getData /leader": answered}, "not_sent": 0, "answered": answered, "errors": {},
            "hist": hist.to_json(), "write_hist": {}, "late_ms_max": 1.0, "watch_events": 30, "outstanding": 0,
            **extra}


def _step(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return _aggregate(100.0, 10.0, lines, {"generator (JVM)": 0.1}, ["1.00"], [{}], [{}], 10.0)


def test_one_process_reports_exact_percentiles_several_merge_their_histograms() -> None:
    latencies = [float(ms) for ms in range(1, 101)]
    exact = {"p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0, "max_ms": 100.0, "write_p50_ms": math.nan,
             "write_p99_ms": math.nan}
    one = _step([_line(1000, latencies, percentiles=exact)])
    assert (one["p50_ms"], one["p99_ms"], one["max_ms"]) == (50.0, 99.0, 100.0)
    assert math.isnan(one["write_p99_ms"])
    assert one["achieved"] == 100.0 and one["watch_events_per_s"] == 3.0

    two = _step([_line(500, latencies[::2]), _line(500, latencies[1::2])])
    assert two["answered"] == 1000 and two["achieved"] == 100.0
    assert two["p50_ms"] == pytest.approx(50.0, rel=0.021) and two["p50_ms"] != 50.0  # a bucket's bound
    assert two["p99_ms"] == pytest.approx(99.0, rel=0.021)


def test_the_report_names_the_java_generator_and_the_cpu_of_each_process() -> None:
    step = {"offered": 4000.0, "sent": {"getData /leader": 45_000},
            "achieved": 4000.0, "p50_ms": 1.0, "p99_ms": 20.0, "write_p50_ms": 4.0,
            "write_p99_ms": 30.0, "watch_events_per_s": 1500.0, "loadavg_1min": ["3.00", "3.10"],
            "cpu_cores": {"zookeeper 1": 0.2, "zookeeper 2": 0.1, "zookeeper 3 (leader)": 0.3,
                          "generator (JVM)": 0.4, "harness": 0.0, "machine (every process)": 1.5}}
    ceiling = {"date": "2026-01-01", "command": "c", "machine": "m", "notes": [], "result": {
        "ensemble": 3, "generator": "java", "workers": 1, "sessions": 200, "group_size": 100, "groups": 2,
        "events_per_group": 4, "step_seconds": 15.0, "warmup_seconds": 10.0, "p99_limit_ms": 100.0,
        "tolerance": 0.05, "mix": {"getData /leader": 970, "setData /events/{id}": 30},
        "mix_sent": {"getData /leader": 97, "setData /events/{id}": 3},
        "mix_ratio": {"reads": 0.97, "writes": 0.03}, "steps": [step], "stopped": "", "ceiling": 4000.0}}
    text = render({"ceiling": ceiling})
    assert "**200 sessions of ZooKeeper's Java client in one JVM**" in text
    assert "CPU cores: generator (one JVM)" in text
    # each server (the leader starred), together, the generator, the machine, others, then µs per answer
    row = ("| 4000 | 3000 | 4000 | 1.0 | 20.0 | 4.0 | 30.0 | 1500 | 0.20, 0.10, 0.30* | 0.60 | 0.40 | 1.50 | 0.50 "
           "| 150 | 100 |")
    assert row in text
    assert "(200 sessions of ZooKeeper's Java client in one JVM (`bench/zkload/ZkLoad.java`" in text
