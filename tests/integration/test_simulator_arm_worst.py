"""The simulated ARM at its worst, over HTTP, as a real process: connections closed without an answer
after the write applied, late answers, 5xx after applying, operations that end Failed, 409 while busy,
throttling with its headers, an unreachable token endpoint, permissions, and the control API's 400s."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from azuresim.client import SimControlError
from tests.plugins.simulator import ARM_POOL, RunningSimulator, SimulatorFactory, two_vms_with_arm

POOL = ARM_POOL
LB = POOL.rsplit("/backendAddressPools/", 1)[0]
ARM_VERSION = {"api-version": "2023-09-01"}
TOKEN_QUERY = {"api-version": "2018-02-01", "resource": "https://management.azure.com/"}


@pytest.fixture
def sim(imds_sim: SimulatorFactory) -> RunningSimulator:
    return two_vms_with_arm(imds_sim, 0.2)


def _token(sim: RunningSimulator, vm: str = "vm0") -> httpx.Response:
    return httpx.get(f"{sim.urls[vm]}/metadata/identity/oauth2/token", params=TOKEN_QUERY,
                     headers={"Metadata": "true"}, trust_env=False)


def _bearer(sim: RunningSimulator) -> dict[str, str]:
    return {"Authorization": "Bearer " + _token(sim).json()["access_token"]}


def _get(sim: RunningSimulator, headers: dict[str, str], path: str = POOL,
         version: dict[str, str] = ARM_VERSION) -> httpx.Response:
    return httpx.get(sim.arm_url + path, params=version, headers=headers, trust_env=False)


def _put(sim: RunningSimulator, headers: dict[str, str], state: str, timeout: float = 5.0) -> httpx.Response:
    body = {"properties": {"loadBalancerBackendAddresses": [
        {"name": "vm0", "properties": {"ipAddress": "10.0.0.4", "adminState": state}},
        {"name": "vm1", "properties": {"ipAddress": "10.0.0.5", "adminState": "None"}}]}}
    return httpx.put(sim.arm_url + POOL, params=ARM_VERSION, headers=headers, json=body, trust_env=False,
                     timeout=timeout)


def _wait_effective(sim: RunningSimulator, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pool = sim.control.pools()[POOL]
        if pool["effective"]["vm0"] == state and pool["provisioning_state"] != "Updating":
            return pool
        time.sleep(0.05)
    raise AssertionError(f"vm0 never became {state}: {sim.control.pools()[POOL]}")


def test_an_answer_lost_after_the_write_applied_closes_the_connection(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    sim.control.add_azure_fault("arm", "lost_answer")
    with pytest.raises(httpx.RemoteProtocolError):
        _put(sim, headers, "Down")
    assert _get(sim, headers).json()["properties"]["loadBalancerBackendAddresses"][0]["properties"][
        "adminState"] == "Down"
    assert _wait_effective(sim, "Down")["writes"] == 1
    assert sim.control.arm_calls()["statuses"]["pool_put dropped"] == 1


def test_a_late_answer_outlasts_the_clients_timeout_and_the_write_is_applied(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    sim.control.add_azure_fault("arm", "lost_answer", delay_seconds=3)
    with pytest.raises(httpx.ReadTimeout):
        _put(sim, headers, "Down", timeout=0.5)
    assert _wait_effective(sim, "Down")["admin_states"]["vm0"] == "Down"


def test_a_server_error_after_applying_and_an_operation_that_fails(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    sim.control.add_azure_fault("arm", "status_after_apply", status=502)
    bad_gateway = _put(sim, headers, "Down")
    assert bad_gateway.status_code == 502 and bad_gateway.json()["error"]["code"] == "BadGateway"
    _wait_effective(sim, "Down")

    sim.control.add_azure_fault("arm", "operation_end", end="Failed")
    sim.control.add_azure_fault("arm", "slow_operation", seconds=2)
    assert [f["kind"] for f in sim.control.azure_faults()] == ["operation_end", "slow_operation"]
    answer = _put(sim, headers, "None")
    operation = answer.headers["Azure-AsyncOperation"]
    assert httpx.get(operation, headers=headers, trust_env=False).json() == {"status": "InProgress"}
    pool = _wait_effective(sim, "Down")  # still Down: the operation failed
    assert pool["provisioning_state"] == "Failed" and pool["admin_states"]["vm0"] == "None"
    status = httpx.get(operation, headers=headers, trust_env=False).json()
    assert status["status"] == "Failed" and status["error"]["code"]
    assert _get(sim, headers).json()["properties"]["provisioningState"] == "Failed"
    _put(sim, headers, "None")  # re-driven
    assert _wait_effective(sim, "None")["provisioning_state"] == "Succeeded"


def test_conflicts_and_throttling_through_the_control_api(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    assert sim.control.arm_settings()["conflict_while_updating"] is False
    assert sim.control.arm_settings(conflict_while_updating=True, async_seconds=30)["async_seconds"] == 30
    assert _put(sim, headers, "Down").status_code == 200
    busy = _put(sim, headers, "Up")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "AnotherOperationInProgress"
    assert "Retry-After" in busy.headers

    view = sim.control.set_throttling(read_capacity=2, read_refill=0.1, write_capacity=5, write_refill=1)
    assert view["enabled"] and view["read_capacity"] == 2
    assert _get(sim, headers).headers["x-ms-ratelimit-remaining-subscription-reads"] == "1"
    assert _get(sim, headers).status_code == 200
    throttled = _get(sim, headers)
    assert throttled.status_code == 429 and throttled.json()["error"]["code"] == "SubscriptionRequestsThrottled"
    assert 1 <= int(throttled.headers["Retry-After"]) <= 10
    still_busy = _put(sim, headers, "Up")  # refused (409), yet it took a write's token
    assert still_busy.status_code == 409 and still_busy.headers["x-ms-ratelimit-remaining-subscription-writes"] == "4"
    assert sim.control.throttling()["remaining"]["00000000-0000-0000-0000-000000000001"]["reads"] == 0
    assert sim.control.set_throttling(False) == {"enabled": False}
    assert "x-ms-ratelimit-remaining-subscription-reads" not in _get(sim, headers).headers


def test_an_unreachable_token_endpoint_then_expired_tokens(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    sim.control.add_azure_fault("token", "unreachable", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        _token(sim)
    assert _token(sim).status_code == 200
    assert sim.control.expire_tokens() >= 2
    expired = _get(sim, headers)
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "ExpiredAuthenticationToken"
    assert sim.control.arm_calls()["statuses"]["token dropped"] == 1


def test_the_callers_permissions_on_a_load_balancer_and_its_resource_group(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    version = {"api-version": "2022-04-01"}
    on_lb = _get(sim, headers, f"{LB}/providers/Microsoft.Authorization/permissions", version)
    assert on_lb.status_code == 200
    assert on_lb.json() == {"value": [{"actions": ["Microsoft.Network/*", "Microsoft.Authorization/*/read"],
                                       "notActions": [], "dataActions": [], "notDataActions": []}]}
    sim.control.set_role("vm0", "none")
    group = LB.split("/providers/")[0]
    assert _get(sim, headers, f"{group}/providers/Microsoft.Authorization/permissions", version).json() == \
        {"value": []}


@pytest.mark.parametrize(("path", "body", "named"), [
    ("/arm/faults", {"target": "arm", "kind": "slow_operation"}, "seconds"),
    ("/arm/faults", {"target": "arm", "kind": "operation_end", "end": "Done"}, "end"),
    ("/arm/faults", {"target": "arm", "kind": "status_after_apply", "status": 501}, "status"),
    ("/arm/faults", {"target": "token", "kind": "lost_answer"}, "kind"),
    ("/arm/faults", {"target": "arm", "kind": "lost_answer", "delay_seconds": -1}, "delay_seconds"),
    ("/arm/settings", {"conflict_while_updating": "yes"}, "conflict_while_updating"),
    ("/arm/throttling", {"read_capacity": 0}, "read_capacity"),
    ("/arm/throttling", {"write_refill": "fast"}, "write_refill"),
])
def test_the_control_api_answers_400_naming_the_field(sim: RunningSimulator, path: str, body: dict[str, Any],
                                                       named: str) -> None:
    answer = httpx.post(sim.control_url + path, json=body, trust_env=False)
    assert answer.status_code == 400 and named in answer.json()["error"], answer.text


def test_the_client_raises_for_a_refused_fault(sim: RunningSimulator) -> None:
    with pytest.raises(SimControlError, match="seconds"):
        sim.control.add_azure_fault("arm", "slow_operation")
    assert sim.control.azure_faults() == [] and sim.control.clear_azure_faults() == 0
