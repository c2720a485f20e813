"""Finished records leave ``/events`` (``decide.records.to_archive``, ``Store.archive_done``): the leader moves
a done record to the history once nothing holds it, so that the VMs an event names, who read every record
in ``/events``, read the open ones and those just done, not every record of the retention."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide
from coordinator.store.base import ClusterView, OutMark, Part, WriteResult, lead_view, named_view
from tests.fakezk_group import FakeGroup
from tests.unit.test_policy import NOW, A, B, doc, rec, view

SERVING = LocalState(phase=Phase.SERVING)
POLICY = Policy()


def archive(cluster: ClusterView | None, me: str = "vm3", *, absent_for: dict[str, float] | None = None,
            policy: Policy = POLICY) -> tuple[str, ...]:
    snap = Snapshot(me=me, now=NOW, mono=1000.0, document=doc(), last_document=doc(), cluster=cluster,
                    absent_for=absent_for or {})
    return decide(snap, SERVING, policy).archive


DONE = NOW - POLICY.archive_after  # done just long enough ago


@pytest.mark.parametrize(("case", "cluster", "absent_for", "moved"), [
    ("done long enough ago, nothing holds it", view(rec(A, ("vm0", "vm1"), done_at=DONE)), {}, (A,)),
    ("on the leader's part of the view (no other VM's ack)",
     lead_view(view(rec(A, ("vm0",), done_at=DONE)), "vm3"), {}, (A,)),
    ("done a moment ago", view(rec(A, ("vm0",), done_at=NOW - 2)), {}, ()),
    ("open", view(rec(A, ("vm0",))), {}, ()),
    ("a member still out of rotation for it",
     replace(view(rec(A, ("vm0",), done_at=DONE)), out={"vm0": OutMark(NOW - 60, (A,))}), {}, ()),
    ("a member out for another event",
     replace(view(rec(A, ("vm0",), done_at=DONE)), out={"vm0": OutMark(NOW - 60, (B,))}), {}, (A,)),
    ("a member still acknowledging it", view(rec(A, ("vm0",), ("vm0",), done_at=DONE)), {}, ()),
    # vm9 runs no agent: out for the event (its Terminate deleted it, or its agent crashed out of rotation),
    # it is counted until its agent has been gone for the grace; the record waits as long.
    ("a VM without an agent out for it, gone a while",
     replace(view(rec(A, ("vm0", "vm9"), done_at=DONE)), out={"vm9": OutMark(NOW - 60, (A,))}),
     {"vm9": 60.0}, ()),
    ("a VM without an agent out for it, gone past the grace",
     replace(view(rec(A, ("vm0", "vm9"), done_at=DONE)), out={"vm9": OutMark(NOW - 900, (A,))}),
     {"vm9": 601.0}, (A,)),
    # None of the VMs it names runs an agent: the VM that published it sees the event in its unit's documents,
    # and a finished event may stay there a while; moved, it would be published again.
    ("no VM it names runs an agent, done a moment ago", view(rec(A, ("vm9",), done_at=DONE)), {}, ()),
    ("no VM it names runs an agent, done past the grace",
     view(rec(A, ("vm9",), done_at=NOW - POLICY.recovery_grace)), {}, (A,)),
])
def test_which_records_the_leader_moves_to_the_history(case: str, cluster: ClusterView,
                                                       absent_for: dict[str, float], moved: tuple[str, ...]) -> None:
    assert archive(cluster, absent_for=absent_for) == moved, case


def test_only_the_leader_moves_records_and_only_on_every_out_mark() -> None:
    done = view(rec(A, ("vm0",), done_at=DONE), me="vm1")
    assert archive(done, me="vm1") == ()
    assert archive(named_view(view(rec(A, ("vm3",), done_at=DONE)), "vm3")) == ()
    assert archive(None) == ()
    assert lead_view(view(), "vm3").part is Part.LEAD


def test_the_store_moves_a_record_and_forgets_it_past_the_retention() -> None:
    cluster = FakeGroup(lambda: NOW)
    store = cluster.store(lambda: NOW)
    store.start()
    store.join("vm0", {})
    assert store.publish_event(rec(A, ("vm0",))) is WriteResult.DONE
    assert store.archive_done([A], older_than=NOW - 100) == 0  # open: it stays
    assert store.mark_done(A, NOW - 50) is WriteResult.DONE
    assert store.archive_done([A.lower()], older_than=NOW - 100) == 1
    assert A not in store.read_view("vm0").records and cluster.history[A].done_at == NOW - 50
    # The history is listed for the entries past the retention at most every LIST_EVERY seconds: by this
    # store not again so soon, by the next leader's store at its first move.
    assert store.archive_done([], older_than=NOW - 10) == 0 and A in cluster.history
    next_leader = cluster.store(lambda: NOW)
    next_leader.start()
    assert next_leader.archive_done([], older_than=NOW - 10) == 0 and A not in cluster.history
