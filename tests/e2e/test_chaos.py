"""Seeded chaos on real processes (``tests.chaos``), judged by the independent oracle.

Three fixed seeds, short runs (about a minute each): a three-server ZooKeeper ensemble started by the run
with the tickTime its seed draws (500 ms for seed 3, 2000 ms for 28, 3000 ms for 22: at 3000 ms the
servers grant the agents 6 s sessions where they ask for 4 s), each agent reaching it through a link proxy
of its own, the simulator under a time scale, four agents, HAProxy with one app server per VM and a steady
load, a story of events and a seeded schedule of faults, link faults among them. Seeds 3 and 28 each cut a
VM's link for longer than its session, cut one briefly, delay one and make one lossy one way for a moment
(agent to ZooKeeper in 3, ZooKeeper to agent in 28); seed 22 loses everything from ZooKeeper to one agent
for 16.8 s, past its 6 s session plus the 4 s kazoo takes to give the silent connection up, while the
agent's own requests still reach the servers. Seed 3 runs once more across two placement groups (vm0,vm1 |
vm2,vm3, each VM seeing only its own unit's events), the agents told their unit. Each run must end with no
violation of S1-S5 and no unexplained liveness miss; on failure the assertion shows every violation with
its timeline.

These tests need java with ZooKeeper's jars and HAProxy: without them they fail, they never skip.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.testbed.zookeeper import find_classpath
from tests.chaos import ChaosConfig, plan, run_chaos
from tests.chaos.planning import LINK_FAULTS, delivery_layout, session_lapse_seconds, tick_time_ms

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

SEEDS = (3, 28, 22)
CONFIG = ChaosConfig(duration=18.0)


def test_the_seeds_cover_every_tick_a_cut_past_the_session_and_a_one_way_loss() -> None:
    """What the seeds are chosen for, from their plans alone (no process started)."""
    assert {tick_time_ms(seed, CONFIG) for seed in SEEDS} == set(CONFIG.tick_choices_ms)
    steps = [(seed, s) for seed in SEEDS for s in plan(seed, CONFIG) if s.kind in LINK_FAULTS]
    assert any(s.kind == "zk_link_cut" and s.seconds > session_lapse_seconds(CONFIG, tick_time_ms(seed, CONFIG))
               for seed, s in steps)
    assert any(s.kind == "zk_link_oneway" for _, s in steps)
    assert any(s.kind == "zk_link_delay" for _, s in steps)


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


@pytest.mark.parametrize(("seed", "config"), [
    *((seed, CONFIG) for seed in SEEDS),
    (3, replace(CONFIG, layout="two-units", tell_unit=True)),
], ids=[*(str(seed) for seed in SEEDS), "3-two-units"])
def test_a_seeded_chaos_run_breaks_no_invariant(seed: int, config: ChaosConfig, tmp_path: Path) -> None:
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line)

    result = run_chaos(seed, config, workdir=tmp_path / "run", say=say)
    assert result.layout == delivery_layout(seed, config).to_json()
    assert result.error is None, f"seed {seed}: the run could not be completed: {result.error}"
    assert result.tick_time_ms == tick_time_ms(seed, config)
    # The link faults of the plan were carried out (one at a time; none skipped for overlapping).
    planned = [s.kind for s in result.steps if s.kind in LINK_FAULTS]
    assert sum(result.faults.get(kind, 0) for kind in LINK_FAULTS) == len(planned), result.faults
    assert len(result.link_faults) == len(planned)
    verdict = result.verdict
    assert verdict is not None
    # The run did what it is for: events came and went, the load went through HAProxy.
    assert verdict.stats["events"] >= 5, verdict.stats
    assert verdict.stats["started_without_notice"] == 1, verdict.stats
    assert verdict.stats["requests"] > 10 * config.duration, verdict.stats
    assert verdict.ok, f"seed {seed}: the oracle found violations:\n{verdict.render(result.origin)}"
    # The plan is a function of the seed alone.
    assert [s.describe() for s in plan(seed, config)] == [s.describe() for s in result.steps]
