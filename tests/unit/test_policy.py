"""Policy rules as decision tables: approval rules, disruption budget, lead time, Terminate batches,
peers that run no agent."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coordinator.blockers import Hold
from coordinator.config import ApprovalRule, PeersPolicy
from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide, rule_for
from coordinator.maintenance_windows import Window
from coordinator.models import Document, parse_document
from coordinator.store.base import ClusterView, ConnectionState, EventRecord, OutMark, Pause

NOW = 1_700_000_000.0
A = "AAAAAAAA-0000-0000-0000-000000000001"
B = "BBBBBBBB-0000-0000-0000-000000000002"
C = "CCCCCCCC-0000-0000-0000-000000000003"
ALL4 = frozenset({"vm0", "vm1", "vm2", "vm3"})
SERVING = LocalState(phase=Phase.SERVING)
DRAINED = LocalState(phase=Phase.DRAINED)


def ev(eid: str, resources: list[str], *, etype: str = "Reboot", status: str = "Scheduled", in_s: float = 900,
       source: str = "Platform", duration: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"EventId": eid, "EventType": etype, "EventStatus": status, "Resources": resources,
                            "EventSource": source, "NotBefore": "" if status == "Started" else _rfc(NOW + in_s)}
    if duration is not None:
        body["DurationInSeconds"] = duration
    return body


def _rfc(t: float) -> str:
    from datetime import UTC, datetime

    from coordinator.models import format_not_before

    return format_not_before(datetime.fromtimestamp(t, UTC))


def doc(*events: dict[str, Any]) -> Document:
    return parse_document({"DocumentIncarnation": 7, "Events": list(events)})


def rec(eid: str, resources: tuple[str, ...], acks: tuple[str, ...] = (), *, admitted: bool = False,
        done_at: float | None = None) -> EventRecord:
    return EventRecord(eid, "Reboot", resources, None, "vm0", NOW - 60, {a: NOW - 30 for a in acks},
                       None, done_at, NOW - 50 if admitted else None)


def view(*records: EventRecord, me: str = "vm3", leader: str = "vm3", members: frozenset[str] = ALL4,
         known: frozenset[str] | None = None, absent: dict[str, float] | None = None) -> ClusterView:
    return ClusterView(members, leader, me == leader, {r.event_id: r for r in records}, ConnectionState.CONNECTED,
                       members if known is None else known, absent or {})


def run(me: str, document: Document, cluster: ClusterView | None, policy: Policy,
        local: LocalState = SERVING, absent_for: dict[str, float] | None = None) -> Any:
    return decide(Snapshot(me, NOW, 100.0, document, document, cluster, absent_for=absent_for or {}), local, policy)


# --- approval rules -------------------------------------------------------------------------------------

RULES = [
    # event, policy, expected rule
    (ev(A, ["vm0"], etype="Freeze", duration=5), Policy(), ApprovalRule.AFTER_DRAIN),
    (ev(A, ["vm0"], etype="Freeze", duration=5), Policy(freeze_immediately_below=10), ApprovalRule.IMMEDIATELY),
    (ev(A, ["vm0"], etype="Freeze", duration=30), Policy(freeze_immediately_below=10), ApprovalRule.AFTER_DRAIN),
    (ev(A, ["vm0"], etype="Freeze", duration=-1), Policy(freeze_immediately_below=10), ApprovalRule.AFTER_DRAIN),
    (ev(A, ["vm0"], etype="Freeze"), Policy(freeze_immediately_below=10), ApprovalRule.AFTER_DRAIN),
    (ev(A, ["vm0"], etype="Redeploy"), Policy(approval={"Redeploy": ApprovalRule.NEVER}), ApprovalRule.NEVER),
    (ev(A, ["vm0"], source="User"), Policy(approval={"Reboot": ApprovalRule.NEVER,
                                                     "User": ApprovalRule.AFTER_DRAIN}), ApprovalRule.AFTER_DRAIN),
    (ev(A, ["vm0"], source="User"), Policy(approval={"Reboot": ApprovalRule.NEVER}), ApprovalRule.NEVER),
    (ev(A, ["vm0"], etype="Hibernate"), Policy(approval={"Reboot": ApprovalRule.IMMEDIATELY}), ApprovalRule.NEVER),
]


@pytest.mark.parametrize(("event", "policy", "expected"), RULES)
def test_rule_for(event: dict[str, Any], policy: Policy, expected: ApprovalRule) -> None:
    assert rule_for(doc(event).events[0], policy) is expected


def test_immediately_approves_without_drain_or_acks() -> None:
    policy = Policy(freeze_immediately_below=10, max_events=None, keep_one_serving=False)
    d = doc(ev(A, ["vm0", "vm1"], etype="Freeze", duration=5))
    plan = run("vm0", d, view(rec(A, ("vm0", "vm1"))), policy)
    assert not plan.start_drain
    assert [(i.event_id, i.required) for i in plan.approve] == [(A, ())]


def test_never_drains_just_in_time_and_never_approves() -> None:
    policy = Policy(approval={"Reboot": ApprovalRule.NEVER}, max_events=None, keep_one_serving=False)
    d = doc(ev(A, ["vm0"]))
    plan = run("vm0", d, view(rec(A, ("vm0",), ("vm0",))), policy, DRAINED)
    assert plan.approve == ()
    assert plan.reasons(A) == ("policy: Reboot events are never approved early",)
    # Nothing to gain from an early drain: it drains latest_start before NotBefore, or at once if configured.
    assert not run("vm0", d, view(rec(A, ("vm0",))), policy).start_drain
    assert run("vm0", doc(ev(A, ["vm0"], in_s=60)), view(rec(A, ("vm0",))), policy).start_drain
    at_once = Policy(approval={"Reboot": ApprovalRule.NEVER}, max_events=None, keep_one_serving=False,
                     unapprovable_at_once=True)
    assert run("vm0", d, view(rec(A, ("vm0",))), at_once).start_drain


# --- disruption budget ----------------------------------------------------------------------------------

BUDGET = Policy(max_events=1, latest_start=120)


def test_leader_admits_first_come_first_served_and_holds_the_rest() -> None:
    d = doc(ev(A, ["vm0"], in_s=900), ev(B, ["vm1"], in_s=600))  # B's NotBefore is earlier
    plan = run("vm3", d, view(rec(A, ("vm0",)), rec(B, ("vm1",))), BUDGET)
    assert plan.admit == (B,)
    assert plan.reasons(A)[0].startswith("maintenance budget: 1 event(s) in maintenance")


def test_only_the_leader_admits() -> None:
    d = doc(ev(A, ["vm0"]))
    assert run("vm1", d, view(rec(A, ("vm0",)), me="vm1"), BUDGET).admit == ()


def test_not_admitted_event_does_not_drain_until_its_latest_start() -> None:
    far = doc(ev(A, ["vm0"], in_s=900))
    assert not run("vm0", far, view(rec(A, ("vm0",)), me="vm0"), BUDGET).start_drain
    near = doc(ev(A, ["vm0"], in_s=100))  # within latest_start: drains, budget or not
    assert run("vm0", near, view(rec(A, ("vm0",)), me="vm0"), BUDGET).start_drain
    assert run("vm0", far, view(rec(A, ("vm0",), admitted=True), me="vm0"), BUDGET).start_drain


def test_without_zookeeper_a_far_event_waits_and_a_near_one_drains() -> None:
    assert not run("vm0", doc(ev(A, ["vm0"], in_s=900)), None, BUDGET).start_drain
    assert run("vm0", doc(ev(A, ["vm0"], in_s=60)), None, BUDGET).start_drain


def test_not_admitted_event_is_not_approved_even_with_every_ack() -> None:
    d = doc(ev(A, ["vm0"]), ev(B, ["vm1"]))
    cluster = view(rec(A, ("vm0",), admitted=True), rec(B, ("vm1",), ("vm1",)), me="vm1", leader="vm3")
    plan = run("vm1", d, cluster, BUDGET, DRAINED)
    assert plan.approve == ()
    # vm1 is not the leader, but reckons the leader's admissions: the budget is the cause, and is named.
    assert plan.reasons(B) == (f"maintenance budget: 1 event(s) in maintenance ({A})",)


# Why an event is not admitted: the true cause in each case, never the budget when it is not full.

def _not_admitted(plan: Any, key: str) -> list[str]:
    return [r for r in plan.reasons(key) if r.startswith(("not admitted", "maintenance budget"))]


def test_not_admitted_while_the_budget_has_room_names_the_leader() -> None:
    # The budget is empty: the leader (vm3) has simply not admitted it yet (its IMDS may not list it yet).
    cluster = view(rec(B, ("vm1",), ("vm1",)), me="vm1", leader="vm3")
    plan = run("vm1", doc(ev(B, ["vm1"])), cluster, BUDGET, DRAINED)
    assert plan.reasons(B) == ("not admitted by the leader vm3 yet (the budget has room for it)",)


def test_not_admitted_without_a_leader_says_so() -> None:
    cluster = replace(view(rec(B, ("vm1",), ("vm1",)), me="vm1"), leader=None, i_am_leader=False)
    plan = run("vm1", doc(ev(B, ["vm1"])), cluster, BUDGET, DRAINED)
    assert plan.reasons(B) == ("not admitted: no leader to admit it",)


def test_not_admitted_under_a_lead_time_says_when_it_will_be() -> None:
    policy = replace(BUDGET, lead_time=600)
    cluster = view(rec(B, ("vm1",), ("vm1",)), me="vm1", leader="vm3")
    plan = run("vm1", doc(ev(B, ["vm1"], in_s=900)), cluster, policy, DRAINED)
    assert plan.reasons(B) == ("not admitted before 600 s ahead of NotBefore (drain.lead_time_seconds)",)
    assert [b.kind for b in plan.blocked[B]] == [Hold.LEAD_TIME] and plan.blocked[B][0].about_admission
    # The leader itself says the same, and admits nothing yet.
    lead = run("vm3", doc(ev(B, ["vm1"], in_s=900)), view(rec(B, ("vm1",), ("vm1",))), policy)
    assert lead.admit == () and _not_admitted(lead, B) == [
        "not admitted before 600 s ahead of NotBefore (drain.lead_time_seconds)"]


def test_not_admitted_because_a_named_vm_runs_no_agent_is_said_by_that_reason_alone() -> None:
    cluster = view(rec(B, ("vm1", "vm9"), ("vm1",)), me="vm1", leader="vm3", known=ALL4 | {"vm9"})
    plan = run("vm1", doc(ev(B, ["vm1", "vm9"])), cluster, BUDGET, DRAINED)
    assert plan.reasons(B) == ("vm9 runs no agent",)
    assert [(b.kind, b.vm) for b in plan.blocked[B]] == [(Hold.NO_AGENT, "vm9")]


def test_not_admitted_outside_the_windows_is_said_by_that_reason_alone() -> None:
    outside = replace(BUDGET, windows=(OUTSIDE,))
    cluster = view(rec(B, ("vm1",), ("vm1",)), me="vm1", leader="vm3")
    plan = run("vm1", doc(ev(B, ["vm1"])), cluster, outside, DRAINED)
    assert plan.reasons(B) == ("outside the maintenance windows",)


def test_paused_and_not_admitted_are_two_reasons() -> None:
    # A pause holds approvals, not admissions: the leader's not having admitted it yet is its own reason.
    cluster = replace(view(rec(B, ("vm1",), ("vm1",)), me="vm1", leader="vm3"), paused=PAUSE)
    plan = run("vm1", doc(ev(B, ["vm1"])), cluster, BUDGET, DRAINED)
    assert plan.reasons(B) == ("approvals paused by ops@bastion: incident 4711",
                               "not admitted by the leader vm3 yet (the budget has room for it)")
    assert [b.kind for b in plan.blocked[B]] == [Hold.PAUSED, Hold.NOT_ADMITTED]


def test_an_operators_words_choose_no_kind() -> None:
    # The pause's reason comes from outside: whatever it says, the blocker is the pause.
    pause = replace(PAUSE, reason="vm1 has not acknowledged")
    cluster = replace(view(rec(B, ("vm1",), ("vm1",), admitted=True), me="vm1", leader="vm3"), paused=pause)
    plan = run("vm1", doc(ev(B, ["vm1"])), cluster, BUDGET, DRAINED)
    assert [(b.kind, b.vm) for b in plan.blocked[B]] == [(Hold.PAUSED, None)]


def test_budget_frees_only_when_the_previous_vms_serve_again() -> None:
    d = doc(ev(B, ["vm1"]))
    still_drained = view(rec(A, ("vm0",), ("vm0",), admitted=True, done_at=NOW - 5), rec(B, ("vm1",)))
    assert run("vm3", d, still_drained, BUDGET).admit == ()
    recovered = view(rec(A, ("vm0",), (), admitted=True, done_at=NOW - 5), rec(B, ("vm1",)))
    assert run("vm3", d, recovered, BUDGET).admit == (B,)


def test_ack_of_a_vm_whose_agent_is_gone_holds_the_budget_only_for_the_recovery_grace() -> None:
    d = doc(ev(B, ["vm1"]))
    members = frozenset({"vm1", "vm2", "vm3"})  # vm0 is rebooting, or gone for good
    gone = view(rec(A, ("vm0",), ("vm0",), admitted=True, done_at=NOW - 60), rec(B, ("vm1",)), members=members)
    # The grace runs on the deciding agent's own clock, from when it saw vm0's agent go.
    assert run("vm3", d, gone, BUDGET, absent_for={"vm0": 60}).admit == ()
    assert run("vm3", d, gone, BUDGET).admit == ()  # not seen gone for any time yet
    assert run("vm3", d, gone, BUDGET, absent_for={"vm0": 601}).admit == (B,)


def test_started_event_holds_the_budget() -> None:
    d = doc(ev(A, ["vm0"], status="Started"), ev(B, ["vm1"]))
    assert run("vm3", d, view(rec(A, ("vm0",)), rec(B, ("vm1",))), BUDGET).admit == ()


def test_vm_budget_counts_vms_not_events() -> None:
    policy = Policy(max_events=None, max_vms=2)
    d = doc(ev(A, ["vm0"]), ev(B, ["vm1"]), ev(C, ["vm2", "vm3"]))
    plan = run("vm3", d, view(rec(A, ("vm0",)), rec(B, ("vm1",)), rec(C, ("vm2", "vm3"))), policy)
    assert plan.admit == (A, B)
    assert "at most 2" in plan.reasons(C)[0]


def test_an_event_larger_than_the_vm_budget_is_admitted_alone() -> None:
    policy = Policy(max_events=None, max_vms=1, keep_one_serving=False)
    d = doc(ev(A, ["vm0", "vm1"]))
    assert run("vm3", d, view(rec(A, ("vm0", "vm1"))), policy).admit == (A,)


def test_never_the_last_serving_vm() -> None:
    members = frozenset({"vm0", "vm1"})
    d = doc(ev(A, ["vm0", "vm1"]))
    plan = run("vm1", d, view(rec(A, ("vm0", "vm1")), me="vm1", leader="vm1", members=members), BUDGET)
    assert plan.admit == ()
    assert plan.reasons(A)[0] == "it would leave no VM serving even with nothing else in maintenance"
    # It does not clear by itself: `coordinator status` says it starts at NotBefore unless unblocked.
    assert plan.blocked[A][0].kind is Hold.BUDGET and plan.blocked[A][0].lasting


def test_once_drained_a_vm_stays_drained_for_that_event() -> None:
    far = doc(ev(A, ["vm0"], in_s=900))
    local = LocalState(phase=Phase.DRAINED, draining_for=frozenset({A}))
    plan = run("vm0", far, None, BUDGET, local)  # ZooKeeper gone, admission unknown
    assert plan.holding == (A,)
    assert plan.next_phase is None and not plan.start_recover


# --- lead time --------------------------------------------------------------------------------------------

def test_lead_time_holds_a_far_future_event() -> None:
    policy = Policy(max_events=None, keep_one_serving=False, lead_time=3600, latest_start=120)
    days_ahead = doc(ev(A, ["vm0"], in_s=3 * 86400))
    assert not run("vm0", days_ahead, view(rec(A, ("vm0",)), me="vm0"), policy).start_drain
    within = doc(ev(A, ["vm0"], in_s=3000))
    assert run("vm0", within, view(rec(A, ("vm0",)), me="vm0"), policy).start_drain


# --- Terminate batches ------------------------------------------------------------------------------------

def test_terminates_sharing_a_not_before_are_approved_together() -> None:
    policy = Policy(max_events=None, keep_one_serving=False)
    d = doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=300))
    one_acked = view(rec(A, ("vm0",), ("vm0",)), rec(B, ("vm1",)), me="vm0")
    plan = run("vm0", d, one_acked, policy, DRAINED)
    assert plan.approve == ()
    assert plan.reasons(A) == ("waiting for the other deletes that share its NotBefore",)
    both = view(rec(A, ("vm0",), ("vm0",)), rec(B, ("vm1",), ("vm1",)), me="vm0")
    assert [i.event_id for i in run("vm0", d, both, policy, DRAINED).approve] == [A]
    apart = doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=400))
    assert [i.event_id for i in run("vm0", apart, one_acked, policy, DRAINED).approve] == [A]


# --- peers that run no agent --------------------------------------------------------------------------------

def test_unknown_peers_ignore_skips_vms_that_never_ran_an_agent_but_not_down_ones() -> None:
    policy = Policy(max_events=None, keep_one_serving=False, unknown_peers=PeersPolicy.IGNORE)
    d = doc(ev(A, ["vm0", "db-7"]))
    members = frozenset({"vm0", "vm1", "vm2", "vm3"})
    never = view(rec(A, ("vm0", "db-7"), ("vm0",)), me="vm0", members=members, known=members)
    plan = run("vm0", d, never, policy, DRAINED)
    assert [(i.event_id, i.required) for i in plan.approve] == [(A, ("vm0",))]
    down = view(rec(A, ("vm0", "db-7"), ("vm0",)), me="vm0", members=members, known=members | {"db-7"})
    assert run("vm0", d, down, policy, DRAINED).reasons(A) == ("db-7 runs no agent",)
    blocking = Policy(max_events=None, keep_one_serving=False)
    assert run("vm0", d, never, blocking, DRAINED).reasons(A) == ("db-7 runs no agent",)


def test_event_already_holding_its_vms_is_admitted_first() -> None:
    # B drained just in time (acks, no admission) while A waits: B already holds its VM, so it goes first.
    d = doc(ev(A, ["vm0"], in_s=300), ev(B, ["vm1"], in_s=600))
    plan = run("vm3", d, view(rec(A, ("vm0",)), rec(B, ("vm1",), ("vm1",))), BUDGET)
    assert plan.admit == (B,)
    assert plan.reasons(A)[0].startswith("maintenance budget: 1 event(s) in maintenance (" + B)


def test_event_holding_its_vms_still_respects_the_rest_of_the_budget() -> None:
    d = doc(ev(A, ["vm0"]), ev(B, ["vm1"]))
    plan = run("vm3", d, view(rec(A, ("vm0",), admitted=True), rec(B, ("vm1",), ("vm1",))), BUDGET)
    assert plan.admit == ()


def test_terminate_batch_is_admitted_as_one_event() -> None:
    d = doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=300),
            ev(C, ["vm2"], in_s=200))
    plan = run("vm3", d, view(rec(A, ("vm0",)), rec(B, ("vm1",)), rec(C, ("vm2",))), BUDGET)
    assert plan.admit == (C,)  # first come: C's NotBefore is earliest
    after = view(rec(A, ("vm0",)), rec(B, ("vm1",)), rec(C, ("vm2",), done_at=NOW - 1))
    batch = run("vm3", doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=300)),
                after, BUDGET)
    assert batch.admit == (A, B)
    in_flight = view(rec(A, ("vm0",), admitted=True), rec(B, ("vm1",), admitted=True), rec(C, ("vm2",)))
    assert run("vm3", d, in_flight, BUDGET).reasons(C)[0].startswith("maintenance budget: 1 event(s)")


def test_member_absent_longer_than_the_grace_counts_as_drained() -> None:
    policy = Policy(max_events=None, keep_one_serving=False, absent_grace=300)
    d = doc(ev(A, ["vm0", "vm1"]))
    members = frozenset({"vm0", "vm2", "vm3"})  # vm1's agent is gone
    known = members | {"vm1"}
    # The grace is measured by the deciding agent's own clock, never against another VM's wall clock:
    # the /absent node's time (here claiming an old absence) is only shown to operators.
    cut_off = view(rec(A, ("vm0", "vm1"), ("vm0",)), me="vm0", members=members, known=known,
                   absent={"vm1": NOW - 10_000})
    assert run("vm0", d, cut_off, policy, DRAINED, {"vm1": 100}).reasons(A) == ("vm1 runs no agent",)
    # Past the grace, the approver first marks vm1 out of rotation (its agent cannot), then approves.
    marking = run("vm0", d, cut_off, policy, DRAINED, {"vm1": 301})
    assert marking.approve == () and marking.mark_out_for == {"vm1": (A,)}
    assert marking.reasons(A) == ("marks vm1 (absent past the grace) out of rotation before it approves without them",)
    marked = replace(cut_off, out={"vm1": OutMark(NOW - 1, (A,))})
    approve = run("vm0", d, marked, policy, DRAINED, {"vm1": 301}).approve
    assert [(i.event_id, i.required) for i in approve] == [(A, ("vm0",))]
    # Without the option, or once it is back (a stale marker), it is waited for.
    no_grace = Policy(max_events=None, keep_one_serving=False)
    assert run("vm0", d, cut_off, no_grace, DRAINED, {"vm1": 301}).approve == ()
    back = view(rec(A, ("vm0", "vm1"), ("vm0",)), me="vm0", known=known, absent={"vm1": NOW - 301})
    assert run("vm0", d, back, policy, DRAINED, {"vm1": 301}).reasons(A) == ("vm1 has not acknowledged",)


def test_an_event_naming_vms_absent_past_the_grace_waits_for_them_to_drain_on_their_own() -> None:
    """Found by the model-based suite: vm1 was cut off from ZooKeeper (absent past the grace) when a Reboot
    of vm0 and vm1 appeared. The approver counted vm1 as gone and approved at once; vm1, alive, drains
    itself for any event naming it, but only once it sees the event: it had been out for 5 s of a 10 s
    drain wait. Now the approval waits until the event has been approvable for vm1's drain wait plus the
    time vm1 may take to see it (``absent_notice``)."""
    policy = Policy(max_events=None, keep_one_serving=False, absent_grace=300, drain_wait=10.0, absent_notice=5.0)
    d = doc(ev(A, ["vm0", "vm1"]))
    members = frozenset({"vm0", "vm2", "vm3"})
    cluster = replace(view(rec(A, ("vm0", "vm1"), ("vm0",)), me="vm0", members=members, known=members | {"vm1"}),
                      out={"vm1": OutMark(NOW - 1, (A,))})  # marked out by the approver (S4)

    def at(mono: float, since: float | None) -> Any:
        snap = Snapshot("vm0", NOW, mono, d, d, cluster, absent_for={"vm1": 400.0}, cycle_started=mono,
                        read_sent=mono)
        return decide(snap, replace(DRAINED, approvable_since={A: since} if since is not None else {}), policy)

    first = at(200.0, None)
    assert first.approve == ()
    assert first.reasons(A) == ("waits 15 s more for vm1 (absent past the grace) to drain for it on their own",)
    assert first.local.approvable_since[A] == 200.0
    assert at(214.0, 200.0).approve == ()
    assert [(i.event_id, i.required) for i in at(215.0, 200.0).approve] == [(A, ("vm0",))]
    # A VM the leader waits for (a live member) adds no such wait: its ack says it is drained.
    live = view(rec(A, ("vm0", "vm1"), ("vm0", "vm1")), me="vm0", members=members | {"vm1"})
    snap = Snapshot("vm0", NOW, 200.0, d, d, live, cycle_started=200.0, read_sent=200.0)
    assert [i.required for i in decide(snap, DRAINED, policy).approve] == [("vm0", "vm1")]


def test_leader_records_absences_and_clears_stale_ones() -> None:
    known = ALL4 | {"vm7"}
    cluster = view(known=known, absent={"vm2": NOW - 5})  # vm7 gone, vm2 back
    plan = run("vm3", doc(), cluster, Policy())
    assert plan.mark_absent == ("vm7",)
    assert plan.clear_absent == ("vm2",)
    assert run("vm1", doc(), view(me="vm1", known=known), Policy()).mark_absent == ()


def test_vm_going_from_one_event_into_the_next_counts_once() -> None:
    # A is gone, but vm0 never served in between: it drained just in time for B. B may be admitted.
    d = doc(ev(B, ["vm0"]))
    cluster = view(rec(A, ("vm0",), ("vm0",), admitted=True, done_at=NOW - 5), rec(B, ("vm0",), ("vm0",)))
    assert run("vm3", d, cluster, BUDGET).admit == (B,)
    # Whereas a VM still recovering from A, and not named by B, holds the budget.
    other = doc(ev(B, ["vm1"]))
    holding = view(rec(A, ("vm0",), ("vm0",), admitted=True, done_at=NOW - 5), rec(B, ("vm1",)))
    assert run("vm3", other, holding, BUDGET).admit == ()


# --- an operator's pause, maintenance windows -------------------------------------------------------------

PAUSE = Pause(reason="incident 4711", by="ops@bastion", at=NOW - 5)
FREE = Policy(max_events=None, keep_one_serving=False)


def _window(start: float, end: float) -> Window:
    """A daily window from ``start`` to ``end`` (epoch seconds on NOW's day), in UTC."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    def clock(t: float) -> Any:
        return datetime.fromtimestamp(t, UTC).time().replace(second=0, microsecond=0)

    return Window(frozenset(range(7)), clock(start), clock(end), ZoneInfo("UTC"))


INSIDE = _window(NOW - 3600, NOW + 3600)
OUTSIDE = _window(NOW + 3600, NOW + 7200)


def test_a_pause_holds_every_approval_and_says_who_paused_and_why() -> None:
    d = doc(ev(A, ["vm0", "vm1"]))
    acked = rec(A, ("vm0", "vm1"), ("vm0", "vm1"))
    assert [i.event_id for i in run("vm0", d, view(acked, me="vm0"), FREE, DRAINED).approve] == [A]
    paused = replace(view(acked, me="vm0"), paused=PAUSE)
    plan = run("vm0", d, paused, FREE, DRAINED)
    assert plan.approve == ()
    assert "approvals paused by ops@bastion: incident 4711" in plan.reasons(A)
    # Approved at once by rule or not: a pause holds it all the same.
    quick = Policy(freeze_immediately_below=10, max_events=None, keep_one_serving=False)
    freeze = doc(ev(A, ["vm0"], etype="Freeze", duration=5))
    assert run("vm0", freeze, replace(view(rec(A, ("vm0",)), me="vm0"), paused=PAUSE), quick).approve == ()


def test_a_pause_lets_admissions_drains_and_acknowledgements_go_on() -> None:
    d = doc(ev(A, ["vm0"], in_s=900))
    assert run("vm3", d, replace(view(rec(A, ("vm0",))), paused=PAUSE), BUDGET).admit == (A,)
    admitted = replace(view(rec(A, ("vm0",), admitted=True), me="vm0"), paused=PAUSE)
    assert run("vm0", d, admitted, BUDGET).start_drain
    drained = LocalState(phase=Phase.DRAINED, drain_started=0.0)
    assert run("vm0", d, admitted, BUDGET, drained).ack == (A,)


def test_outside_the_windows_an_event_is_neither_admitted_nor_drained_early_nor_approved() -> None:
    d = doc(ev(A, ["vm0"], in_s=900))
    outside = replace(BUDGET, windows=(OUTSIDE,))
    assert run("vm3", d, view(rec(A, ("vm0",))), outside).admit == ()
    assert not run("vm0", d, view(rec(A, ("vm0",), admitted=True), me="vm0"), outside).start_drain
    acked = view(rec(A, ("vm0",), ("vm0",), admitted=True), me="vm0")
    plan = run("vm0", d, acked, outside, DRAINED)
    assert plan.approve == () and "outside the maintenance windows" in plan.reasons(A)
    # Just in time all the same: latest_start before NotBefore it drains, whatever the windows.
    assert run("vm0", doc(ev(A, ["vm0"], in_s=60)), view(rec(A, ("vm0",)), me="vm0"), outside).start_drain


def test_inside_a_window_an_event_is_admitted_drained_and_approved_as_without_windows() -> None:
    d = doc(ev(A, ["vm0"], in_s=900))
    inside = replace(BUDGET, windows=(OUTSIDE, INSIDE))
    assert run("vm3", d, view(rec(A, ("vm0",))), inside).admit == (A,)
    assert run("vm0", d, view(rec(A, ("vm0",), admitted=True), me="vm0"), inside).start_drain
    acked = view(rec(A, ("vm0",), ("vm0",), admitted=True), me="vm0")
    assert [i.event_id for i in run("vm0", d, acked, inside, DRAINED).approve] == [A]


def test_a_terminate_arriving_after_its_batch_was_admitted_joins_it() -> None:
    """Deletes sharing one NotBefore are one operation for the budget: one seen after the others were
    admitted (its record came a document later) joins them instead of waiting for the batch to end,
    which it never would: the batch is approved only together."""
    d = doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=300))
    late = view(rec(A, ("vm0",), admitted=True), rec(B, ("vm1",)))
    assert run("vm3", d, late, BUDGET).admit == (B,)
    other = doc(ev(A, ["vm0"], etype="Terminate", in_s=300), ev(B, ["vm1"], etype="Terminate", in_s=400))
    assert run("vm3", other, late, BUDGET).reasons(B)[0].startswith("maintenance budget: 1 event(s)")


def test_the_leader_counts_itself_out_of_rotation_before_the_view_shows_its_out_mark() -> None:
    """A leader that drained on its own evidence while ZooKeeper was unreachable (an event of its own near
    its NotBefore) writes its ``/out`` mark in its first cycle back, from a view read before the mark: it
    is out of rotation all the same, and admitting another event then would leave no VM serving."""
    policy = Policy(max_events=None, keep_one_serving=True)
    d = doc(ev(A, ["vm0", "vm1"]), ev(B, ["vm3", "vm9"], in_s=60))  # vm9 runs no agent: B waits for NotBefore
    cluster = replace(view(rec(A, ("vm0", "vm1")), rec(B, ("vm3", "vm9"))),
                      out={"vm2": OutMark(NOW - 1, ())})  # vm2 is starting up
    drained = LocalState(phase=Phase.DRAINED, draining_for=frozenset({B}))
    plan = run("vm3", d, cluster, policy, local=drained)
    assert plan.mark_out == (B,)  # the mark this cycle writes
    assert plan.admit == ()
    assert plan.reasons(A)[0].startswith("it would leave no VM serving")
    # Serving, the leader is the VM that stays in rotation: the same view admits A.
    assert run("vm3", doc(ev(A, ["vm0", "vm1"])), cluster, policy).admit == (A,)
