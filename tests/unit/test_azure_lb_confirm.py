"""The azure-lb action is done only when ARM confirms the write applied ("done means confirmed").

A scripted ARM (``FakeArm``, on ``httpx.MockTransport``) models one backend address pool as Azure does:
a PUT is applied at once (GET shows the new states, ``provisioningState: Updating``), its asynchronous
operation ends ``Succeeded``, ``Failed`` or ``Canceled`` some seconds later, and only a ``Succeeded`` one
reaches the data plane (``effective``). Time is a fake clock that only sleeps move, so every scenario is
deterministic. The safety property checked throughout: when ``drain`` returns None the address is
effectively ``Down``, and when ``recover`` returns it is effectively ``None``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from coordinator.actions import ActionContext
from coordinator.actions.azure_lb import ArmClient, ArmError, AzureLbAction, ManagedIdentity
from coordinator.azure_arm import ARM_CAUSES
from tests.doubles import SleepClock

ARM = "https://arm.test"
POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/Microsoft.Network/"
        "loadBalancers/lb/backendAddressPools/web")
OPS = "/subscriptions/00000000-0000-0000-0000-000000000001/providers/Microsoft.Network/locations/x/operations/"
CTX = ActionContext("vm0", ())


@dataclass
class _Op:
    due: float
    outcome: str  # Succeeded, Failed, Canceled, or never (stays InProgress)
    states: dict[str, str]
    done: bool = False


def _error(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": f"{code} (scripted)"}},
                          headers=headers or {})


@dataclass
class FakeArm:
    """One pool, its writes' operations and its data plane, on ``clock``; scripted faults per request kind."""

    clock: SleepClock
    async_seconds: float = 3.0
    outcome: str = "Succeeded"  # of the next operations
    put_answer: str = "async"  # async (Azure-AsyncOperation), location (Location only), none (neither)
    op_retry_after: str | None = None
    states: dict[str, str] = field(default_factory=lambda: {"vm0": "None", "vm1": "None"})
    effective: dict[str, str] = field(default_factory=lambda: {"vm0": "None", "vm1": "None"})
    last_outcome: str = "Succeeded"  # of the pool's last finished operation: its provisioningState
    etag: int = 1
    ops: dict[str, _Op] = field(default_factory=dict)
    # Scripted answers, by kind (pool_get, pool_put, operation, location), taken before the model answers.
    faults: dict[str, list[httpx.Response | str]] = field(default_factory=dict)
    # After an applied PUT: "timeout" (the answer is lost: ReadTimeout) or "502" (a 502 sent after the write).
    after_put: list[str] = field(default_factory=list)
    expire_token_after_put: bool = False
    expired: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    unreachable: bool = False
    # A PUT held on its way: it reaches the pool only at ``land()`` (its If-Match judged then); a timeout now.
    hold_puts: bool = False
    held: list[httpx.Request] = field(default_factory=list)

    def land(self) -> list[int]:
        """Hand every held PUT to the pool, in the order sent; the statuses nobody hears."""
        held, self.held = self.held, []
        return [self._put(request, request.headers["Authorization"].removeprefix("Bearer ")).status_code
                for request in held]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def count(self, kind: str) -> int:
        return sum(1 for r in self.requests if r == kind)

    def _settle(self) -> None:
        for op in self.ops.values():
            if op.done or op.outcome == "never" or op.due > self.clock.now:
                continue
            op.done = True
            self.last_outcome = "Succeeded" if op.outcome == "Succeeded" else "Failed"
            if op.outcome == "Succeeded":
                self.effective.update(op.states)

    def provisioning(self) -> str:
        self._settle()
        return "Updating" if any(not op.done for op in self.ops.values()) else self.last_outcome

    def _pool(self) -> dict[str, Any]:
        return {"name": "web", "id": POOL, "etag": f'W/"{self.etag}"',
                "properties": {"provisioningState": self.provisioning(), "loadBalancerBackendAddresses": [
                    {"name": name, "properties": {"ipAddress": f"10.0.0.{4 + i}", "adminState": state}}
                    for i, (name, state) in enumerate(self.states.items())]}}

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        kind = ("operation" if path.startswith(OPS) else "location" if path.endswith("/location")
                else f"pool_{request.method.lower()}")
        self.requests.append(kind)
        if self.unreachable:
            raise httpx.ConnectError("connection refused (scripted)", request=request)
        token = request.headers["Authorization"].removeprefix("Bearer ")
        if token in self.expired:
            return _error(401, "ExpiredAuthenticationToken")
        queued = self.faults.get(kind)
        if queued:
            fault = queued.pop(0)
            if isinstance(fault, httpx.Response):
                return fault
        self._settle()
        if kind == "pool_get":
            return httpx.Response(200, json=self._pool())
        if kind == "pool_put" and self.hold_puts:
            self.held.append(request)
            raise httpx.ReadTimeout("no answer: the write is held on its way (scripted)", request=request)
        if kind == "pool_put":
            return self._put(request, token)
        op = self.ops[path.rsplit("/", 1)[-1] if kind == "operation" else path.split("/")[-2]]
        headers = {"Retry-After": self.op_retry_after} if self.op_retry_after else {}
        if kind == "location":
            return httpx.Response(202 if not op.done else 200, headers=headers)
        if not op.done:
            return httpx.Response(200, json={"status": "InProgress"}, headers=headers)
        body: dict[str, Any] = {"status": op.outcome}
        if op.outcome != "Succeeded":
            body["error"] = {"code": "InternalServerError", "message": "the write did not apply (scripted)"}
        return httpx.Response(200, json=body)

    def _put(self, request: httpx.Request, token: str) -> httpx.Response:
        if request.headers.get("If-Match") != f'W/"{self.etag}"':
            return _error(412, "PreconditionFailed")
        body = json.loads(request.content)
        states = {a["name"]: a["properties"].get("adminState", "None")
                  for a in body["properties"]["loadBalancerBackendAddresses"]}
        self.states.update(states)
        self.etag += 1
        op_id = f"op{len(self.ops) + 1}"
        self.ops[op_id] = _Op(self.clock.now + self.async_seconds, self.outcome, dict(states))
        if self.expire_token_after_put:
            self.expired.add(token)
        if self.after_put:
            lost = self.after_put.pop(0)
            if lost == "timeout":
                raise httpx.ReadTimeout("the answer was lost (scripted)", request=request)
            return _error(502, "BadGateway")
        headers = {"Retry-After": "1"}
        if self.put_answer == "async":
            headers["Azure-AsyncOperation"] = f"{ARM}{OPS}{op_id}?api-version=2023-09-01"
        elif self.put_answer == "location":
            headers["Location"] = f"{ARM}{OPS.replace('/operations/', '/results/')}{op_id}/location"
        return httpx.Response(200, json=self._pool(), headers=headers)


class FakeImds:
    """IMDS's token endpoint: a new token on each request (t1, t2...), or a scripted refusal."""

    def __init__(self) -> None:
        self.issued = 0
        self.refuse: int | None = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.refuse is not None:
            return httpx.Response(self.refuse, json={"error": "invalid_request", "error_description": "scripted"})
        self.issued += 1
        return httpx.Response(200, json={"access_token": f"t{self.issued}", "expires_in": "86399"})


@dataclass
class Rig:
    clock: SleepClock
    arm: FakeArm
    imds: FakeImds
    client: ArmClient
    action: AzureLbAction
    failures: list[str]


def rig(*, deadline: float = 60.0, fallback_wait: float = 0.0, **arm_options: Any) -> Rig:
    clock = SleepClock()
    arm = FakeArm(clock, **arm_options)
    imds = FakeImds()
    identity = ManagedIdentity("http://imds.test", clock=clock, sleep=clock.sleep,
                               transport=httpx.MockTransport(imds.handle))
    client = ArmClient(ARM, identity, poll_interval=1.0, clock=clock, sleep=clock.sleep, transport=arm.transport())
    failures: list[str] = []
    action = AzureLbAction("azure-lb", [POOL], "vm0", client, deadline=deadline, fallback_wait=fallback_wait,
                           clock=clock, sleep=clock.sleep, on_failure=failures.append)
    return Rig(clock, arm, imds, client, action, failures)


# -- the lost answer of an applied write (bug 1) -------------------------------------------------------------


@pytest.mark.parametrize("lost", ["timeout", "502"])
def test_a_write_whose_answer_was_lost_is_done_only_once_arm_says_succeeded(lost: str) -> None:
    r = rig(async_seconds=8.0)
    r.arm.after_put = [lost]  # applied, but the answer never arrives; the retry meets 412 and reads Down, Updating
    assert r.action.drain(CTX) is None
    assert r.arm.effective["vm0"] == "Down", "drain returned while the load balancer still routes to the VM"
    assert r.arm.count("pool_put") == 2 and r.arm.provisioning() == "Succeeded"
    assert r.failures == []


def test_a_write_whose_answer_was_lost_and_never_applies_falls_back_to_the_probe() -> None:
    r = rig(deadline=30.0, fallback_wait=35.0, outcome="never")
    r.arm.after_put = ["timeout"]
    began = r.clock.now
    fallback = r.action.drain(CTX)
    assert fallback is not None and "is not confirmed" in fallback, fallback
    assert r.failures == ["not_confirmed"]
    assert r.clock.now - began >= 35.0  # the probe's lag was waited out
    assert r.arm.effective["vm0"] == "None"


def test_a_recovery_reading_none_while_the_pool_is_updating_waits_for_succeeded() -> None:
    r = rig(deadline=10.0, async_seconds=25.0)
    r.arm.states["vm0"] = r.arm.effective["vm0"] = "Down"  # drained
    with pytest.raises(ArmError) as first:  # the write outlives the deadline
        r.action.recover(CTX)
    assert first.value.cause == "not_confirmed"
    r.clock.advance(5.0)  # the agent retries: the pool reads None, Updating
    with pytest.raises(ArmError, match="still Updating") as second:
        r.action.recover(CTX)
    assert second.value.cause == "not_confirmed" and r.arm.effective["vm0"] == "Down"
    r.clock.advance(5.0)
    r.action.recover(CTX)  # polls the pool until Succeeded
    assert r.arm.effective["vm0"] == "None", "recovery returned while the VM is still out of rotation"
    assert r.arm.count("pool_put") == 1 and r.failures == ["not_confirmed", "not_confirmed"]


# -- a write that lands after the action gave up -------------------------------------------------------------


def test_a_drains_write_held_on_its_way_cannot_land_after_the_recovery() -> None:
    r = rig(deadline=10.0)
    r.arm.hold_puts = True  # ARM takes the drain's PUTs in only after the drain gave up
    fallback = r.action.drain(CTX)
    assert fallback is not None and "unreachable" in fallback, fallback
    assert r.arm.held and r.arm.states["vm0"] == "None"
    r.arm.hold_puts = False

    held = len(r.arm.held)
    r.action.recover(CTX)  # the pool reads None, Succeeded: the read alone would be taken as done
    assert r.arm.count("pool_put") == held + 1, "the recovery wrote nothing: the held writes can still land"
    assert r.arm.land() == [412] * held  # sent against an etag the recovery's write replaced
    r.clock.advance(10.0)
    assert (r.arm.states["vm0"], r.arm.provisioning(), r.arm.effective["vm0"]) == ("None", "Succeeded", "None"), (
        "the drain's held write landed after the recovery returned: the VM is out of the load balancer while "
        "its agent counts it serving")


# -- operations that end Failed or Canceled (bug 2) ----------------------------------------------------------


@pytest.mark.parametrize("outcome", ["Failed", "Canceled"])
def test_an_operation_that_fails_is_a_fallback_for_a_drain_and_an_error_for_a_recovery(outcome: str) -> None:
    r = rig(outcome=outcome)
    fallback = r.action.drain(CTX)
    assert fallback is not None and f"ended {outcome}" in fallback
    assert r.failures == ["operation_failed"] and r.arm.effective["vm0"] == "None"

    r.arm.outcome = outcome
    r.arm.states["vm0"] = r.arm.effective["vm0"] = "Down"
    r.arm.last_outcome = "Succeeded"
    with pytest.raises(ArmError, match="may still be Down") as raised:
        r.action.recover(CTX)
    assert raised.value.cause == "operation_failed" and raised.value.outside_vm
    assert r.failures == ["operation_failed", "operation_failed"]


@pytest.mark.parametrize("outcome", ["Failed", "Canceled"])
def test_a_recovery_after_a_failed_write_writes_again_instead_of_taking_the_read_as_done(outcome: str) -> None:
    r = rig(outcome=outcome)
    r.arm.states["vm0"] = r.arm.effective["vm0"] = "Down"
    with pytest.raises(ArmError):
        r.action.recover(CTX)
    assert r.arm.states["vm0"] == "None" and r.arm.provisioning() == "Failed"  # reads as wanted, never applied
    r.arm.outcome = "Succeeded"
    r.clock.advance(5.0)
    r.action.recover(CTX)
    assert r.arm.effective["vm0"] == "None", "recovery reported done while the VM is out of rotation for good"
    assert r.arm.count("pool_put") == 2


def test_a_pool_read_back_failed_with_the_wanted_state_is_written_again() -> None:
    r = rig()
    r.arm.states["vm0"] = "Down"  # an earlier write asked for Down and failed: the data plane never applied it
    r.arm.last_outcome = "Failed"
    assert r.action.drain(CTX) is None
    assert r.arm.count("pool_put") == 1 and r.arm.effective["vm0"] == "Down"


def test_a_pool_that_reads_failed_after_this_attempts_own_write_is_an_error() -> None:
    r = rig(put_answer="none", outcome="Failed")
    fallback = r.action.drain(CTX)
    assert fallback is not None and "ended Failed" in fallback
    assert r.failures == ["operation_failed"] and r.arm.count("pool_put") == 1


# -- Retry-After past the deadline (bug 3) -------------------------------------------------------------------


def test_a_retry_after_past_the_deadline_holds_every_request_back_until_arms_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = rig(deadline=60.0)
    r.arm.states["vm0"] = r.arm.effective["vm0"] = "Down"
    r.arm.faults["pool_get"] = [_error(429, "TooManyRequests", {"Retry-After": "120"})]
    caplog.set_level(logging.INFO, logger="coordinator")
    with pytest.raises(ArmError) as first:
        r.action.recover(CTX)
    assert first.value.cause == "throttled"
    assert r.arm.requests == ["pool_get"]
    for _ in range(10):  # the agent retries every 5 s: nothing is sent before ARM's time
        r.clock.advance(5.0)
        with pytest.raises(ArmError, match=r"ARM asked to wait until .*, \d+ s more \(429 Retry-After\)") as held:
            r.action.recover(CTX)
        assert held.value.cause == "throttled"
    assert r.arm.requests == ["pool_get"], "a request was sent before ARM's Retry-After"
    assert r.client.held_for() == pytest.approx(70.0)
    told = [rec for rec in caplog.records if "ARM asked to wait" in rec.getMessage()
            and rec.name == "coordinator.azure_arm"]
    assert len(told) == 1, [rec.getMessage() for rec in told]  # logged once, not on every retry
    r.clock.advance(70.0)
    r.action.recover(CTX)
    assert r.arm.effective["vm0"] == "None"
    assert r.failures == ["throttled"] * 11


def test_a_retry_after_within_the_deadline_is_waited_out_in_the_attempt() -> None:
    r = rig(deadline=60.0)
    r.arm.faults["pool_put"] = [_error(429, "TooManyRequests", {"Retry-After": "7"})]
    assert r.action.drain(CTX) is None
    assert 7.0 in r.clock.sleeps and r.client.held_for() == 0.0
    assert r.arm.effective["vm0"] == "Down"


# -- a write answered without an operation URL (bug 4) -------------------------------------------------------


@pytest.mark.parametrize("answer", ["none", "location"])
def test_a_write_answered_without_an_operation_url_is_confirmed_by_polling(answer: str) -> None:
    r = rig(put_answer=answer, async_seconds=6.0)
    assert r.action.drain(CTX) is None
    assert r.arm.effective["vm0"] == "Down", "drain returned while the load balancer still routes to the VM"
    if answer == "location":
        assert r.arm.count("location") >= 2
    else:
        assert r.arm.count("pool_get") >= 3


def test_a_write_answered_without_an_operation_url_that_never_applies_is_not_confirmed() -> None:
    r = rig(put_answer="none", outcome="never", deadline=20.0)
    r.arm.states["vm0"] = r.arm.effective["vm0"] = "Down"
    with pytest.raises(ArmError) as raised:
        r.action.recover(CTX)
    assert raised.value.cause == "not_confirmed" and r.arm.effective["vm0"] == "Down"


# -- 409 AnotherOperationInProgress --------------------------------------------------------------------------


def test_another_operation_in_progress_is_retried_after_its_retry_after() -> None:
    r = rig()
    r.arm.faults["pool_put"] = [_error(409, "AnotherOperationInProgress", {"Retry-After": "4"}),
                                _error(409, "AnotherOperationInProgress")]
    assert r.action.drain(CTX) is None
    assert r.arm.effective["vm0"] == "Down" and r.action.conflicts == 2
    assert r.arm.count("pool_get") == 3  # read again after each 409
    assert any(s >= 4.0 for s in r.clock.sleeps), r.clock.sleeps
    assert r.failures == []


def test_another_operation_in_progress_until_the_deadline_is_a_conflict() -> None:
    r = rig(deadline=10.0)
    r.arm.faults["pool_put"] = [_error(409, "AnotherOperationInProgress", {"Retry-After": "4"})] * 5
    assert r.action.drain(CTX) is not None
    assert r.failures == ["conflict"]


def test_another_conflict_code_is_refused_as_a_conflict() -> None:
    r = rig()
    r.arm.faults["pool_put"] = [_error(409, "Conflict")]
    assert r.action.drain(CTX) is not None and r.failures == ["conflict"]
    assert r.arm.count("pool_put") == 1


# -- tokens ---------------------------------------------------------------------------------------------------


def test_a_token_that_expires_while_the_operation_is_polled_is_replaced() -> None:
    r = rig(expire_token_after_put=True)
    assert r.action.drain(CTX) is None
    assert r.imds.issued == 2 and r.arm.effective["vm0"] == "Down"
    assert r.arm.count("operation") >= 2


# -- causes ---------------------------------------------------------------------------------------------------


def _forbidden(r: Rig) -> None:
    r.arm.faults["pool_get"] = [_error(403, "AuthorizationFailed")]


def _not_found(r: Rig) -> None:
    r.arm.faults["pool_get"] = [_error(404, "ResourceNotFound")]


def _token(r: Rig) -> None:
    r.imds.refuse = 400


def _unreachable(r: Rig) -> None:
    r.arm.unreachable = True


def _server_error(r: Rig) -> None:
    r.arm.faults["pool_get"] = [_error(500, "InternalServerError")] * 20


def _throttled(r: Rig) -> None:
    r.arm.faults["pool_get"] = [_error(429, "TooManyRequests", {"Retry-After": "600"})]


def _operation_failed(r: Rig) -> None:
    r.arm.outcome = "Failed"


def _not_confirmed(r: Rig) -> None:
    r.arm.outcome = "never"


def _bad_answer(r: Rig) -> None:
    r.arm.faults["pool_get"] = [httpx.Response(200, text="<html>")]


def _address_missing(r: Rig) -> None:
    del r.arm.states["vm0"]


@pytest.mark.parametrize(("cause", "script"), [
    ("forbidden", _forbidden), ("not_found", _not_found), ("token", _token), ("unreachable", _unreachable),
    ("server_error", _server_error), ("throttled", _throttled), ("operation_failed", _operation_failed),
    ("not_confirmed", _not_confirmed), ("bad_answer", _bad_answer), ("not_found", _address_missing),
])
def test_on_failure_is_told_the_cause_once_per_fallen_back_drain(
    cause: str, script: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    assert cause in ARM_CAUSES
    r = rig(deadline=20.0)
    script(r)
    caplog.set_level(logging.ERROR, logger="coordinator.actions.azure_lb")
    assert r.action.drain(CTX) is not None
    assert r.failures == [cause]
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "coordinator.actions.azure_lb"]
    assert len(lines) == 1 and f"through ARM ({cause}: " in lines[0], lines


def test_a_failed_recovery_says_its_cause_and_arm_errors_are_outside_the_vm() -> None:
    r = rig()
    _forbidden(r)
    with pytest.raises(ArmError) as raised:
        r.action.recover(CTX)
    assert raised.value.cause == "forbidden" and "forbidden: GET" in str(raised.value)
    assert ArmError.outside_vm is True and r.failures == ["forbidden"]


def test_a_failure_hook_that_raises_does_not_change_the_drain() -> None:
    r = rig()
    _forbidden(r)

    def broken(cause: str) -> None:
        raise RuntimeError("metrics are broken")

    r.action._on_failure = broken
    assert r.action.drain(CTX) is not None


def test_a_confirmed_pool_is_not_written_again() -> None:
    r = rig()
    assert r.action.drain(CTX) is None
    assert r.action.drain(CTX) is None  # reads Down, Succeeded: confirmed, nothing written
    assert r.arm.count("pool_put") == 1
