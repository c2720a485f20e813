"""The azure-lb drain action against the simulator's IMDS identity endpoint and ARM, as a real process."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest

from coordinator.actions import ActionContext, ProbeAction, ProbeState, run_drain, run_recover
from coordinator.actions.azure_lb import ArmClient, AzureLbAction, ManagedIdentity
from coordinator.config import AzureLbActionConfig, Settings
from coordinator.errors import ActionError
from coordinator.runtime import build_azure_lb
from tests.plugins.simulator import RunningSimulator, SimulatorFactory

SUB = "00000000-0000-0000-0000-000000000001"
LB = f"/subscriptions/{SUB}/resourceGroups/rg-app/providers/Microsoft.Network/loadBalancers/lb-app"
WEB = f"{LB}/backendAddressPools/pool-web"
API = f"{LB}/backendAddressPools/pool-api"
CTX = ActionContext("vm0", ())
FAST = ["--arm-async-seconds", "0.2", "--arm-retry-after", "0"]


def _addresses(vms: list[str]) -> list[dict[str, Any]]:
    return [{"name": vm, "ip_address": f"10.0.{i // 250}.{i % 250 + 4}"} for i, vm in enumerate(vms)]


def _start(imds_sim: SimulatorFactory, vms: list[str], *extra: str) -> RunningSimulator:
    sim = imds_sim(tuple(vms), rate_limit=0 if len(vms) > 3 else None,
                   extra_args=["--arm", "127.0.0.1:0", *FAST, *extra])
    assert sim.arm_url
    for pool in (WEB, API):
        sim.control.add_pool(pool, _addresses(vms))
    return sim


def _action(sim: RunningSimulator, vm: str = "vm0", *, pools: tuple[str, ...] = (WEB, API), arm_url: str | None = None,
            deadline: float = 20.0, fallback_wait: float = 0.0, client_id: str | None = None) -> AzureLbAction:
    identity = ManagedIdentity(sim.urls[vm], client_id=client_id, timeout=5.0)
    client = ArmClient(arm_url or str(sim.arm_url), identity, timeout=5.0, poll_interval=0.1)
    return AzureLbAction("azure-lb", pools, vm, client, deadline=deadline, fallback_wait=fallback_wait)


def _states(sim: RunningSimulator, pool: str = WEB) -> dict[str, str]:
    view: dict[str, str] = sim.control.pools()[pool]["effective"]
    return view


def test_drain_sets_the_address_down_in_every_pool_and_recover_sets_none(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"])
    settings = Settings.model_validate({"cluster": "web", "actions": [{
        "type": "azure-lb", "backend_pools": [WEB, API], "backend_address": "10.0.0.4",  # vm0 by its IP address
        "arm_url": sim.arm_url, "imds_url": sim.urls["vm0"], "deadline_seconds": 20}]})
    item = settings.actions[0]
    assert isinstance(item, AzureLbActionConfig)
    action = build_azure_lb(item, settings)  # the agent's own wiring
    assert getattr(action, "recover_after_probe", False)  # recovered once the probe serves, as HAProxy is

    action.drain(CTX)
    for pool in (WEB, API):  # effective: the asynchronous operation had succeeded before drain returned
        assert _states(sim, pool) == {"vm0": "Down", "vm1": "None"}
    calls = sim.control.arm_calls()
    assert calls["calls"]["pool_put"] == 2 and calls["statuses"]["pool_put 200"] == 2, calls
    assert calls["statuses"].get("operation Succeeded") == 2, calls
    action.drain(CTX)  # idempotent: already Down, nothing written
    assert sim.control.arm_calls()["calls"]["pool_put"] == 2

    action.recover(CTX)
    for pool in (WEB, API):
        assert _states(sim, pool) == {"vm0": "None", "vm1": "None"}
    assert sim.control.arm_calls()["calls"]["token"] == 1  # one token, cached across drain and recovery


def test_a_pool_changed_by_another_writer_is_read_again_and_its_change_kept(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"])
    sim.control.write_address(WEB, "vm1", "Down")  # vm1 is already out, set by someone else
    sim.control.add_azure_fault("arm", "concurrent_write")  # and another write lands between our GET and PUT
    action = _action(sim, pools=(WEB,))
    action.drain(CTX)
    assert _states(sim) == {"vm0": "Down", "vm1": "Down"}
    calls = sim.control.arm_calls()
    assert calls["statuses"]["pool_put 412"] == 1 and calls["statuses"]["pool_put 200"] == 1, calls
    assert calls["calls"]["pool_get"] == 2, calls  # read again after the 412
    assert action.conflicts == 1


def test_429_is_retried_after_the_retry_after_it_names(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"])
    sim.control.add_azure_fault("arm", status=429, retry_after=1, methods=["PUT"])
    sim.control.add_azure_fault("token", status=429, retry_after=1)
    action = _action(sim, pools=(WEB,))
    began = time.monotonic()
    action.drain(CTX)
    took = time.monotonic() - began
    assert _states(sim) == {"vm0": "Down", "vm1": "None"}
    calls = sim.control.arm_calls()
    assert calls["statuses"]["token 429"] == 1 and calls["statuses"]["pool_put 429"] == 1, calls
    assert took >= 2.0, f"two Retry-After: 1 waits, but the drain took {took:.2f} s"


def test_an_expiring_token_is_refreshed_before_it_expires_and_a_refused_one_at_once(
    imds_sim: SimulatorFactory,
) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"], "--token-lifetime", "2")
    action = _action(sim, pools=(WEB,))
    action.drain(CTX)
    assert sim.control.arm_calls()["calls"]["token"] == 1
    time.sleep(1.2)  # past half the 2 s lifetime: the cached token is renewed before use
    action.recover(CTX)
    calls = sim.control.arm_calls()
    assert calls["calls"]["token"] == 2, calls
    assert not any(key.endswith(" 401") for key in calls["statuses"]), calls

    sim.control.expire_tokens()  # ARM now refuses the cached token: one 401, a new token, the same request again
    action.drain(CTX)
    calls = sim.control.arm_calls()
    assert calls["statuses"]["pool_get 401"] == 1 and calls["calls"]["token"] == 3, calls
    assert _states(sim) == {"vm0": "Down", "vm1": "None"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_arm_down_says_so_in_one_line_and_the_drain_goes_on_through_the_probe(
    imds_sim: SimulatorFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"])
    action = _action(sim, pools=(WEB,), arm_url=f"http://127.0.0.1:{_closed_port()}", deadline=2.0,
                     fallback_wait=3.0)
    probe = ProbeState(serving=True)
    caplog.set_level(logging.INFO, logger="coordinator.actions")
    began = time.monotonic()
    run_drain([ProbeAction(probe), action], CTX)  # no ActionError: the drain holds through the probe
    took = time.monotonic() - began
    assert probe.serving is False
    assert took >= 3.0, f"the fallback waits out the probe's lag (3 s), but the drain took {took:.2f} s"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "coordinator.actions.azure_lb"]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "cannot set backend address vm0 Down through ARM" in line and "ConnectError" in line, line
    assert "health probe alone" in line

    with pytest.raises(ActionError, match="may still be Down"):  # a recovery is never given up: the agent retries
        run_recover([ProbeAction(probe), action], CTX)
    assert probe.serving is True  # the probe recovered first (azure-lb recovers after it)


def test_a_missing_role_is_named_and_the_drain_falls_back(
    imds_sim: SimulatorFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"])
    sim.control.set_role("vm0", "reader")
    action = _action(sim, pools=(WEB,))
    caplog.set_level(logging.ERROR, logger="coordinator.actions")
    action.drain(CTX)
    errors = [r.getMessage() for r in caplog.records if r.name == "coordinator.actions.azure_lb"]
    assert len(errors) == 1 and "403 AuthorizationFailed" in errors[0], errors
    assert "backendAddressPools/write" in errors[0]
    assert _states(sim) == {"vm0": "None", "vm1": "None"}


def test_a_user_assigned_identity_by_client_id(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim, ["vm0", "vm1"], "--no-system-identity")
    client_id = "6c0e1d63-5b3d-4c11-9a2b-0f1e2d3c4b5a"
    sim.control.add_identity(client_id, vms=["vm0"])
    _action(sim, pools=(WEB,), client_id=client_id).drain(CTX)
    assert _states(sim) == {"vm0": "Down", "vm1": "None"}


def test_twenty_vms_drain_at_once_through_one_pool_and_all_come_back(imds_sim: SimulatorFactory) -> None:
    vms = [f"vm{i:02d}" for i in range(20)]
    sim = _start(imds_sim, vms)
    actions = [_action(sim, vm, pools=(WEB,), deadline=60.0) for vm in vms]
    errors: list[BaseException] = []

    def all_at_once(phase: str) -> float:
        barrier = threading.Barrier(len(actions))

        def run(action: AzureLbAction) -> None:
            barrier.wait()
            try:
                getattr(action, phase)(ActionContext(action.address, ()))
            except BaseException as exc:  # reported below, with the counts
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(a,)) for a in actions]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        return time.monotonic() - began

    drain_took = all_at_once("drain")
    after_drain = sim.control.arm_calls()
    drained = _states(sim)
    conflicts_drain = sum(a.conflicts for a in actions)
    recover_took = all_at_once("recover")
    calls = sim.control.arm_calls()
    conflicts = sum(a.conflicts for a in actions)
    report = (f"drain {drain_took:.1f} s: {after_drain['calls']} ({conflicts_drain} conflicts, 412); "
              f"drain + recover ({recover_took:.1f} s): {calls['calls']}, {conflicts} conflicts; "
              f"statuses {calls['statuses']}; errors {errors!r}")
    assert errors == [], report
    assert drained == dict.fromkeys(vms, "Down"), report  # every write landed
    assert _states(sim) == dict.fromkeys(vms, "None"), report  # none left Down
    assert sim.control.pools()[WEB]["admin_states"] == dict.fromkeys(vms, "None"), report
    # Every VM wrote once per phase (40 writes that landed); each 412 cost one more GET and PUT.
    assert calls["statuses"]["pool_put 200"] == 40, report
    assert calls["statuses"].get("pool_put 412", 0) == conflicts, report
    assert calls["calls"]["pool_get"] == 40 + conflicts, report
    assert calls["calls"]["token"] == 20, report  # one token per VM, cached across both phases
    print(report)
