"""The simulated load balancer's data plane: effective admin states change on time and are reported, in
order, to a hook; the HAProxy hook turns them into runtime API commands and survives HAProxy's faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from azuresim.azure import AzureModel, EffectiveChange
from azuresim.haproxy_runtime import HAProxyRuntime, HAProxyUnreachable
from azuresim.lb_haproxy import HAProxyDataPlane, commands_for

POOL = ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/"
        "backendAddressPools/pool")
QUERY = {"api-version": "2023-09-01"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def model(clock: Clock, seen: list[EffectiveChange]) -> tuple[AzureModel, str]:
    azure = AzureModel(["vm0", "vm1"], async_seconds=1.0, clock=clock, on_effective=seen.append)
    azure.add_pool(POOL, [{"name": "vm0", "ip_address": "10.0.0.4"}, {"name": "vm1", "ip_address": "10.0.0.5"}])
    answer = azure.token("vm0", "GET", {"api-version": "2018-02-01", "resource": "https://management.azure.com/"},
                         True)
    assert answer.status == 200, answer
    return azure, f"Bearer {answer.body['access_token']}"


def put_state(azure: AzureModel, auth: str, states: dict[str, str]) -> None:
    """A PUT of the pool with these admin states, the way a client sends it (If-Match on the etag read)."""
    pool = azure.arm("GET", POOL, QUERY, {"authorization": auth}, b"", "http://arm").body
    body = {"properties": {"loadBalancerBackendAddresses": [
        {"name": name, "properties": {"adminState": state}} for name, state in states.items()]}}
    answer = azure.arm("PUT", POOL, QUERY, {"authorization": auth, "if-match": pool["etag"]},
                       json.dumps(body).encode(), "http://arm")
    assert answer.status == 200, answer


def test_tick_makes_a_due_write_effective_without_any_request_and_reports_each_change_once() -> None:
    clock, seen = Clock(), []
    azure, auth = model(clock, seen)
    put_state(azure, auth, {"vm0": "Down", "vm1": "None"})
    clock.now += 0.5
    assert azure.tick() == [] and seen == []  # not due: the data plane is unchanged
    clock.now += 0.6
    changes = azure.tick()
    assert changes == [EffectiveChange(POOL, "vm0", "10.0.0.4", "None", "Down", clock.now)]
    assert seen == changes  # vm1 did not change: not reported
    assert azure.tick() == [] and len(seen) == 1  # reported once
    assert azure.pools()[0]["effective"] == {"vm0": "Down", "vm1": "None"}


def test_changes_reach_the_hook_in_the_order_they_happened_and_a_control_write_at_once() -> None:
    clock, seen = Clock(), []
    azure, auth = model(clock, seen)
    put_state(azure, auth, {"vm0": "Down", "vm1": "None"})
    clock.now += 0.2
    put_state(azure, auth, {"vm0": "None", "vm1": "None"})  # taken back before the first write was effective
    clock.now += 2.0
    azure.tick()
    assert [(c.address, c.before, c.after) for c in seen] == [("vm0", "None", "Down"), ("vm0", "Down", "None")]
    azure.write_address(POOL, "vm1", "Up")  # another writer, through the control API: effective at once
    assert (seen[-1].address, seen[-1].after) == ("vm1", "Up")


def test_a_hook_that_raises_does_not_break_the_model() -> None:
    clock = Clock()

    def broken(change: EffectiveChange) -> None:
        raise RuntimeError("bug")

    azure = AzureModel(["vm0"], clock=clock, on_effective=broken)
    azure.add_pool(POOL, [{"name": "vm0"}])
    view = azure.write_address(POOL, "vm0", "Down")
    assert view["effective"] == {"vm0": "Down"}


@pytest.mark.parametrize(("before", "after", "expected"), [
    ("None", "Down", ["set server be/vm0 state drain"]),
    ("Down", "None", ["set server be/vm0 state ready"]),
    ("None", "Up", ["set server be/vm0 state ready", "disable health be/vm0"]),
    ("Up", "None", ["set server be/vm0 state ready", "enable health be/vm0"]),
    ("Up", "Down", ["set server be/vm0 state drain", "enable health be/vm0"]),
])
def test_admin_states_map_to_haproxy_runtime_commands(before: str, after: str, expected: list[str]) -> None:
    assert commands_for("be", "vm0", before, after) == expected


class FakeRuntime:
    address = "unix:/fake"

    def __init__(self, answers: list[str | Exception]) -> None:
        self.answers = answers
        self.sent: list[str] = []

    def execute(self, command: str) -> str:
        self.sent.append(command)
        answer = self.answers.pop(0) if self.answers else ""
        if isinstance(answer, Exception):
            raise answer
        return answer


def change(after: str, address: str = "vm0") -> EffectiveChange:
    return EffectiveChange(POOL, address, "10.0.0.4", "None" if after != "None" else "Down", after, 0.0)


def test_data_plane_applies_changes_and_counts_what_haproxy_refused_or_could_not_hear() -> None:
    runtime = FakeRuntime(["", "No such server.\n", HAProxyUnreachable("unreachable")])
    plane = HAProxyDataPlane(runtime, "be_app")
    assert plane(change("Down")) is True
    assert plane(change("None", "vm9")) is False
    assert plane(change("Down")) is False
    assert plane(change("Down", "bad name\nshow info")) is False  # never sent: not a server name
    assert runtime.sent == ["set server be_app/vm0 state drain", "set server be_app/vm9 state ready",
                            "set server be_app/vm0 state drain"]
    view = plane.view()
    assert (view["applied"], view["failed"], view["commands"]) == (1, 3, 3)
    assert "server name" in view["last_error"]


def test_data_plane_with_no_haproxy_listening_counts_a_failure(tmp_path: Path) -> None:
    plane = HAProxyDataPlane(HAProxyRuntime(tmp_path / "absent.sock", timeout=0.5), "be_app")
    assert plane(change("Down")) is False
    assert plane.view()["failed"] == 1 and "unreachable" in plane.view()["last_error"]
