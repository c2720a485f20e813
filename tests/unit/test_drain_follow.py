"""``coordinator drain VM --wait`` / ``undrain VM --wait``: the states said on the way, and when following stops."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from coordinator.decide import Policy
from coordinator.groupstatus.follow import Outcome, drain_state, follow, undrain_state
from coordinator.groupstatus.model import AgentReport, DrainedByHand, GroupStatus, Member, OutOfRotation
from coordinator.groupstatus.read import GroupStatusError
from coordinator.store.base import BY_HAND

NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def status(*, drains: list[DrainedByHand] = (), phase: str | None = "serving", out: list[str] | None = None,
           member: bool = True) -> GroupStatus:
    agent = AgentReport(reachable=phase is not None, url="http://vm1/status", phase=phase)
    return GroupStatus(
        cluster="web", base_path="/azure-maintenance/web", zookeeper="zk:2181", read_at=NOW, read_only_server=False,
        policy="test", paused=None, leader=None,
        members=[Member(vm="vm1", leader=False, agent=agent)] if member else [], registered=["vm1"],
        out_of_rotation=[OutOfRotation(vm="vm1", since=NOW, events=out, member=member)] if out is not None else [],
        drained_by_hand=list(drains), absent=[], events=[], done=[], attention=[])


def drain(**fields: Any) -> DrainedByHand:
    return DrainedByHand(**{"vm": "vm1", "reason": "disk swap", "by": "ops", "at": NOW, "out": False, **fields})


def test_a_drain_is_followed_from_the_budget_to_drained() -> None:
    steps = [
        (status(drains=[drain(waiting="maintenance budget: 1 VM(s) in maintenance, at most 1")]), Outcome.WAIT,
         "waiting for the maintenance budget: maintenance budget: 1 VM(s) in maintenance, at most 1"),
        (status(drains=[drain()]), Outcome.WAIT, "waiting for the maintenance budget: the leader has not weighed "
                                                 "it yet"),
        (status(drains=[drain(admitted_at=NOW, admitted_by="vm0")]), Outcome.WAIT,
         "admitted by vm0; its agent takes it out of rotation"),
        (status(drains=[drain(admitted_at=NOW, admitted_by="vm0", out=True, phase="draining")]), Outcome.WAIT,
         "out of rotation, draining (draining)"),
        (status(drains=[drain(admitted_at=NOW, admitted_by="vm0", out=True, phase="drained")]), Outcome.DONE,
         "drained: out of rotation, its drain actions done"),
        (status(), Outcome.STOP, "not drained by hand any more (undone meanwhile)"),
    ]
    for read, outcome, words in steps:
        assert drain_state(read, "vm1") == (outcome, words)


def test_an_undrain_is_followed_until_the_vm_serves_without_its_mark() -> None:
    assert undrain_state(status(drains=[drain()]), "vm1") == (Outcome.STOP, "drained by hand again (asked again "
                                                                             "meanwhile)")
    assert undrain_state(status(member=False), "vm1") == (Outcome.STOP, "runs no agent: it serves again once its "
                                                                         "agent runs")
    assert undrain_state(status(phase="recovering", out=[BY_HAND]), "vm1") == (Outcome.WAIT, "coming back "
                                                                                             "(recovering)")
    assert undrain_state(status(phase="drained", out=[BY_HAND, "E-REBOOT"]), "vm1") == (
        Outcome.WAIT, "held by E-REBOOT (drained)")
    assert undrain_state(status(phase="serving", out=[BY_HAND]), "vm1") == (
        Outcome.WAIT, "serving again; its out-of-rotation mark is being cleared")
    assert undrain_state(status(), "vm1") == (Outcome.DONE, "back in rotation: serving")


class Reads:
    """A reader whose reads build the given statuses in turn (an error string: a failed read)."""

    def __init__(self, statuses: list[GroupStatus | str]) -> None:
        self.statuses = statuses

    def read(self) -> GroupStatus | str:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


def test_following_says_each_change_once_and_stops_at_the_deadline(monkeypatch: Any) -> None:
    queue: list[GroupStatus | str] = [status(drains=[drain()]), status(drains=[drain()]), "ZooKeeper went away",
                                      status(drains=[drain(admitted_at=NOW, admitted_by="vm0")])]
    reads = Reads(queue)

    def build(read: GroupStatus | str, policy: Policy, source: str) -> GroupStatus:
        if isinstance(read, str):
            raise GroupStatusError(read)
        return read

    monkeypatch.setattr("coordinator.groupstatus.follow.build_status", build)
    now = [0.0]
    said: list[str] = []
    outcome = follow(reads, Policy(), "vm1", drain_state, timeout=10, say=said.append,  # type: ignore[arg-type]
                     clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert outcome is Outcome.WAIT and now[0] >= 10
    assert said == ["vm1: waiting for the maintenance budget: the leader has not weighed it yet",
                    "vm1: cannot read the group: ZooKeeper went away",
                    "vm1: admitted by vm0; its agent takes it out of rotation"]
