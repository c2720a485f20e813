"""The Resource Graph client (``coordinator.azure_graph``) against ``httpx.MockTransport`` handlers: paging by
``$skipToken``, a 429 then success, the quota headers, and the one-line messages of 403, no token and an
unreachable endpoint."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from coordinator.azure_arm import ArmError, ManagedIdentity
from coordinator.azure_graph import (
    GRAPH_API_VERSION,
    CliToken,
    GraphError,
    ResourceGraphClient,
    parse_row,
    quota_resets_after,
    scheduled_events_query,
)

SUB = "11111111-2222-3333-4444-555555555555"
SCALE_SET = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/web"


def row(event_id: str, status: str = "Scheduled", resources: Sequence[str] = ("web_0",), **properties: Any) -> dict:
    return {"id": f"{SCALE_SET}/providers/Microsoft.Maintenance/scheduledevents/{event_id}", "name": event_id,
            "type": "microsoft.maintenance/scheduledevents", "subscriptionId": SUB, "resourceGroup": "rg",
            "properties": {"EventId": event_id, "EventType": "Freeze", "EventStatus": status,
                           "Resources": list(resources), "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                           "ResourceType": "VirtualMachine", "EventSource": "Platform", **properties}}


class FixedToken:
    def __init__(self) -> None:
        self.invalidated = 0

    def token(self, deadline: float) -> str:
        return f"token-{self.invalidated}"

    def invalidate(self) -> None:
        self.invalidated += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def client(handler: Callable[[httpx.Request], httpx.Response], tokens: Any = None, clock: Clock | None = None,
           **kwargs: Any) -> ResourceGraphClient:
    clock = clock or Clock()
    return ResourceGraphClient(tokens or FixedToken(), arm_url="https://arm.test",
                               transport=httpx.MockTransport(handler), clock=clock, sleep=clock.sleep,
                               who="vm0's identity", **kwargs)


def page(rows: list[dict], skip_token: str | None = None, total: int | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"totalRecords": total if total is not None else len(rows), "count": len(rows),
                            "resultTruncated": "false", "data": rows, "facets": []}
    if skip_token is not None:
        body["$skipToken"] = skip_token
    return httpx.Response(200, json=body, headers=headers or {})


def test_pages_are_followed_by_skip_token_with_the_same_query_and_subscriptions() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/providers/Microsoft.ResourceGraph/resources"
        assert request.url.params["api-version"] == GRAPH_API_VERSION
        assert request.headers["Authorization"] == "Bearer token-0"
        body = json.loads(request.content)
        seen.append(body)
        if "$skipToken" not in body["options"]:
            return page([row("E1"), row("E2")], skip_token="next-1", total=3)
        assert body["options"]["$skipToken"] == "next-1"
        return page([row("E3", "Started", NotBefore="")], total=3)

    result = client(handler).scheduled_events([SUB], hours=6)
    assert [e.event_id for e in result.events] == ["E1", "E2", "E3"] and result.pages == 2
    assert seen[0]["query"] == seen[1]["query"] == scheduled_events_query(6)
    assert "ago(6h)" in seen[0]["query"] and "maintenanceresources" in seen[0]["query"]
    assert all(b["subscriptions"] == [SUB] and b["options"]["resultFormat"] == "objectArray" for b in seen)
    started = result.events[2]
    assert started.status == "Started" and started.not_before is None and started.unit == SCALE_SET


def test_a_429_is_waited_out_by_retry_after_then_the_query_succeeds() -> None:
    answers = [httpx.Response(429, json={"error": {"code": "RateLimiting", "message": "throttled"}},
                              headers={"Retry-After": "3", "x-ms-user-quota-remaining": "0"}),
               page([row("E1")], headers={"x-ms-user-quota-remaining": "14",
                                         "x-ms-user-quota-resets-after": "00:00:05"})]
    clock = Clock()
    graph = client(lambda request: answers.pop(0), clock=clock)
    result = graph.scheduled_events([SUB])
    assert [e.event_id for e in result.events] == ["E1"]
    assert clock.slept == [3.0] and graph.requests == 2 and graph.quota_remaining == 14


def test_a_quota_used_up_makes_the_next_page_wait_for_the_window() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "$skipToken" not in json.loads(request.content)["options"]:
            return page([row("E1")], skip_token="t", total=2,
                        headers={"x-ms-user-quota-remaining": "0", "x-ms-user-quota-resets-after": "00:00:04"})
        return page([row("E2")], total=2)

    clock = Clock()
    assert len(client(handler, clock=clock).scheduled_events([SUB]).events) == 2
    assert clock.slept == [4.0]


def test_a_throttle_longer_than_the_bound_is_one_clear_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": {"code": "RateLimiting", "message": "throttled"}},
                              headers={"Retry-After": "120"})

    with pytest.raises(GraphError) as caught:
        client(handler, max_wait=30).scheduled_events([SUB])
    assert caught.value.cause == "throttled"
    message = str(caught.value)
    assert "\n" not in message and "429" in message and "120 s" in message and "15 queries per 5 s" in message


def test_403_names_the_role_and_the_subscriptions() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"error": {"code": "AuthorizationFailed", "message": "no access"}})

    with pytest.raises(GraphError) as caught:
        client(handler).scheduled_events([SUB, "other-sub"])
    assert caught.value.cause == "forbidden"
    assert str(caught.value) == (f"vm0's identity may not read the scheduled events (403 AuthorizationFailed: no "
                                 f"access): give it the Reader role on subscription(s) {SUB}, other-sub")


def test_401_asks_for_a_new_token_once() -> None:
    tokens = FixedToken()
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Authorization"])
        if len(sent) == 1:
            return httpx.Response(401, json={"error": {"code": "ExpiredAuthenticationToken", "message": "expired"}})
        return page([row("E1")])

    assert len(client(handler, tokens).scheduled_events([SUB]).events) == 1
    assert sent == ["Bearer token-0", "Bearer token-1"] and tokens.invalidated == 1


def test_no_managed_identity_token_is_one_line_naming_the_way_out() -> None:
    def imds(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "invalid_request", "error_description": "Identity not found"})

    identity = ManagedIdentity("http://imds.test", transport=httpx.MockTransport(imds))
    sent: list[httpx.Request] = []
    graph = client(lambda request: sent.append(request) or page([]), identity)
    with pytest.raises(GraphError) as caught:
        graph.scheduled_events([SUB])
    message = str(caught.value)
    assert caught.value.cause == "token" and not sent and "\n" not in message
    assert message.startswith("no token for vm0's identity: IMDS refused a token for the system-assigned identity: "
                              "400 invalid_request: Identity not found")
    assert "--auth cli" in message


def test_unreachable_is_retried_then_one_line() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(GraphError) as caught:
        client(handler).scheduled_events([SUB])
    assert caught.value.cause == "unreachable" and len(calls) == 3
    assert str(caught.value) == ("cannot reach Resource Graph at https://arm.test: connection refused or host "
                                 "unreachable")


def test_a_refused_query_shows_the_detail_resource_graph_gives() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": "BadRequest", "message": "invalid", "details": [
            {"code": "InvalidQuery", "message": "table not found"}]}})

    with pytest.raises(GraphError) as caught:
        client(handler).scheduled_events([SUB])
    assert caught.value.cause == "bad_query"
    assert str(caught.value) == ("Resource Graph refused the query (400 BadRequest: invalid; InvalidQuery: table "
                                 "not found)")


def test_rows_that_cannot_be_read_are_set_aside_and_old_finished_ones_dropped() -> None:
    old = row("OLD", "Completed", LastUpdateTime="2001-01-01T00:00:00Z")
    recent = row("NEW", "Canceled", LastUpdateTime="2099-01-01T00:00:00Z")
    undated = row("UNDATED", "Completed")
    result = client(lambda request: page([old, recent, undated, {"id": "x"}])).scheduled_events([SUB], hours=24)
    assert [e.event_id for e in result.events] == ["NEW", "UNDATED"]
    assert result.skipped == ["row 'x' has no properties"]


def test_parse_row_takes_the_unit_from_target_resource_id_else_the_id() -> None:
    availability_set = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/availabilitySets/db"
    event = parse_row(row("E1", TargetResourceId=availability_set, DurationInSeconds=5))
    assert event.unit == availability_set and event.duration == 5
    assert event.not_before == 1474309787.0 and event.pending
    assert parse_row(row("E2")).unit == SCALE_SET
    with pytest.raises(ValueError, match="Resources is not a list"):
        parse_row(row("E3", Resources="web_0"))


def test_quota_reset_header() -> None:
    assert quota_resets_after("00:00:05") == 5 and quota_resets_after("1.00:01:02") == 86462
    assert quota_resets_after("soon") is None and quota_resets_after(None) is None


def test_cli_token_from_az_and_its_failures() -> None:
    def run(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert list(command[1:]) == ["account", "get-access-token", "--resource", "https://management.azure.com/",
                                     "-o", "json"]
        return subprocess.CompletedProcess(command, 0, json.dumps({"accessToken": "abc", "expires_on": 4102444800}), "")

    assert CliToken(run=run, which=lambda name: "/usr/bin/az").token(0) == "abc"
    with pytest.raises(GraphError, match=r"^no token: the Azure CLI \(az\) is not installed"):
        CliToken(run=run, which=lambda name: None).token(0)

    def not_logged_in(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Please run 'az login' to setup account.\n")

    with pytest.raises(GraphError) as caught:
        CliToken(run=not_logged_in, which=lambda name: "/usr/bin/az").token(0)
    assert str(caught.value) == ("no token from the Azure CLI (az account get-access-token exited 1: ERROR: Please "
                                 "run 'az login' to setup account.); run az login")


def test_arm_error_of_a_token_source_is_wrapped() -> None:
    class Failing(FixedToken):
        def token(self, deadline: float) -> str:
            raise ArmError("IMDS unreachable", cause="token")

    with pytest.raises(GraphError, match=r"^no token for vm0's identity: IMDS unreachable;"):
        client(lambda request: page([]), Failing()).scheduled_events([SUB])
