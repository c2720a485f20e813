"""The chaos oracle's liveness judgement (``tests/oracle/checks_liveness.py``) on hand-made
timelines: an allowable event approved in time, one that waited for its NotBefore for nothing (the run
fails), ones whose wait a fault explains (named), ones the policy held (no miss), and records left open.

Times are seconds from the start of the made-up run (``tests/unit/test_oracle.py``'s builder). The group:
vm0, vm1 and vm2, each with an agent from 0 s and a member node from 0.5 s, vm0 leading, all serving
unless a test says otherwise. With the default settings the L1 bound is 1.5 + 5 x 0.5 + 0.5 + 2 = 6.5 s
and the L2 bound 3 + 4 x 0.5 + 2 = 7 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import OracleSettings, Verdict, dump, load
from tests.unit.test_oracle import DOWN, DRAIN, E1, E2, T0, UP, VMS, Run, rejudge_kept_runs

PIDS = {"vm0": 100, "vm1": 101, "vm2": 102}
E3 = "33333333-3333-3333-3333-333333333333"
OWNERS = {"vm0": 0xA, "vm1": 0xB, "vm2": 0xC}
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def group(end: float = 60.0, *, out: dict[str, tuple[float, float]] | None = None, **settings: Any) -> Run:
    """Three agents running and members, vm0 the leader; each VM serving except while ``out`` says it
    drained (probe 503 and HAProxy DRAIN from start to end)."""
    run = Run(end, **settings)
    out = out or {}
    for vm in VMS:
        run.process(vm, PIDS[vm], 0.0)
        run.node("member", 0.5, vm=vm, owner=OWNERS[vm])
        if vm in out:
            a, b = out[vm]
            run.probe(vm, 0, a, 200)
            run.probe(vm, a, b, 503)
            run.probe(vm, b, end, 200)
            run.servers(0, a + 0.4, {vm: UP})
            run.servers(a + 0.4, b + 1.0, {vm: DRAIN})
            run.servers(b + 1.0, end, {vm: UP})
        else:
            run.probe(vm, 0, end, 200)
            run.servers(0, end, {vm: UP})
    run.node("leader", 0.6, owner=OWNERS["vm0"])
    return run


def liveness(verdict: Verdict) -> dict[str, Any]:
    return verdict.stats["liveness"]  # type: ignore[no-any-return]


def approved_freeze(run: Run, event_id: str = E1, *, created: float = 2.0, approved: float = 5.0) -> None:
    """A Freeze of vm0 and vm1, admitted at once, acknowledged and approved by vm0 at ``approved``."""
    run.event(event_id, ("vm0", "vm1"), created, started=approved, removed=approved + 3.0)
    run.node("admitted", created + 0.5, event_id=event_id, gone=approved + 4.5)
    run.node("ack", approved - 0.4, vm="vm0", event_id=event_id, owner=OWNERS["vm0"], gone=approved + 4.0)
    run.node("ack", approved - 0.3, vm="vm1", event_id=event_id, owner=OWNERS["vm1"], gone=approved + 4.0)
    run.approval(approved, "vm0", event_id)


# -- L1 ---------------------------------------------------------------------------------------------------


def test_an_allowable_event_approved_within_the_bound_is_no_miss_and_its_time_is_counted() -> None:
    run = group(out={"vm0": (3.0, 9.0), "vm1": (3.0, 9.0)})
    approved_freeze(run, created=2.0, approved=5.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["outcomes"] == {"allowable": 1, "approved in time": 1}
    assert judged["misses"] == [] and judged["misses_unexplained"] == 0
    assert judged["allowable_to_approved"] == {"n": 1, "p50": 3.0, "p99": 3.0, "max": 3.0}
    assert judged["allowable_to_approved_with_faults"]["n"] == 0


def test_an_event_that_waited_for_its_not_before_with_nothing_in_the_way_fails_the_run() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    verdict = run.verdict()
    assert [v.invariant for v in verdict.violations] == ["liveness"]
    violation = verdict.violations[0]
    assert violation.t == pytest.approx(T0 + 8.5)  # allowable from 2 s, bound 6.5 s
    assert violation.summary.startswith(f"L1: Freeze {E1} (vm0,vm1) allowable from t=2.00s, not approved by "
                                        "t=8.50s (bound 6.5 s): started at its NotBefore at t=25.00s")
    assert "no fault on its path explains it" in violation.summary
    assert liveness(verdict)["misses_by_cause"] == {"L1 unexplained": 1}
    assert any(e.source == "imds" and "new -> Scheduled" in e.text for e in violation.timeline)


def test_an_approval_later_than_the_bound_of_an_allowable_event_is_a_miss() -> None:
    run = group(out={"vm0": (3.0, 18.0), "vm1": (3.0, 18.0)})
    approved_freeze(run, created=2.0, approved=14.0)
    verdict = run.verdict()
    assert [v.invariant for v in verdict.violations] == ["liveness"]
    assert "not approved by t=8.50s (bound 6.5 s): approved at t=14.00s" in verdict.violations[0].summary


def test_a_wait_while_one_of_its_vms_agents_was_stopped_is_a_miss_explained_by_the_pause() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=17.0, reason="not_before", removed=20.0)
    run.harness(4.0, "sigstop", "vm1", PIDS["vm1"])
    run.harness(12.0, "sigcont", "vm1", PIDS["vm1"])
    # The pause outlasted vm1's session: its member node went at 9 s, a new session joined at 12.5 s.
    run.obs.nodes = [n for n in run.obs.nodes if n.vm != "vm1"]
    run.node("member", 0.5, vm="vm1", owner=OWNERS["vm1"], gone=9.0)
    run.node("member", 12.5, vm="vm1", owner=0xD)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["misses_by_cause"] == {"L1 agent stopped (SIGSTOP)": 1}
    detail = judged["misses"][0]["detail"]
    assert "allowable from t=2.00s, started at its NotBefore at t=17.00s" in detail
    assert "agent stopped (SIGSTOP) on vm1 (by the harness) from t=4.00s to t=12.00s" in detail


def test_a_wait_while_one_of_its_vms_links_to_zookeeper_was_cut_is_a_miss_explained_by_the_cut() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=9.0, reason="not_before", removed=12.0)
    run.harness(4.0, "zk_link_cut", "vm1")
    run.harness(6.5, "zk_link_heal", "vm1")
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["misses_by_cause"] == {"L1 ZooKeeper link cut": 1}
    # Healed at 6.5 s, reconnected within a second, two cycles and a probe round: its effects until 9 s.
    assert "ZooKeeper link cut on vm1 from t=4.00s to t=6.50s, its effects until t=9.00s" in (
        judged["misses"][0]["detail"])


def test_a_fault_excuses_a_wait_only_until_its_effects_are_over() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    run.harness(4.0, "zk_link_cut", "vm1")
    run.harness(6.5, "zk_link_heal", "vm1")
    verdict = run.verdict()
    assert [v.invariant for v in verdict.violations] == ["liveness"]
    assert ("allowable from t=2.00s (the clock from t=9.00s, after the faults on its path), not approved by "
            "t=15.50s") in verdict.violations[0].summary


def test_a_fault_on_a_vm_the_event_does_not_name_and_that_does_not_lead_is_not_on_its_path() -> None:
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=12.0, reason="not_before", removed=15.0)
    run.harness(4.0, "zk_link_cut", "vm2")
    run.harness(6.5, "zk_link_heal", "vm2")
    assert [v.invariant for v in run.verdict().violations] == ["liveness"]
    run = group()
    run.event(E1, ("vm1", "vm2"), 2.0, started=12.0, reason="not_before", removed=15.0)
    run.harness(4.0, "zk_link_cut", "vm0")  # the leader: it admits
    run.harness(6.5, "zk_link_heal", "vm0")
    verdict = run.verdict()
    assert verdict.ok and liveness(verdict)["misses_by_cause"] == {"L1 ZooKeeper link cut": 1}


def test_an_event_held_by_the_budget_while_another_is_in_maintenance_is_no_miss() -> None:
    run = group(out={"vm0": (1.2, 22.0)})
    run.event(E1, ("vm0",), 1.0, started=3.0, removed=20.0)  # approved early, in maintenance until 20 s
    run.node("admitted", 1.1, event_id=E1, gone=21.0)
    run.node("ack", 2.9, vm="vm0", event_id=E1, owner=OWNERS["vm0"], gone=20.5)
    run.approval(3.0, "vm0", E1)
    run.event(E2, ("vm1",), 2.0, started=18.0, reason="not_before", removed=21.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["misses"] == []
    assert judged["outcomes"] == {"allowable": 1, "approved in time": 1, "never allowable": 1}
    assert judged["held_by"] == {"the budget": 1}
    # Without the budget, the same wait is a miss.
    run.obs.settings = OracleSettings(agent_vms=VMS, drain_wait_seconds=1.5, max_events_in_maintenance=None)
    assert [v.invariant for v in run.verdict().violations] == ["liveness"]


def test_a_vm_not_back_in_rotation_after_an_event_holds_the_budget_for_it() -> None:
    # E1 is over at 6 s, but vm0 serves again only at 15 s: until then E1 still holds the slot (S4, L4).
    run = group(out={"vm0": (1.2, 15.0)})
    run.event(E1, ("vm0",), 1.0, started=3.0, removed=6.0)
    run.node("ack", 2.9, vm="vm0", event_id=E1, owner=OWNERS["vm0"], gone=6.5)
    run.approval(3.0, "vm0", E1)
    run.event(E2, ("vm1",), 4.0, started=16.5, reason="not_before", removed=19.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    assert liveness(verdict)["held_by"] == {"the budget": 1}


def agent_down(run: Run, vm: str, stopped: float, end: float, *, killed: bool = False, member_gone: float,
               serving_until: float | None = None) -> None:
    """``vm``'s agent stopped at ``stopped`` (SIGTERM, or SIGKILL) and not started again: its probe answers
    200 until ``serving_until`` (just after the agent went, unless a drain took it out before), nothing
    after; HAProxy marks it DOWN; its member node goes at ``member_gone``."""
    serving_until = stopped + 0.1 if serving_until is None else serving_until
    run.obs.processes = [p for p in run.obs.processes if p.vm != vm]
    run.obs.probes = [s for s in run.obs.probes if s.vm != vm]
    run.obs.servers = [s for s in run.obs.servers if s.server != vm]
    run.obs.nodes = [n for n in run.obs.nodes if not (n.kind == "member" and n.vm == vm)]
    run.process(vm, PIDS[vm], 0.0, exited=stopped + 0.05, rc=-9 if killed else 0)
    run.harness(stopped, "sigkill" if killed else "sigterm", vm, PIDS[vm])
    run.node("member", 0.5, vm=vm, owner=OWNERS[vm], gone=member_gone)
    run.probe(vm, 0, serving_until, 200)
    if serving_until < stopped:  # drained by its agent: 503 until the agent went
        run.probe(vm, serving_until, stopped + 0.1, 503)
    run.probe(vm, max(serving_until, stopped + 0.1), end, None)
    run.servers(0, serving_until + 0.4, {vm: UP})
    run.servers(serving_until + 0.4, end, {vm: DOWN})


def early_freeze(run: Run, event_id: str, vm: str, created: float, approved: float) -> None:
    """A Freeze of ``vm`` alone, admitted at once, acknowledged and approved by ``vm`` at ``approved``."""
    run.event(event_id, (vm,), created, started=approved, removed=approved + 3.0)
    run.node("admitted", created + 0.5, event_id=event_id, gone=approved + 4.5)
    run.node("ack", approved - 0.4, vm=vm, event_id=event_id, owner=OWNERS[vm], gone=approved + 4.0)
    run.approval(approved, vm, event_id)


def test_a_finished_event_naming_a_vm_whose_agent_is_down_without_an_ack_holds_no_budget_slot() -> None:
    # vm2's agent stopped (SIGTERM) at 1 s without draining: no ack, no /out node, out of rotation for the
    # rest of the run. E1 names it, waits for its NotBefore (its VM runs no agent) and is over at 13 s:
    # vm2 out of rotation is down, not in maintenance for E1 (L4), so E2 is allowable from its creation
    # and its approval 3 s later is in time, as the agents' budget (``_out_vms``) has it.
    run = group(40.0, out={"vm0": (19.0, 27.0)})
    agent_down(run, "vm2", 1.0, 40.0, member_gone=2.0)
    run.event(E1, ("vm2",), 2.0, started=10.0, reason="not_before", removed=13.0)
    early_freeze(run, E2, "vm0", created=18.0, approved=21.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    assert judged["outcomes"] == {"allowable": 1, "approved in time": 1, "never allowable": 1}
    assert judged["held_by"] == {"the agent of vm2 not running": 1}
    second = next(e for e in judged["events"] if e["event"] == E2)
    assert second["allowable_from"] == 18.0 and second["outcome"] == "approved in time"
    assert judged["misses"] == []


def test_a_vm_drained_by_its_agent_for_an_event_and_then_stopped_still_holds_the_budget_for_it() -> None:
    # vm2 went out of rotation by its agent's own drain for E1 (admitted, live, 503 from 3 s), and its agent
    # was stopped at 5 s before it acknowledged: its /out node (not recorded here) still names E1, so the
    # agents' budget counts E1 while vm2 is out: E2 is held, not allowable.
    run = group(40.0)
    agent_down(run, "vm2", 5.0, 40.0, member_gone=6.0, serving_until=3.0)
    run.event(E1, ("vm2",), 2.0, started=10.0, reason="not_before", removed=13.0)
    run.node("admitted", 2.5, event_id=E1, gone=14.0)
    run.event(E2, ("vm0",), 18.0, started=30.0, reason="not_before", removed=33.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    second = next(e for e in judged["events"] if e["event"] == E2)
    assert second["outcome"] == "never allowable" and second["why"] == "the budget"
    assert judged["misses"] == []


def test_a_vm_that_acknowledged_and_was_killed_holds_the_budget_for_the_recovery_grace_only() -> None:
    # vm2 drained for E1 and acknowledged it, then its agent was killed at 5 s (its session lapsed at 14 s).
    # E1 is over at 8 s; vm2, out of rotation for it, holds E1's slot while the agents' budget still counts
    # it (``policy.recovery_grace_seconds``, 600 s by default, from its member node gone): E2 is held. Past
    # the grace it counts no more (``decide.budget.out_vms``): E3 is allowable and approved in time.
    run = group(640.0, out={"vm0": (621.0, 628.0)})
    agent_down(run, "vm2", 5.0, 640.0, killed=True, member_gone=14.0, serving_until=2.0)
    run.event(E1, ("vm2",), 1.0, started=4.0, removed=8.0)
    run.node("admitted", 1.5, event_id=E1, gone=9.0)
    run.node("ack", 3.9, vm="vm2", event_id=E1, owner=OWNERS["vm2"], gone=14.0)
    run.approval(4.0, "vm2", E1)
    run.event(E2, ("vm0",), 20.0, started=40.0, reason="not_before", removed=43.0)
    early_freeze(run, E3, "vm0", created=620.0, approved=623.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = liveness(verdict)
    by_event = {e["event"]: e for e in judged["events"]}
    assert by_event[E2]["outcome"] == "never allowable" and by_event[E2]["why"] == "the budget"
    assert by_event[E3]["outcome"] == "approved in time" and by_event[E3]["allowable_from"] == 620.0
    assert judged["misses"] == []


def test_keep_one_serving_and_an_operators_pause_hold_an_event_without_a_miss() -> None:
    run = group(out={"vm2": (0.0, 60.0)})  # the one VM outside the event's Resources out throughout
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    assert liveness(verdict)["held_by"] == {"keep_one_serving": 1}
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    run.node("pause", 1.0)
    verdict = run.verdict()
    assert verdict.ok and liveness(verdict)["held_by"] == {"an operator's pause": 1}


def test_an_event_whose_rule_is_not_after_drain_is_never_allowable() -> None:
    run = group(approval_rules={"Freeze": "never"})
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    verdict = run.verdict()
    assert verdict.ok
    assert liveness(verdict)["outcomes"] == {"never allowable": 1}
    assert liveness(verdict)["held_by"] == {"its rule is never": 1}


def test_a_member_node_of_a_dead_process_is_no_session_of_the_restarted_agent() -> None:
    # vm1's agent killed at 3 s and restarted at 4 s; the old session's member node stands until it
    # expires at 9 s, the new agent joins at 9.5 s. The event is allowable again from 9.5 s, not 4 s, and
    # the clock starts once the kill's effects are over: its old session may hold the slot it led, or
    # its acks, for a whole session after the kill (9 s by default) plus two cycles and a probe round.
    run = group()
    run.event(E1, ("vm0", "vm1"), 2.0, started=30.0, reason="not_before", removed=33.0)
    run.obs.processes = [p for p in run.obs.processes if p.vm != "vm1"]
    run.process("vm1", PIDS["vm1"], 0.0, exited=3.05, rc=-9)
    run.process("vm1", 111, 4.0)
    run.harness(3.0, "sigkill", "vm1", PIDS["vm1"])
    run.obs.nodes = [n for n in run.obs.nodes if n.vm != "vm1"]
    run.node("member", 0.5, vm="vm1", owner=OWNERS["vm1"], gone=9.0)
    run.node("member", 9.5, vm="vm1", owner=0xE)
    verdict = run.verdict()
    assert [v.invariant for v in verdict.violations] == ["liveness"]
    assert ("allowable from t=9.50s (the clock from t=13.50s, after the faults on its path), not approved by "
            "t=20.00s") in verdict.violations[0].summary


# -- L2 ---------------------------------------------------------------------------------------------------


def test_a_record_left_open_after_its_event_went_fails_the_run_unless_a_fault_on_the_leader_explains_it() -> None:
    run = group(out={"vm0": (3.0, 9.0), "vm1": (3.0, 9.0)})
    approved_freeze(run, created=2.0, approved=5.0)  # removed at 8 s
    run.obs.nodes = [n for n in run.obs.nodes if n.kind != "admitted"]
    run.node("admitted", 2.5, event_id=E1, gone=20.0)  # 12 s after the event went (bound 7 s)
    verdict = run.verdict()
    assert [v.invariant for v in verdict.violations] == ["liveness"]
    assert verdict.violations[0].summary.startswith(
        f"L2: the record of Freeze {E1} (vm0,vm1) stood open (its admitted node) until t=20.00s, 12.0 s after the "
        "event left the simulator at t=8.00s (bound 7.0 s); no fault on the leader's path explains it")
    # The leader (vm0) killed as the event went: its session, /leader with it, lived on for a session.
    run.harness(8.5, "sigkill", "vm0", PIDS["vm0"])
    run.node("member", 10.5, vm="vm0", owner=0xF)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    assert liveness(verdict)["misses_by_cause"] == {"L2 agent killed": 1}


def test_a_record_closed_within_the_bound_is_no_miss() -> None:
    run = group(out={"vm0": (3.0, 9.0), "vm1": (3.0, 9.0)})
    approved_freeze(run, created=2.0, approved=5.0)  # admitted node gone 1.5 s after the event
    judged = liveness(run.verdict())
    assert [m for m in judged["misses"] if m["law"] == "L2"] == []


# -- what carries the judgement -------------------------------------------------------------------------------


def test_the_settings_the_judgement_reads_survive_a_kept_record_and_an_older_one_reads_with_defaults() -> None:
    run = group(approval_rules={"Freeze": "never"}, poll_interval_seconds=1.0)
    again = load(dump(run.obs))
    assert again.settings.approval_rules == {"Freeze": "never"} and again.settings.poll_interval_seconds == 1.0
    body = json.loads(dump(run.obs))
    for name in ("approval_rules", "poll_interval_seconds", "session_lapse_seconds", "liveness_slack_seconds"):
        del body["settings"][name]
    older = load(json.dumps(body)).settings
    assert older.poll_interval_seconds == 0.5 and older.approval_rules == {}
    assert older.l1_bound("Freeze") == pytest.approx(6.5) and older.l2_bound() == pytest.approx(7.0)


def test_the_rejudge_and_summary_scripts_count_liveness_misses(tmp_path: Path) -> None:
    missed = group()
    missed.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    explained = group()
    explained.event(E1, ("vm0", "vm1"), 2.0, started=9.0, reason="not_before", removed=12.0)
    explained.harness(4.0, "zk_link_cut", "vm1")
    explained.harness(6.5, "zk_link_heal", "vm1")
    results, done = rejudge_kept_runs(tmp_path, (missed, explained))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("    liveness: L1: Freeze")
    assert ("liveness: 2 event(s) allowable, 0 approved within the bound; misses: L1 ZooKeeper link cut 1, "
            "L1 unexplained 1") in lines
    out = subprocess.run([sys.executable, str(SCRIPTS / "chaos_summary.py"), str(results)], capture_output=True,
                         text=True, check=True).stdout
    assert "| violations | liveness: 1 |" in out
    assert ("| liveness | 2 events allowable: 0 approved within the bound, 2 misses (1 unexplained); by cause: "
            "L1 ZooKeeper link cut 1, L1 unexplained 1 |") in out
    # The same as tables: outcomes, each miss with its runs, and the allowable-to-approved times (none here).
    assert "| miss | 2 |" in out
    assert "| L1: ZooKeeper link cut | 1 | 1 |" in out and "| L1: unexplained | 1 | 1 |" in out
    assert "| no fault on its path between | 0 | - | - | - |" in out


def test_a_server_down_in_haproxy_outside_the_resources_does_not_count_as_serving() -> None:
    run = group()
    run.obs.servers = [s for s in run.obs.servers if s.server != "vm2"]
    run.servers(0, 60, {"vm2": DOWN})
    run.event(E1, ("vm0", "vm1"), 2.0, started=25.0, reason="not_before", removed=28.0)
    verdict = run.verdict()
    assert verdict.ok and liveness(verdict)["held_by"] == {"keep_one_serving": 1}
