"""Seeded chaos on real processes (``coordinator.testbed.chaos``), judged by the independent oracle.

Three fixed seeds, short runs (about a minute each): a three-server ZooKeeper ensemble (the plugin's
``zk_ensemble``), the simulator under a time scale, four agents, HAProxy with one app server per VM and a
steady load, a story of events and a seeded schedule of faults. Each run must end with no violation of
S1-S5; on failure the assertion shows every violation with its timeline.

These tests need java with ZooKeeper's jars and HAProxy: without them they fail, they never skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coordinator.testbed.chaos import ChaosConfig, plan, run_chaos
from coordinator.testbed.zookeeper import LocalEnsemble, find_classpath

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

SEEDS = (5, 8, 13)
CONFIG = ChaosConfig(duration=18.0)


@pytest.fixture(autouse=True)
def _real_components() -> None:
    """Fail (not skip) when a real component is missing: chaos on stand-ins proves nothing."""
    if shutil.which("java") is None:
        pytest.fail("java is required for the chaos runs (apt-get install zookeeper)", pytrace=False)
    try:
        find_classpath()
    except RuntimeError as exc:
        pytest.fail(f"ZooKeeper is required for the chaos runs: {exc}", pytrace=False)
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is required for the chaos runs (apt-get install haproxy)", pytrace=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_chaos_run_breaks_no_invariant(seed: int, zk_ensemble: LocalEnsemble, tmp_path: Path) -> None:
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line)

    result = run_chaos(seed, CONFIG, workdir=tmp_path / "run", say=say, ensemble=zk_ensemble)
    assert result.error is None, f"seed {seed}: the run could not be completed: {result.error}"
    verdict = result.verdict
    assert verdict is not None
    # The run did what it is for: events came and went, the load went through HAProxy.
    assert verdict.stats["events"] >= 5, verdict.stats
    assert verdict.stats["started_without_notice"] == 1, verdict.stats
    assert verdict.stats["requests"] > 10 * CONFIG.duration, verdict.stats
    assert verdict.ok, f"seed {seed}: the oracle found violations:\n{verdict.render(result.origin)}"
    # The plan is a function of the seed alone.
    assert [s.describe() for s in plan(seed, CONFIG)] == [s.describe() for s in result.steps]
