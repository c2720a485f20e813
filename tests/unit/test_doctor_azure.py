"""The pure verdicts of ``coordinator doctor``'s ARM checks, and how a resource id is scoped; the ``azure-lb``
check against IMDS and ARM as ``httpx.MockTransport`` handlers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.doctor.azure import scope_of
from coordinator.doctor.verdicts import (
    LbProbe,
    Status,
    Verdict,
    auto_approve_verdict,
    iso_duration_seconds,
    lb_probe_verdict,
    repairs_verdict,
    spot_verdict,
    terminate_verdict,
)

SUB = "/subscriptions/s/resourceGroups/rg/providers"


@pytest.mark.parametrize(("text", "seconds"), [
    ("PT10M", 600), ("PT1H30M", 5400), ("PT90S", 90), ("P1D", 86400), ("pt15m", 900), ("PT0.5S", 0.5),
    ("10M", None), ("PT", None), ("", None), (None, None), (600, None),
])
def test_iso_durations_as_arm_writes_them(text: object, seconds: float | None) -> None:
    assert iso_duration_seconds(text) == seconds


def test_scope_of_a_scale_set_instance_is_its_scale_set() -> None:
    assert scope_of(f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3") == \
        ("scale_set", f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web")
    vm = f"{SUB}/Microsoft.Compute/virtualMachines/vm0"
    assert scope_of(vm) == ("vm", vm)
    assert scope_of("/subscriptions/s") == ("unknown", None)


def _probe(**changes: object) -> LbProbe:
    fields: dict[str, object] = {"lb": "lb", "name": "p", "protocol": "Http", "port": 8090, "interval": 5.0,
                                 "threshold": 2, "request_path": "/health"}
    fields.update(changes)
    return LbProbe(**fields)  # type: ignore[arg-type]


def _lb(probes: list[LbProbe], wait: float = 15.0, interval: float = 5.0, threshold: int = 2) -> Verdict:
    return lb_probe_verdict(probes=probes, port=8090, path="/health", configured_interval=interval,
                            configured_threshold=threshold, probe_wait=wait, admin_state=False)


def test_a_probe_whose_lag_the_wait_covers_passes() -> None:
    verdict = _lb([_probe()])
    assert verdict.status is Status.PASS and "new flows stop 10 s after" in verdict.summary
    assert verdict.details["lag"] == 10.0


def test_a_drain_wait_shorter_than_interval_times_threshold_fails() -> None:
    verdict = _lb([_probe(interval=15.0, threshold=3)], wait=35.0, interval=15.0, threshold=3)
    assert verdict.status is Status.FAIL and "still sends it new flows" in verdict.summary
    assert "drain.probe_threshold: 3" in verdict.fix and "at least 45 s" in verdict.fix


def test_a_tcp_probe_never_sees_the_503() -> None:
    verdict = _lb([_probe(protocol="Tcp", request_path=None)])
    assert verdict.status is Status.FAIL and "Tcp probe" in verdict.summary and "Http" in verdict.fix


def test_no_probe_on_the_agents_port_warns() -> None:
    verdict = _lb([_probe(port=80)])
    assert verdict.status is Status.WARN and "port 8090" in verdict.summary


def test_another_path_or_other_drain_values_warn() -> None:
    assert _lb([_probe(request_path="/")]).status is Status.WARN
    other = _lb([_probe()], interval=15.0, threshold=2)
    assert other.status is Status.WARN and "15 s x 2" in other.summary


def test_the_slowest_probe_on_the_port_counts() -> None:
    verdict = _lb([_probe(name="fast"), _probe(name="slow", interval=10.0)], wait=15.0)
    assert verdict.status is Status.FAIL and verdict.details["probe"] == "slow"


def test_repairs_off_pass() -> None:
    assert repairs_verdict(enabled=False, grace_period=None, repair_action=None, health_source=None,
                           drain_probe_source=False).status is Status.PASS


def test_a_ten_minute_grace_on_the_drain_probe_fails() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT10M", repair_action="Replace",
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.FAIL and "10 min" in verdict.summary and "replaced" in verdict.summary
    assert "gracePeriod=PT20M" in verdict.fix


def test_no_grace_means_arms_default_ten_minutes() -> None:
    verdict = repairs_verdict(enabled=True, grace_period=None, repair_action=None,
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.FAIL and verdict.details["grace_seconds"] == 600.0


def test_a_grace_longer_than_the_longest_drain_passes() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT30M", repair_action="Restart",
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.PASS and "longer than the longest drain (15 min)" in verdict.summary


def test_repairs_from_another_health_source_pass_and_without_one_warn() -> None:
    other = repairs_verdict(enabled=True, grace_period="PT10M", repair_action=None,
                            health_source="the Application Health extension (http port 8091 /app)",
                            drain_probe_source=False)
    assert other.status is Status.PASS and "not from the drain probe" in other.summary
    none = repairs_verdict(enabled=True, grace_period="PT10M", repair_action=None, health_source=None,
                           drain_probe_source=False)
    assert none.status is Status.WARN and "no health source" in none.summary


def test_an_extension_asking_the_agent_for_a_path_it_does_not_serve_fails_with_repairs_and_warns_without() -> None:
    source = "the Application Health extension (http port 8090 /)"
    on = repairs_verdict(enabled=True, grace_period="PT30M", repair_action=None, health_source=source,
                         drain_probe_source=False, unserved="port 9110 /apphealth")
    assert on.status is Status.FAIL and "every VM reads Unhealthy and is replaced" in on.summary
    assert on.fix == ("point the extension's requestPath at the agent's application health endpoint "
                      "(port 9110 /apphealth)")
    off = repairs_verdict(enabled=False, grace_period=None, repair_action=None, health_source=source,
                          drain_probe_source=False, unserved="port 9110 /apphealth")
    assert off.status is Status.WARN


def test_an_unreadable_grace_warns() -> None:
    assert repairs_verdict(enabled=True, grace_period="ten minutes", repair_action=None, health_source="x",
                           drain_probe_source=True).status is Status.WARN


def test_terminate_notifications_off_warn() -> None:
    verdict = terminate_verdict(enabled=False, not_before_timeout=None, drain_wait=35.0, lapse=32.0)
    assert verdict.status is Status.WARN and "without a Terminate event" in verdict.summary
    assert "--enable-terminate-notification true" in verdict.fix


def test_terminate_notice_against_the_drain_wait_and_a_lost_agent() -> None:
    assert terminate_verdict(enabled=True, not_before_timeout="PT10M", drain_wait=35.0, lapse=32.0).status \
        is Status.PASS
    # 5 minutes when the profile gives no notBeforeTimeout.
    short = terminate_verdict(enabled=True, not_before_timeout=None, drain_wait=300.0, lapse=32.0)
    assert short.status is Status.FAIL and "5 min of notice" in short.summary
    lost = terminate_verdict(enabled=True, not_before_timeout="PT5M", drain_wait=280.0, lapse=32.0)
    assert lost.status is Status.WARN and "lost agent" in lost.summary


def test_os_image_notifications_are_reported() -> None:
    verdict = terminate_verdict(enabled=True, not_before_timeout="PT15M", drain_wait=35.0, lapse=32.0,
                                os_image="on (PT15M)")
    assert "OS image notifications on (PT15M)" in verdict.summary


def test_automatic_approvals_fail_and_say_how_to_turn_them_off() -> None:
    passed = auto_approve_verdict(reboot=False, redeploy=None, resource="scale set web", command="az vmss update")
    assert passed.status is Status.PASS and "allInstancesDown, the default" in passed.summary
    verdict = auto_approve_verdict(reboot=True, redeploy=True, resource="scale set web",
                                   command="az vmss update --ids ID")
    assert verdict.status is Status.FAIL and "appear as Started with no Scheduled phase" in verdict.summary
    assert verdict.fix == ("az vmss update --ids ID --set scheduledEventsPolicy.userInitiatedReboot."
                           "automaticallyApprove=false scheduledEventsPolicy.userInitiatedRedeploy.automaticallyApprove"
                           "=false")


def test_all_instances_down_turned_off_warns_that_such_an_event_waits_its_notice() -> None:
    verdict = auto_approve_verdict(reboot=False, redeploy=False, all_down=False, resource="VM vm0",
                                   command="az vm update --ids ID")
    assert verdict.status is Status.WARN and "waits its whole notice with nothing serving" in verdict.summary
    assert verdict.fix == "az vm update --ids ID --set scheduledEventsPolicy.allInstancesDown.automaticallyApprove=true"
    assert auto_approve_verdict(reboot=False, redeploy=False, all_down=True, resource="VM vm0",
                                command="az vm update --ids ID").status is Status.PASS


@pytest.mark.parametrize(("priority", "status"), [(None, Status.PASS), ("Regular", Status.PASS),
                                                  ("Spot", Status.WARN), ("Low", Status.WARN)])
def test_spot_warns(priority: str | None, status: Status) -> None:
    verdict = spot_verdict(priority=priority, resource="VM vm0")
    assert verdict.status is status
    if status is Status.WARN:
        assert "Preempt with 30 s of notice" in verdict.summary and verdict.fix


def test_repairs_reading_the_drain_probe_lead_with_the_application_health_endpoint() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT10M", repair_action="Replace",
                              health_source="load balancer probe p", drain_probe_source=True,
                              app_health="port 9110 /apphealth")
    assert verdict.status is Status.FAIL
    assert verdict.fix.startswith("take the repairs' health source off the drain probe: point the Application "
                                  "Health extension at the agent's application health endpoint (port 9110 /apphealth)")
    assert verdict.fix.index("/apphealth") < verdict.fix.index("gracePeriod")


def test_the_repairs_check_names_where_this_configuration_serves_application_health(tmp_path: Path) -> None:
    from coordinator.config import Settings
    from coordinator.doctor.azure import AzureSeen, check_repairs
    from coordinator.doctor.context import Context

    lb = f"{SUB}/Microsoft.Network/loadBalancers/lb"
    scale_set = {"properties": {
        "automaticRepairsPolicy": {"enabled": True, "gracePeriod": "PT10M"},
        "virtualMachineProfile": {"networkProfile": {"healthProbe": {"id": f"{lb}/probes/drain"}}},
    }}
    balancer = {"name": "lb", "properties": {"probes": [
        {"name": "drain", "properties": {"protocol": "Http", "port": 8090, "requestPath": "/health"}}]}}
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "http": {"listen": "127.0.0.1:9200"},
                                        "app_health": {"listen": "127.0.0.1:9111"}})
    ctx = Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5,
                  azure=AzureSeen(load_balancers={lb.lower(): balancer}, scale_set=scale_set,
                                  scale_set_id=f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web"))
    verdict = check_repairs(ctx)
    assert verdict.status is Status.FAIL
    assert "application health endpoint (port 9111 /apphealth or port 9200 /apphealth)" in verdict.fix


# --- the azure-lb check: the action's identity, its pools, and its right to write them --------------------

LB_ID = f"{SUB}/Microsoft.Network/loadBalancers/web-lb"
POOL_ID = f"{LB_ID}/backendAddressPools/web"
ARM = "https://arm.test"
WRITE = "Microsoft.Network/loadBalancers/backendAddressPools/write"
NETWORK_CONTRIBUTOR = {"actions": ["Microsoft.Authorization/*/read", "Microsoft.Network/*",
                                   "Microsoft.Resources/deployments/*"], "notActions": []}


def _pool(*addresses: tuple[str, str | None]) -> dict[str, object]:
    return {"id": POOL_ID, "name": "web", "etag": 'W/"1"', "properties": {"loadBalancerBackendAddresses": [
        {"name": name, "properties": {"ipAddress": ip, "adminState": "None"} if ip else {}}
        for name, ip in addresses]}}


class FakeAzure:
    """IMDS's token endpoint and ARM, as ``httpx.MockTransport`` handlers: what each answers can be changed."""

    def __init__(self) -> None:
        self.token: httpx.Response = httpx.Response(200, json={"access_token": "t0k3n", "expires_in": "3600"})
        self.pool: httpx.Response | Exception = httpx.Response(200, json=_pool(("vm0", "10.0.0.4"), ("vm1", None)))
        self.permissions: httpx.Response = httpx.Response(200, json={"value": [NETWORK_CONTRIBUTOR]})
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(f"{request.method} {request.url.host}{request.url.path}")
        if request.url.host == "imds.test":
            assert request.headers["Metadata"] == "true"
            return self.token
        assert request.method == "GET" and request.headers["Authorization"] == "Bearer t0k3n"
        if request.url.path.endswith("/providers/Microsoft.Authorization/permissions"):
            assert request.url.params["api-version"] == "2022-04-01"
            assert request.url.path == f"{LB_ID}/providers/Microsoft.Authorization/permissions"
            return self.permissions
        assert request.url.path == POOL_ID
        if isinstance(self.pool, Exception):
            raise self.pool
        return self.pool


def _arm_error(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": f"{code} for the test"}})


class FakeTime:
    """The clock the ARM client waits on: ``sleep`` moves it (a retried request costs no real time)."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _lb_context(tmp_path: Path, actions: list[dict[str, object]] | None = None) -> Any:
    from coordinator.config import Settings
    from coordinator.doctor.context import Context

    if actions is None:
        actions = [{"type": "azure-lb", "backend_pools": [POOL_ID], "backend_address": "vm0",
                    "imds_url": "http://imds.test", "arm_url": ARM}]
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "actions": actions})
    return Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 30)


def _admin_state(tmp_path: Path, azure: FakeAzure, actions: list[dict[str, object]] | None = None) -> Verdict:
    from coordinator.doctor.azure_lb import check_admin_state

    fake = FakeTime()
    return check_admin_state(_lb_context(tmp_path, actions), httpx.MockTransport(azure), clock=fake.clock,
                             sleep=fake.sleep)


def test_the_azure_lb_check_is_skipped_without_an_azure_lb_action(tmp_path: Path) -> None:
    azure = FakeAzure()
    verdict = _admin_state(tmp_path, azure, actions=[])
    assert verdict.status is Status.SKIP and "no azure-lb action" in verdict.summary
    assert azure.asked == []


def test_an_identity_that_may_read_and_write_the_pool_passes(tmp_path: Path) -> None:
    azure = FakeAzure()
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.PASS, verdict
    assert verdict.summary == (f"azure-lb: the system-assigned identity got a token, read vm0 in pool(s) web-lb/web "
                               f"(admin state None), and may write them ({WRITE} granted)")
    assert azure.asked == ["GET imds.test/metadata/identity/oauth2/token", f"GET arm.test{POOL_ID}",
                           f"GET arm.test{LB_ID}/providers/Microsoft.Authorization/permissions"]
    assert verdict.details["permissions"] == [{"load_balancer": LB_ID, "write": True, "error": None}]


def test_no_token_names_the_identity_and_imds(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.token = httpx.Response(400, json={"error": "invalid_request", "error_description": "Identity not found"})
    verdict = _admin_state(tmp_path, azure, actions=[{
        "type": "azure-lb", "backend_pools": [POOL_ID], "backend_address": "vm0", "imds_url": "http://imds.test",
        "arm_url": ARM, "client_id": "11111111-2222-3333-4444-555555555555"}])
    assert verdict.status is Status.FAIL
    assert "no token for user-assigned identity 11111111-2222-3333-4444-555555555555 from IMDS at " \
           "http://imds.test" in verdict.summary and "Identity not found" in verdict.summary
    assert "az vm identity assign" in verdict.fix and "client_id" in verdict.fix
    assert [a for a in azure.asked if "arm.test" in a] == []


def test_arm_unreachable_names_the_arm_url(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.pool = httpx.ConnectError("connection refused")
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.FAIL
    assert f"ARM at {ARM} cannot be reached from this VM" in verdict.summary
    assert f"open outbound HTTPS from this VM to {ARM}" in verdict.fix and "AzureResourceManager" in verdict.fix
    assert not any("permissions" in a for a in azure.asked)  # nothing more to learn from an unreachable ARM


def test_a_403_on_the_pool_names_the_missing_role_and_the_command(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.pool = _arm_error(403, "AuthorizationFailed")
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.FAIL
    assert ("the system-assigned identity may not read pool web-lb/web (403 AuthorizationFailed): the identity "
            "lacks a role that may read/write the pool") in verdict.summary
    assert verdict.fix.startswith(f"give it Network Contributor on the load balancer {LB_ID}: az role assignment "
                                  "create --assignee-object-id PRINCIPAL_ID --assignee-principal-type "
                                  f"ServicePrincipal --role \"Network Contributor\" --scope {LB_ID}")


def test_a_pool_that_does_not_exist_fails(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.pool = _arm_error(404, "NotFound")
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.FAIL and "pool web-lb/web not found (404 NotFound)" in verdict.summary
    assert "az network lb address-pool list -g rg --lb-name web-lb" in verdict.fix


def test_an_address_missing_from_the_pool_fails_listing_the_addresses(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.pool = httpx.Response(200, json=_pool(("web_1", "10.0.0.5"), ("web_2", "10.0.0.6")))
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.FAIL
    assert ("backend address vm0 is not in pool web-lb/web (its addresses: web_1 (10.0.0.5), web_2 (10.0.0.6))"
            in verdict.summary)
    assert "backend_address" in verdict.fix


def test_an_address_found_by_its_ip_address_passes(tmp_path: Path) -> None:
    azure = FakeAzure()
    verdict = _admin_state(tmp_path, azure, actions=[{
        "type": "azure-lb", "backend_pools": [POOL_ID], "backend_address": "10.0.0.4", "imds_url": "http://imds.test",
        "arm_url": ARM}])
    assert verdict.status is Status.PASS, verdict


def test_a_reader_may_read_the_pool_but_not_write_it(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.permissions = httpx.Response(200, json={"value": [{"actions": ["*/read"], "notActions": []}]})
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.FAIL
    assert (f"the system-assigned identity may not write the pools of load balancer web-lb: {WRITE} is not granted "
            "there (granted: */read)") in verdict.summary
    assert "Network Contributor" in verdict.fix and f"--scope {LB_ID}" in verdict.fix


def test_permissions_that_cannot_be_read_warn_that_the_write_is_not_verified(tmp_path: Path) -> None:
    azure = FakeAzure()
    azure.permissions = _arm_error(403, "AuthorizationFailed")
    verdict = _admin_state(tmp_path, azure)
    assert verdict.status is Status.WARN and "was not verified" in verdict.summary
    assert "Microsoft.Authorization/permissions/read" in verdict.fix


@pytest.mark.parametrize(("permissions", "write"), [
    ([{"actions": ["*"], "notActions": []}], True),
    ([{"actions": ["Microsoft.Network/*"], "notActions": []}], True),
    ([{"actions": ["microsoft.network/loadbalancers/backendaddresspools/write"]}], True),  # ARM ignores case
    ([{"actions": ["Microsoft.Network/loadBalancers/*/write"], "notActions": []}], True),
    ([{"actions": ["Microsoft.Network/*"], "notActions": ["Microsoft.Network/loadBalancers/*"]}], False),
    ([{"actions": ["Microsoft.Network/*"], "notActions": ["*/write"]}], False),
    # notActions take away from their own entry only: another role may still grant it.
    ([{"actions": ["*"], "notActions": ["Microsoft.Network/*"]}, {"actions": [WRITE], "notActions": []}], True),
    ([{"actions": ["Microsoft.Network/loadBalancers/read"], "notActions": []}], False),
    ([{"actions": ["Microsoft.Network/loadBalancers/backendAddressPools/writeX"]}], False),
    ([], False),
])
def test_the_write_is_granted_as_arm_matches_actions(permissions: list[dict[str, list[str]]], write: bool) -> None:
    from coordinator.doctor.verdicts import granted

    entries = [(p.get("actions", []), p.get("notActions", [])) for p in permissions]
    assert granted(entries, WRITE) is write


def test_every_page_of_permissions_is_read_on_arms_own_host(tmp_path: Path) -> None:
    azure = FakeAzure()
    pages = [httpx.Response(200, json={"value": [{"actions": ["*/read"], "notActions": []}],
                                       "nextLink": f"{ARM}{LB_ID}/providers/Microsoft.Authorization/permissions"
                                                   "?api-version=2022-04-01&$skiptoken=2"}),
             httpx.Response(200, json={"value": [{"actions": [WRITE], "notActions": []}],
                                       "nextLink": "https://elsewhere.test/steal"})]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/permissions"):
            azure.asked.append(str(request.url))
            return pages.pop(0)
        return azure(request)

    from coordinator.doctor.azure_lb import check_admin_state

    fake = FakeTime()
    verdict = check_admin_state(_lb_context(tmp_path), httpx.MockTransport(answer), clock=fake.clock, sleep=fake.sleep)
    assert verdict.status is Status.PASS, verdict
    assert pages == [] and not any("elsewhere" in a for a in azure.asked)


def test_several_azure_lb_actions_are_each_checked(tmp_path: Path) -> None:
    azure = FakeAzure()
    other_pool = f"{SUB}/Microsoft.Network/loadBalancers/other-lb/backendAddressPools/web"
    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == other_pool:
            return _arm_error(403, "AuthorizationFailed")
        return azure(request)

    from coordinator.doctor.azure_lb import check_admin_state

    base = {"type": "azure-lb", "backend_address": "vm0", "imds_url": "http://imds.test", "arm_url": ARM}
    fake = FakeTime()
    verdict = check_admin_state(
        _lb_context(tmp_path, [{**base, "name": "front", "backend_pools": [POOL_ID]},
                               {**base, "name": "back", "backend_pools": [other_pool]}]),
        httpx.MockTransport(answer), clock=fake.clock, sleep=fake.sleep)
    assert verdict.status is Status.FAIL
    assert verdict.summary.startswith("front: the system-assigned identity got a token")
    assert "; back: the system-assigned identity may not read pool other-lb/web (403" in verdict.summary
    assert "--scope " + other_pool.rsplit("/backendAddressPools", 1)[0] in verdict.fix
