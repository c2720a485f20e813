"""What holds an event's approval back, as a value: its kind, the VM it is about and its words.

The decision (``coordinator.decide``) gives each Scheduled event it does not approve a tuple of
``Blocker``. The kind is what programs read: the ``reason`` label of the metrics, what ``coordinator status``
works out (whether a blocker clears by itself, which one is about the leader's admission). The words are
for people (the cycle's log line, ``/status``, the status view) and are never parsed back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["AT_APPROVAL", "DECIDED", "NOT_ADMITTED_YET", "NO_APPROVER", "Blocker", "Hold", "waiting_for_ack"]


class Hold(enum.Enum):
    """The kind of a blocker. Its value is the ``reason`` label of ``coordinator_events_blocked`` and
    ``coordinator_event_blocked`` (docs/metrics.md, "Why approvals wait")."""

    NOT_ACKNOWLEDGED = "not_acknowledged"  # a VM it names has not acknowledged (not drained yet)
    NO_AGENT = "no_agent"  # a VM it names runs no agent
    NOT_ADMITTED = "not_admitted"  # the leader has not admitted it into the budget, which has room
    LEAD_TIME = "lead_time"  # not admitted before ``drain.lead_time_seconds`` ahead of its NotBefore
    BUDGET = "budget"  # the budget is full, or taking its VMs out would leave none serving
    PEER_NOT_SERVING = "peer_not_serving"  # it would leave none serving: peers not confirmed in rotation
    TERMINATE_BATCH = "terminate_batch"  # a Terminate waits for the others sharing its NotBefore
    STALE_DOCUMENT = "stale_document"  # it waits for a document read after it became approvable
    ABSENT_PAST_GRACE = "absent_past_grace"  # it goes ahead without VMs gone past the grace: not quite yet
    NO_APPROVER = "no_approver"  # no live agent it names, and no leader
    ZOOKEEPER = "zookeeper"  # the ZooKeeper connection is not CONNECTED
    NOT_PUBLISHED = "not_published"  # its record is not in ZooKeeper yet
    RECORD_DONE = "record_done"  # its record is marked done: it is reopened first
    PAUSED = "paused"  # an operator paused approvals
    OUTSIDE_WINDOW = "outside_window"  # outside the maintenance windows
    POLICY = "policy"  # the policy never approves it early (rule ``never``, an unknown type)
    INVALID_EVENT = "invalid_event"  # its Resources, NotBefore or EventId cannot be coordinated
    # Said only by ``coordinator status``, never by the decision:
    NOT_BEFORE = "not_before"  # held until its NotBefore, when it starts without an approval
    UNDECIDED = "undecided"  # the decision function failed: the reasons are read off the records


#: The kinds the decision gives, each a value of the metrics' ``reason`` label.
DECIDED: tuple[Hold, ...] = tuple(kind for kind in Hold if kind not in (Hold.NOT_BEFORE, Hold.UNDECIDED))

#: How the words of a blocker weighed again by the approver, right before it approves, begin.
AT_APPROVAL = "at approval: "


@dataclass(frozen=True)
class Blocker:
    """One reason an event is not approved now.

    ``words`` are what a person reads; ``vm`` is the VM the blocker is about (None: the event as a whole);
    ``at_approval``: the budget weighed again by the approver right before it approves, after the leader
    admitted the event; ``lasting``: it does not clear by itself (the budget could not admit the event
    even with nothing else in maintenance, a peer's probe does not answer).
    """

    kind: Hold
    words: str
    vm: str | None = None
    at_approval: bool = False
    lasting: bool = False

    def __str__(self) -> str:
        return AT_APPROVAL + self.words if self.at_approval else self.words

    @property
    def about_admission(self) -> bool:
        """Whether it says why the leader has not admitted the event (the budget, no leader, a lead time)."""
        return (self.kind in (Hold.NOT_ADMITTED, Hold.LEAD_TIME, Hold.BUDGET, Hold.PEER_NOT_SERVING)
                and not self.at_approval)

    def weighed_at_approval(self) -> Blocker:
        """The same blocker, as the approver's last look at the budget before it approves."""
        return replace(self, at_approval=True)

    def as_json(self) -> dict[str, Any]:
        """The blocker as ``/status`` gives it (``words`` as people read it, the ``at approval:`` included)."""
        return {"kind": self.kind.value, "vm": self.vm, "words": str(self), "at_approval": self.at_approval,
                "lasting": self.lasting}

    @classmethod
    def from_json(cls, value: object) -> Blocker | None:
        """A blocker from another agent's ``/status`` (None: not one this version reads)."""
        if not isinstance(value, Mapping):
            return None
        try:
            kind = Hold(value.get("kind"))
        except ValueError:
            return None
        words, vm = value.get("words"), value.get("vm")
        if not isinstance(words, str) or not (vm is None or isinstance(vm, str)):
            return None
        at_approval = value.get("at_approval") is True
        return cls(kind, words.removeprefix(AT_APPROVAL) if at_approval else words, vm, at_approval,
                   value.get("lasting") is True)


#: An event none of whose VMs runs a live agent, in a group without a leader: nobody approves it.
NO_APPROVER = Blocker(Hold.NO_APPROVER, "no live agent named in Resources and no leader")
#: The leader has not admitted the event into the budget yet (the deciding agent may say why in its place).
NOT_ADMITTED_YET = Blocker(Hold.NOT_ADMITTED, "not admitted yet")


def waiting_for_ack(vm: str, runs_agent: bool) -> Blocker:
    """A VM the event names and waits for, without its ack: not drained yet, or never to drain (no agent)."""
    if runs_agent:
        return Blocker(Hold.NOT_ACKNOWLEDGED, f"{vm} has not acknowledged", vm)
    return Blocker(Hold.NO_AGENT, f"{vm} runs no agent", vm)
