"""The ceiling's Java load generator (bench/zkload/ZkLoad.java), compiled with javac and run for a few
seconds against a real ZooKeeper server: its sessions connect, it sends the mix on schedule and reports
the answers, step by step, in the protocol the harness reads."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coordinator.testbed.zookeeper import LocalZooKeeper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.zk_ceiling import (  # noqa: E402
    MIX,
    WRITES,
    _read_line,
    client_log_config,
    compile_zkload,
    create_layout,
    finish_generators,
    start_generators,
    zkload_command,
)


def test_the_java_generator_answers_the_mix_against_a_real_server(zk_server: LocalZooKeeper, zk_chroot: str,
                                                                   tmp_path: Path) -> None:
    if shutil.which("javac") is None:
        message = "javac is missing: scripts/setup.sh installs it (default-jdk-headless)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    classes = compile_zkload(tmp_path / "classes")
    admin = KazooClient(hosts=zk_server.hosts, timeout=10.0)
    admin.start(timeout=10)
    try:
        create_layout(admin, groups=2, size=5, root=zk_chroot)
    finally:
        admin.stop()
        admin.close()
    command = zkload_command(classes, hosts=zk_server.hosts, sessions=10, group_size=5, rates=(400,),
                             step_seconds=2.0, warmup_rate=200, warmup_seconds=1.0, root=zk_chroot,
                             log_config=client_log_config(tmp_path))
    procs, start = start_generators([command], tmp_path)
    (proc,) = procs
    try:
        lines = [_read_line(proc, time.monotonic() + 30) for _ in range(3)]
    finally:
        finish_generators(procs, timeout=20)
    assert time.time() >= start + 3.0
    warm, step, closed = lines
    assert warm is not None and warm["step"] == -1 and warm["answered"] > 0
    assert step is not None and step["step"] == 0, (tmp_path / "generator-0.log").read_text()
    assert closed == {"closed": True}
    sent = sum(step["sent"].values())
    assert 0.8 * 800 <= sent <= 800 + 1  # 400/s for 2 s, on schedule
    assert step["answered"] >= 0.8 * 800 and step["not_sent"] == 0
    assert step["errors"] == {}
    assert set(step["sent"]) <= set(MIX) and set(step["sent"]) & WRITES and set(step["sent"]) - WRITES
    exact = step["percentiles"]
    assert 0 < exact["p50_ms"] <= exact["p99_ms"] <= exact["max_ms"] < 2000
    assert not math.isnan(exact["write_p50_ms"])
    assert sum(step["hist"].values()) == step["answered"]
    assert step["watch_events"] > 0  # the writes fired the watches the reads set
    assert proc.returncode == 0
