"""The azure-lb action's configuration and its pure parts (the PUT body, Retry-After, token lifetime), and
how a drain that falls back to the health probe reaches the agent's ``/status``."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions import ActionContext, ProbeAction, ProbeState, run_drain
from coordinator.actions.azure_lb import (
    ArmClient,
    ArmError,
    AzureLbAction,
    parse_retry_after,
    token_lifetime,
    with_admin_state,
)
from coordinator.agent import Agent
from coordinator.config import AzureLbActionConfig, load_settings
from coordinator.decide import Policy
from coordinator.errors import ConfigError
from coordinator.metrics import Metrics
from coordinator.models import format_not_before, parse_document
from coordinator.runtime import startup_summary
from coordinator.state import StateFile
from tests.doubles import Clock, InlineExecutor, StaticImds
from tests.fakezk_group import lone_store

POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/Microsoft.Network/"
        "loadBalancers/lb/backendAddressPools/web")


def _load(tmp_path: Path, action: str) -> Any:
    path = tmp_path / "c.yaml"
    path.write_text(f"cluster: web\nvm_name: vm0\nstate_file: null\nactions:\n  - type: azure-lb\n{action}")
    return load_settings(path, environ={})


def test_defaults_are_azure_s(tmp_path: Path) -> None:
    settings = _load(tmp_path, f"    backend_pools: [{POOL}]\n    backend_address: vm0\n")
    item = settings.actions[0]
    assert isinstance(item, AzureLbActionConfig)
    assert item.arm_url == "https://management.azure.com" and item.imds_url == "http://169.254.169.254"
    assert item.api_version == "2023-09-01" and item.client_id is None and item.name == "azure-lb"
    assert item.fallback_wait_seconds is None and item.deadline_seconds == 60
    assert "azure-lb azure-lb (vm0 in 1 pool(s))" in startup_summary(settings)


@pytest.mark.parametrize(("action", "expected"), [
    ("    backend_address: vm0\n", "actions.0.azure-lb.backend_pools: Field required"),
    ("    backend_pools: []\n    backend_address: vm0\n",
     "actions.0.azure-lb.backend_pools: List should have at least 1"),
    ("    backend_pools: [/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb]\n"
     "    backend_address: vm0\n", "actions.0.azure-lb.backend_pools: item 0 ("),
    (f"    backend_pools: [{POOL}, {POOL.upper()}]\n    backend_address: vm0\n", "listed twice"),
    (f"    backend_pools: [{POOL}]\n", "actions.0.azure-lb.backend_address: Field required"),
    (f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    client_id: drain-identity\n",
     "actions.0.azure-lb.client_id: must be the user-assigned identity's client id, a GUID"),
    (f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    arm_url: http://management.azure.com\n",
     "actions.0.azure-lb.arm_url: must start with https://"),
    (f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    imds_url: https://169.254.169.254\n",
     "actions.0.azure-lb.imds_url: IMDS is plain HTTP"),
    (f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    deadline_seconds: 0\n",
     "actions.0.azure-lb.deadline_seconds: Input should be greater than 0"),
    (f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    pools: [x]\n",
     "actions.0.azure-lb.pools: Extra inputs are not permitted"),
])
def test_errors_name_the_field(tmp_path: Path, action: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, action)
    assert expected in str(raised.value)


def test_plain_http_arm_only_on_loopback(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:8443", "http://localhost:1", "http://[::1]:9"):
        text = f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    arm_url: {url}/\n"
        item = _load(tmp_path, text).actions[0]
        assert item.arm_url == url
    with pytest.raises(ConfigError, match="arm_url"):
        _load(tmp_path, f"    backend_pools: [{POOL}]\n    backend_address: vm0\n    arm_url: http://10.0.0.9\n")


def test_two_actions_with_one_name_are_refused(tmp_path: Path) -> None:
    one = f"    backend_pools: [{POOL}]\n    backend_address: vm0\n"
    with pytest.raises(ConfigError, match="two actions share a name"):
        _load(tmp_path, one + "  - type: azure-lb\n" + one)


def _pool() -> dict[str, Any]:
    return {
        "name": "web", "id": POOL, "etag": 'W/"1"', "type": "Microsoft.Network/loadBalancers/backendAddressPools",
        "properties": {
            "provisioningState": "Succeeded", "loadBalancingRules": [{"id": "r"}], "drainPeriodInSeconds": 30,
            "loadBalancerBackendAddresses": [
                {"name": "vm0", "properties": {"ipAddress": "10.0.0.4", "adminState": "None",
                                               "inboundNatRulesPortMapping": []}},
                {"name": "vm1", "properties": {"ipAddress": "10.0.0.5", "adminState": "Down"}},
                {"name": "vm2", "properties": {"ipAddress": "10.0.0.6"}},
            ],
        },
    }


def test_the_put_body_changes_one_address_and_keeps_everything_else_writable() -> None:
    body, current = with_admin_state(_pool(), "vm0", "Down")
    assert current == ["None"]
    assert body["name"] == "web" and body["id"] == POOL and "etag" not in body
    props = body["properties"]
    assert props["drainPeriodInSeconds"] == 30  # writable: sent back as read
    assert "provisioningState" not in props and "loadBalancingRules" not in props  # read-only: left out
    assert props["loadBalancerBackendAddresses"] == [
        {"name": "vm0", "properties": {"ipAddress": "10.0.0.4", "adminState": "Down"}},
        {"name": "vm1", "properties": {"ipAddress": "10.0.0.5", "adminState": "Down"}},  # another VM's state kept
        {"name": "vm2", "properties": {"ipAddress": "10.0.0.6"}},
    ]
    by_ip, current = with_admin_state(_pool(), "10.0.0.6", "Down")
    assert current == ["None"]  # no adminState is None
    assert by_ip["properties"]["loadBalancerBackendAddresses"][2]["properties"]["adminState"] == "Down"


def test_an_address_missing_from_the_pool_is_an_error_naming_the_pool_s_addresses() -> None:
    with pytest.raises(ArmError, match=r"no backend address named 'vm9'.*vm0, vm1, vm2"):
        with_admin_state(_pool(), "vm9", "Down")
    with pytest.raises(ArmError, match="no loadBalancerBackendAddresses"):
        with_admin_state({"id": POOL, "properties": {}}, "vm0", "Down")


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0
    date = email.utils.formatdate(1_000_010, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(10.0)


def test_token_lifetime_from_imds_strings_or_expires_on() -> None:
    assert token_lifetime({"expires_in": "86399"}) == 86399.0  # IMDS sends strings
    assert token_lifetime({"expires_in": 3600}) == 3600.0
    assert token_lifetime({"expires_on": "1000600"}, now=1_000_000) == 600.0
    with pytest.raises(ValueError, match="expires_in"):
        token_lifetime({"expires_in": "0", "expires_on": "5"}, now=10)


class _NoRole:
    """ARM as a managed identity without a role on the pool meets it."""

    def get_resource(self, resource_id: str, deadline: float, **options: Any) -> dict[str, Any]:
        raise ArmError(f"GET {resource_id}: 403 AuthorizationFailed", cause="forbidden")


FELL_BACK = (f"azure-lb drain fell back to the health probe alone: cannot set backend address vm0 Down through "
             f"ARM (forbidden: GET {POOL}: 403 AuthorizationFailed)")


def test_a_drain_that_falls_back_to_the_probe_says_so_up_to_the_agents_status(tmp_path: Path) -> None:
    clock = Clock()
    action = AzureLbAction("azure-lb", [POOL], "vm0", cast(ArmClient, _NoRole()), clock=clock.monotonic)
    probe = ProbeState(serving=True)
    assert run_drain([ProbeAction(probe), action], ActionContext("vm0", ())) == (FELL_BACK,)
    assert probe.serving is False  # the drain holds, through the probe

    not_before = format_not_before(datetime.fromtimestamp(clock.wall + 60, UTC))  # too close to wait for anything
    document = parse_document({"DocumentIncarnation": 2, "Events": [{
        "EventId": "E1", "EventType": "Freeze", "EventStatus": "Scheduled", "Resources": ["vm0"],
        "NotBefore": not_before}]})
    agent = Agent(vm="vm0", imds=StaticImds(document), store=lone_store(clock.now),
                  actions=[ProbeAction(ProbeState()), action], policy=Policy(), metrics=Metrics(CollectorRegistry()),
                  clock=clock, jobs=InlineExecutor(),  # type: ignore[arg-type]
                  state_file=StateFile(tmp_path / "state.json"))
    assert agent.status()["action_fallback"] is None
    for _ in range(3):
        agent.cycle()
        clock.advance(1.0)
    status = agent.status()
    assert status["phase"] in ("draining", "drained")
    assert (status["action_error"], status["action_fallback"]) == (None, FELL_BACK)
