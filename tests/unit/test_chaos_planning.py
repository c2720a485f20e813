"""The chaos plan's link faults and tickTime, drawn from the seed alone (``coordinator.testbed.chaos.planning``)."""

from __future__ import annotations

import itertools

import pytest

from coordinator.testbed.chaos.planning import (
    ARM_FAULT_SECONDS,
    ARM_FAULTS,
    LINK_FAULTS,
    ChaosConfig,
    describe_arm_fault,
    granted_session_ms,
    plan,
    session_lapse_seconds,
    tick_time_ms,
)

SEEDS = range(1, 61)


def link_steps(seed: int, config: ChaosConfig) -> list:  # type: ignore[type-arg]
    return [s for s in plan(seed, config) if s.kind in LINK_FAULTS]


def test_the_plan_and_the_tick_are_functions_of_the_seed() -> None:
    config = ChaosConfig(duration=18.0)
    for seed in (1, 5, 8, 13):
        assert [s.describe() for s in plan(seed, config)] == [s.describe() for s in plan(seed, config)]
        assert tick_time_ms(seed, config) == tick_time_ms(seed, config)
    assert {tick_time_ms(seed) for seed in SEEDS} == {500, 2000, 3000}
    assert tick_time_ms(7, ChaosConfig(tick_time_ms=1000)) == 1000


@pytest.mark.parametrize(("tick", "granted"), [(500, 4000), (2000, 4000), (3000, 6000), (40_000, 60_000)])
def test_the_session_granted_follows_zookeepers_bounds(tick: int, granted: int) -> None:
    # Asked 4 s: raised to 2 x tickTime, lowered to maxSessionTimeout.
    assert granted_session_ms(ChaosConfig(), tick) == granted
    assert session_lapse_seconds(ChaosConfig(), tick) == (granted + tick) / 1000.0


def test_every_default_plan_has_link_faults_one_at_a_time_within_the_window() -> None:
    for duration in (18.0, 30.0):
        config = ChaosConfig(duration=duration)
        for seed in SEEDS:
            steps = link_steps(seed, config)
            assert steps, seed
            for step in steps:
                assert 0 < step.at < duration
                assert step.target in (*config.vms, "named")
                assert step.target != "named" or step.fallback in config.vms
            for before, after in itertools.pairwise(steps):
                assert before.at + before.seconds < after.at, (seed, before, after)


def test_link_faults_meant_to_outlast_a_session_outlast_what_the_server_grants() -> None:
    config = ChaosConfig(duration=30.0)
    long_cuts = 0
    for seed in SEEDS:
        lapse = session_lapse_seconds(config, tick_time_ms(seed, config))
        for step in link_steps(seed, config):
            if step.params["past_session"]:
                assert step.seconds > lapse + 0.99
                assert step.target == "named"  # cut off while an event names it, when one does
                long_cuts += step.kind == "zk_link_cut"
            elif step.kind != "zk_link_delay":
                assert step.seconds < config.session_timeout
    assert long_cuts >= len(SEEDS) * 0.8  # the mandatory long cut fits in most windows


def test_no_zookeeper_server_fault_lets_a_session_outlive_a_long_cut() -> None:
    """A new ZooKeeper leader gives every session a fresh timeout: no server goes down from shortly after
    the previous server fault (its restart and election) until the cut agent's session can have expired."""
    for duration in (18.0, 30.0):
        config = ChaosConfig(duration=duration)
        for seed in SEEDS:
            lapse = session_lapse_seconds(config, tick_time_ms(seed, config))
            steps = plan(seed, config)
            servers = [s for s in steps if s.kind == "zk_down"]
            for cut in (s for s in steps if s.kind in LINK_FAULTS and s.params["past_session"]):
                for down in servers:
                    assert cut.params["lapse"] >= lapse - 0.01
                    before = down.at + down.seconds + 6.0 <= cut.at + 1e-9
                    after = down.at >= cut.at + cut.params["lapse"] + 0.5
                    assert before or after, (seed, cut.describe(), down.describe())


def test_every_link_fault_kind_and_direction_is_drawn() -> None:
    seen = set()
    for seed in SEEDS:
        for step in link_steps(seed, ChaosConfig()):
            seen.add((step.kind, step.params.get("direction"), step.params["past_session"]))
    assert {("zk_link_cut", None, True), ("zk_link_cut", None, False), ("zk_link_delay", None, False),
            ("zk_link_oneway", "up", True), ("zk_link_oneway", "down", True), ("zk_link_oneway", "up", False),
            ("zk_link_oneway", "down", False)} <= seen


def test_link_faults_can_be_left_out() -> None:
    assert not any(link_steps(seed, ChaosConfig(link_faults=False)) for seed in SEEDS)


def test_link_faults_are_described_in_the_plan() -> None:
    texts = [s.describe() for seed in SEEDS for s in link_steps(seed, ChaosConfig())]
    assert any("cut the ZooKeeper link of a VM an event names" in t and "(longer than the session)" in t
               for t in texts)
    assert any(t.startswith("one-way loss (agent to ZooKeeper)") for t in texts)
    assert any(t.startswith("one-way loss (ZooKeeper to agent)") for t in texts)
    assert any(t.startswith("delay ") and " ms each way on the ZooKeeper link of " in t for t in texts)


# -- ARM faults (--admin-state) ---------------------------------------------------------------------------------


def arm_steps(seed: int, config: ChaosConfig) -> list:  # type: ignore[type-arg]
    return [s for s in plan(seed, config) if s.kind == "arm_fault"]


def test_arm_faults_only_with_admin_state() -> None:
    assert not any(arm_steps(seed, ChaosConfig()) for seed in SEEDS)
    config = ChaosConfig(admin_state=True)
    assert all(arm_steps(seed, config) for seed in SEEDS)
    assert [s.describe() for s in plan(7, config)] == [s.describe() for s in plan(7, config)]


def test_every_arm_fault_carries_a_body_of_the_list_one_at_a_time_within_the_window() -> None:
    drawn = []
    for duration in (18.0, 30.0):
        config = ChaosConfig(duration=duration, admin_state=True)
        for seed in SEEDS:
            steps = arm_steps(seed, config)
            for step in steps:
                assert 0 < step.at < duration
                assert ARM_FAULT_SECONDS[0] <= step.seconds <= ARM_FAULT_SECONDS[1]
                assert step.params["body"] in ARM_FAULTS and step.target == step.params["body"]["target"]
                drawn.append(step.params["body"])
            for before, after in itertools.pairwise(steps):
                assert before.at + before.seconds < after.at, (seed, before, after)
    assert all(body in drawn for body in ARM_FAULTS)  # each body of the list is drawn by some seed
    body = arm_steps(1, ChaosConfig(admin_state=True))[0].params["body"]
    assert all(body is not listed for listed in ARM_FAULTS)  # a copy: the step's body is the step's own


def test_arm_faults_are_described_in_the_plan() -> None:
    assert describe_arm_fault({"target": "arm", "kind": "status", "status": 503, "count": None,
                               "methods": ["PUT"]}) == "on arm: status 503 (every request, PUT)"
    assert describe_arm_fault({"target": "arm", "kind": "status", "status": 429, "retry_after": 1, "count": 3}) == (
        "on arm: status 429 Retry-After 1 (3 request(s))")
    # A kind the simulator learns later, with fields of its own, reads as well.
    assert describe_arm_fault({"target": "arm", "kind": "slow_operation", "seconds": 4, "count": 1}) == (
        "on arm: slow_operation seconds=4 (1 request(s))")
    texts = [s.describe() for seed in SEEDS for s in arm_steps(seed, ChaosConfig(admin_state=True))]
    assert all(t.startswith("ARM fault on ") and t.endswith(", then cleared") for t in texts)
