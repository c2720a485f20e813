"""The application health signal for automatic repairs: the decision (a table), the sampling of a running
agent across its recovery retries, the answer's format, and its configuration."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.actions import ActionContext, ProbeAction
from coordinator.actions.probe import ProbeState
from coordinator.agent import Agent
from coordinator.apphealth import AppHealth, Observed, State, Verdict, body, decide, reason_header
from coordinator.config import load_settings
from coordinator.decide import Policy
from coordinator.errors import ActionError, ConfigError
from coordinator.httpserver import APP_HEALTH_REASON_HEADER, HttpSurface, ListenError
from coordinator.metrics import Metrics
from coordinator.models import format_not_before, parse_document
from coordinator.state import StateFile
from tests.doubles import Clock as AgentClock
from tests.doubles import InlineExecutor, StaticImds
from tests.fakezk_group import lone_store

STUCK = 600.0
FAILING = 1800.0
H, U = State.HEALTHY, State.UNHEALTHY

# (what the agent shows, recover_failing_after, expected state, a word of the reason)
TABLE: list[tuple[Observed, float | None, State, str]] = [
    # Starting: the loop does not exist yet (IMDS may be unreachable: no fault of this VM).
    (Observed(running=False), FAILING, H, "starting"),
    # Serving, and every phase of planned maintenance, are healthy, however long they last.
    (Observed(running=True, since_cycle=1, phase="serving"), FAILING, H, "serving"),
    (Observed(running=True, since_cycle=1, phase="unknown"), FAILING, H, "unknown"),
    (Observed(running=True, since_cycle=1, phase="draining"), FAILING, H, "planned maintenance"),
    (Observed(running=True, since_cycle=1, phase="drained"), FAILING, H, "planned maintenance"),
    # A drain that failed keeps the VM out until the event is gone: maintenance, not a repair.
    (Observed(running=True, since_cycle=1, phase="draining", error="drain failed: hook exited 1"), FAILING, H,
     "planned maintenance"),
    (Observed(running=True, since_cycle=1, phase="recovering"), FAILING, H, "recovering"),
    # A cycle completes even when ZooKeeper and IMDS are unreachable: a slow loop below the bound is healthy.
    (Observed(running=True, since_cycle=STUCK - 1, phase="drained"), FAILING, H, "planned maintenance"),
    # Stuck: no cycle for the bound, whatever the phase (the phase it shows is stale).
    (Observed(running=True, since_cycle=STUCK, phase="serving"), FAILING, U, "stuck"),
    (Observed(running=True, since_cycle=STUCK + 5, phase="drained"), FAILING, U, "stuck"),
    # Recovery failing after the event is gone: healthy until the bound, then unhealthy.
    (Observed(running=True, phase="recovering", recover_failing_for=FAILING - 1, error="recover failed: x"),
     FAILING, H, "retried"),
    (Observed(running=True, phase="recovering", recover_failing_for=FAILING, error="recover failed: x"),
     FAILING, U, "recover failed: x"),
    # ... and never, when that check is off.
    (Observed(running=True, phase="recovering", recover_failing_for=10 * FAILING, error="recover failed: x"),
     None, H, "retried"),
]


@pytest.mark.parametrize(("observed", "failing_after", "state", "word"), TABLE)
def test_decide(observed: Observed, failing_after: float | None, state: State, word: str) -> None:
    verdict = decide(observed, stuck_after=STUCK, recover_failing_after=failing_after)
    assert verdict.state is state, verdict
    assert word in verdict.reason


def test_body_is_exactly_the_documented_json() -> None:
    assert json.loads(body(Verdict(H, "x"))) == {"ApplicationHealthState": "Healthy"}
    assert json.loads(body(Verdict(U, "x"))) == {"ApplicationHealthState": "Unhealthy"}


def test_reason_header_is_printable_ascii_and_bounded() -> None:
    header = reason_header(Verdict(U, "recover failed: line one\r\nX-Injected: 1\u00e9" + "y" * 500))
    assert "\r" not in header and "\n" not in header and header.isascii() and header.isprintable()
    assert len(header) == 200


class FakeAgent:
    def __init__(self) -> None:
        self.since = 0.5
        self.phase = "serving"
        self.error: str | None = None

    def since_last_cycle(self) -> float:
        return self.since

    def status(self) -> dict[str, Any]:
        return {"phase": self.phase, "action_error": self.error}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failing_recovery_is_timed_across_retries_and_reset_when_it_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    agent, clock = FakeAgent(), Clock()
    health = AppHealth(lambda: agent, stuck_after=STUCK, recover_failing_after=60, clock=clock)
    assert health.verdict().state is H

    agent.phase, agent.error = "drained", None
    clock.now += 3600  # drained for an hour: still healthy
    assert health.verdict().state is H

    agent.phase, agent.error = "recovering", "recover failed: hook exited 1"
    assert health.verdict().state is H  # first seen now
    clock.now += 59
    agent.error = "recover failed: hook exited 2"  # a retry failed again: the same failing streak
    assert health.verdict().state is H
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="coordinator.apphealth"):
        verdict = health.verdict()
    assert verdict.state is U and "hook exited 2" in verdict.reason
    assert "Unhealthy" in caplog.text

    agent.error = None  # the retry succeeded
    assert health.verdict().state is H
    agent.error = "recover failed: again"  # a new streak starts from zero
    clock.now += 30
    assert health.verdict().state is H


def test_a_new_event_while_recovery_fails_resets_the_streak() -> None:
    agent, clock = FakeAgent(), Clock()
    health = AppHealth(lambda: agent, stuck_after=STUCK, recover_failing_after=60, clock=clock)
    agent.phase, agent.error = "recovering", "recover failed: x"
    assert health.verdict().state is H
    clock.now += 30
    agent.phase = "draining"  # held for a new event: the error stays until that drain ends
    assert health.verdict().state is H
    clock.now += 300
    assert health.verdict().state is H
    agent.phase = "recovering"
    clock.now += 30
    assert health.verdict().state is H  # 30 s into a new streak, not 360


def test_stuck_loop_and_starting_agent() -> None:
    agent, clock = FakeAgent(), Clock()
    current: list[FakeAgent] = []
    health = AppHealth(lambda: current[0] if current else None, stuck_after=STUCK, recover_failing_after=None,
                       clock=clock)
    assert health.verdict().reason.startswith("starting")
    current.append(agent)
    agent.since = STUCK + 1
    assert health.verdict().state is U


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"cluster": "web", **data}))
    return path


def test_defaults(tmp_path: Path) -> None:
    health = load_settings(write(tmp_path, {}), environ={}).app_health
    assert health.listen is None  # served on http.listen (loopback) only
    assert health.path == "/apphealth"
    assert health.stuck_after_seconds == 600
    assert health.recover_failing_after_seconds == 1800


@pytest.mark.parametrize(("section", "message"), [
    ({"app_health": {"listen": "10.0.1.4:9111"}}, "app_health.listen: the extension asks http://localhost:PORT"),
    ({"app_health": {"listen": "nope"}}, "app_health.listen: expected HOST:PORT"),
    ({"app_health": {"path": "apphealth"}}, "app_health.path: must be a URL path starting with /"),
    ({"app_health": {"path": "/apphealth?x=1"}}, "app_health.path: must be a URL path"),
    ({"app_health": {"path": "/readyz"}}, "app_health.path: /readyz is an admin endpoint"),
    ({"app_health": {"path": "/health"}}, "app_health.path and probe.path must differ"),
    ({"app_health": {"stuck_after_seconds": 30}}, "app_health.stuck_after_seconds: Input should be greater than or "
                                                  "equal to 60"),
    ({"app_health": {"stuck_after_seconds": 90}, "imds": {"poll_interval": 20, "backoff_max_seconds": 20},
      "zookeeper": {"session_timeout": 60}}, "app_health.stuck_after_seconds (90) must be at least three idle cycles"),
    ({"app_health": {"recover_failing_after_seconds": 0}}, "app_health.recover_failing_after_seconds: Input should "
                                                           "be greater than 0"),
    ({"app_health": {"listen": "0.0.0.0:8090"}}, "app_health.listen and probe.listen must be different ports"),
    ({"app_health": {"listen": "127.0.0.1:9110"}}, "app_health.listen and http.listen must be different ports"),
    ({"app_health": {"unknown": 1}}, "app_health.unknown"),
])
def test_invalid_configuration_names_the_field(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, section), environ={})
    assert message in str(info.value)


@pytest.mark.parametrize("listen", ["127.0.0.1:9111", "[::1]:9111", "localhost:9111", "0.0.0.0:9111", "[::]:9111"])
def test_listeners_the_extension_reaches(tmp_path: Path, listen: str) -> None:
    assert load_settings(write(tmp_path, {"app_health": {"listen": listen}}), environ={}).app_health.listen == listen


def test_served_on_the_admin_listener_and_its_own_with_a_2xx_whatever_the_state() -> None:
    verdicts = [Verdict(H, "drained for planned maintenance"), Verdict(U, "agent stuck\r\n")]
    probe = ProbeState(serving=False)
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=probe, registry=CollectorRegistry(), status=dict,
                          app_health=lambda: verdicts[0], app_health_path="/apphealth",
                          app_health_listen="127.0.0.1:0")
    surface.start()
    try:
        own = surface.app_health_address
        assert own is not None
        with httpx.Client(trust_env=False, timeout=5) as client:
            probe_port, admin_port = surface.probe_address[1], surface.admin_address[1]
            assert client.get(f"http://127.0.0.1:{probe_port}/health").status_code == 503  # drained
            assert client.get(f"http://127.0.0.1:{probe_port}/apphealth").status_code == 404  # never on the probe's
            for port in (admin_port, own[1]):
                answer = client.get(f"http://127.0.0.1:{port}/apphealth")
                assert answer.status_code == 200 and answer.json() == {"ApplicationHealthState": "Healthy"}
                assert answer.headers[APP_HEALTH_REASON_HEADER] == "drained for planned maintenance"
            assert client.get(f"http://127.0.0.1:{own[1]}/status").status_code == 404  # its path only
            verdicts[0] = verdicts[1]
            answer = client.get(f"http://127.0.0.1:{own[1]}/apphealth")
            assert answer.status_code == 200 and answer.json() == {"ApplicationHealthState": "Unhealthy"}
            assert answer.headers[APP_HEALTH_REASON_HEADER] == "agent stuck"
    finally:
        surface.stop()


def test_its_own_listener_failing_is_named() -> None:
    blocker = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=True), registry=CollectorRegistry(), status=dict)
    taken = f"127.0.0.1:{blocker.admin_address[1]}"
    try:
        with pytest.raises(ListenError) as info:
            HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                        probe=ProbeState(serving=True), registry=CollectorRegistry(), status=dict,
                        app_health=lambda: Verdict(H, "ok"), app_health_listen=taken)
        assert info.value.which == "app_health" and info.value.address == taken
    finally:
        blocker.stop()


# --- a recovery failing outside this VM (ARM for the azure-lb action) -------------------------------------

OUTSIDE: list[tuple[Observed, float | None, State, str]] = [
    # Past the bound, but the failure is outside this VM: a repair would fix nothing.
    (Observed(running=True, phase="recovering", recover_failing_for=10 * FAILING, outside_vm=True,
              error="recover failed: azure-lb: 403 AuthorizationFailed"), FAILING, H, "outside this VM"),
    (Observed(running=True, phase="recovering", recover_failing_for=1, outside_vm=True,
              error="recover failed: azure-lb: ARM unreachable"), FAILING, H, "retried"),
    # A stuck loop is the agent's own fault, whatever its last action error.
    (Observed(running=True, since_cycle=STUCK, phase="recovering", recover_failing_for=10 * FAILING, outside_vm=True,
              error="recover failed: x"), FAILING, U, "stuck"),
]


@pytest.mark.parametrize(("observed", "failing_after", "state", "word"), OUTSIDE)
def test_decide_outside_this_vm(observed: Observed, failing_after: float | None, state: State, word: str) -> None:
    verdict = decide(observed, stuck_after=STUCK, recover_failing_after=failing_after)
    assert verdict.state is state, verdict
    assert word in verdict.reason


class OutsideAgent(FakeAgent):
    def __init__(self) -> None:
        super().__init__()
        self.outside = False

    def status(self) -> dict[str, Any]:
        return {**super().status(), "action_error_outside_vm": self.outside}


def test_a_recovery_failing_outside_this_vm_stays_healthy_and_the_kinds_are_timed_apart() -> None:
    agent, clock = OutsideAgent(), Clock()
    health = AppHealth(lambda: agent, stuck_after=STUCK, recover_failing_after=60, clock=clock)
    agent.phase, agent.error, agent.outside = "recovering", "recover failed: azure-lb: 403 AuthorizationFailed", True
    assert health.verdict().state is H
    clock.now += 3600
    verdict = health.verdict()
    assert verdict.state is H, verdict
    assert "recovery failing outside this VM for 3600 s" in verdict.reason and "retried" in verdict.reason
    # A failure inside this VM now (a hook): its own streak starts from zero, not from an hour ago.
    agent.error, agent.outside = "recover failed: hook exited 1", False
    assert health.verdict().state is H
    clock.now += 59
    assert health.verdict().state is H
    clock.now += 1
    assert health.verdict().state is U


class _ArmDown(ActionError):
    outside_vm = True


class _Recovery:
    """An action whose drain works and whose recovery fails with ``error``."""

    name = "lb"
    always_recover = False

    def __init__(self, error: ActionError) -> None:
        self.error = error

    def drain(self, ctx: ActionContext) -> None:
        return None

    def recover(self, ctx: ActionContext) -> None:
        raise self.error


def _recovering_agent(tmp_path: Path, error: ActionError) -> tuple[Agent, AgentClock]:
    """A real agent, drained for an event that then leaves IMDS, whose recovery fails with ``error``."""
    clock = AgentClock()
    not_before = format_not_before(datetime.fromtimestamp(clock.wall + 600, UTC))
    imds = StaticImds(parse_document({"DocumentIncarnation": 2, "Events": [{
        "EventId": "E1", "EventType": "Freeze", "EventStatus": "Scheduled", "Resources": ["vm0"],
        "NotBefore": not_before}]}))
    agent = Agent(vm="vm0", imds=imds, store=lone_store(clock.now),
                  actions=[ProbeAction(ProbeState()), _Recovery(error)], policy=Policy(),
                  metrics=Metrics(CollectorRegistry()), clock=clock, jobs=InlineExecutor(),  # type: ignore[arg-type]
                  state_file=StateFile(tmp_path / "state.json"))
    for _ in range(200):
        agent.cycle()
        clock.advance(5.0)
        if agent.status()["phase"] == "drained":
            break
    assert agent.status()["phase"] == "drained"
    imds.document = parse_document({"DocumentIncarnation": 3, "Events": []})
    for _ in range(200):
        agent.cycle()
        clock.advance(5.0)
        status = agent.status()
        if status["phase"] == "recovering" and status["action_error"]:
            return agent, clock
    raise AssertionError(f"the agent never failed to recover: {agent.status()}")


@pytest.mark.parametrize(("error", "outside", "state"), [
    (_ArmDown("azure-lb: backend address vm0 may still be Down: 403 AuthorizationFailed"), True, H),
    (ActionError("hook exited 1"), False, U),
])
def test_the_agent_hands_apphealth_whether_its_failing_recovery_lies_outside_this_vm(
    tmp_path: Path, error: ActionError, outside: bool, state: State,
) -> None:
    agent, clock = _recovering_agent(tmp_path, error)
    assert agent.status()["action_error_outside_vm"] is outside
    health = AppHealth(lambda: agent, stuck_after=STUCK, recover_failing_after=60, clock=clock.monotonic)
    assert health.verdict().state is H  # the first sample of a failing recovery
    for _ in range(15):  # retried, failing, for 75 s
        clock.advance(5.0)
        agent.cycle()
    assert agent.status()["phase"] == "recovering" and agent.status()["action_error"].startswith("recover failed")
    verdict = health.verdict()
    assert verdict.state is state, verdict
    assert ("outside this VM" in verdict.reason) is outside
