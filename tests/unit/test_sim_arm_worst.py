"""The simulated ARM at its worst, on an injected clock: answers lost after the write applied, 5xx after
applying, operations slower than any deadline or ending Failed/Canceled, 409 AnotherOperationInProgress,
throttling by token buckets, tokens that expire or cannot be fetched, and the caller's own permissions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from azuresim.azure import AzureModel, EffectiveChange
from azuresim.errors import InvalidRequest
from azuresim.schema import ArmSettingsRequest, AzureFaultRequest, ThrottlingRequest, parse

SUB = "/subscriptions/s/resourceGroups/rg"
LB = f"{SUB}/providers/Microsoft.Network/loadBalancers/lb"
POOL = f"{LB}/backendAddressPools/pool"
OTHER_POOL = f"{LB}/backendAddressPools/other"
QUERY = {"api-version": "2023-09-01"}
TOKEN_QUERY = {"api-version": "2018-02-01", "resource": "https://management.azure.com/"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Arm:
    """One model on an injected clock, with vm0's token, and the requests a client makes."""

    def __init__(self, **options: Any) -> None:
        self.clock = Clock()
        self.seen: list[EffectiveChange] = []
        self.azure = AzureModel(["vm0", "vm1"], async_seconds=1.0, retry_after=2, clock=self.clock,
                                on_effective=self.seen.append, **options)
        for pool in (POOL, OTHER_POOL):
            self.azure.add_pool(pool, [{"name": "vm0", "ip_address": "10.0.0.4"},
                                       {"name": "vm1", "ip_address": "10.0.0.5"}])
        self.auth = self.token()

    def token(self, vm: str = "vm0") -> str:
        answer = self.azure.token(vm, "GET", TOKEN_QUERY, True)
        assert answer.status == 200, answer
        return f"Bearer {answer.body['access_token']}"

    def get(self, path: str = POOL, query: dict[str, str] | None = None, auth: str | None = None) -> Any:
        return self.azure.arm("GET", path, QUERY if query is None else query, {"authorization": auth or self.auth},
                              b"", "http://arm")

    def put(self, states: dict[str, str], path: str = POOL, if_match: str | None = None) -> Any:
        body = {"properties": {"loadBalancerBackendAddresses": [
            {"name": name, "properties": {"adminState": state}} for name, state in states.items()]}}
        headers = {"authorization": self.auth} | ({"if-match": if_match} if if_match else {})
        return self.azure.arm("PUT", path, QUERY, headers, json.dumps(body).encode(), "http://arm")

    def operation(self, answer: Any) -> Any:
        url = answer.headers["Azure-AsyncOperation"].removeprefix("http://arm")
        path, _, _ = url.partition("?")
        return self.get(path).body

    def pool(self, pool_id: str = POOL) -> dict[str, Any]:
        return next(p for p in self.azure.pools() if p["id"] == pool_id)


@pytest.fixture
def arm() -> Arm:
    return Arm()


def _states(answer: Any) -> dict[str, str]:
    return {a["name"]: a["properties"]["adminState"] for a in answer.body["properties"]["loadBalancerBackendAddresses"]}


# -- 1. the answer lost after the write applied -----------------------------------------------------------


def test_lost_answer_applies_the_put_then_sends_nothing(arm: Arm) -> None:
    before = arm.get().body["etag"]
    arm.azure.add_fault("arm", "lost_answer")
    answer = arm.put({"vm0": "Down", "vm1": "None"})
    assert answer.drop and answer.delay == 0
    # Applied: new content and etag, the operation started (the pool Updating), effective once it is due.
    read = arm.get()
    assert read.body["etag"] != before and _states(read) == {"vm0": "Down", "vm1": "None"}
    assert read.body["properties"]["provisioningState"] == "Updating"
    arm.clock.now += 1.0
    arm.azure.tick()
    assert arm.pool()["effective"] == {"vm0": "Down", "vm1": "None"}
    assert arm.azure.calls()["statuses"]["pool_put dropped"] == 1
    assert arm.azure.faults() == []  # used up
    assert not arm.put({"vm0": "None", "vm1": "None"}).drop


def test_lost_answer_with_a_delay_sends_the_answer_late(arm: Arm) -> None:
    arm.azure.add_fault("arm", "lost_answer", delay_seconds=30)
    assert arm.azure.faults()[0]["delay_seconds"] == 30
    answer = arm.put({"vm0": "Down"})
    assert answer.status == 200 and not answer.drop and answer.delay == 30
    assert "Azure-AsyncOperation" in answer.headers
    assert _states(arm.get())["vm0"] == "Down"


def test_faults_of_an_applied_put_wait_for_a_put_that_is_applied(arm: Arm) -> None:
    arm.azure.add_fault("arm", "lost_answer")
    refused = arm.put({"vm0": "Down"}, if_match='W/"stale"')
    assert refused.status == 412 and not refused.drop
    assert len(arm.azure.faults()) == 1  # a refused PUT leaves it queued
    assert arm.get().status == 200  # and a GET is not hit
    assert arm.put({"vm0": "Down"}).drop


# -- a write held on its way ------------------------------------------------------------------------------


def test_a_stalled_write_shows_nothing_until_it_reaches_the_pool_and_is_judged_then(arm: Arm) -> None:
    etag = arm.get().body["etag"]
    arm.azure.add_fault("arm", "stalled_write", seconds=30, count=2)
    assert arm.azure.faults()[0]["seconds"] == 30
    first = arm.put({"vm0": "Down", "vm1": "None"}, if_match=etag)
    assert first.drop and first.delay == 30  # the connection is held, then closed unanswered
    arm.clock.now += 10
    later = arm.put({"vm0": "Down", "vm1": "Down"}, if_match=etag)  # held too, 10 s behind the first
    assert later.drop
    read = arm.get()  # nothing of either shows: the pool as it was
    assert read.body["etag"] == etag and _states(read) == {"vm0": "None", "vm1": "None"}
    assert read.body["properties"]["provisioningState"] == "Succeeded"

    arm.clock.now += 20  # the first reaches the pool: its If-Match holds, it applies
    arm.azure.tick()
    assert _states(arm.get()) == {"vm0": "Down", "vm1": "None"}
    arm.clock.now += 11  # the second was sent against the same etag, which the first replaced
    arm.azure.tick()
    statuses = arm.azure.calls()["statuses"]
    assert (statuses["pool_put dropped"], statuses["pool_put landed 200"], statuses["pool_put landed 412"]) == (2, 1, 1)
    assert arm.pool()["effective"] == {"vm0": "Down", "vm1": "None"}


def test_a_write_that_replaced_the_etag_fences_a_stalled_one(arm: Arm) -> None:
    etag = arm.get().body["etag"]
    arm.azure.add_fault("arm", "stalled_write", seconds=30)
    assert arm.put({"vm0": "Down", "vm1": "None"}, if_match=etag).drop
    assert arm.put({"vm0": "None", "vm1": "None"}, if_match=etag).status == 200  # same etag, not held
    arm.clock.now += 31
    arm.azure.tick()
    assert arm.azure.calls()["statuses"]["pool_put landed 412"] == 1
    assert arm.pool()["admin_states"] == arm.pool()["effective"] == {"vm0": "None", "vm1": "None"}


# -- 2. 5xx after applying ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), [(500, "InternalServerError"), (502, "BadGateway"),
                                              (503, "ServiceUnavailable"), (504, "GatewayTimeout")])
def test_status_after_apply_answers_a_server_error_for_a_write_it_applied(arm: Arm, status: int, code: str) -> None:
    arm.azure.add_fault("arm", "status_after_apply", status=status, retry_after=5)
    answer = arm.put({"vm0": "Down"})
    assert answer.status == status and answer.body["error"]["code"] == code
    assert answer.headers["Retry-After"] == "5"
    assert _states(arm.get())["vm0"] == "Down" and arm.pool()["writes"] == 1
    arm.clock.now += 1.0
    assert [c.after for c in arm.azure.tick()] == ["Down"]
    assert arm.azure.calls()["statuses"][f"pool_put {status}"] == 1


# -- 3. writes slower than any deadline --------------------------------------------------------------------


def test_slow_operation_keeps_the_pool_updating_and_the_data_plane_unchanged_until_it_ends(arm: Arm) -> None:
    arm.azure.add_fault("arm", "slow_operation", seconds=600, count=2)
    first = arm.put({"vm0": "Down"})
    arm.clock.now += 300
    arm.azure.tick()
    assert arm.operation(first) == {"status": "InProgress"}
    assert arm.get().body["properties"]["provisioningState"] == "Updating"
    assert arm.pool()["effective"]["vm0"] == "None" and arm.seen == []
    arm.clock.now += 300
    assert arm.operation(first) == {"status": "Succeeded"}
    assert arm.pool()["effective"]["vm0"] == "Down" and arm.pool()["provisioning_state"] == "Succeeded"
    # The second PUT is slow too; the third is not.
    second = arm.put({"vm0": "None"})
    arm.clock.now += 1
    assert arm.operation(second) == {"status": "InProgress"}
    arm.clock.now += 599
    assert arm.operation(second) == {"status": "Succeeded"}
    third = arm.put({"vm0": "Up"})
    arm.clock.now += 1
    assert arm.operation(third) == {"status": "Succeeded"}


def test_a_pools_operations_end_in_the_order_they_were_accepted(arm: Arm) -> None:
    arm.azure.add_fault("arm", "slow_operation", seconds=100)
    slow = arm.put({"vm0": "Down"})
    quick = arm.put({"vm0": "Up"})  # accepted after the slow one: queued behind it
    arm.clock.now += 50
    assert arm.operation(quick) == {"status": "InProgress"}
    arm.clock.now += 50
    assert arm.operation(slow) == {"status": "Succeeded"} and arm.operation(quick) == {"status": "Succeeded"}
    assert [(c.before, c.after) for c in arm.seen] == [("None", "Down"), ("Down", "Up")]


# -- 4. operations that end Failed or Canceled -------------------------------------------------------------


@pytest.mark.parametrize(("end", "code"), [("Failed", "InternalServerError"), ("Canceled", "Canceled")])
def test_an_operation_that_does_not_succeed_changes_nothing_but_the_provisioning_state(
        arm: Arm, end: str, code: str) -> None:
    arm.azure.add_fault("arm", "operation_end", end=end)
    assert arm.azure.faults()[0]["end"] == end
    answer = arm.put({"vm0": "Down", "vm1": "None"})
    assert answer.status == 200
    arm.clock.now += 1.0
    status = arm.operation(answer)
    assert status["status"] == end and status["error"]["code"] == code and status["error"]["message"]
    assert arm.seen == [] and arm.pool()["effective"] == {"vm0": "None", "vm1": "None"}
    read = arm.get()
    assert read.body["properties"]["provisioningState"] == "Failed"  # no Canceled in ProvisioningState
    assert _states(read)["vm0"] == "Down"  # what was asked, not what applies
    assert arm.azure.calls()["statuses"][f"operation {end}"] == 1
    # A later PUT re-drives it: a new operation, which succeeds.
    again = arm.put({"vm0": "Down", "vm1": "None"}, if_match=read.body["etag"])
    assert again.headers["Azure-AsyncOperation"] != answer.headers["Azure-AsyncOperation"]
    arm.clock.now += 1.0
    assert arm.operation(again) == {"status": "Succeeded"}
    assert arm.pool()["effective"]["vm0"] == "Down" and arm.pool()["provisioning_state"] == "Succeeded"


# -- 5. 409 AnotherOperationInProgress ---------------------------------------------------------------------


def test_a_put_during_an_operation_is_accepted_by_default(arm: Arm) -> None:
    assert arm.azure.configure()["conflict_while_updating"] is False
    arm.put({"vm0": "Down"})
    assert arm.put({"vm0": "Up"}).status == 200


def test_conflict_while_updating_refuses_a_put_while_the_load_balancer_is_busy() -> None:
    arm = Arm(conflict_while_updating=True)
    first = arm.put({"vm0": "Down"})
    etag = arm.get().body["etag"]
    refused = arm.put({"vm0": "Up"})
    assert refused.status == 409 and refused.body["error"]["code"] == "AnotherOperationInProgress"
    assert refused.headers["Retry-After"] == "2"
    assert first.headers["Azure-AsyncOperation"] in refused.body["error"]["message"]
    assert arm.get().body["etag"] == etag and _states(arm.get())["vm0"] == "Down"  # not applied
    assert arm.put({"vm1": "Down"}, path=OTHER_POOL).status == 409  # another pool of the same load balancer
    arm.clock.now += 1.0
    assert arm.put({"vm0": "Up"}).status == 200
    assert arm.azure.calls()["statuses"]["pool_put 409"] == 2


def test_configure_switches_conflicts_and_checks_its_arguments(arm: Arm) -> None:
    settings = arm.azure.configure(conflict_while_updating=True, async_seconds=5, retry_after=7)
    assert settings == {"conflict_while_updating": True, "async_seconds": 5.0, "retry_after": 7}
    arm.put({"vm0": "Down"})
    assert arm.put({"vm0": "Up"}).headers["Retry-After"] == "7"
    with pytest.raises(InvalidRequest, match="async_seconds"):
        arm.azure.configure(async_seconds=-1)
    with pytest.raises(InvalidRequest, match="retry_after"):
        arm.azure.configure(retry_after=-1)


# -- 6. throttling by token buckets ------------------------------------------------------------------------


def test_throttling_is_off_by_default_and_answers_carry_no_ratelimit_header(arm: Arm) -> None:
    assert arm.azure.throttling() == {"enabled": False}
    assert not any(h.startswith("x-ms-ratelimit") for h in arm.get().headers)


def test_an_empty_bucket_is_429_with_retry_after_and_a_write_is_not_applied(arm: Arm) -> None:
    view = arm.azure.set_throttling(read_capacity=2, read_refill=1, write_capacity=1, write_refill=0.25)
    assert view["enabled"] and view["read_capacity"] == 2 and view["write_refill"] == 0.25
    assert arm.get().headers["x-ms-ratelimit-remaining-subscription-reads"] == "1"
    assert arm.get().headers["x-ms-ratelimit-remaining-subscription-reads"] == "0"
    throttled = arm.get()
    assert throttled.status == 429 and throttled.body["error"]["code"] == "SubscriptionRequestsThrottled"
    assert throttled.headers["Retry-After"] == "1"
    assert throttled.headers["x-ms-ratelimit-remaining-subscription-reads"] == "0"
    arm.clock.now += 1.0
    assert arm.get().status == 200  # a token is back
    # Writes have their own bucket.
    written = arm.put({"vm0": "Down"})
    assert written.status == 200 and written.headers["x-ms-ratelimit-remaining-subscription-writes"] == "0"
    refused = arm.put({"vm0": "Up"})
    assert refused.status == 429 and refused.headers["Retry-After"] == "4"
    assert arm.pool()["admin_states"]["vm0"] == "Down" and arm.pool()["writes"] == 1  # not applied
    assert arm.azure.calls()["statuses"]["pool_put 429"] == 1
    assert arm.azure.throttling()["remaining"]["s"] == {"reads": 0, "writes": 0}


def test_operation_status_reads_count_and_subscriptions_have_their_own_buckets(arm: Arm) -> None:
    other = "/subscriptions/t/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/backendAddressPools/p"
    arm.azure.add_pool(other, [{"name": "vm0"}])
    answer = arm.put({"vm0": "Down"})
    arm.azure.set_throttling(read_capacity=1, read_refill=0.5)
    assert arm.operation(answer) == {"status": "InProgress"}
    assert arm.operation(answer)["error"]["code"] == "SubscriptionRequestsThrottled"
    assert arm.get(other).status == 200
    assert arm.azure.set_throttling(False) == {"enabled": False}
    assert arm.get().status == 200


def test_throttling_limits_are_checked(arm: Arm) -> None:
    assert arm.azure.set_throttling()["read_capacity"] == 250  # the documented defaults
    assert arm.azure.throttling()["write_refill"] == 10.0
    with pytest.raises(InvalidRequest, match="read_capacity"):
        arm.azure.set_throttling(read_capacity=0)
    with pytest.raises(InvalidRequest, match="write_refill"):
        arm.azure.set_throttling(write_refill=0)


# -- 7. tokens ---------------------------------------------------------------------------------------------


def test_expired_tokens_and_an_unreachable_token_endpoint(arm: Arm) -> None:
    assert arm.azure.expire_tokens() == 1
    expired = arm.get()
    assert expired.status == 401 and expired.body["error"]["code"] == "ExpiredAuthenticationToken"
    arm.azure.add_fault("token", "unreachable", count=2)
    assert arm.azure.token("vm0", "GET", TOKEN_QUERY, True).drop
    assert arm.azure.token("vm0", "GET", TOKEN_QUERY, True).drop
    fresh = arm.token()
    assert arm.get(auth=fresh).status == 200
    assert arm.azure.calls()["statuses"]["token dropped"] == 2
    arm.azure.add_fault("token", status=503, retry_after=1)
    assert arm.azure.token("vm0", "GET", TOKEN_QUERY, True).status == 503


def test_an_unreachable_arm_does_nothing(arm: Arm) -> None:
    arm.azure.add_fault("arm", "unreachable", methods=["PUT"])
    assert arm.get().status == 200  # GETs are not hit
    assert arm.put({"vm0": "Down"}).drop
    assert arm.pool()["writes"] == 0
    assert arm.azure.calls()["statuses"]["pool_put dropped"] == 1


# -- 8. the caller's own permissions -----------------------------------------------------------------------

PERMISSIONS_QUERY = {"api-version": "2022-04-01"}
ACTIONS = {"network-contributor": ["Microsoft.Network/*", "Microsoft.Authorization/*/read"], "reader": ["*/read"]}


@pytest.mark.parametrize("roles", [["network-contributor"], ["reader"], ["network-contributor", "reader"], ["none"]])
@pytest.mark.parametrize("scope", [LB, SUB, f"{SUB}/providers/Microsoft.Network//loadBalancers/lb"])
def test_permissions_list_the_callers_roles(arm: Arm, roles: list[str], scope: str) -> None:
    arm.azure.set_role("vm0", roles=roles)
    answer = arm.get(f"{scope}/providers/Microsoft.Authorization/permissions", PERMISSIONS_QUERY)
    assert answer.status == 200
    assert answer.body == {"value": [{"actions": ACTIONS[r], "notActions": [], "dataActions": [], "notDataActions": []}
                                     for r in roles if r != "none"]}


def test_permissions_need_a_token_and_an_api_version(arm: Arm) -> None:
    path = f"{LB}/providers/Microsoft.Authorization/permissions"
    assert arm.azure.arm("GET", path, PERMISSIONS_QUERY, {}, b"", "http://arm").status == 401
    assert arm.get(path, {}).body["error"]["code"] == "MissingApiVersionParameter"
    assert arm.get(path, QUERY).body["error"]["code"] == "InvalidApiVersionParameter"
    assert arm.azure.arm("PUT", path, PERMISSIONS_QUERY, {"authorization": arm.auth}, b"", "http://arm").status == 405
    assert arm.azure.calls()["calls"]["permissions_get"] == 3


# -- faults and settings: what is refused, in Python and by the control API's schemas ----------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"target": "arm", "kind": "slow_operation"}, "seconds"),
    ({"target": "arm", "kind": "stalled_write"}, "seconds"),
    ({"target": "arm", "kind": "stalled_write", "seconds": 0}, "seconds"),
    ({"target": "arm", "kind": "operation_end"}, "end"),
    ({"target": "arm", "kind": "status_after_apply", "status": 501}, "status"),
    ({"target": "arm", "kind": "status_after_apply"}, "status"),
    ({"target": "token", "kind": "lost_answer"}, "kind"),
    ({"target": "arm", "kind": "status", "status": 500, "seconds": 3}, "seconds"),
    ({"target": "arm", "kind": "lost_answer", "end": "Failed"}, "end"),
    ({"target": "arm", "kind": "slow_operation", "seconds": 5, "delay_seconds": 3}, "delay_seconds"),
    ({"target": "arm", "kind": "lost_answer", "status": 500}, "status"),
])
def test_a_fault_that_does_not_fit_its_kind_is_refused_naming_the_field(
        arm: Arm, fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        arm.azure.add_fault(**parse(AzureFaultRequest, fields).given())
    assert arm.azure.faults() == []


@pytest.mark.parametrize(("model", "fields", "named"), [
    (AzureFaultRequest, {"target": "arm", "kind": "operation_end", "end": "Done"}, "end"),
    (AzureFaultRequest, {"target": "arm", "kind": "slow_operation", "seconds": -1}, "seconds"),
    (AzureFaultRequest, {"target": "arm", "kind": "lost_answer", "delay_seconds": 0}, "delay_seconds"),
    (AzureFaultRequest, {"target": "arm", "kind": "hang"}, "kind"),
    (ArmSettingsRequest, {"conflict_while_updating": "yes"}, "conflict_while_updating"),
    (ArmSettingsRequest, {"conflicts": True}, "conflicts"),
    (ThrottlingRequest, {"read_capacity": 0}, "read_capacity"),
    (ThrottlingRequest, {"write_refill": 0}, "write_refill"),
])
def test_the_schemas_name_the_field_at_fault(model: Any, fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        parse(model, fields)


def test_the_faults_view_lists_every_kind_in_order(arm: Arm) -> None:
    arm.azure.add_fault("arm", "slow_operation", seconds=60, count=None)
    arm.azure.add_fault("arm", "operation_end", end="Canceled", methods=["GET"])
    arm.azure.add_fault("token", "unreachable")
    views = arm.azure.faults()
    assert [v["kind"] for v in views] == ["slow_operation", "operation_end", "unreachable"]
    assert views[0]["seconds"] == 60 and views[0]["count"] is None
    assert views[1]["methods"] == ["PUT"]  # a fault of an applied PUT waits for a PUT
    assert arm.azure.clear_faults() == 3
