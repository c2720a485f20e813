"""End to end: the documented Azure Scheduled Events scenarios, played by the simulator against three agents.

Each test starts a group (ZooKeeper from the session, the simulator and three agent processes through
``LocalCluster``), plays one scenario of the Scheduled Events documentation, and checks the same two
properties from the outside:

* no approval reached IMDS before every VM named by its event had acknowledged (the simulator's log
  against the acknowledgement nodes' ZooKeeper ctimes, recorded by the ``Observer``);
* every VM that drained serves again (probe 200) once its event is gone.

The simulator's impacts are real: a Freeze pauses (SIGSTOP) the agent processes registered for the
named VMs, a Reboot kills them (SIGKILL) and the test restarts the agent, as a rebooted VM would.
Timings are shortened (drain wait 1 s, poll 0.3 s, short Started times, or a time scale) so that each
test takes seconds; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.observer import Observer
from tests.e2e.support import (
    VMS,
    ClusterFactory,
    acked,
    approvals,
    assert_no_approval_before_acks,
    assert_recovered,
    gone,
    probes_between,
    process_state,
    register_agents,
    serving,
    sim,
    transition,
    transitions,
)

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

# -- the scenarios ---------------------------------------------------------------------------------


def test_cancelled_event_drained_vms_recover_and_nothing_is_approved(make_cluster: ClusterFactory) -> None:
    # Events that cannot be approved early drain at once with this option (just in time by default).
    cluster = make_cluster(extra_config={"drain": {"unapprovable": "at-once"}})
    with Observer(cluster) as observer:
        # vm9 is outside the group and runs no agent: it keeps the event from being approved, so the
        # cancellation reaches VMs that have drained and acknowledged.
        event_id = sim(cluster).schedule("Freeze", ["vm0", "vm1", "vm9"], not_before_in=300)["event_id"]
        cluster.wait(lambda: acked(observer, event_id, "vm0", "vm1"), 15, "vm0 and vm1 to drain and acknowledge")
        sim(cluster).cancel(event_id)
        cluster.wait(lambda: serving(cluster), 15, "vm0 and vm1 to serve again")
        assert approvals(cluster, event_id) == []
        assert transitions(cluster, event_id) == [(None, "Scheduled", "scheduled"), ("Scheduled", None, "cancelled")]
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})


def test_hardware_failure_drains_the_named_vm_at_once_and_it_recovers(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(started_for=3.0)
    with Observer(cluster) as observer:
        created = time.time()
        event_id = sim(cluster).schedule("Reboot", ["vm1"], status="Started")["event_id"]
        cluster.wait(lambda: cluster.agents["vm1"].probe() == 503, 3, "vm1 to drain at once")
        drained_after = time.time() - created
        cluster.wait(lambda: gone(cluster, event_id), 10, "the event to end")
        removed = transition(cluster, event_id, None)["t"]
        cluster.wait(lambda: cluster.agents["vm1"].probe() == 200, 10, "vm1 to serve again")
        assert drained_after < 3
        assert 200 not in probes_between(observer, "vm1", created + drained_after, removed)
        assert transitions(cluster, event_id) == [
            (None, "Started", "scheduled"),
            ("Started", None, "started_for_elapsed"),
        ]
        assert sim(cluster).log(kind="approval") == []  # nothing Scheduled, nothing to approve
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm1"})


def test_second_impact_while_started_keeps_the_vm_drained_until_removal(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    with Observer(cluster) as observer:
        register_agents(cluster, "vm0", "vm1")
        event_id = sim(cluster).schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=1, started_for=6,
                                         not_before_in=300)["event_id"]
        started = sim(cluster).wait_for_transition(event_id, "Started", timeout=20)
        sim(cluster).wait_for(lambda c: len(c.log(kind="signal")) >= 4, timeout=5, message="the first pause to end")
        second = sim(cluster).impact(event_id, seconds=1, pause=True)  # a second, shorter impact
        removed = sim(cluster).wait_for_transition(event_id, None, timeout=15)
        cluster.wait(lambda: serving(cluster), 15, "vm0 and vm1 to serve again")
        assert started["reason"] == "approved"
        assert second["reason"] == "second" and second["vms"] == ["vm0", "vm1"]
        # The event stayed Started through the second impact, and the VMs stayed out of the pool.
        assert transitions(cluster, event_id) == [
            (None, "Scheduled", "scheduled"),
            ("Scheduled", "Started", "approved"),
            ("Started", None, "started_for_elapsed"),
        ]
        for vm in ("vm0", "vm1"):
            during = probes_between(observer, vm, started["t"], removed["t"])
            assert during and 200 not in during, (vm, during)
        stops = [e for e in sim(cluster).log(kind="signal") if e["signal"] == "SIGSTOP"]
        assert len(stops) == 4  # two impacts, two VMs
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})


def test_reboot_that_turns_out_to_be_a_freeze(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(started_for=4.0)
    with Observer(cluster) as observer:
        pids = register_agents(cluster, "vm0", "vm1")
        event_id = sim(cluster).schedule("Reboot", ["vm0", "vm1"], impact="freeze", impact_seconds=1.5,
                                         not_before_in=300)["event_id"]
        sim(cluster).wait_for_transition(event_id, "Started", timeout=20)
        cluster.wait(lambda: all(process_state(pid) == "T" for pid in pids.values()), 3, "the agents to be paused")
        cluster.wait(lambda: gone(cluster, event_id), 15, "the event to end")
        assert_recovered(cluster, observer, {"vm0", "vm1"})
        # A freeze, not a reboot: the very same processes were paused and continued, never killed.
        assert {vm: cluster.agents[vm].pid for vm in pids} == pids
        signals = [(e["vm"], e["signal"]) for e in sim(cluster).log(kind="signal")]
        assert sorted(signals) == sorted([(vm, s) for vm in pids for s in ("SIGSTOP", "SIGCONT")])
        assert {e["event_type"] for e in sim(cluster).log(kind="transition") if e["event_id"] == event_id} == {"Reboot"}
        assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm0"]
        assert_no_approval_before_acks(cluster, observer)


def test_back_to_back_events_across_fault_domains(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    with Observer(cluster) as observer:
        rollout = sim(cluster).rollout("Freeze", not_before_in=300, duration_in_seconds=1)
        assert rollout["groups"] == [["vm0", "vm2"], ["vm1"]]  # fault domains 0 and 1
        first = rollout["event"]["event_id"]

        def second_id() -> str | None:
            return sim(cluster).rollouts()[0]["event_id"] if sim(cluster).rollouts()[0]["step"] == 1 else None

        cluster.wait(lambda: second_id() is not None, 30, "the first event to end and the second to appear")
        second = second_id()
        assert second is not None
        cluster.wait(lambda: gone(cluster, second), 30, "the second event to be approved, start and end")
        cluster.wait(lambda: serving(cluster), 15, "everyone serving")

        first_approved = approvals(cluster, first)[0]["t"]
        first_removed = transition(cluster, first, None)["t"]
        second_created = transition(cluster, second, "Scheduled")["t"]
        second_approved = approvals(cluster, second)[0]["t"]
        second_removed = transition(cluster, second, None)["t"]
        assert first_approved < first_removed <= second_created < second_approved < second_removed
        assert [a["vm"] for a in approvals(cluster, first)] == ["vm0"]
        assert [a["vm"] for a in approvals(cluster, second)] == ["vm1"]
        # The VMs of the first domain were back in the pool while the second domain was in maintenance,
        # and the second domain's VM served all through the first.
        for vm in ("vm0", "vm2"):
            assert 200 in probes_between(observer, vm, first_removed, second_removed), vm
        assert 503 not in probes_between(observer, "vm1", 0, second_created)
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1", "vm2"})


def test_several_events_in_one_document(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    with Observer(cluster) as observer:
        a = sim(cluster).schedule("Freeze", ["vm0"], not_before_in=300)["event_id"]
        b = sim(cluster).schedule("Redeploy", ["vm1"], not_before_in=360)["event_id"]
        assert [e["EventId"] for e in sim(cluster).document("vm2")["Events"]] == [a, b]
        cluster.wait(lambda: gone(cluster, a) and gone(cluster, b), 40, "both events to be approved, start and end")
        assert [x["vm"] for x in approvals(cluster, a)] == ["vm0"]
        assert [x["vm"] for x in approvals(cluster, b)] == ["vm1"]
        assert ("Scheduled", "Started", "approved") in transitions(cluster, a)
        assert ("Scheduled", "Started", "approved") in transitions(cluster, b)
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})


def test_user_initiated_reboot_is_approved_after_drain(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    with Observer(cluster) as observer:
        event_id = sim(cluster).schedule("Reboot", ["vm2"], source="User", not_before_in=300)["event_id"]
        [served] = sim(cluster).document("vm0")["Events"]
        assert served["EventSource"] == "User"
        cluster.wait(lambda: gone(cluster, event_id), 20, "the user's reboot to be approved, start and end")
        [approval] = approvals(cluster, event_id)
        assert approval["vm"] == "vm2"
        assert ("Scheduled", "Started", "approved") in transitions(cluster, event_id)
        assert approval["t"] >= observer.seen.ack_ctime[(event_id, "vm2")]
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm2"})


def test_terminate_batch_starts_together_only_once_every_delete_is_approved(make_cluster: ClusterFactory) -> None:
    # Terminate notice 600 s on a time scale of 10: one real minute of notice, rendered in real time. A budget
    # of two events admits both deletes (see the next test for the default budget), and drains wait for the
    # admission (latest_start 5 s) rather than starting at once because NotBefore is less than 120 s away.
    cluster = make_cluster(started_for=20.0,
                           extra_config={"policy": {"max_events_in_maintenance": 2},
                                         "drain": {"latest_start_seconds": 5}},
                           sim_args=["--time-scale", "10", "--terminate-notice", "600", "--not-before-clock", "real"])
    vm1 = cluster.agents["vm1"].proc
    assert vm1 is not None
    with Observer(cluster) as observer:
        vm1.send_signal(signal.SIGSTOP)  # vm1's agent is slow to act on its delete
        try:
            a = sim(cluster).schedule("Terminate", ["vm0"])
            b = sim(cluster).schedule("Terminate", ["vm1"], not_before_at=a["not_before"])
            assert a["not_before_text"] == b["not_before_text"]
            cluster.wait(lambda: acked(observer, a["event_id"], "vm0"), 15, "vm0 to drain and acknowledge")

            def vm0_decided() -> bool:
                status = cluster.agents["vm0"].status() or {}
                mine = next((e for e in status.get("events", []) if e["event_id"] == a["event_id"]), None)
                return a["event_id"] in status.get("approved_by_me", []) or bool(mine and mine["waiting_for"])

            cluster.wait(vm0_decided, 10, "vm0 to approve its delete or say what it waits for")
            # Whatever vm0 did, its delete has not started while vm1's is pending.
            assert sim(cluster).event(a["event_id"])["status"] == "Scheduled"  # type: ignore[index]
            if approvals(cluster, a["event_id"]):
                assert [h["held_by"] for h in sim(cluster).log(kind="hold")] == [[b["event_id"]]]
        finally:
            vm1.send_signal(signal.SIGCONT)
        cluster.wait(lambda: gone(cluster, a["event_id"]) and gone(cluster, b["event_id"]), 30,
                     "both deletes to be approved, start and end")
        started = {eid: transition(cluster, eid, "Started") for eid in (a["event_id"], b["event_id"])}
        last_approval = max(approvals(cluster, eid)[0]["t"] for eid in started)
        assert {e["reason"] for e in started.values()} == {"approved"}
        assert len({e["sim_t"] for e in started.values()}) == 1  # in the same instant
        assert min(e["t"] for e in started.values()) >= last_approval
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})


def test_terminate_batch_is_approved_early_with_the_default_policy(make_cluster: ClusterFactory) -> None:
    # Terminate notice 300 s on a time scale of 30: ten real seconds of notice, rendered in real time.
    cluster = make_cluster(started_for=30.0,
                           sim_args=["--time-scale", "30", "--not-before-clock", "real"])
    with Observer(cluster) as observer:
        a = sim(cluster).schedule("Terminate", ["vm0"])
        b = sim(cluster).schedule("Terminate", ["vm1"], not_before_at=a["not_before"])
        cluster.wait(lambda: gone(cluster, a["event_id"]) and gone(cluster, b["event_id"]), 30,
                     "both deletes to start and end")
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})
        # Both VMs drained and acknowledged well before NotBefore: the batch should have been approved.
        assert acked(observer, a["event_id"], "vm0") and acked(observer, b["event_id"], "vm1")
        assert {transition(cluster, e["event_id"], "Started")["reason"] for e in (a, b)} == {"approved"}


def test_freeze_really_pauses_the_agents_of_the_named_vms(make_cluster: ClusterFactory) -> None:
    # A 20-second Freeze on a time scale of 10 pauses the agents for two real seconds.
    cluster = make_cluster(started_for=40.0, sim_args=["--time-scale", "10"])
    with Observer(cluster) as observer:
        pids = register_agents(cluster, "vm0", "vm1")
        bystander = cluster.agents["vm2"].pid
        assert bystander is not None
        event_id = sim(cluster).schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=20)["event_id"]
        started = sim(cluster).wait_for_transition(event_id, "Started", timeout=20)
        cluster.wait(lambda: all(process_state(pid) == "T" for pid in pids.values()), 3, "the agents to be paused")
        assert process_state(bystander) != "T"
        cluster.wait(lambda: all(process_state(pid) != "T" for pid in pids.values()), 10, "the agents to continue")
        cluster.wait(lambda: gone(cluster, event_id), 15, "the Freeze to end")
        assert started["reason"] == "approved"
        signals = sim(cluster).log(kind="signal")
        expected = {(pid, name) for pid in pids.values() for name in ("SIGSTOP", "SIGCONT")}
        assert {(e["pid"], e["signal"]) for e in signals} == expected
        for pid in pids.values():
            stop, cont = (next(e for e in signals if e["pid"] == pid and e["signal"] == name)
                          for name in ("SIGSTOP", "SIGCONT"))
            assert cont["sim_t"] - stop["sim_t"] >= 20
            assert 1.5 <= cont["t"] - stop["t"] < 5
        assert {vm: cluster.agents[vm].pid for vm in pids} == pids  # the same processes, alive
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})


def test_reboot_kills_the_agent_which_comes_back_drained_then_recovers(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(started_for=5.0)
    with Observer(cluster) as observer:
        [old_pid] = register_agents(cluster, "vm1").values()
        event_id = sim(cluster).schedule("Reboot", ["vm1"], not_before_in=300)["event_id"]
        cluster.wait(lambda: not cluster.agents["vm1"].alive(), 20, "the Reboot to kill vm1's agent")
        [kill] = sim(cluster).log(kind="signal")
        assert (kill["vm"], kill["pid"], kill["signal"], kill["result"]) == ("vm1", old_pid, "SIGKILL", "sent")
        assert sim(cluster).pids("vm1") == []
        restarted_at = time.time()
        cluster.start_agent("vm1")  # the VM comes back from its reboot
        assert cluster.agents["vm1"].pid != old_pid
        cluster.wait(lambda: gone(cluster, event_id), 15, "the event to end")
        removed = transition(cluster, event_id, None)["t"]
        cluster.wait(lambda: cluster.agents["vm1"].probe() == 200, 15, "vm1 to serve again")
        during = probes_between(observer, "vm1", restarted_at, removed)
        assert during and 200 not in during, during
        assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm1"]
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm1"})


def test_imds_faults_during_an_event_neither_approve_early_nor_crash(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster()
    control = sim(cluster)
    with Observer(cluster) as observer:
        event_id = control.schedule("Freeze", ["vm0", "vm1"], not_before_in=300)["event_id"]
        control.add_fault("status", status=500, count=3)
        control.add_fault("status", status=429, count=3)
        control.add_fault("status", status=410, count=2)
        control.add_fault("malformed", count=2)
        control.add_fault("wrong_type", field="Resources")
        control.add_fault("status", vm="vm0", status=500, count=2, methods=["POST"])  # vm0's approval fails twice
        control.refuse("vm0", 1.5)
        control.refuse("vm1", 1.0)
        cluster.wait(lambda: gone(cluster, event_id), 40, "the event to be approved, start and end")
        assert all(agent.alive() for agent in cluster.agents.values())
        served = {(e["vm"], e["fault"], e.get("status")) for e in control.log(kind="fault")}
        for vm in ("vm0", "vm1"):
            for fault in (("status", 500), ("status", 429), ("status", 410), ("malformed", None),
                          ("wrong_type", None), ("refuse", None)):
                assert (vm, *fault) in served, (vm, fault)
        [approval] = [a for a in approvals(cluster, event_id) if a["status"] == 200]
        assert approval["vm"] == "vm0"
        for vm in ("vm0", "vm1"):
            assert "coordinator_imds_documents_invalid_total 0.0" not in cluster.agents[vm].metrics()
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0", "vm1"})
        assert control.faults() == []


def test_incarnation_reset_and_skip_during_an_event(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(started_for=3.0)
    control = sim(cluster)
    with Observer(cluster) as observer:
        event_id = control.schedule("Freeze", ["vm0"], not_before_in=300)["event_id"]
        cluster.wait(lambda: (cluster.agents["vm0"].status() or {}).get("imds", {}).get("incarnation") == 2, 5,
                     "vm0 to read the event")
        control.reset_incarnation()  # as after 24 h without a request: the same events, incarnation 1
        cluster.wait(lambda: all((cluster.agents[vm].status() or {}).get("imds", {}).get("incarnation") == 1
                                 for vm in VMS), 5, "every agent to accept the lower incarnation")
        started = control.wait_for_transition(event_id, "Started", timeout=20)
        control.skip_incarnation(by=5)  # as a VM that was down while Started sees it
        cluster.wait(lambda: gone(cluster, event_id), 15, "the event to end")
        served = control.document("vm0")["DocumentIncarnation"]
        cluster.wait(lambda: (cluster.agents["vm0"].status() or {}).get("imds", {}).get("incarnation") == served,
                     5, "vm0 to read the last document")
        assert started["reason"] == "approved"
        [reset] = [e for e in control.log(kind="incarnation") if e["vm"] == "vm0" and e["action"] == "reset"]
        assert reset["seq"] < started["seq"]  # the reset came while the event was Scheduled
        assert served == 1 + 1 + 5 + 1  # reset, Started, skip, removed
        assert [a["vm"] for a in approvals(cluster, event_id)] == ["vm0"]
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm0"})


def test_events_delivered_only_to_the_vms_they_name_are_approved_early(make_cluster: ClusterFactory) -> None:
    """GPU VMs of a one-fault-domain scale set see only their own events: the leader, which never sees
    them, admits them from their records and marks them done once their VMs are back."""
    cluster = make_cluster()
    with Observer(cluster) as observer:
        a = sim(cluster).schedule("Freeze", ["vm1"], not_before_in=300, deliver_to_named_only=True)["event_id"]
        assert sim(cluster).document("vm0")["Events"] == []
        assert sim(cluster).document("vm2")["Events"] == []
        cluster.wait(lambda: gone(cluster, a), 40, "vm1's event to be approved, start and end")
        b = sim(cluster).schedule("Redeploy", ["vm2"], not_before_in=300, deliver_to_named_only=True)["event_id"]
        cluster.wait(lambda: gone(cluster, b), 40, "vm2's event to be approved too: the budget was freed")
        assert [x["vm"] for x in approvals(cluster, a)] == ["vm1"]
        assert [x["vm"] for x in approvals(cluster, b)] == ["vm2"]
        assert ("Scheduled", "Started", "approved") in transitions(cluster, a)
        assert ("Scheduled", "Started", "approved") in transitions(cluster, b)
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm1", "vm2"})


def test_a_group_across_two_placement_groups_approves_each_units_events_early(make_cluster: ClusterFactory) -> None:
    """One group (one budget) over two placement groups, as a scale set past 100 instances is: vm0 and vm1 in
    pg0, vm2 and vm3 in pg1, each VM's IMDS showing only its own unit's events, each agent told its unit.
    A Freeze of vm3 never reaches the leader's documents (vm0, pg0): admitted from its record (unit pg1),
    approved early by vm3, its record closed only once it is gone from pg1; then a Reboot of vm1 (pg0)."""
    units = {"vm0": "pg0", "vm1": "pg0", "vm2": "pg1", "vm3": "pg1"}
    told = {vm: {"imds": {"unit": unit, "delivery": "unit"}} for vm, unit in units.items()}
    cluster = make_cluster(vms=tuple(units), sim_args=["--units", "vm0,vm1/vm2,vm3"], per_vm_config=told)
    with Observer(cluster) as observer:
        freeze = sim(cluster).schedule("Freeze", ["vm3"], not_before_in=300)["event_id"]
        assert sim(cluster).document("vm0")["Events"] == []
        assert [e["EventId"] for e in sim(cluster).document("vm2")["Events"]] == [freeze]
        cluster.wait(lambda: gone(cluster, freeze), 40, "vm3's Freeze to be approved, start and end")
        assert [x["vm"] for x in approvals(cluster, freeze)] == ["vm3"]
        assert ("Scheduled", "Started", "approved") in transitions(cluster, freeze)
        reboot = sim(cluster).schedule("Reboot", ["vm1"], not_before_in=300)["event_id"]
        cluster.wait(lambda: gone(cluster, reboot), 60, "vm1's Reboot to be approved too: the budget was freed")
        assert [x["vm"] for x in approvals(cluster, reboot)] == ["vm1"]
        assert_no_approval_before_acks(cluster, observer)
        assert_recovered(cluster, observer, {"vm1", "vm3"})
