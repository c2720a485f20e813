"""The simulator's managed-identity endpoint and ARM backend address pools, over HTTP, as a real process."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from azuresim.client import SimControlError
from tests.plugins.simulator import ARM_POOL, RunningSimulator, SimulatorFactory, two_vms_with_arm

POOL = ARM_POOL
ARM_VERSION = {"api-version": "2023-09-01"}
TOKEN_QUERY = {"api-version": "2018-02-01", "resource": "https://management.azure.com/"}


@pytest.fixture
def sim(imds_sim: SimulatorFactory) -> RunningSimulator:
    return two_vms_with_arm(imds_sim, 0.3)


def _token(sim: RunningSimulator, vm: str = "vm0", **params: str) -> httpx.Response:
    return httpx.get(f"{sim.urls[vm]}/metadata/identity/oauth2/token", params={**TOKEN_QUERY, **params},
                     headers={"Metadata": "true"}, trust_env=False)


def _bearer(sim: RunningSimulator, vm: str = "vm0") -> dict[str, str]:
    return {"Authorization": "Bearer " + _token(sim, vm).json()["access_token"]}


def _get(sim: RunningSimulator, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(sim.arm_url + POOL, params=ARM_VERSION, headers=headers, trust_env=False)


def _put(sim: RunningSimulator, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
    return httpx.put(sim.arm_url + POOL, params=ARM_VERSION, headers=headers, json=body, trust_env=False)


def _with_state(pool: dict[str, Any], address: str, state: str) -> dict[str, Any]:
    for entry in pool["properties"]["loadBalancerBackendAddresses"]:
        if entry["name"] == address:
            entry["properties"]["adminState"] = state
    return pool


def test_token_endpoint_answers_like_imds(sim: RunningSimulator) -> None:
    answer = _token(sim)
    assert answer.status_code == 200
    body = answer.json()
    assert body["token_type"] == "Bearer" and body["resource"] == "https://management.azure.com/"
    # IMDS sends the numbers as strings.
    assert isinstance(body["expires_in"], str) and int(body["expires_in"]) == 86399
    assert int(body["expires_on"]) - time.time() == pytest.approx(86399, abs=5)

    no_header = httpx.get(f"{sim.urls['vm0']}/metadata/identity/oauth2/token", params=TOKEN_QUERY, trust_env=False)
    assert no_header.status_code == 400 and "metadata header" in no_header.json()["error_description"]
    no_resource = _token(sim, resource="")
    assert no_resource.status_code == 400 and "resource" in no_resource.json()["error_description"]
    unknown = _token(sim, client_id="11111111-2222-3333-4444-555555555555")
    assert unknown.status_code == 400 and unknown.json()["error_description"] == "Identity not found"


def test_user_assigned_identity_by_client_id_and_resource_id(sim: RunningSimulator) -> None:
    client_id = "11111111-2222-3333-4444-555555555555"
    res_id = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/drain"
    sim.control.add_identity(client_id, res_id, vms=["vm1"])
    assert _token(sim, "vm0", client_id=client_id).status_code == 400  # assigned to vm1 only
    by_client = _token(sim, "vm1", client_id=client_id)
    assert by_client.status_code == 200 and by_client.json()["client_id"] == client_id
    assert _token(sim, "vm1", msi_res_id=res_id).json()["client_id"] == client_id


def test_token_faults_429_and_500_with_retry_after(sim: RunningSimulator) -> None:
    sim.control.add_azure_fault("token", status=429, retry_after=2)
    sim.control.add_azure_fault("token", status=500)
    throttled = _token(sim)
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    assert _token(sim).status_code == 500
    assert _token(sim).status_code == 200


def test_arm_refuses_without_a_valid_token_and_without_the_role(sim: RunningSimulator) -> None:
    missing = _get(sim, {})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "AuthenticationFailed"
    assert "WWW-Authenticate" in missing.headers
    assert _get(sim, {"Authorization": "Bearer forged"}).status_code == 401
    headers = _bearer(sim)
    sim.control.expire_tokens()
    expired = _get(sim, headers)
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "ExpiredAuthenticationToken"

    sim.control.set_role("vm0", "reader")
    headers = _bearer(sim)
    pool = _get(sim, headers)
    assert pool.status_code == 200
    refused = _put(sim, headers | {"If-Match": pool.json()["etag"]}, _with_state(pool.json(), "vm0", "Down"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "AuthorizationFailed"
    assert "backendAddressPools/write" in refused.json()["error"]["message"]
    sim.control.set_role("vm0", "none")
    assert _get(sim, headers).status_code == 403
    assert sim.control.pools()[POOL]["admin_states"] == {"vm0": "None", "vm1": "None"}


def test_put_completes_asynchronously_and_only_then_takes_effect(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    pool = _get(sim, headers).json()
    assert pool["type"] == "Microsoft.Network/loadBalancers/backendAddressPools" and pool["etag"]
    answer = _put(sim, headers | {"If-Match": pool["etag"]}, _with_state(pool, "vm0", "Down"))
    assert answer.status_code == 200
    assert answer.json()["properties"]["provisioningState"] == "Updating"
    operation = answer.headers["Azure-AsyncOperation"]
    assert "/providers/Microsoft.Network/locations/westeurope/operations/" in operation
    assert httpx.get(operation, headers=headers, trust_env=False).json() == {"status": "InProgress"}
    view = sim.control.pools()[POOL]
    assert view["admin_states"]["vm0"] == "Down" and view["effective"]["vm0"] == "None"
    time.sleep(0.4)
    assert httpx.get(operation, headers=headers, trust_env=False).json() == {"status": "Succeeded"}
    view = sim.control.pools()[POOL]
    assert view["effective"] == {"vm0": "Down", "vm1": "None"} and view["provisioning_state"] == "Succeeded"
    assert _get(sim, headers).json()["etag"] != pool["etag"]


def test_if_match_on_a_changed_pool_is_412_and_nothing_changes(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    pool = _get(sim, headers).json()
    sim.control.write_address(POOL, "vm1", "Down")  # another writer, between our read and our write
    stale = _put(sim, headers | {"If-Match": pool["etag"]}, _with_state(pool, "vm0", "Down"))
    assert stale.status_code == 412 and stale.json()["error"]["code"] == "PreconditionFailed"
    assert sim.control.pools()[POOL]["admin_states"] == {"vm0": "None", "vm1": "Down"}
    # concurrent_write: the same, queued for the next PUT.
    pool = _get(sim, headers).json()
    sim.control.add_azure_fault("arm", "concurrent_write")
    assert _put(sim, headers | {"If-Match": pool["etag"]}, _with_state(pool, "vm0", "Down")).status_code == 412


def test_arm_429_with_retry_after_and_bad_requests(sim: RunningSimulator) -> None:
    headers = _bearer(sim)
    sim.control.add_azure_fault("arm", status=429, retry_after=3, methods=["GET"])
    throttled = _get(sim, headers)
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "3"
    assert throttled.json()["error"]["code"] == "TooManyRequests"
    pool = _get(sim, headers).json()
    bad = _put(sim, headers | {"If-Match": pool["etag"]}, _with_state(pool, "vm0", "Drained"))
    assert bad.status_code == 400 and "adminState" in bad.json()["error"]["message"]
    no_version = httpx.get(sim.arm_url + POOL, headers=headers, trust_env=False)
    assert no_version.status_code == 400 and no_version.json()["error"]["code"] == "MissingApiVersionParameter"
    missing = httpx.get(sim.arm_url + POOL.replace("pool-web", "pool-none"), params=ARM_VERSION, headers=headers,
                        trust_env=False)
    assert missing.status_code == 404
    calls = sim.control.arm_calls()
    assert calls["calls"]["pool_get"] == 4 and calls["calls"]["pool_put"] == 1
    assert calls["statuses"]["pool_get 429"] == 1 and calls["statuses"]["pool_put 400"] == 1


# -- read-only resources: load balancers and their probes, scale sets, VMs ----------------------------------

SUB = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-app/providers"
LB = f"{SUB}/Microsoft.Network/loadBalancers/lb-app"
SCALE_SET = f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web"
VM = f"{SUB}/Microsoft.Compute/virtualMachines/app0"
COMPUTE_VERSION = {"api-version": "2024-07-01"}


def _read(sim: RunningSimulator, resource: str, version: dict[str, str], vm: str = "vm0") -> httpx.Response:
    return httpx.get(sim.arm_url + resource, params=version, headers=_bearer(sim, vm), trust_env=False)


def test_a_load_balancer_answers_its_probes_and_pools_as_the_specification_shapes_them(sim: RunningSimulator) -> None:
    sim.control.add_load_balancer(LB, [
        {"name": "drain", "protocol": "Http", "port": 8090, "interval_in_seconds": 5, "probe_threshold": 2,
         "request_path": "/health"},
        {"name": "tcp", "protocol": "Tcp", "port": 22, "number_of_probes": 3},
    ])
    answer = _read(sim, LB, ARM_VERSION)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["name"], body["id"], body["type"]) == ("lb-app", LB, "Microsoft.Network/loadBalancers")
    probes = {p["name"]: p for p in body["properties"]["probes"]}
    assert probes["drain"]["id"] == f"{LB}/probes/drain"
    assert probes["drain"]["properties"] == {"provisioningState": "Succeeded", "protocol": "Http", "port": 8090,
                                             "intervalInSeconds": 5, "probeThreshold": 2, "requestPath": "/health",
                                             "loadBalancingRules": []}
    # Not given: left out, as ARM leaves out what was never set; a Tcp probe has no requestPath.
    assert probes["tcp"]["properties"]["numberOfProbes"] == 3 and "requestPath" not in probes["tcp"]["properties"]
    assert [p["id"] for p in body["properties"]["backendAddressPools"]] == [POOL]
    one = _read(sim, f"{LB}/probes/drain", ARM_VERSION)
    assert one.status_code == 200 and one.json() == probes["drain"]
    assert _read(sim, f"{LB}/probes/none", ARM_VERSION).status_code == 404


def test_a_scale_set_answers_the_settings_that_change_what_the_agent_sees(sim: RunningSimulator) -> None:
    sim.control.add_scale_set(SCALE_SET, automatic_repairs={"enabled": True, "grace_period": "PT10M"},
                              terminate_notification={"enable": True, "not_before_timeout": "PT7M"},
                              os_image_notification={"enable": True, "not_before_timeout": "PT15M"},
                              scheduled_events_policy={"user_initiated_reboot": True}, priority="Spot",
                              health_probe=f"{LB}/probes/drain",
                              health_extension={"protocol": "http", "port": 8091, "request_path": "/app"})
    sim.control.set_role("vm0", "reader")
    answer = _read(sim, SCALE_SET, COMPUTE_VERSION)
    assert answer.status_code == 200, answer.text
    properties = answer.json()["properties"]
    assert properties["automaticRepairsPolicy"] == {"enabled": True, "gracePeriod": "PT10M", "repairAction": "Replace"}
    assert properties["scheduledEventsPolicy"] == {"userInitiatedReboot": {"automaticallyApprove": True}}
    profile = properties["virtualMachineProfile"]
    assert profile["priority"] == "Spot" and profile["evictionPolicy"] == "Deallocate"
    assert profile["scheduledEventsProfile"] == {
        "terminateNotificationProfile": {"notBeforeTimeout": "PT7M", "enable": True},
        "osImageNotificationProfile": {"notBeforeTimeout": "PT15M", "enable": True}}
    assert profile["networkProfile"]["healthProbe"] == {"id": f"{LB}/probes/drain"}
    extension = profile["extensionProfile"]["extensions"][0]["properties"]
    assert extension["type"] == "ApplicationHealthLinux"
    assert extension["settings"] == {"protocol": "http", "port": 8091, "requestPath": "/app"}
    # The Network api-version is not the Compute one.
    assert _read(sim, SCALE_SET, ARM_VERSION).json()["error"]["code"] == "InvalidApiVersionParameter"


def test_a_vm_answers_its_priority_and_scheduled_events_policy(sim: RunningSimulator) -> None:
    sim.control.add_vm_resource(VM, priority="Regular", scheduled_events_policy={"user_initiated_redeploy": True})
    sim.control.set_role("vm0", "reader")
    properties = _read(sim, VM, COMPUTE_VERSION).json()["properties"]
    assert properties["priority"] == "Regular"
    assert properties["scheduledEventsPolicy"] == {"userInitiatedRedeploy": {"automaticallyApprove": True}}


def test_reading_compute_needs_reader_and_network_contributor_reads_only_the_network(sim: RunningSimulator) -> None:
    sim.control.add_load_balancer(LB, [{"name": "drain", "protocol": "Http", "port": 8090, "request_path": "/"}])
    sim.control.add_scale_set(SCALE_SET)
    # The default role, Network Contributor: the load balancer yes, the scale set no.
    assert _read(sim, LB, ARM_VERSION).status_code == 200
    refused = _read(sim, SCALE_SET, COMPUTE_VERSION)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "AuthorizationFailed"
    assert "Microsoft.Compute/virtualMachineScaleSets/read" in refused.json()["error"]["message"]
    sim.control.set_role("vm0", roles=["network-contributor", "reader"])
    assert _read(sim, SCALE_SET, COMPUTE_VERSION).status_code == 200
    sim.control.set_role("vm0", "none")
    assert _read(sim, LB, ARM_VERSION).status_code == 403
    missing = _read(sim, f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/other", {"api-version": "2024-07-01"},
                    vm="vm1")
    assert missing.status_code == 403  # vm1 holds Network Contributor: no read of compute at all
    sim.control.set_role("vm1", "reader")
    missing = _read(sim, f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/other", COMPUTE_VERSION, vm="vm1")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "ResourceNotFound"
    assert httpx.get(sim.arm_url + SCALE_SET, params=COMPUTE_VERSION, trust_env=False).status_code == 401


def test_the_control_api_refuses_what_arm_would_refuse(sim: RunningSimulator) -> None:
    with pytest.raises(SimControlError, match="PT10M to PT90M"):
        sim.control.add_scale_set(SCALE_SET, automatic_repairs={"enabled": True, "grace_period": "PT5M"})
    with pytest.raises(SimControlError, match="PT5M to PT15M"):
        sim.control.add_scale_set(SCALE_SET, terminate_notification={"enable": True, "not_before_timeout": "PT20M"})
    with pytest.raises(SimControlError, match="interval_in_seconds"):
        sim.control.add_load_balancer(LB, [{"name": "p", "protocol": "Http", "port": 80, "interval_in_seconds": 2,
                                            "request_path": "/"}])
    with pytest.raises(SimControlError, match="request_path"):
        sim.control.add_load_balancer(LB, [{"name": "p", "protocol": "Tcp", "port": 80, "request_path": "/"}])


def test_a_user_reboot_the_policy_approves_appears_started_with_no_scheduled_phase(sim: RunningSimulator) -> None:
    """``scheduledEventsPolicy.userInitiatedReboot.automaticallyApprove``: Azure approves a user's reboot at
    once, so it appears Started, with no NotBefore and no time to drain (what ``coordinator doctor`` FAILs)."""
    app = f"{SUB}/Microsoft.Compute/availabilitySets/app"
    sim.control.add_availability_set(app, scheduled_events_policy={"user_initiated_reboot": True,
                                                                    "user_initiated_redeploy": False})
    sim.control.add_vm_resource(f"{SUB}/Microsoft.Compute/virtualMachines/vm0", availability_set=app)
    rebooted = sim.control.schedule("Reboot", ["vm0"], source="User", event_id="E-USER-REBOOT")
    assert rebooted["status"] == "Started" and rebooted["not_before"] is None
    [event] = sim.control.document("vm0")["Events"]
    assert (event["EventId"], event["EventStatus"], event["NotBefore"], event["EventSource"]) == (
        "E-USER-REBOOT", "Started", "", "User")
    transitions = [entry for entry in sim.control.log(kind="transition") if entry.get("event_id") == "E-USER-REBOOT"]
    assert [(t.get("from"), t.get("to")) for t in transitions][:1] == [(None, "Started")]
    assert "scheduledEventsPolicy" in transitions[0].get("reason", "")
    # What the policy does not approve keeps its Scheduled phase: a user redeploy (false here), a platform
    # reboot, and a user reboot of a VM the simulated ARM holds no policy for.
    for event_type, vm, source in (("Redeploy", "vm0", "User"), ("Reboot", "vm0", "Platform"),
                                   ("Reboot", "vm1", "User")):
        scheduled = sim.control.schedule(event_type, [vm], source=source)
        assert scheduled["status"] == "Scheduled" and scheduled["not_before"] is not None, (event_type, vm, source)


def test_a_scale_set_policy_approves_its_instances_user_redeploys(imds_sim: SimulatorFactory) -> None:
    sim = imds_sim(("web_0", "web_1"), extra_args=["--arm", "127.0.0.1:0", "--scale-set", "web"])
    sim.control.add_scale_set(SCALE_SET, scheduled_events_policy={"user_initiated_redeploy": True})
    assert sim.control.schedule("Redeploy", ["web_0", "web_1"], source="User")["status"] == "Started"
    assert sim.control.schedule("Reboot", ["web_1"], source="User")["status"] == "Scheduled"


def test_the_maintenance_api_acknowledges_events_as_imds_approves_them(sim: RunningSimulator) -> None:
    """``ScheduledEvents_Acknowledge`` and its list form: the same approval as one through IMDS, for the role
    that may make it."""
    vm0 = f"{SUB}/Microsoft.Compute/virtualMachines/vm0"
    maintenance = f"{sim.arm_url}{vm0}/providers/Microsoft.Maintenance/scheduledevents"
    version = {"api-version": "2025-11-01"}
    one = sim.control.schedule("Reboot", ["vm0"], event_id="E-ONE")["event_id"]
    two = sim.control.schedule("Freeze", ["vm1"], event_id="E-TWO")["event_id"]
    denied = httpx.post(f"{maintenance}/{one}/acknowledge", params=version, headers=_bearer(sim), trust_env=False)
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "AuthorizationFailed"
    sim.control.set_role("vm0", "scheduled-event-contributor")
    wrong = httpx.post(f"{maintenance}/{one}/acknowledge", params={"api-version": "2023-09-01"}, headers=_bearer(sim),
                       trust_env=False)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "InvalidApiVersionParameter"
    acked = httpx.post(f"{maintenance}/{one.lower()}/acknowledge", params=version, headers=_bearer(sim),
                       trust_env=False)
    assert acked.status_code == 200 and acked.json() == {"value": "Successfully Approved"}
    approvals = [e for e in sim.control.log(kind="approval") if e["vm"] == "maintenance-api"]
    assert [e["accepted"] for e in approvals] == [[one]]
    listed = httpx.post(maintenance, params=version, json={"value": [two, "E-NONE"]}, headers=_bearer(sim),
                        trust_env=False)
    assert listed.status_code == 400 and [d["target"] for d in listed.json()["error"]["details"]] == ["E-NONE"]
    unknown = httpx.post(f"{maintenance}/E-NONE/acknowledge", params=version, headers=_bearer(sim), trust_env=False)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "ScheduledEventNotFound"
    assert sim.control.event(two)["approved_by"] == ["maintenance-api"]
