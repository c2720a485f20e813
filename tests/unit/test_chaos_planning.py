"""The chaos plan's link faults, tickTime and ARM faults, drawn from the seed alone
(``tests.chaos.planning``); the plans without ``--admin-state`` as they always were; the
group of an ``--admin-state`` run: its agents drain without an HAProxy action of their own, know HAProxy's
probe lag, and the harness plays ARM faults and stretches as the plan says; and the delivery layouts: drawn
from a stream of their own, every event of the story naming VMs of one unit, passed to the simulator and the
agents, and recorded in each run's result."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from azuresim import SimulatedGroup
from azuresim.azure.model import AzureModel
from azuresim.cli import add_arguments
from azuresim.layout import vm_infos
from azuresim.schema import ArmSettingsRequest, AzureFaultRequest, ThrottlingRequest
from coordinator.config import Settings
from coordinator.config.actions import AzureLbActionConfig
from coordinator.config.advice import drain_warnings
from coordinator.testbed.cluster import (
    HAPROXY_CHECK_FALL,
    HAPROXY_CHECK_INTERVAL_SECONDS,
    PROBE_LAG_SECONDS,
    AdminStateDrain,
    LocalCluster,
)
from coordinator.testbed.haproxy import LocalHAProxy
from tests.chaos import cli, processes
from tests.chaos.faults import FaultSteps, arm_fault_count_kind
from tests.chaos.planning import (
    ARM_FAULT_SECONDS,
    ARM_FAULTS,
    ARM_STRETCH_SECONDS,
    ARM_STRETCHES,
    LAYOUTS,
    LINK_FAULTS,
    ChaosConfig,
    Step,
    arm_linger_seconds,
    delivery_layout,
    describe_arm_fault,
    describe_arm_stretch,
    granted_session_ms,
    plan,
    session_lapse_seconds,
    tick_time_ms,
)
from tests.chaos.result import RunResult
from tests.chaos.state import Abort

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


# -- ARM at its worst in the plan (--admin-state) ----------------------------------------------------------------

# The plans without --admin-state, seeds 1-200, as they were before any ARM fault was planned: a digest of every
# step (time, kind, target, seconds, params, fallback, label) of the default run, a shorter one, one without
# link faults.
PLAIN_PLAN_DIGESTS = {
    ChaosConfig(): "3d1fa324dea2953afa7d5ba5345db1f91398eba6c2524143153a5b42fa5cd022",
    ChaosConfig(duration=18.0): "5962af5a778494675f8b536f425410a75d5312fbaa767a15e631e7543a5e070c",
    ChaosConfig(link_faults=False): "aa2b1dde6ec10b13810b86036c2702493d429f1eefc201ec219a22a1b569beef",
}


def plan_digest(config: ChaosConfig, seeds: range = range(1, 201)) -> str:
    digest = hashlib.sha256()
    for seed in seeds:
        for s in plan(seed, config):
            digest.update(json.dumps([seed, round(s.at, 9), s.kind, s.target, round(s.seconds, 9), s.params,
                                      s.fallback, s.label], sort_keys=True).encode())
    return digest.hexdigest()


@pytest.mark.parametrize("config", list(PLAIN_PLAN_DIGESTS))
def test_plans_without_admin_state_are_the_ones_they_always_were(config: ChaosConfig) -> None:
    assert plan_digest(config) == PLAIN_PLAN_DIGESTS[config]


def test_the_admin_state_plan_is_the_plain_one_and_arm_items_on_a_timeline_of_their_own() -> None:
    for config in PLAIN_PLAN_DIGESTS:
        admin_state = replace(config, admin_state=True)
        for seed in SEEDS:
            steps = plan(seed, admin_state)
            rest = [s for s in steps if s.kind not in ("arm_fault", "arm_stretch")]
            assert [(s.at, s.describe(), s.params) for s in rest] == [
                (s.at, s.describe(), s.params) for s in plan(seed, config)]
            assert len(rest) < len(steps)


def hostile_key(body: dict) -> tuple:  # type: ignore[type-arg]
    return (body["target"], body["kind"], body.get("status"), body.get("end"), "delay_seconds" in body)


def test_arm_faults_hold_every_kind_of_arm_at_its_worst() -> None:
    keys = {hostile_key(body) for body in ARM_FAULTS}
    assert {("arm", "lost_answer", None, None, False), ("arm", "lost_answer", None, None, True),
            ("arm", "status_after_apply", 502, None, False), ("arm", "status_after_apply", 504, None, False),
            ("arm", "slow_operation", None, None, False), ("arm", "operation_end", None, "Failed", False),
            ("arm", "operation_end", None, "Canceled", False), ("arm", "unreachable", None, None, False),
            ("arm", "stalled_write", None, None, False), ("token", "unreachable", None, None, False)} <= keys
    assert len({json.dumps(body, sort_keys=True) for body in ARM_FAULTS}) == len(ARM_FAULTS)  # no body twice


def test_the_hostile_faults_outlast_what_the_agents_give_arm() -> None:
    setup = AdminStateDrain()
    late = [b for b in ARM_FAULTS if b["kind"] == "lost_answer" and "delay_seconds" in b]
    assert late and all(b["delay_seconds"] > setup.timeout_seconds for b in late)  # a timeout after the fact
    slow = [b for b in ARM_FAULTS if b["kind"] == "slow_operation"]
    assert slow and all(b["seconds"] > setup.deadline_seconds for b in slow)  # the drain gives up, then it applies
    held = [b for b in ARM_FAULTS if b["kind"] == "stalled_write"]
    assert held and all(b["seconds"] > setup.deadline_seconds for b in held)  # it lands after the action gave up
    assert all(arm_linger_seconds(b) == b["seconds"] for b in slow + held)
    assert all(arm_linger_seconds(b) == 0.0 for b in ARM_FAULTS if b["kind"] not in ("slow_operation", "stalled_write"))


def test_every_arm_fault_and_stretch_is_one_the_simulator_takes() -> None:
    azure = AzureModel(["vm0"])
    for body in ARM_FAULTS:
        fields = AzureFaultRequest.model_validate(body).model_dump(exclude_unset=True)
        azure.add_fault(**fields)
    assert len(azure.faults()) == len(ARM_FAULTS)
    assert {s["name"] for s in ARM_STRETCHES} == {"conflict_while_updating", "throttling"}
    for stretch in ARM_STRETCHES:
        if stretch["path"] == "/arm/settings":
            assert azure.configure(**ArmSettingsRequest.model_validate(stretch["on"]).model_dump(exclude_none=True))[
                "conflict_while_updating"] is True
            assert azure.configure(**ArmSettingsRequest.model_validate(stretch["off"]).model_dump(exclude_none=True))[
                "conflict_while_updating"] is False
        else:
            assert stretch["path"] == "/arm/throttling"
            on = azure.set_throttling(**ThrottlingRequest.model_validate(stretch["on"]).model_dump())
            assert on["enabled"] and on["write_capacity"] == 1 and on["read_capacity"] == 4
            assert not azure.set_throttling(**ThrottlingRequest.model_validate(stretch["off"]).model_dump())["enabled"]


def test_arm_stretches_and_faults_one_at_a_time_a_slow_operation_holding_arm_until_it_is_over() -> None:
    stretches, windows = [], []
    for duration in (18.0, 30.0):
        config = ChaosConfig(duration=duration, admin_state=True)
        for seed in SEEDS:
            steps = [s for s in plan(seed, config) if s.kind in ("arm_fault", "arm_stretch")]
            if duration == 30.0:  # the first two fit in a default run: a fault and a stretch
                assert {s.kind for s in steps[:2]} == {"arm_fault", "arm_stretch"}, seed
            assert any(s.kind == "arm_fault" for s in steps), seed
            for step in steps:
                assert 0 < step.at < duration and step.target in ("arm", "token")
                if step.kind == "arm_stretch":
                    assert ARM_STRETCH_SECONDS[0] <= step.seconds <= ARM_STRETCH_SECONDS[1]
                    assert step.params["stretch"] in ARM_STRETCHES and step.target == "arm"
                    stretches.append(step.params["stretch"]["name"])
                    assert step.describe().endswith(", then undone")
                else:
                    assert step.params.get("expire_tokens", False) == (step.target == "token")
                windows.append(step)
            for before, after in itertools.pairwise(steps):
                linger = arm_linger_seconds(before.params["body"]) if before.kind == "arm_fault" else 0.0
                assert before.at + before.seconds + linger < after.at, (seed, before, after)
    assert set(stretches) == {s["name"] for s in ARM_STRETCHES}
    assert any(s.params.get("body", {}).get("kind") == "slow_operation" for s in windows)


def test_arm_stretches_and_token_expiry_are_described_in_the_plan() -> None:
    throttling = next(s for s in ARM_STRETCHES if s["name"] == "throttling")
    assert describe_arm_stretch(throttling) == ("throttling on (POST /arm/throttling write_capacity=1 write_refill=0.2 "
                                                "read_capacity=4 read_refill=1.0)")
    texts = [s.describe() for seed in SEEDS for s in plan(seed, ChaosConfig(admin_state=True))]
    assert any(t.startswith("ARM conflict_while_updating on (POST /arm/settings") for t in texts)
    assert any(t.startswith("ARM fault on token: unreachable (3 request(s)) (then every token expired) for ")
               for t in texts)
    assert describe_arm_fault({"target": "arm", "kind": "operation_end", "end": "Canceled", "count": 1}) == (
        "on arm: operation_end end=Canceled (1 request(s))")
    assert arm_fault_count_kind({"target": "arm", "kind": "operation_end", "end": "Canceled"}) == (
        "arm_operation_end_Canceled")
    assert arm_fault_count_kind({"target": "token", "kind": "unreachable", "count": 3}) == "token_unreachable"
    assert arm_fault_count_kind({"target": "arm", "kind": "status_after_apply", "status": 504}) == (
        "arm_status_after_apply_504")


# -- the group of an --admin-state run ------------------------------------------------------------------------


class _Ensemble:
    tick_time_ms = 2000
    hosts = "127.0.0.1:2181"


def _cluster_built(config: ChaosConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:  # type: ignore[type-arg]
    """The keyword arguments the harness gives ``LocalCluster`` for ``config`` (the cluster is not started)."""
    built: list[dict] = []  # type: ignore[type-arg]

    class Cluster:
        def __init__(self, *args: object, **kwargs: object) -> None:
            built.append(kwargs)

        def start(self) -> None:
            raise RuntimeError("not here")

    monkeypatch.setattr(processes, "LocalCluster", Cluster)
    run = processes.RunProcesses(1, config, tmp_path, lambda _: None, ensemble=_Ensemble())  # type: ignore[arg-type]
    with pytest.raises(Abort):
        run._start()
    return built[-1]


def test_admin_state_runs_drain_without_an_haproxy_action_of_their_own(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for admin_state in (False, True):
        built = _cluster_built(ChaosConfig(admin_state=admin_state, link_faults=False), tmp_path, monkeypatch)
        assert built["haproxy_action"] is not admin_state
        assert (built["admin_state"] is not None) is admin_state


def test_the_agents_are_told_haproxys_probe_lag_and_the_fallback_covers_it(tmp_path: Path) -> None:
    assert f"inter {HAPROXY_CHECK_INTERVAL_SECONDS * 1000:g}ms fall {HAPROXY_CHECK_FALL} " in LocalHAProxy(
        tmp_path, {}, check_interval=f"{HAPROXY_CHECK_INTERVAL_SECONDS * 1000:g}ms").render()

    class Sim:
        def add_pool(self, pool_id: str, addresses: list) -> None:  # type: ignore[type-arg]
            pass

    setup = AdminStateDrain()
    cluster = LocalCluster(tmp_path, ["vm0"], zk_hosts="127.0.0.1:2181", drain_wait=ChaosConfig().drain_wait,
                           with_haproxy=True, haproxy_action=False, admin_state=setup)
    cluster.imds_urls, cluster.arm_url, cluster.sim = {"vm0": "http://127.0.0.1:1"}, "http://127.0.0.1:2", Sim()  # type: ignore[assignment]
    cluster._attach_admin_state(setup)
    settings = Settings.model_validate(cluster.agent_config("vm0", 1, 2))
    drain = settings.drain
    assert drain.probe_interval_seconds * drain.probe_threshold == PROBE_LAG_SECONDS
    assert drain_warnings(settings) == []  # the fallback wait covers the lag, and the warning knows it
    assert [a.type for a in settings.actions] == ["azure-lb"]
    (action,) = settings.actions
    assert isinstance(action, AzureLbActionConfig)
    assert (action.timeout_seconds, action.deadline_seconds) == (setup.timeout_seconds, setup.deadline_seconds)
    with pytest.raises(ValueError, match="probe lag"):
        LocalCluster(tmp_path, ["vm0"], with_haproxy=True, admin_state=AdminStateDrain(fallback_wait=0.5))
    LocalCluster(tmp_path, ["vm0"], admin_state=AdminStateDrain(fallback_wait=0.5))  # no HAProxy, no lag
    plain = LocalCluster(tmp_path, ["vm0"], zk_hosts="127.0.0.1:2181")
    plain.imds_urls = {"vm0": "http://127.0.0.1:1"}
    assert "probe_interval_seconds" not in plain.agent_config("vm0", 1, 2)["drain"]  # no load balancer to match


class _Answer:
    def __init__(self, body: dict) -> None:  # type: ignore[type-arg]
        self.status_code, self._body, self.text, self.is_error = 200, body, "", False

    def json(self) -> dict:  # type: ignore[type-arg]
        return self._body


class _Control:
    """The simulator's control API as the harness's ARM client sees it: every call kept, every answer 200."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []
        self.answers = [{"pool_get 200": 1}, {"pool_get 200": 1, "token dropped": 3, "pool_put 200": 2}]

    def get(self, url: str) -> _Answer:  # GET /arm/calls: what ARM answered so far, more each time
        return _Answer({"statuses": self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]})

    def post(self, url: str, json: object = None) -> _Answer:
        self.calls.append(("POST", url.removeprefix("http://sim"), json))
        return _Answer({"expired": 4} if url.endswith("expire-tokens") else {})

    def delete(self, url: str) -> _Answer:
        self.calls.append(("DELETE", url.removeprefix("http://sim"), None))
        return _Answer({"cleared": 1})

    def close(self) -> None:
        pass


def playing(tmp_path: Path) -> tuple[FaultSteps, _Control]:
    run = FaultSteps(1, ChaosConfig(admin_state=True, link_faults=False), tmp_path, lambda _: None,
                     ensemble=_Ensemble())  # type: ignore[arg-type]
    control = _Control()
    run._arm_http = control  # type: ignore[assignment]
    run.cluster = SimpleNamespace(sim=SimpleNamespace(url="http://sim"))  # type: ignore[assignment]
    return run, control


def test_the_harness_plays_an_arm_stretch_and_undoes_it_recorded_as_an_arm_fault(tmp_path: Path) -> None:
    run, control = playing(tmp_path)
    throttling = next(s for s in ARM_STRETCHES if s["name"] == "throttling")
    run._arm_stretch(Step(1.0, "arm_stretch", "arm", 0.0, params={"stretch": throttling}))
    assert control.calls == [("POST", "/arm/throttling", throttling["on"]),
                             ("POST", "/arm/throttling", {"enabled": False})]
    assert [(r.kind, r.target) for r in run.harness] == [("arm_fault", "arm"), ("arm_fault_heal", "arm")]
    assert run.harness[0].detail.startswith("throttling on (POST /arm/throttling write_capacity=1")
    assert run.harness[1].detail == ("throttling undone at the end of its window; ARM answered meanwhile: "
                                     "pool_put 200 x2, token dropped x3")
    assert run.faults == {"arm_throttling": 1}
    assert run.arm_faults[0]["stretch"] == "throttling" and run.arm_faults[0]["on"] == throttling["on"]


def test_the_harness_expires_tokens_before_a_token_fault_and_holds_arm_while_a_slow_operation_lasts(
        tmp_path: Path) -> None:
    run, control = playing(tmp_path)
    token = {"target": "token", "kind": "unreachable", "count": 3}
    run._arm_fault(Step(1.0, "arm_fault", "token", 0.0, params={"body": token, "expire_tokens": True}))
    # The fault first, then every token expired: each agent's next token request meets it.
    assert control.calls == [("POST", "/arm/faults", token), ("POST", "/identities/expire-tokens", None),
                             ("DELETE", "/arm/faults", None)]
    assert "then every token expired (4)" in run.harness[0].detail
    assert run.faults == {"token_unreachable": 1} and run.arm_faults[0]["tokens_expired"] == 4
    # What ARM answered while it was queued: whether an agent met it.
    assert run.arm_faults[0]["answered"] == {"token dropped": 3, "pool_put 200": 2}
    assert run.harness[1].detail.endswith("ARM answered meanwhile: pool_put 200 x2, token dropped x3")
    slow = {"target": "arm", "kind": "slow_operation", "seconds": 0.2, "count": 1}
    began = time.monotonic()
    run._arm_fault(Step(2.0, "arm_fault", "arm", 0.0, params={"body": slow}))
    assert time.monotonic() - began >= 0.2  # the heal is recorded once the slowed operation is over
    heals = [r for r in run.harness if r.kind == "arm_fault_heal"]
    assert len(heals) == 2 and "the operations it slowed are over 0.2s later" in heals[-1].detail
    assert heals[-1].t - run.harness[-2].t >= 0.2
    assert run.arm_faults[-1]["linger_seconds"] == 0.2


# -- delivery layouts -------------------------------------------------------------------------------------------


def story(seed: int, config: ChaosConfig) -> list[Step]:
    return [s for s in plan(seed, config) if s.kind in ("event", "cancel")]


def test_each_layout_has_its_units_and_delivery_and_mixed_draws_them_all_from_the_seed() -> None:
    one, named, two = (delivery_layout(1, ChaosConfig(layout=name)) for name in LAYOUTS)
    assert (one.units, one.delivery) == ((("pg0", ("vm0", "vm1", "vm2", "vm3")),), "unit")
    assert (named.units, named.delivery) == ((("pg0", ("vm0", "vm1", "vm2", "vm3")),), "named")
    assert (two.units, two.delivery) == ((("pg0", ("vm0", "vm1")), ("pg1", ("vm2", "vm3"))), "unit")
    assert two.vm_units() == {"vm0": "pg0", "vm1": "pg0", "vm2": "pg1", "vm3": "pg1"}
    assert delivery_layout(1, ChaosConfig(vms=("vm0", "vm1", "vm2"), layout="two-units")).units == (
        ("pg0", ("vm0", "vm1")), ("pg1", ("vm2",)))
    assert not one.told  # ChaosConfig() is the run as it always was: agents at their default delivery
    mixed = ChaosConfig(layout="mixed", tell_unit=None)
    drawn = [delivery_layout(seed, mixed) for seed in SEEDS]
    assert {(d.name, d.told) for d in drawn} == {(name, told) for name in LAYOUTS for told in (True, False)}
    assert [(d.name, d.told) for d in drawn] == [(d.name, d.told) for d in (delivery_layout(s, mixed) for s in SEEDS)]
    # Each draw is independent of the other's setting: a fixed telling leaves the layout drawn as it was.
    for seed, layout in zip(SEEDS, drawn, strict=True):
        assert delivery_layout(seed, replace(mixed, tell_unit=True)).name == layout.name
        assert delivery_layout(seed, replace(mixed, layout="named")).told == layout.told
    with pytest.raises(ValueError, match="layout must be one of"):
        ChaosConfig(layout="three-units")


def test_the_plan_of_a_seed_is_the_one_unit_plan_in_every_layout_but_for_the_vms_two_units_keep_apart() -> None:
    for config in (ChaosConfig(), ChaosConfig(duration=18.0), ChaosConfig(vms=("vm0", "vm1", "vm2"))):
        swapped = 0
        for seed in SEEDS:
            base = plan(seed, config)
            # One unit: the very same plan. Mixed: the plan of the layout it draws.
            assert [(s.at, s.describe(), s.params) for s in plan(seed, replace(config, layout="named"))] == [
                (s.at, s.describe(), s.params) for s in base]
            mixed = replace(config, layout="mixed")
            drawn = replace(config, layout=delivery_layout(seed, mixed).name)
            assert [(s.at, s.describe(), s.params) for s in plan(seed, mixed)] == [
                (s.at, s.describe(), s.params) for s in plan(seed, drawn)]
            two = plan(seed, replace(config, layout="two-units"))
            assert [(s.at, s.kind, s.target, s.seconds, s.fallback, s.label) for s in two] == [
                (s.at, s.kind, s.target, s.seconds, s.fallback, s.label) for s in base]
            swapped += sum(a.params != b.params for a, b in zip(base, two, strict=True))
            for step, was in zip(two, base, strict=True):
                if step.params != was.params:  # only the VMs an event names
                    assert {k: v for k, v in step.params.items() if k != "resources"} == {
                        k: v for k, v in was.params.items() if k != "resources"}
        assert swapped > 0


@pytest.mark.parametrize("layout", [*LAYOUTS, "mixed"])
def test_every_event_of_the_story_names_vms_of_one_unit_and_the_simulator_takes_it(layout: str) -> None:
    for vms in (("vm0", "vm1", "vm2", "vm3"), ("vm0", "vm1", "vm2"), tuple(f"vm{i}" for i in range(6))):
        config = ChaosConfig(vms=vms, layout=layout, tell_unit=None)
        for seed in SEEDS:
            resolved = delivery_layout(seed, config)
            parser = argparse.ArgumentParser(exit_on_error=False)
            add_arguments(parser)
            args = parser.parse_args(resolved.sim_args())
            infos = vm_infos(args, list(vms))
            assert {i.name: i.unit for i in infos} == resolved.vm_units()
            group = SimulatedGroup(infos, clock=lambda: 1_700_000_000.0, delivery=args.delivery)
            steps = story(seed, config)
            freezes = [s for s in steps if s.label in ("freeze-two", "freeze-late")]
            assert [len(set(s.params["resources"])) for s in freezes] == [2, 2], seed
            reboot = next(s for s in steps if s.label == "reboot")
            assert reboot.params["resources"][0] not in freezes[0].params["resources"]
            for step in steps:  # the simulator refuses an event naming VMs of two units
                fields = {k: v for k, v in step.params.items() if k not in ("event_type", "resources")}
                group.schedule(step.params["event_type"], step.params["resources"], **fields)
                assert len({resolved.unit_of(vm) for vm in step.params["resources"]}) == 1


def test_the_harness_gives_the_simulator_the_layout_and_tells_the_agents_when_the_layout_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def started(config: ChaosConfig) -> dict:  # type: ignore[type-arg]
        return _cluster_built(config, tmp_path, monkeypatch)

    two = started(ChaosConfig(layout="two-units", tell_unit=True, link_faults=False))
    args = two["sim_args"]
    assert args[args.index("--units") + 1] == "pg0=vm0,vm1/pg1=vm2,vm3"
    assert args[args.index("--delivery") + 1] == "unit"
    assert args[:4] == ["--time-scale", "40", "--not-before-clock", "real"]
    assert two["per_vm_config"]["vm1"]["imds"] == {"unit": "pg0", "delivery": "unit"}
    assert two["per_vm_config"]["vm3"]["imds"] == {"unit": "pg1", "delivery": "unit"}
    named = started(ChaosConfig(layout="named", tell_unit=True))
    assert named["sim_args"][named["sim_args"].index("--delivery") + 1] == "named"
    # Told, beside the agent's own link to ZooKeeper: both sections merged into its configuration.
    assert named["per_vm_config"]["vm2"]["imds"] == {"unit": "pg0", "delivery": "named"}
    assert set(named["per_vm_config"]["vm2"]) == {"zookeeper", "imds"}
    untold = started(ChaosConfig(layout="two-units", tell_unit=False))
    assert "--units" in untold["sim_args"]
    assert all("imds" not in section for section in untold["per_vm_config"].values())


def test_a_harness_whose_simulator_holds_another_layout_stops_the_run(tmp_path: Path) -> None:
    class Sim:
        def __init__(self, served: dict) -> None:  # type: ignore[type-arg]
            self.served = served

        def vms(self) -> dict:  # type: ignore[type-arg]
            return self.served

    run = processes.RunProcesses(1, ChaosConfig(layout="two-units"), tmp_path, lambda _: None,
                                 ensemble=_Ensemble())  # type: ignore[arg-type]
    good = {"delivery": "unit", "vms": [{"name": vm, "unit": "pg0" if vm in ("vm0", "vm1") else "pg1"}
                                        for vm in ("vm0", "vm1", "vm2", "vm3")]}
    run.cluster = SimpleNamespace(sim=Sim(good))  # type: ignore[assignment]
    run._check_layout()
    run.cluster = SimpleNamespace(sim=Sim({**good, "delivery": "named"}))  # type: ignore[assignment]
    with pytest.raises(Abort, match="is not the run's"):
        run._check_layout()
    one_unit = {"delivery": "unit", "vms": [{"name": vm, "unit": ""} for vm in ("vm0", "vm1", "vm2", "vm3")]}
    run.cluster = SimpleNamespace(sim=Sim(one_unit))  # type: ignore[assignment]
    with pytest.raises(Abort):
        run._check_layout()


def test_each_runs_result_and_the_long_runs_file_say_its_layout() -> None:
    layout = delivery_layout(3, ChaosConfig(layout="two-units", tell_unit=True))
    body = RunResult(3, [], 0.0, 1.0, None, layout=layout.to_json()).to_json()
    assert body["layout"] == {"name": "two-units", "units": {"pg0": ["vm0", "vm1"], "pg1": ["vm2", "vm3"]},
                              "delivery": "unit", "told": True}
    assert json.loads(json.dumps(body))["layout"] == body["layout"]


def test_the_command_line_takes_the_layout_and_plays_mixed_by_default(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    played: list[ChaosConfig] = []

    def run_chaos(seed: int, config: ChaosConfig, **kwargs: object) -> RunResult:
        played.append(config)
        return RunResult(seed, [], 0.0, 1.0, None, error="not here",
                         layout=delivery_layout(seed, config).to_json())

    monkeypatch.setattr(cli, "_check_prerequisites", lambda: None)
    monkeypatch.setattr(cli, "run_chaos", run_chaos)
    cli.main(["--seed", "1", "--json", str(tmp_path / "a.json")])
    assert (played[-1].layout, played[-1].tell_unit) == ("mixed", None)
    written = json.loads((tmp_path / "a.json").read_text())
    assert written["config"]["layout"] == "mixed" and written["config"]["tell_unit"] is None
    assert written["results"][0]["layout"]["name"] == delivery_layout(1, played[-1]).name
    assert sum(written["runs_by_layout"].values()) == 1
    cli.main(["--seed", "1", "--layout", "two-units", "--tell-unit", "yes"])
    assert (played[-1].layout, played[-1].tell_unit) == ("two-units", True)
    with pytest.raises(SystemExit):
        cli.main(["--seed", "1", "--layout", "three-units"])
