"""The azure-lb action against the simulator's ARM at its worst, as a real process over HTTP.

Each test turns on one hostile behaviour of the simulated ARM (``docs/simulator.md``, "ARM at its worst")
and judges the real action by the simulator's data plane, the *effective* admin state of the VM's address
(what the load balancer does: ``SimControl.pools()[pool]["effective"]``), never by the action's own word.
What the product promises (``coordinator.actions.azure_lb``, "done means confirmed"):

* a drain that returns None: the address is effectively ``Down`` in every pool at the moment it returns;
* a drain that falls back (returns a string): it waited at least ``fallback_wait``, the string says why,
  and ``on_failure`` was told the cause;
* a recovery that returns: the address is effectively ``None`` at the moment it returns;
* a recovery that cannot be confirmed raises ``ArmError`` with the cause (``on_failure`` told it too); the
  address is then whatever ARM applied, and nothing claims otherwise.

The effective state is read right after the action returns, from the thread that ran it. Operations take
0.2 s (``--arm-async-seconds``) and ARM asks for no wait between polls (``--arm-retry-after 0``) unless a
test says otherwise, so that the whole file runs in well under a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from azuresim import SimControl
from coordinator.actions import ActionContext
from coordinator.actions.azure_lb import ArmClient, ArmError, AzureLbAction, ManagedIdentity
from tests.plugins.simulator import RunningSimulator, SimulatorFactory

SUB = "00000000-0000-0000-0000-000000000001"
LB = f"/subscriptions/{SUB}/resourceGroups/rg-app/providers/Microsoft.Network/loadBalancers/lb-app"
WEB = f"{LB}/backendAddressPools/pool-web"
API = f"{LB}/backendAddressPools/pool-api"
BOTH = (WEB, API)
FAST = ["--arm-async-seconds", "0.2", "--arm-retry-after", "0"]
WAIT = 30.0  # seconds a test waits for the simulator to reach a state: generous, the machine may be loaded


def _start(imds_sim: SimulatorFactory, vms: Sequence[str] = ("vm0", "vm1"), *extra: str) -> RunningSimulator:
    sim = imds_sim(tuple(vms), rate_limit=0, extra_args=["--arm", "127.0.0.1:0", *FAST, *extra])
    assert sim.arm_url
    addresses = [{"name": vm, "ip_address": f"10.0.0.{i + 4}"} for i, vm in enumerate(vms)]
    for pool in BOTH:
        sim.control.add_pool(pool, addresses)
    return sim


@dataclass
class Drained:
    said: str | None  # what drain returned: None (done) or the fallback
    effective: dict[str, str]  # pool -> the address's effective admin state, read right after
    took: float
    told: list[str]  # what on_failure was told during this drain


@dataclass
class Recovered:
    error: ArmError | None  # None: recover returned (done)
    effective: dict[str, str]
    told: list[str]


@dataclass
class Lb:
    """One VM's real azure-lb action (its own identity and ARM client), with what ``on_failure`` was told."""

    sim: RunningSimulator
    action: AzureLbAction
    client: ArmClient
    fallback_wait: float
    failures: list[str] = field(default_factory=list)

    @property
    def vm(self) -> str:
        return self.action.address

    def effective(self, control: SimControl | None = None) -> dict[str, str]:
        view = (control or self.sim.control).pools()
        return {pool: view[pool]["effective"][self.vm] for pool in self.action.pools}

    def drain(self, control: SimControl | None = None) -> Drained:
        told = len(self.failures)
        began = time.monotonic()
        said = self.action.drain(ActionContext(self.vm, ()))
        took = time.monotonic() - began
        return Drained(said, self.effective(control), took, self.failures[told:])

    def recover(self, control: SimControl | None = None) -> Recovered:
        told = len(self.failures)
        error: ArmError | None = None
        try:
            self.action.recover(ActionContext(self.vm, ()))
        except ArmError as exc:
            error = exc
        return Recovered(error, self.effective(control), self.failures[told:])


def _lb(sim: RunningSimulator, vm: str = "vm0", *, pools: tuple[str, ...] = BOTH, deadline: float = 20.0,
        fallback_wait: float = 0.0, timeout: float = 5.0) -> Lb:
    identity = ManagedIdentity(sim.urls[vm], timeout=timeout)
    client = ArmClient(str(sim.arm_url), identity, timeout=timeout, poll_interval=0.1)
    failures: list[str] = []
    action = AzureLbAction("azure-lb", pools, vm, client, deadline=deadline, fallback_wait=fallback_wait,
                           on_failure=failures.append)
    return Lb(sim, action, client, fallback_wait, failures)


def _short(effective: dict[str, str]) -> dict[str, str]:
    """``{pool name: state}``, for messages."""
    return {pool.rsplit("/", 1)[-1]: state for pool, state in effective.items()}


def _calls(sim: RunningSimulator) -> dict[str, Any]:
    return sim.control.arm_calls()


def _landed(calls: dict[str, Any]) -> int:
    """Held PUTs that reached their pool, whatever it answered."""
    return sum(n for key, n in calls["statuses"].items() if key.startswith("pool_put landed "))


def _status(sim: RunningSimulator, key: str) -> int:
    count: int = _calls(sim)["statuses"].get(key, 0)
    return count


# -- the promises ---------------------------------------------------------------------------------------------


def _assert_drained(lb: Lb, outcome: Drained) -> None:
    """Done: effectively Down in every pool when drain returned, and no failure told."""
    assert outcome.said is None, f"the drain fell back: {outcome.said} ({_calls(lb.sim)})"
    assert outcome.effective == dict.fromkeys(lb.action.pools, "Down"), (
        f"drain of {lb.vm} returned None (done) while its address is effectively {_short(outcome.effective)}: the "
        f"load balancer still sends it new flows ({_calls(lb.sim)})")
    assert outcome.told == [], outcome.told


def _assert_fell_back(lb: Lb, outcome: Drained, cause: str, *words: str) -> None:
    """Fell back: waited out ``fallback_wait``, said why (``words``, one of them at least), told ``cause``."""
    assert outcome.said is not None, (
        f"drain of {lb.vm} claimed done (effective {_short(outcome.effective)}) where it should have fallen back "
        f"({cause})")
    assert outcome.took >= lb.fallback_wait, (
        f"the fallback returned after {outcome.took:.2f} s, before the probe's lag ({lb.fallback_wait} s)")
    assert "fell back to the health probe alone" in outcome.said, outcome.said
    assert any(w in outcome.said for w in words), f"the fallback does not say why ({words}): {outcome.said}"
    assert outcome.told == [cause], (outcome.told, outcome.said)


def _assert_recovered(lb: Lb, outcome: Recovered) -> None:
    """Done: effectively None in every pool when recover returned."""
    assert outcome.error is None, f"the recovery failed: {outcome.error} ({_calls(lb.sim)})"
    assert outcome.effective == dict.fromkeys(lb.action.pools, "None"), (
        f"recovery of {lb.vm} returned (done) while its address is effectively {_short(outcome.effective)}: the "
        f"load balancer still keeps it out ({_calls(lb.sim)})")
    assert outcome.told == [], outcome.told


def _assert_recovery_failed(lb: Lb, outcome: Recovered, cause: str) -> ArmError:
    """Not done: ``ArmError`` with ``cause``, named in its message, and told to ``on_failure``."""
    error = outcome.error
    assert error is not None, (
        f"recovery of {lb.vm} claimed done (effective {_short(outcome.effective)}) where it should have raised "
        f"({cause})")
    assert error.cause == cause, (error.cause, str(error))
    assert f"({cause}: " in str(error) and "may still be Down" in str(error), str(error)
    assert outcome.told == [cause], outcome.told
    return error


def _all_at_once(lbs: Sequence[Lb], phase: Callable[[Lb, SimControl], Any], timeout: float = 120.0) -> list[Any]:
    """Run ``phase`` of every action at the same moment, each on its thread with its own control client (for
    the read right after); their outcomes, in order (an exception is an outcome too, re-raised after)."""
    barrier = threading.Barrier(len(lbs))
    outcomes: list[Any] = [None] * len(lbs)

    def run(i: int, lb: Lb) -> None:
        with SimControl(lb.sim.control_url) as control:
            barrier.wait()
            try:
                outcomes[i] = phase(lb, control)
            except BaseException as exc:  # re-raised below, in the test's thread
                outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i, lb), daemon=True) for i, lb in enumerate(lbs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
        assert not thread.is_alive(), f"an action still runs after {timeout:g} s"
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


# -- the answer lost after the write applied -----------------------------------------------------------------


def test_an_answer_lost_after_the_write_applied_is_confirmed_before_done(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim)
    sim.control.add_azure_fault("arm", "lost_answer")  # the connection is closed once the PUT has applied
    # ... and its operation outlasts the client's retry: read back after the 412, the pool says Down, Updating.
    sim.control.add_azure_fault("arm", "slow_operation", seconds=2.0)
    _assert_drained(lb, lb.drain())
    assert _status(sim, "pool_put dropped") == 1
    assert _status(sim, "pool_put 412") >= 1  # the write sent again met its own applied write

    sim.control.add_azure_fault("arm", "lost_answer")
    _assert_recovered(lb, lb.recover())
    assert _status(sim, "pool_put dropped") == 2


def test_an_answer_later_than_the_clients_timeout_is_confirmed_before_done(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim, timeout=1.0)
    sim.control.add_azure_fault("arm", "lost_answer", delay_seconds=2.5)  # applied, answered after the timeout
    _assert_drained(lb, lb.drain())
    assert _status(sim, "pool_put 412") >= 1, _calls(sim)  # the write sent again after the timeout


# -- 5xx after applying ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "retry_after"), [(502, None), (504, 0)])
def test_a_5xx_after_the_write_applied_is_confirmed_before_done(
    imds_sim: SimulatorFactory, status: int, retry_after: int | None,
) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim)
    # Without Retry-After the client backs off (1 s), with one it retries when told: either way it resends.
    sim.control.add_azure_fault("arm", "status_after_apply", status=status, retry_after=retry_after)
    _assert_drained(lb, lb.drain())
    assert _status(sim, f"pool_put {status}") == 1

    sim.control.add_azure_fault("arm", "status_after_apply", status=status, retry_after=retry_after)
    _assert_recovered(lb, lb.recover())
    assert _status(sim, f"pool_put {status}") == 2


# -- an operation slower than the deadline ---------------------------------------------------------------------


def test_a_drain_whose_write_outlives_the_deadline_falls_back_and_a_later_one_waits_for_it(
    imds_sim: SimulatorFactory,
) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim, pools=(WEB,), deadline=1.0, fallback_wait=1.5)
    sim.control.add_azure_fault("arm", "slow_operation", seconds=3.0)
    first = lb.drain()
    # On a loaded machine the last read of the operation may itself run out of the deadline (a read timeout,
    # told as unreachable): either way ARM did not confirm the write in time, and the drain falls back.
    if first.told == ["unreachable"]:
        _assert_fell_back(lb, first, "unreachable", "timed out")
    else:
        _assert_fell_back(lb, first, "not_confirmed", "did not report Succeeded")

    # An agent that restarted cannot know which writes of its earlier life are still on their way: drained
    # at once, it writes once, and is done when that write applied (after the slow one: a pool's operations
    # end in the order they were accepted).
    puts = _calls(sim)["calls"]["pool_put"]
    again = _lb(sim, pools=(WEB,), deadline=15.0)
    _assert_drained(again, again.drain())
    assert _calls(sim)["calls"]["pool_put"] == puts + 1

    # The first action again: the pool moved past its own last write and reads Down, Succeeded: done, unwritten.
    _assert_drained(lb, lb.drain())
    assert _calls(sim)["calls"]["pool_put"] == puts + 1


def test_a_recovery_whose_write_outlives_the_deadline_raises_until_arm_applied_it(
    imds_sim: SimulatorFactory,
) -> None:
    sim = _start(imds_sim)
    drained_by = _lb(sim, pools=(WEB,))
    _assert_drained(drained_by, drained_by.drain())
    lb = _lb(sim, pools=(WEB,), deadline=1.0)
    sim.control.add_azure_fault("arm", "slow_operation", seconds=4.0)

    first = lb.recover()
    _assert_recovery_failed(lb, first, "not_confirmed")
    view = sim.control.pools()[WEB]
    assert (view["provisioning_state"], view["admin_states"]["vm0"]) == ("Updating", "None"), view
    assert first.effective == {WEB: "Down"}  # ARM has not applied it: still out of rotation, and not claimed

    second = lb.recover()  # at once: the pool reads None, but Updating
    error = _assert_recovery_failed(lb, second, "not_confirmed")
    assert "still Updating" in str(error), str(error)
    assert second.effective == {WEB: "Down"}

    sim.control.wait_for(lambda c: c.pools()[WEB]["provisioning_state"] == "Succeeded", WAIT,
                         message="the slow write applied")
    puts = _calls(sim)["calls"]["pool_put"]
    _assert_recovered(lb, lb.recover())  # finds None applied
    assert _calls(sim)["calls"]["pool_put"] == puts, "the applied write was written again"
    assert lb.failures == ["not_confirmed", "not_confirmed"]


# -- a write that lands after the action gave up ---------------------------------------------------------------


def test_a_drains_write_that_lands_after_the_recovery_cannot_take_the_vm_out_again(imds_sim: SimulatorFactory) -> None:
    """The drain's PUT of ``Down`` is held on its way past the drain's deadline (the drain falls back to the
    probe); the event ends and the recovery runs while that PUT is still on its way, the pool reading ``None``
    and ``Succeeded``; then the PUT reaches the pool. The recovery's own write moved the etag the held PUT was
    sent against, so it is refused 412 when it lands: the VM stays in rotation, as the recovery said."""
    sim = _start(imds_sim)
    lb = _lb(sim, pools=(WEB,), deadline=1.5, fallback_wait=0.2, timeout=0.5)
    stall = 6.0
    sim.control.add_azure_fault("arm", "stalled_write", seconds=stall, count=None)  # every PUT, until cleared
    began = time.monotonic()
    _assert_fell_back(lb, lb.drain(), "unreachable", "ReadTimeout", "timed out")
    sim.control.clear_azure_faults()
    assert sim.control.pools()[WEB]["admin_states"]["vm0"] == "None"  # nothing of the held PUTs shows yet

    recovered = lb.recover()
    assert time.monotonic() - began < stall, "the recovery ran after the held PUTs landed: the test proves nothing"
    _assert_recovered(lb, recovered)

    held = _status(sim, "pool_put dropped")
    assert held >= 1, _calls(sim)
    sim.control.wait_for(lambda c: _landed(c.arm_calls()) == held, WAIT, message="every held PUT reached the pool")
    assert _status(sim, "pool_put landed 412") == held, _calls(sim)
    assert lb.effective() == {WEB: "None"}, (
        f"a drain's write held on its way landed after the recovery was confirmed: {lb.vm} is out of the load "
        f"balancer while its agent counts it serving ({_calls(sim)})")


# -- an operation that ends Failed or Canceled -----------------------------------------------------------------


@pytest.mark.parametrize("end", ["Failed", "Canceled"])
def test_a_write_whose_operation_ends_badly_is_not_done_and_is_driven_again(
    imds_sim: SimulatorFactory, end: str,
) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim, fallback_wait=0.5)
    sim.control.add_azure_fault("arm", "operation_end", end=end)
    drained = lb.drain()
    _assert_fell_back(lb, drained, "operation_failed", f"ended {end}")
    assert sim.control.pools()[WEB]["provisioning_state"] == "Failed"
    assert sim.control.pools()[WEB]["admin_states"]["vm0"] == "Down"  # what GET answers: asked, never applied
    assert drained.effective == {WEB: "None", API: "None"}

    puts = _calls(sim)["calls"]["pool_put"]
    _assert_drained(lb, lb.drain())  # driven again: written anew
    assert _calls(sim)["calls"]["pool_put"] == puts + 2  # the failed pool again, and the other one

    sim.control.add_azure_fault("arm", "operation_end", end=end)
    failed = lb.recover()
    _assert_recovery_failed(lb, failed, "operation_failed")
    assert failed.effective == {WEB: "Down", API: "Down"}  # nothing applied: still out, and not claimed back
    _assert_recovered(lb, lb.recover())


# -- 409 AnotherOperationInProgress: two VMs writing the same pool at once -------------------------------------


def test_two_vms_writing_the_same_pools_at_once_through_409s_both_end_confirmed(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim)
    # While a write to any pool of the load balancer is in progress (0.5 s), any other write is refused 409.
    sim.control.arm_settings(conflict_while_updating=True, async_seconds=0.5)
    lbs = [_lb(sim, vm, deadline=60.0) for vm in ("vm0", "vm1")]  # generous: the machine may be loaded

    for lb, outcome in zip(lbs, _all_at_once(lbs, lambda lb, c: lb.drain(c)), strict=True):
        _assert_drained(lb, outcome)
    assert _status(sim, "pool_put 409") >= 1, _calls(sim)
    assert sum(lb.action.conflicts for lb in lbs) >= 1
    print(f"conflicts {[lb.action.conflicts for lb in lbs]}; {_calls(sim)}")

    for lb, outcome in zip(lbs, _all_at_once(lbs, lambda lb, c: lb.recover(c)), strict=True):
        _assert_recovered(lb, outcome)


# -- 429 with a Retry-After past the deadline ------------------------------------------------------------------


def test_a_retry_after_past_the_deadline_fails_the_recovery_and_holds_the_next_one_back(
    imds_sim: SimulatorFactory,
) -> None:
    sim = _start(imds_sim)
    drained_by = _lb(sim, pools=(WEB,))
    _assert_drained(drained_by, drained_by.drain())
    lb = _lb(sim, pools=(WEB,), deadline=2.0)
    sim.control.add_azure_fault("arm", status=429, retry_after=30, methods=["GET"])

    first = lb.recover()
    _assert_recovery_failed(lb, first, "throttled")
    assert first.effective == {WEB: "Down"}  # nothing was written, nothing claimed

    before = _calls(sim)
    second = lb.recover()  # at once: ARM asked for 30 s of quiet
    error = _assert_recovery_failed(lb, second, "throttled")
    assert "ARM asked to wait" in str(error), str(error)
    after = _calls(sim)
    assert after["calls"] == before["calls"], f"a request was sent before ARM's Retry-After: {before} -> {after}"
    assert second.effective == {WEB: "Down"}
    assert lb.client.held_for() > 20.0
    assert lb.failures == ["throttled", "throttled"]


# -- throttling: tiny buckets, five writers ---------------------------------------------------------------------


def test_five_writers_under_tiny_throttling_buckets_never_claim_done_too_early(imds_sim: SimulatorFactory) -> None:
    vms = [f"vm{i}" for i in range(5)]
    sim = _start(imds_sim, vms)
    sim.control.set_throttling(read_capacity=5, read_refill=5, write_capacity=2, write_refill=2)
    lbs = [_lb(sim, vm, pools=(WEB,), deadline=60.0, fallback_wait=0.5) for vm in vms]

    outcomes = _all_at_once(lbs, lambda lb, c: lb.drain(c))
    calls = _calls(sim)
    throttled = sum(n for key, n in calls["statuses"].items() if key.endswith(" 429"))
    report = f"{[(lb.vm, o.said, lb.failures) for lb, o in zip(lbs, outcomes, strict=True)]}; {calls}"
    for lb, outcome in zip(lbs, outcomes, strict=True):
        if outcome.said is None:
            _assert_drained(lb, outcome)
        else:
            _assert_fell_back(lb, outcome, "throttled", "429", "ARM asked to wait")
    assert throttled >= 1, f"the buckets never ran dry: {report}"
    assert sum(o.said is None for o in outcomes) >= 1, f"no drain got through at all: {report}"
    print(f"throttled {throttled} time(s); {report}")


# -- tokens ------------------------------------------------------------------------------------------------------


def test_a_token_that_expires_between_the_write_and_its_completion_is_replaced(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim)
    lb = _lb(sim, pools=(WEB,))
    sim.control.add_azure_fault("arm", "slow_operation", seconds=2.0)  # a window between the PUT and Succeeded
    result: list[Drained] = []
    errors: list[BaseException] = []

    def drain() -> None:
        with SimControl(sim.control_url) as control:
            try:
                result.append(lb.drain(control))
            except BaseException as exc:  # re-raised below
                errors.append(exc)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()

    def written(control: SimControl) -> bool:
        view = control.pools()[WEB]
        return bool(view["provisioning_state"] == "Updating" and view["admin_states"]["vm0"] == "Down")

    sim.control.wait_for(written, WAIT, interval=0.02, message="the PUT applied")
    assert sim.control.expire_tokens() >= 1
    thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    _assert_drained(lb, result[0])
    calls = _calls(sim)
    assert calls["statuses"].get("operation_get 401") == 1, calls  # the poll after the expiry, once
    assert calls["calls"]["token"] == 2, calls


def test_an_unreachable_token_endpoint_falls_back_naming_the_token(imds_sim: SimulatorFactory) -> None:
    sim = _start(imds_sim)
    sim.control.add_azure_fault("token", "unreachable", count=None)  # every token request: closed, no answer
    lb = _lb(sim, deadline=1.5, fallback_wait=2.0)
    drained = lb.drain()
    _assert_fell_back(lb, drained, "token", "no token from IMDS")
    assert drained.effective == {WEB: "None", API: "None"}
    calls = _calls(sim)
    assert calls["total_arm"] == 0 and calls["statuses"].get("token dropped", 0) >= 1, calls

    _assert_recovery_failed(lb, lb.recover(), "token")
