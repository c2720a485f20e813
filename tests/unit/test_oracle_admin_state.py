"""The chaos oracle on runs whose agents drain through the load balancer's admin state (``--admin-state``):
each VM's *effective* admin state is sampled beside its probe and HAProxy, and S1 and S4 judge it as they
judge HAProxy; an ARM fault of the harness is on every event's path for the liveness judgement.

Built on the hand-made timelines of ``test_oracle`` (times in seconds from the made-up run's start).
"""

from __future__ import annotations

import json

from tests.oracle import check, dump, load
from tests.oracle.records import AdminStateSample
from tests.unit.test_oracle import DOWN, DRAIN, E1, E2, T0, UP, VMS, Run, drained_freeze, invariants
from tests.unit.test_oracle_liveness import group, liveness


def admin(run: Run, start: float, end: float, states: dict[str, str], every: float = 0.15) -> None:
    """The load balancer's effective admin state of each VM in ``states``, sampled from ``start`` to ``end``."""
    t = start
    while t < end - 1e-9:
        for vm, state in states.items():
            run.obs.admin_states.append(AdminStateSample(T0 + t, vm, state))
        t += every


def freeze_with_vm1_serving_until_the_approval(run: Run) -> None:
    """``drained_freeze`` (a Freeze of vm0 and vm1 approved by vm0 at 7 s), but vm1's probe answers 200
    until 6.9 s and it acknowledges at 6.95 s: by its probe it was still in rotation at the approval."""
    drained_freeze(run, ack_vm1=6.95, vm1_fails_from=6.9)


# -- S1 ---------------------------------------------------------------------------------------------------


def test_s1_flags_an_approval_while_a_vm_is_still_routed_admin_state_none_and_probe_passing() -> None:
    run = Run()
    freeze_with_vm1_serving_until_the_approval(run)
    admin(run, 0, 60, dict.fromkeys(VMS, "None"))
    verdict = run.verdict()
    assert invariants(verdict) == ["S1"]
    summary = verdict.violations[0].summary
    assert f"Freeze {E1} approved by vm0 while vm1's probe still answered 200" in summary
    assert "(its effective admin state None)" in summary
    assert any(e.source == "lb" and e.text == "vm1 admin state None" for e in verdict.violations[0].timeline)


def test_s1_takes_a_vm_down_in_the_load_balancer_for_out_whatever_its_probe_says() -> None:
    run = Run()
    freeze_with_vm1_serving_until_the_approval(run)
    admin(run, 0, 3.2, dict.fromkeys(VMS, "None"))
    admin(run, 3.2, 16.0, {"vm0": "Down", "vm1": "Down", "vm2": "None"})
    admin(run, 16.0, 60, dict.fromkeys(VMS, "None"))
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)


def test_s1_without_admin_state_samples_is_judged_by_the_probe_as_before() -> None:
    run = Run()
    freeze_with_vm1_serving_until_the_approval(run)
    verdict = run.verdict()
    assert invariants(verdict) == ["S1"]
    assert "effective admin state" not in verdict.violations[0].summary


def test_s1_does_not_take_down_for_granted_when_it_changed_across_the_approval() -> None:
    # Down before the approval, None in the first sample after it: not Down across it, judged by the probe.
    run = Run()
    freeze_with_vm1_serving_until_the_approval(run)
    admin(run, 0, 3.2, dict.fromkeys(VMS, "None"))
    admin(run, 3.2, 6.95, {"vm0": "Down", "vm1": "Down", "vm2": "None"})
    admin(run, 7.05, 60, {"vm0": "Down", "vm1": "None", "vm2": "None"})
    verdict = run.verdict()
    assert invariants(verdict) == ["S1"]
    assert "(its effective admin state not seen Down)" in verdict.violations[0].summary


def test_s1_flags_a_vm_up_in_haproxy_or_forced_up_across_the_approval_in_an_admin_state_run() -> None:
    run = Run()
    drained_freeze(run)  # vm0 and vm1 drained by their probes from 3 s, DRAIN in HAProxy from 3.5 s
    admin(run, 0, 60, dict.fromkeys(VMS, "None"))
    assert run.verdict().ok
    run.obs.servers = [s for s in run.obs.servers if not (s.server == "vm1" and T0 + 6 <= s.t <= T0 + 8)]
    run.servers(6.0, 8.0, {"vm1": UP})  # HAProxy routes to vm1 again around the approval
    run.obs.admin_states = [s for s in run.obs.admin_states if not (s.vm == "vm0" and T0 + 6 <= s.t <= T0 + 8)]
    admin(run, 6.0, 8.0, {"vm0": "Up"})  # routed whatever its probe says
    verdict = run.verdict()
    summaries = [v.summary for v in verdict.violations if v.invariant == "S1"]
    assert any("vm1 was still UP in HAProxy on both sides of the approval (its effective admin state None)" in s
               for s in summaries), summaries
    assert any("vm0 was still routed to by the load balancer: effective admin state Up" in s for s in summaries)


def test_s1_reads_a_drain_that_fell_back_to_the_probe_with_haproxy_drained_only_by_its_check() -> None:
    """The agents of an --admin-state run have no HAProxy action: when ARM fails, the admin state stays None
    and HAProxy takes the VM out only when its check of the probe fails (DOWN, not DRAIN). Out by then: clean;
    approved while the check still had it UP: routed to, whatever the probe said."""
    run = Run()
    drained_freeze(run)  # vm0 and vm1 fail their probes from 3 s
    run.obs.servers = []
    run.servers(0, 4.0, {"vm0": UP, "vm1": UP, "vm2": UP})
    run.servers(4.0, 16.5, {"vm0": DOWN, "vm1": DOWN, "vm2": UP})  # the check's lag: 1 s
    run.servers(16.5, 60, {"vm0": UP, "vm1": UP, "vm2": UP})
    admin(run, 0, 60, dict.fromkeys(VMS, "None"))  # ARM never took the writes
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    run.obs.servers = [s for s in run.obs.servers if not (s.server == "vm1" and T0 + 4.0 <= s.t <= T0 + 8)]
    run.servers(4.0, 8.0, {"vm1": UP})  # the check had not taken vm1 out at the approval
    verdict = run.verdict()
    assert invariants(verdict) == ["S1"]
    assert verdict.violations[0].summary.endswith(
        "vm1 was still UP in HAProxy on both sides of the approval (its effective admin state None)")


# -- S4 ---------------------------------------------------------------------------------------------------


def test_s4_counts_a_vm_down_in_the_load_balancer_as_out_when_keeping_one_serving() -> None:
    run = Run()
    drained_freeze(run)  # vm2, outside the Freeze, serving and UP in HAProxy throughout
    run.node("admitted", 2.5, event_id=E1)
    admin(run, 0, 60, dict.fromkeys(VMS, "None"))
    assert run.verdict().ok
    run.obs.admin_states = [s for s in run.obs.admin_states if not (s.vm == "vm2" and T0 + 2 <= s.t <= T0 + 8)]
    admin(run, 2.0, 8.0, {"vm2": "Down"})  # UP in HAProxy by its probe, but Down in the load balancer
    verdict = run.verdict()
    assert invariants(verdict) == ["S4", "S4"]
    admission, approval = verdict.violations
    assert admission.summary.startswith(f"admission of Freeze {E1} (vm0,vm1) while no VM outside its Resources was "
                                        "UP in HAProxy and not Down in the load balancer")
    assert "vm2 UP admin Down" in admission.summary
    assert approval.summary.startswith(f"approval of {E1} by vm0 while no VM was UP in HAProxy and not Down in the "
                                       "load balancer")


def test_s4_counts_a_vm_down_in_the_load_balancer_as_out_of_rotation_for_the_budget() -> None:
    run = Run()
    run.all_serving(0, 3)
    run.event(E1, ("vm0",), 1.0, started=5.0, removed=20.0)
    run.event(E2, ("vm1",), 2.0, started=8.0, removed=20.0)
    # vm0's probe last answered 200 before E1 (its sampler silent after), HAProxy UP: in rotation by both.
    run.probe("vm0", 24, 60, 200)
    run.probe("vm1", 3, 24, 503)
    run.probe("vm1", 24, 60, 200)
    run.probe("vm2", 3, 60, 200)
    run.servers(3, 60, {"vm0": UP, "vm1": DRAIN, "vm2": UP})
    run.node("ack", 4.8, vm="vm0", event_id=E1)
    run.node("ack", 7.8, vm="vm1", event_id=E2)
    run.approval(5.0, "vm0", E1)
    run.approval(8.0, "vm1", E2)
    assert run.verdict().ok  # without admin state, vm0 is in rotation by its probe and HAProxy
    admin(run, 0, 60, {"vm1": "None", "vm2": "None"})
    admin(run, 0, 4.0, {"vm0": "None"})
    admin(run, 4.0, 24.0, {"vm0": "Down"})
    admin(run, 24.0, 60, {"vm0": "None"})
    verdict = run.verdict()
    assert invariants(verdict) == ["S4"]
    assert f"while Freeze {E1}, approved early, was still present with vm0 out of rotation" in (
        verdict.violations[0].summary)


# -- S2 at the end ------------------------------------------------------------------------------------------


def test_s2_flags_a_vm_left_down_in_the_load_balancer_after_everything_healed() -> None:
    run = Run()
    drained_freeze(run)
    run.obs.healed_at = T0 + 20.0
    admin(run, 0, 3.2, dict.fromkeys(VMS, "None"))
    admin(run, 3.2, 60, {"vm0": "Down", "vm1": "Down", "vm2": "None"})
    admin(run, 3.2 + 0.05, 17.0, {"vm0": "Down"})  # vm0 comes back, vm1 is left Down
    run.obs.admin_states = [s for s in run.obs.admin_states if not (s.vm == "vm0" and s.t >= T0 + 17.0)]
    admin(run, 17.0, 60, {"vm0": "None"})
    verdict = run.verdict()
    assert invariants(verdict) == ["S2"]
    assert verdict.violations[0].summary.startswith("vm1 was back to admin state None in the load balancer not at "
                                                    "the end of the run")


# -- liveness: an ARM fault is on every event's path ----------------------------------------------------------


def test_a_wait_while_arm_was_faulty_is_a_miss_explained_by_the_arm_fault() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=9.0, reason="not_before", removed=12.0)
    assert [v.invariant for v in run.verdict().violations] == ["liveness"]  # nothing in the way: unexplained
    run.harness(4.0, "arm_fault", "arm")
    run.harness(6.0, "arm_fault_heal", "arm")
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["misses_by_cause"] == {"L1 ARM fault": 1}
    # Cleared at 6 s; a drain that met it may retry until its deadline (10 s), then two cycles and a probe round.
    assert "ARM fault on arm from t=4.00s to t=6.00s, its effects until t=17.50s" in judged["misses"][0]["detail"]


# -- the record --------------------------------------------------------------------------------------------


def test_admin_state_samples_are_kept_and_a_record_without_them_still_reads() -> None:
    run = Run()
    freeze_with_vm1_serving_until_the_approval(run)
    admin(run, 0, 10, dict.fromkeys(VMS, "None"))
    again = load(dump(run.obs))
    assert again.admin_states == run.obs.admin_states
    body = json.loads(dump(run.obs))
    del body["admin_states"]
    del body["settings"]["arm_deadline_seconds"]
    old = load(json.dumps(body))
    assert old.admin_states == [] and old.settings.arm_deadline_seconds == 10.0
    assert "effective admin state" not in check(old).violations[0].summary
