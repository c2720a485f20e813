"""The simulated load balancer drives a real HAProxy (``coordinator imds-sim --lb-haproxy``): an admin state
written through the simulator's ARM, once effective, drains the VM's HAProxy server (no new requests) and
``None`` puts it back. The simulator runs as a process; HAProxy is the ``haproxy`` fixture's (servers
``web0`` and ``web1``, so the VMs carry those names, as the addresses do)."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from coordinator.actions import ActionContext
from coordinator.actions.azure_lb import ArmClient, AzureLbAction, ManagedIdentity
from tests.plugins.haproxy import BACKEND, RunningHAProxy
from tests.plugins.simulator import RunningSimulator, SimulatorFactory
from tests.plugins.zookeeper import wait_until

POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/Microsoft.Network/"
        "loadBalancers/lb/backendAddressPools/pool-web")
CTX = ActionContext("web0", ())
ASYNC = 0.3  # the simulated ARM completes a write this long after the PUT


@pytest.fixture(autouse=True)
def _haproxy_required() -> None:
    """This test is about HAProxy: without it, it fails (the shared fixture would skip outside CI)."""
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is required for this test (apt-get install haproxy)", pytrace=False)


def start(imds_sim: SimulatorFactory, haproxy: RunningHAProxy) -> RunningSimulator:
    sim = imds_sim(("web0", "web1"), extra_args=[
        "--arm", "127.0.0.1:0", "--arm-async-seconds", str(ASYNC), "--arm-retry-after", "0",
        "--lb-haproxy", str(haproxy.socket_path), "--lb-haproxy-backend", BACKEND])
    sim.control.add_pool(POOL, [{"name": "web0", "ip_address": "127.0.0.1"},
                                {"name": "web1", "ip_address": "127.0.0.1"}])
    return sim


def action(sim: RunningSimulator) -> AzureLbAction:
    client = ArmClient(str(sim.arm_url), ManagedIdentity(sim.urls["web0"], timeout=5.0), timeout=5.0,
                       poll_interval=0.1)
    return AzureLbAction("azure-lb", (POOL,), "web0", client, deadline=20.0)


def put_without_polling(sim: RunningSimulator, state: str) -> None:
    """Set web0's admin state with one PUT and never ask about the operation again: only the simulator's
    own ticker can then make it effective."""
    token = httpx.get(sim.urls["web0"] + "/metadata/identity/oauth2/token", headers={"Metadata": "true"},
                      params={"api-version": "2018-02-01", "resource": "https://management.azure.com/"},
                      trust_env=False).json()["access_token"]
    auth = {"Authorization": f"Bearer {token}"}
    url, query = f"{sim.arm_url}{POOL}", {"api-version": "2023-09-01"}
    pool = httpx.get(url, params=query, headers=auth, trust_env=False).json()
    for address in pool["properties"]["loadBalancerBackendAddresses"]:
        if address["name"] == "web0":
            address["properties"]["adminState"] = state
    body = {"properties": {"loadBalancerBackendAddresses": pool["properties"]["loadBalancerBackendAddresses"]}}
    answer = httpx.put(url, params=query, headers={**auth, "If-Match": pool["etag"]}, json=body, trust_env=False)
    assert answer.status_code == 200, answer.text


def test_an_effective_down_drains_the_haproxy_server_and_none_brings_it_back(
    imds_sim: SimulatorFactory, haproxy: RunningHAProxy,
) -> None:
    sim = start(imds_sim, haproxy)
    assert set(haproxy.served_by(6)) == {"web0", "web1"}

    action(sim).drain(CTX)  # returns once ARM reports the operation Succeeded
    assert haproxy.status("web0") == "DRAIN"  # already applied when ARM said Succeeded
    assert sim.control.pools()[POOL]["effective"] == {"web0": "Down", "web1": "None"}
    before = haproxy.backends["web0"].hits
    assert set(haproxy.served_by(10)) == {"web1"}
    assert haproxy.backends["web0"].hits == before  # no new request reached web0

    put_without_polling(sim, "None")
    began = time.monotonic()
    wait_until(lambda: haproxy.status("web0") == "UP", timeout=5, message="web0 ready again in HAProxy")
    took = time.monotonic() - began
    assert took < ASYNC + 1.0, f"the ticker applied the write {took:.2f} s after the PUT (due after {ASYNC} s)"
    assert set(haproxy.served_by(6)) == {"web0", "web1"}

    changes = sim.control.log(kind="admin_state")
    assert [(c["address"], c["before"], c["after"], c["haproxy"]) for c in changes] == [
        ("web0", "None", "Down", True), ("web0", "Down", "None", True)]
    plane = sim.control.arm_calls()["data_plane"]
    assert (plane["applied"], plane["failed"]) == (2, 0), plane


def test_an_unreachable_haproxy_is_logged_and_counted_and_arm_goes_on(imds_sim: SimulatorFactory,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    absent = tmp_path_factory.mktemp("nohaproxy") / "admin.sock"
    sim = imds_sim(("web0", "web1"), extra_args=[
        "--arm", "127.0.0.1:0", "--arm-async-seconds", str(ASYNC), "--arm-retry-after", "0",
        "--lb-haproxy", str(absent), "--lb-haproxy-timeout", "0.5"])
    sim.control.add_pool(POOL, [{"name": "web0"}, {"name": "web1"}])
    action(sim).drain(CTX)  # ARM itself is unaffected: the drain completes
    assert sim.control.pools()[POOL]["effective"] == {"web0": "Down", "web1": "None"}
    plane = sim.control.arm_calls()["data_plane"]
    assert (plane["applied"], plane["failed"]) == (0, 1), plane
    assert "unreachable" in plane["last_error"]
    assert [c["haproxy"] for c in sim.control.log(kind="admin_state")] == [False]
    assert "cannot apply admin state Down of web0" in sim.stderr()
