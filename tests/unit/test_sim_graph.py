"""The simulated Resource Graph (``azuresim.graph``) without sockets, on a fake clock: the rows an
event's life writes, what the query accepts and refuses, paging, the per-caller quota, and who may query."""

from __future__ import annotations

import json
from typing import Any

import pytest

from azuresim.azure import AzureModel
from azuresim.catalogue import VmInfo
from azuresim.graph import ResourceGraph
from azuresim.group import SimulatedGroup
from coordinator.azure_graph import scheduled_events_query

SUB = "00000000-0000-0000-0000-000000000000"
QUERY = scheduled_events_query(24)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(clock: FakeClock) -> tuple[SimulatedGroup, AzureModel, ResourceGraph]:
    vms = [VmInfo("web_0", scale_set_name="web", unit="pg0"), VmInfo("web_1", scale_set_name="web", unit="pg0"),
           VmInfo("db0", unit="db"), VmInfo("lone")]
    group = SimulatedGroup(vms, clock=clock, started_for=60)
    azure = AzureModel([v.name for v in vms], clock=clock)
    azure.set_role("web_0", "reader")
    return group, azure, ResourceGraph(group, azure, clock=clock, page_size=2)


def bearer(azure: AzureModel, vm: str = "web_0") -> dict[str, str]:
    answer = azure.token(vm, "GET", {"api-version": "2018-02-01", "resource": "https://management.azure.com/"}, True)
    return {"authorization": f"Bearer {answer.body['access_token']}"}


def ask(graph: ResourceGraph, headers: dict[str, str], query: str = QUERY, **options: Any) -> Any:
    body = {"subscriptions": [SUB], "query": query, "options": {"resultFormat": "objectArray", **options}}
    return graph.query("POST", {"api-version": "2022-10-01"}, headers, json.dumps(body).encode())


def statuses(graph: ResourceGraph) -> dict[str, str]:
    return {row["name"]: row["properties"]["EventStatus"] for row in graph.rows()}


def test_an_event_moves_scheduled_started_completed_and_a_deleted_one_is_canceled(world: Any, clock: FakeClock) -> None:
    group, _, graph = world
    freeze = group.schedule("Freeze", ["web_0"], event_id="E-FREEZE")
    group.schedule("Reboot", ["db0"], event_id="E-REBOOT")
    assert statuses(graph) == {"E-FREEZE": "Scheduled", "E-REBOOT": "Scheduled"}
    group.cancel("E-REBOOT")
    group.approve("web_0", ["E-FREEZE"])
    rows = {row["name"]: row for row in graph.rows()}
    assert {k: r["properties"]["EventStatus"] for k, r in rows.items()} == {"E-FREEZE": "Started",
                                                                            "E-REBOOT": "Canceled"}
    assert rows["E-FREEZE"]["properties"]["NotBefore"] == ""  # blank once Started
    clock.now += 61
    assert statuses(graph)["E-FREEZE"] == "Completed"
    row = rows["E-FREEZE"]
    scale_set = (f"/subscriptions/{SUB}/resourceGroups/maintenance-sim/providers/Microsoft.Compute/"
                 "virtualMachineScaleSets/web")
    assert row["id"] == f"{scale_set}/providers/Microsoft.Maintenance/scheduledevents/E-FREEZE"
    assert row["properties"]["TargetResourceId"] == scale_set and row["type"] == "microsoft.maintenance/scheduledevents"
    assert row["properties"]["Description"] == freeze["description"] and row["properties"]["DurationInSeconds"] == -1
    assert rows["E-REBOOT"]["properties"]["TargetResourceId"].endswith("/availabilitySets/db")


def test_finished_rows_are_kept_for_a_while_then_dropped(world: Any, clock: FakeClock) -> None:
    group, _, graph = world
    graph.configure(keep_finished_seconds=3600)
    group.schedule("Redeploy", ["lone"], event_id="E-LONE")
    group.cancel("E-LONE")
    clock.now += 3599
    assert statuses(graph) == {"E-LONE": "Canceled"}
    clock.now += 2
    assert statuses(graph) == {}


def test_pages_by_skip_token_and_only_for_the_same_query(world: Any) -> None:
    group, azure, graph = world
    for index, vm in enumerate(["web_0", "web_1", "db0"]):
        group.schedule("Freeze", [vm], event_id=f"E{index}")
    headers = bearer(azure)
    first = ask(graph, headers)
    assert first.status == 200 and first.body["totalRecords"] == 3 and first.body["count"] == 2
    assert first.body["resultTruncated"] == "false" and first.body["facets"] == []
    second = ask(graph, headers, **{"$skipToken": first.body["$skipToken"]})
    assert second.body["count"] == 1 and "$skipToken" not in second.body
    ids = [r["id"] for r in first.body["data"] + second.body["data"]]
    assert ids == sorted(ids) and len(set(ids)) == 3
    other = ask(graph, headers, scheduled_events_query(1), **{"$skipToken": first.body["$skipToken"]})
    assert other.status == 400 and other.body["error"]["details"][0]["code"] == "InvalidSkipToken"
    assert ask(graph, headers, **{"$top": 1}).body["count"] == 1


def test_a_query_that_is_not_the_products_is_refused(world: Any) -> None:
    _, azure, graph = world
    answer = ask(graph, bearer(azure), "Resources | where type =~ 'microsoft.compute/virtualmachines'")
    assert answer.status == 400
    assert answer.body["error"]["code"] == "BadRequest" and answer.body["error"]["details"][0]["code"] == "InvalidQuery"
    table = ask(graph, bearer(azure), resultFormat="table")
    assert table.status == 400 and "objectArray" in table.body["error"]["details"][0]["message"]


def test_the_quota_per_caller_and_its_headers(world: Any, clock: FakeClock) -> None:
    _, azure, graph = world
    graph.configure(quota=3, window_seconds=5)
    headers = bearer(azure)
    remaining = [ask(graph, headers).headers["x-ms-user-quota-remaining"] for _ in range(3)]
    assert remaining == ["2", "1", "0"]
    throttled = ask(graph, headers)
    assert throttled.status == 429 and throttled.body["error"]["code"] == "RateLimiting"
    assert throttled.headers["Retry-After"] == "5" and throttled.headers["x-ms-user-quota-resets-after"] == "00:00:05"
    clock.now += 5
    assert ask(graph, headers).status == 200


def test_who_may_query(world: Any) -> None:
    _, azure, graph = world
    assert ask(graph, {}).status == 401
    refused = ask(graph, bearer(azure, "db0"))  # db0's identity: network-contributor, reads no maintenance resource
    assert refused.status == 403 and refused.body["error"]["code"] == "AuthorizationFailed"
    assert graph.query("POST", {"api-version": "2019-04-01"}, bearer(azure), b"{}").status == 400
    azure.add_fault("graph", "status", status=503, retry_after=1)
    assert ask(graph, bearer(azure)).status == 503
    azure.add_fault("graph", "unreachable")
    assert ask(graph, bearer(azure)).drop
    assert azure.calls()["statuses"]["graph_query 403"] == 1
