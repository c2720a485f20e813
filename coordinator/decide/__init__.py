"""The decision function: what should be true, given what this cycle observed.

``decide(snapshot, local, policy) -> Plan`` is pure: no I/O, no clock reads, no randomness. The agent
loop builds the snapshot, calls it, and carries out the plan. Because every cycle recomputes the plan
from the current document and the current cluster view (level-triggered), a restart, a missed watch,
a duplicate document or a new leader need no special code. ``docs/safety.md`` lists the invariants
these rules keep, and the tests that try to break them.

The safety rules live here and nowhere else:

* An event is approved only by its approver, only while Scheduled in a document read *this* cycle,
  only when it is of a known type, names at least one VM, its rule allows it, the disruption budget
  admitted it, every VM it names has acknowledged (unless its rule is ``immediately``), and only while
  the ZooKeeper connection is CONNECTED. The store re-checks the acks, the admission and this agent's
  ownership of its member or leader node with a synced read right before the POST (``Store.approve``),
  and the POST is fenced by the time since that check (``Agent``).
* An acknowledgement means "drained for this event *now*": acks are ephemeral nodes of the VM's
  session, and a VM withdraws its ack of an event it no longer drains for, and leaves the drained
  state only once ZooKeeper shows no ack of it (or every session that could hold one has lapsed).
* A VM drains for an event that names it when the event is Started (it is being hit), when the
  budget admitted it, or at the latest ``latest_start`` before NotBefore, whatever the budget and
  ZooKeeper say. An event that can never be approved early drains just in time. Once draining for an
  event it stays drained until that event is *gone*: missing (or no longer naming the VM) from at
  least two fresh documents over ``gone_after`` seconds; a failed read changes nothing. A fresh
  process starts in ``UNKNOWN`` and fails the health probe until such a document clears it.
* A VM out of rotation says so in ``/out/{vm}`` until its load balancer routes to it again
  (``return_wait`` after its recovery finished); the budget counts every such VM.

Where each rule lives: ``decision.py`` holds ``decide`` itself, one short function that reads top to bottom,
and which part of the group's view it needs (``view_needed``); ``events.py`` what an event is (parsed, its record, its
approver, whose ack it waits for, whether it could be approved early); ``drain.py`` drain and recovery
(what holds this VM, its state machine, its acks, when it may serve, its ``/out`` mark); ``budget.py`` the
disruption budget (who is out of rotation, what is in flight, the leader's admissions); ``approval.py``
approval (why not now, the approval intents, the last holds before a POST); ``records.py`` the leader's
upkeep of records and absences; ``local.py`` this VM's own state once the plan is carried out, and how each
operation's result is folded into it (``reported``); ``order.py`` the plan's operations in the order the shell
carries them out (``Plan.operations``, typed in ``coordinator.operations``).
"""

from __future__ import annotations

from coordinator.decide.decision import decide, view_needed
from coordinator.decide.events import choose_approver
from coordinator.decide.local import reported
from coordinator.decide.order import in_order
from coordinator.snapshot import (
    ApprovalIntent,
    LocalState,
    PeerSeen,
    Phase,
    Plan,
    Policy,
    Sighting,
    Snapshot,
    approval_fence,
    is_gone,
    rule_for,
    session_lapses_after,
)

__all__ = [
    "ApprovalIntent",
    "LocalState",
    "PeerSeen",
    "Phase",
    "Plan",
    "Policy",
    "Sighting",
    "Snapshot",
    "approval_fence",
    "choose_approver",
    "decide",
    "in_order",
    "is_gone",
    "reported",
    "rule_for",
    "session_lapses_after",
    "view_needed",
]
