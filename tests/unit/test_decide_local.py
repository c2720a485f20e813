"""The plan's part about the VM itself, as tables: which recover actions run, what the state file is told,
whether the peers are probed, whether IMDS is read at once for a peer's record, when the leader purges."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.decide import LocalState, PeerSeen, Phase, Plan, decide
from coordinator.decide.local import PURGE_EVERY
from coordinator.state import PersistedState
from tests.unit.test_decide import ALL3, DRAINED, EID, NOW, POLICY, SERVING, doc, event, record, snap, view

RESTARTED = LocalState(phase=Phase.UNKNOWN, phase_since=0.0)


def _plan(local: LocalState, *, me: str = "vm0", events: tuple[dict[str, object], ...] = (),
          records: tuple[object, ...] = (), leader: str = "vm2", fresh: bool = True, mono: float = 100.0,
          peers: dict[str, PeerSeen] | None = None) -> Plan:
    document = doc(*events)
    cluster = view(ALL3, tuple(records), leader=leader, me=me)  # type: ignore[arg-type]
    observed = replace(snap(me, document if fresh else None, cluster, last=document, mono=mono), peers=peers)
    return decide(observed, local, POLICY)


@pytest.mark.parametrize(("local", "recover_all"), [
    (RESTARTED, True),  # the state file is missing, unreadable or said "not serving": every recover runs
    (replace(RESTARTED, recover_all_at_start=False), False),  # restarted while serving: only the probe's
    (replace(DRAINED, recover_all_at_start=False), True),  # drained by this process: a full recovery
])
def test_a_recovery_runs_every_action_unless_a_restart_found_the_vm_serving(local: LocalState,
                                                                           recover_all: bool) -> None:
    plan = _plan(local)
    assert plan.start_recover and plan.recover_all is recover_all


def test_a_drain_is_on_disk_before_its_job_and_the_cycle_saves_nothing_more() -> None:
    plan = _plan(SERVING, events=(event(["vm0"], status="Started"),))
    assert plan.start_drain
    assert plan.save_first == PersistedState("draining", frozenset({EID}), NOW)
    assert plan.save is None  # what the write-ahead said is what the cycle leaves
    assert plan.local.phase is Phase.DRAINING and plan.local.draining_for == {EID}


def test_a_recovery_whose_actions_ran_is_saved_as_serving_once() -> None:
    done = LocalState(phase=Phase.RECOVERING, phase_since=0.0, job_running=False, job_done_at=99.0,
                      saved=PersistedState("draining", frozenset({EID}), NOW - 60))
    plan = _plan(done)
    assert plan.save == PersistedState("serving", frozenset(), NOW)  # no full recovery again after a restart
    assert _plan(replace(done, saved=plan.save)).save is None  # said once


def test_nothing_is_saved_before_the_vm_knows_its_state() -> None:
    plan = _plan(RESTARTED, events=(event(["vm1"]),), fresh=False)
    assert plan.local.phase is Phase.UNKNOWN and plan.save is None and plan.save_first is None


def test_the_approver_probes_its_peers_and_keeps_doing_so_without_a_fresh_document() -> None:
    acks = record(("vm0", "vm1"))
    approving = _plan(SERVING, events=(event(["vm0", "vm1"]),), records=(acks,), peers={})
    assert approving.probe_peers is True and approving.local.approving
    # No fresh document: the plan names no approver; the last fresh one still stands.
    stale = _plan(approving.local, events=(event(["vm0", "vm1"]),), records=(acks,), fresh=False, peers={})
    assert stale.probe_peers is True
    # vm1 is named after vm0: it does not approve, and does not probe.
    assert _plan(SERVING, me="vm1", events=(event(["vm0", "vm1"]),), records=(acks,), peers={}).probe_peers is False
    # A group whose agents probe no peers (``confirm_peers_by_probe`` off) has nothing to start or stop.
    assert _plan(SERVING, events=(event(["vm0", "vm1"]),), records=(acks,)).probe_peers is None


def test_the_leader_probes_only_while_something_waits() -> None:
    assert _plan(SERVING, me="vm2", peers={}).probe_peers is False  # an idle group probes nothing
    assert _plan(SERVING, me="vm2", records=(record(("vm0",)),), peers={}).probe_peers is True
    # Without a view there is nobody to probe for: the probes stay as they were.
    plan = decide(replace(snap("vm2", doc(), None), peers={}), SERVING, POLICY)
    assert plan.probe_peers is None


def test_a_record_a_peer_published_first_reads_imds_now_once() -> None:
    published = record(("vm0",))  # this VM's documents do not show it yet
    first = _plan(SERVING, records=(published,))
    assert first.read_now and first.local.asked == {EID}
    again = _plan(first.local, records=(published,))
    assert not again.read_now and again.local.asked == {EID}
    # Shown, or gone from the view: nothing to ask; the record leaves the set once the view no longer holds it.
    assert not _plan(SERVING, events=(event(["vm0"]),), records=(published,)).read_now
    assert _plan(first.local).local.asked == frozenset()


def test_the_leader_purges_old_records_at_most_once_per_period() -> None:
    old = record(("vm0",), done_at=NOW - POLICY.done_retention - 1)
    first = _plan(SERVING, me="vm2", records=(old,), mono=1000.0)
    assert first.purge_before == NOW - POLICY.done_retention and first.local.last_purge == 1000.0
    soon = _plan(first.local, me="vm2", records=(old,), mono=1000.0 + PURGE_EVERY - 1)
    assert soon.purge_before is None and soon.local.last_purge == 1000.0
    later = _plan(first.local, me="vm2", records=(old,), mono=1000.0 + PURGE_EVERY)
    assert later.purge_before is not None
