"""The chaos oracle's liveness judgement under each delivery layout (``OracleSettings.units``, ``delivery``):
which VMs' documents show an event, and so when the leader may admit it, what holds the budget after it is
gone, who closes its record and what excuses a record left open (``docs/safety.md``, L2 and "Delivery units:
which observation closes a record"). Safety (S1-S5) reads no layout.

The group is ``tests/unit/test_oracle_liveness.py``'s: vm0, vm1 and vm2, agents from 0 s, members from 0.5 s,
vm0 leading. ``TWO_UNITS`` puts vm0 and vm1 in pg0 and vm2 in pg1; ``NAMED`` shows each VM only the events
naming it. L1 bound 6.5 s, L2 bound 7 s.
"""

from __future__ import annotations

import json
from typing import Any

from tests.oracle import OracleSettings, Verdict, dump, load
from tests.unit.test_oracle import E1, E2, T0, VMS, Run, drained_freeze
from tests.unit.test_oracle_liveness import OWNERS, PIDS, agent_down, group, liveness

TWO_UNITS: dict[str, Any] = {"layout": "two-units", "units": {"vm0": "pg0", "vm1": "pg0", "vm2": "pg1"}}
NAMED: dict[str, Any] = {"layout": "named", "units": dict.fromkeys(VMS, "pg0"), "delivery": "named"}
ONE_UNIT: dict[str, Any] = {}


def by_event(verdict: Verdict) -> dict[str, dict[str, Any]]:
    return {e["event"]: e for e in liveness(verdict)["events"]}


def liveness_violations(verdict: Verdict) -> list[str]:
    return [v.summary for v in verdict.violations if v.invariant == "liveness"]


def test_who_sees_an_event_follows_the_layout() -> None:
    one = OracleSettings(agent_vms=VMS, drain_wait_seconds=1.5)
    two = OracleSettings(agent_vms=VMS, drain_wait_seconds=1.5, **TWO_UNITS)
    named = OracleSettings(agent_vms=VMS, drain_wait_seconds=1.5, **NAMED)
    assert one.every_vm_sees_every_event and one.sees("vm0", ("vm2",))
    assert two.sees("vm0", ("VM1",)) and two.sees("vm2", ("vm2",)) and not two.sees("vm0", ("vm2",))
    assert not two.every_vm_sees_every_event and two.unit_of("VM2") == "pg1"
    assert named.sees("vm1", ("vm0", "vm1")) and not named.sees("vm0", ("vm1",))
    assert not named.every_vm_sees_every_event


# -- L1: admission by a leader that does not see the event ------------------------------------------------------


def pg1_reboot(run: Run, *, record: float | None = 2.3, approved: float = 10.0) -> None:
    """A Reboot of vm2 created at 2 s (its record published at ``record``), admitted at 5.9 s, vm2 drained from
    6 s, acknowledged and approved at ``approved``."""
    run.event(E1, ("vm2",), 2.0, event_type="Reboot", started=approved, removed=approved + 3.0)
    if record is not None:
        run.node("record", record, event_id=E1, gone=approved + 4.5)
    run.node("admitted", 5.9, event_id=E1, gone=approved + 4.5)
    run.node("ack", approved - 0.4, vm="vm2", event_id=E1, owner=OWNERS["vm2"], gone=approved + 4.0)
    run.approval(approved, "vm2", E1)


def test_a_leader_that_does_not_see_an_event_admits_it_from_its_record_only_once_known_for_gone_after() -> None:
    # Judged as if every VM saw it: allowable from 2 s, due at 8.5 s, approved at 10 s: a miss.
    run = group(out={"vm2": (6.0, 16.0)})
    pg1_reboot(run)
    assert len(liveness_violations(run.verdict())) == 1
    # The leader (vm0) does not see it: it admits it from its record (published at 2.3 s) once it has known it
    # for gone_after and a cycle, 5.8 s; allowable from then, due at 12.3 s: in time.
    for layout in (TWO_UNITS, NAMED):
        run = group(out={"vm2": (6.0, 16.0)}, **layout)
        pg1_reboot(run)
        verdict = run.verdict()
        assert verdict.ok, verdict.render(T0)
        judged = by_event(verdict)[E1]
        assert judged["outcome"] == "approved in time" and judged["allowable_from"] == 5.8
    # Its approval later than that bound is a miss still.
    run = group(out={"vm2": (6.0, 16.0)}, **TWO_UNITS)
    pg1_reboot(run, approved=13.0)
    assert liveness_violations(run.verdict())[0].startswith(f"L1: Reboot {E1} (vm2) allowable from t=5.80s, not "
                                                            "approved by t=12.30s")


def test_an_event_the_leader_sees_or_nobody_published_is_allowable_as_soon_as_it_is_created() -> None:
    # Of the leader's unit (it names vm1): the leader's documents show it, no wait for its record.
    run = group(out={"vm1": (6.0, 16.0)}, **TWO_UNITS)
    run.event(E1, ("vm1",), 2.0, event_type="Reboot", started=10.0, removed=13.0)
    run.node("record", 2.3, event_id=E1)
    run.node("admitted", 2.8, event_id=E1, gone=14.5)
    run.approval(10.0, "vm1", E1)
    assert len(liveness_violations(run.verdict())) == 1
    # Never published (no record node): no VM's documents showed it, which holds nothing.
    run = group(out={"vm2": (6.0, 16.0)}, **TWO_UNITS)
    pg1_reboot(run, record=None)
    assert len(liveness_violations(run.verdict())) == 1


def test_a_leader_restarted_after_an_event_was_published_hears_of_its_record_anew() -> None:
    # The leader's agent (vm0) killed at 3 s and back at 3.5 s, leading again from 4 s: the record, published at
    # 2.3 s, is known to the new process from 3.5 s, so it admits from 7 s. The wait until then is the kill's (a
    # fault), not a policy hold; the clock starts after the kill's effects (its session: 13.5 s).
    run = group(out={"vm2": (6.0, 24.0)}, **TWO_UNITS)
    run.obs.processes = [p for p in run.obs.processes if p.vm != "vm0"]
    run.process("vm0", PIDS["vm0"], 0.0, exited=3.05, rc=-9)
    run.process("vm0", 110, 3.5)
    run.harness(3.0, "sigkill", "vm0", PIDS["vm0"])
    run.obs.nodes = [n for n in run.obs.nodes if n.kind != "leader"]
    run.node("leader", 0.6, owner=OWNERS["vm0"], gone=4.0)
    run.node("member", 3.9, vm="vm0", owner=0xD)
    run.node("leader", 4.0, owner=0xD)
    pg1_reboot(run, approved=18.0)
    verdict = run.verdict()
    assert verdict.ok, verdict.render(T0)
    judged = by_event(verdict)[E1]
    assert judged["outcome"] == "approved in time"
    assert judged["allowable_from"] == 7.0  # 3.5 s + gone_after + a cycle
    # The same kill, judged as if vm0 saw the event, is no such wait: allowable from 2 s.
    run.obs.settings = OracleSettings(agent_vms=VMS, drain_wait_seconds=1.5)
    assert by_event(run.verdict())[E1]["allowable_from"] == 2.0


# -- L1: the budget held by a record not closed yet ---------------------------------------------------------------


def record_held(layout: dict[str, Any], *, closed: float = 16.0, approved: float = 20.0) -> Verdict:
    """A Reboot of vm2 (pg1) approved early at 6.5 s and gone at 9.5 s, its record closed (admitted node gone)
    at ``closed``; a Freeze of vm0 created at 7 s, admitted at 16.1 s and approved at ``approved``."""
    run = group(out={"vm2": (5.0, 10.0), "vm0": (approved - 2.0, approved + 5.0)}, **layout)
    run.event(E1, ("vm2",), 1.0, event_type="Reboot", started=6.5, removed=9.5)
    run.node("record", 1.1, event_id=E1, gone=closed)
    run.node("admitted", 4.7, event_id=E1, gone=closed)
    run.node("ack", 6.1, vm="vm2", event_id=E1, owner=OWNERS["vm2"], gone=10.0)
    run.approval(6.5, "vm2", E1)
    run.event(E2, ("vm0",), 7.0, started=approved, removed=approved + 3.0)
    run.node("record", 7.1, event_id=E2, gone=approved + 4.5)
    run.node("admitted", 16.1, event_id=E2, gone=approved + 4.5)
    run.node("ack", approved - 0.4, vm="vm0", event_id=E2, owner=OWNERS["vm0"], gone=approved + 4.0)
    run.approval(approved, "vm0", E2)
    return run.verdict()


def test_an_event_gone_from_the_simulator_holds_the_budget_until_its_record_closes_for_who_does_not_see_it() -> None:
    # Where every VM sees every event, the Reboot frees its slot once gone and vm2 is back in rotation (11.5 s):
    # the Freeze, allowable from then, is due at 18 s, and its approval at 20 s is a miss.
    verdict = record_held(ONE_UNIT)
    assert by_event(verdict)[E2]["allowable_from"] == 11.5
    assert len(liveness_violations(verdict)) == 1
    # vm0 (the leader and the Freeze's approver) does not see the Reboot: it knows it from its record, admitted
    # until closed at 16 s; the Freeze is allowable from then, due at 22.5 s: in time.
    for layout in (TWO_UNITS, NAMED):
        verdict = record_held(layout)
        assert verdict.ok, verdict.render(T0)
        judged = by_event(verdict)[E2]
        assert judged["allowable_from"] == 16.0 and judged["outcome"] == "approved in time"
    # A record closed late does not excuse the wait past its closing: approved at 23 s, the Freeze missed.
    verdict = record_held(TWO_UNITS, approved=23.0)
    assert liveness_violations(verdict)[0].startswith(f"L1: Freeze {E2} (vm0) allowable from t=16.00s")


def test_the_record_holds_the_budget_when_the_approver_alone_does_not_see_the_event() -> None:
    # Named delivery, the gone event names vm0 (the leader, who sees it), the waiting one vm1 (its approver,
    # who does not): vm1 weighs the gone event by its record until it is closed (16 s), not only until vm0 is
    # back in rotation (11.5 s) as where every VM sees every event.
    for layout, allowable in ((ONE_UNIT, 11.5), (NAMED, 16.0)):
        verdict = approver_blind(layout)
        assert by_event(verdict)[E2]["allowable_from"] == allowable
    assert approver_blind(NAMED).ok and not approver_blind(ONE_UNIT).ok


def approver_blind(layout: dict[str, Any]) -> Verdict:
    run = group(out={"vm0": (5.0, 10.0), "vm1": (18.0, 25.0)}, **layout)
    run.event(E1, ("vm0",), 1.0, event_type="Reboot", started=6.5, removed=9.5)
    run.node("admitted", 1.5, event_id=E1, gone=16.0)
    run.node("ack", 6.1, vm="vm0", event_id=E1, owner=OWNERS["vm0"], gone=10.0)
    run.approval(6.5, "vm0", E1)
    run.event(E2, ("vm1",), 7.0, started=20.0, removed=23.0)
    run.node("record", 7.1, event_id=E2)
    run.node("admitted", 16.1, event_id=E2, gone=24.5)
    run.node("ack", 19.6, vm="vm1", event_id=E2, owner=OWNERS["vm1"], gone=24.0)
    run.approval(20.0, "vm1", E2)
    return run.verdict()


# -- L2: who closes a record, and what excuses one left open ---------------------------------------------------


def pg1_record_open(layout: dict[str, Any], *, closed: float, end: float = 40.0) -> Run:
    """A Reboot of vm2 (pg1) approved at 6.5 s, gone at 9.5 s; its record (admitted node) closed at ``closed``."""
    run = group(end, out={"vm2": (5.0, 10.0)}, **layout)
    run.event(E1, ("vm2",), 1.0, event_type="Reboot", started=6.5, removed=9.5)
    run.node("record", 1.1, event_id=E1, gone=closed)
    run.node("admitted", 4.7, event_id=E1, gone=closed)
    run.node("ack", 6.1, vm="vm2", event_id=E1, owner=OWNERS["vm2"], gone=10.0)
    run.approval(6.5, "vm2", E1)
    return run


def test_a_record_the_leader_does_not_see_is_its_closers_and_a_fault_on_the_closer_explains_it_left_open() -> None:
    # vm2's agent killed at 9 s, back at 10 s: its old session's member node stands until 14 s (the closer as
    # the agents count members, unable to judge), its new one joins at 14.5 s. The record closes at 22 s.
    def killed(run: Run) -> Run:
        run.obs.processes = [p for p in run.obs.processes if p.vm != "vm2"]
        run.process("vm2", PIDS["vm2"], 0.0, exited=9.05, rc=-9)
        run.process("vm2", 112, 10.0)
        run.harness(9.0, "sigkill", "vm2", PIDS["vm2"])
        run.obs.nodes = [n for n in run.obs.nodes if not (n.kind == "member" and n.vm == "vm2")]
        run.node("member", 0.5, vm="vm2", owner=OWNERS["vm2"], gone=14.0)
        run.node("member", 14.5, vm="vm2", owner=0xE)
        return run

    # Where the leader sees the event, it closes the record itself: vm2's kill is no excuse.
    violations = liveness_violations(killed(pg1_record_open(ONE_UNIT, closed=22.0)).verdict())
    assert len(violations) == 1 and "no fault on the leader's path explains it" in violations[0]
    # Where it does not (another unit, named delivery), the record is vm2's to close: explained by the kill.
    for layout in (TWO_UNITS, NAMED):
        verdict = killed(pg1_record_open(layout, closed=22.0)).verdict()
        assert verdict.ok, verdict.render(T0)
        assert liveness(verdict)["misses_by_cause"] == {"L2 agent killed": 1}


def test_a_record_its_live_closer_leaves_open_fails_the_run_whoever_leads() -> None:
    for layout in (ONE_UNIT, TWO_UNITS, NAMED):
        violations = liveness_violations(pg1_record_open(layout, closed=22.0).verdict())
        assert len(violations) == 1 and violations[0].startswith(f"L2: the record of Reboot {E1} (vm2) stood open")
    assert "no fault on the path of its VMs or the leader's explains it" in liveness_violations(
        pg1_record_open(TWO_UNITS, closed=22.0).verdict())[0]


def test_a_record_of_an_event_none_of_whose_vms_runs_a_live_agent_is_excused_in_a_unit_the_leader_does_not_see(
) -> None:
    # vm2's agent stopped (SIGTERM, no fault) at 9 s, before its event went, and never back: nobody could see
    # the event go, and the record stays open until nobody holds it and it was released (L2's excuse).
    def stopped(run: Run) -> Run:
        agent_down(run, "vm2", 9.0, 40.0, member_gone=9.2, serving_until=5.0)
        return run

    verdict = stopped(pg1_record_open(TWO_UNITS, closed=35.0)).verdict()
    assert liveness_violations(verdict) == []
    assert liveness(verdict)["misses_by_cause"] == {"L2 no live agent among its VMs": 1}
    assert "excused by L2" in liveness(verdict)["misses"][0]["detail"]
    # The leader that sees it closes it, live agents among its VMs or not: the same record fails the run.
    assert len(liveness_violations(stopped(pg1_record_open(ONE_UNIT, closed=35.0)).verdict())) == 1


def test_a_closer_back_late_starts_the_clock_of_a_record_the_leader_does_not_see() -> None:
    # vm2's agent stopped at 9 s, started again at 15 s (a member from 15.5 s): due at 22.5 s.
    def back(run: Run) -> Run:
        agent_down(run, "vm2", 9.0, 40.0, member_gone=9.2, serving_until=5.0)
        run.process("vm2", 112, 15.0)
        run.node("member", 15.5, vm="vm2", owner=0xE)
        return run

    verdict = back(pg1_record_open(TWO_UNITS, closed=21.0)).verdict()
    assert liveness_violations(verdict) == []
    assert liveness(verdict)["misses_by_cause"] == {"L2 no live agent among its VMs": 1}
    violations = liveness_violations(back(pg1_record_open(TWO_UNITS, closed=24.0)).verdict())
    assert len(violations) == 1 and "no fault on the path of its VMs or the leader's explains it" in violations[0]


# -- safety reads no layout; the layout is kept with the record -----------------------------------------------


def test_safety_is_judged_the_same_in_every_layout() -> None:
    for layout in (ONE_UNIT, TWO_UNITS, NAMED):
        run = Run(**layout)
        drained_freeze(run, ack_vm1=None)
        assert [v.invariant for v in run.verdict().violations] == ["S1"]


def test_the_layout_survives_a_kept_record_and_an_older_one_reads_as_one_unit() -> None:
    run = group(**TWO_UNITS, told_vms=("vm0", "vm1", "vm2"))
    again = load(dump(run.obs)).settings
    assert (again.layout, dict(again.units), again.delivery, again.told_vms) == (
        "two-units", TWO_UNITS["units"], "unit", ("vm0", "vm1", "vm2"))
    body = json.loads(dump(run.obs))
    for name in ("layout", "units", "delivery", "told_vms"):
        del body["settings"][name]
    older = load(json.dumps(body)).settings
    assert (older.layout, dict(older.units), older.delivery, older.told_vms) == ("one-unit", {}, "unit", ())
    assert older.every_vm_sees_every_event
