"""What a cycle's plan asks the shell to carry out: small typed values, in the order the decision gives them.

``coordinator.decide`` makes the plan and puts its operations in order (``decide.order.in_order``): the order
is part of the decision, since safety rests on it (this VM's ``/out`` mark before its ack, the mark cleared
last, the state file written before the drain job starts). An executor carries them out one at a time
(``coordinator.execute``: the live one; ``coordinator.dryrun``: one that carries out nothing and says what it
would do) and answers each with a ``Done``, which the loop folds into its local state
(``decide.local.reported``).

Two class attributes say what an operation is: ``in_store`` (a write to the coordination store, or the
approval that rests on the store's last check: once one fails, the rest of the cycle's store operations are
not sent, and the next cycle decides again from what the store then shows) and ``changes`` (it changes
something outside this process: a dry run says it would do it, and does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from coordinator.models import ScheduledEvent
from coordinator.state import PersistedState
from coordinator.store.base import EventRecord

__all__ = [
    "DONE", "FAILED", "Acknowledge", "Admit", "AdmitDrain", "ApprovalIntent", "Approve", "Archive", "ClearAbsent",
    "ClearOut", "ConfirmPeers", "Done", "ForgetAdmission", "MarkAbsent", "MarkDone", "MarkOtherOut", "MarkOut",
    "Operation", "ProbePeers", "PublishEvent", "Purge", "ReadImdsNow", "Reopen", "SaveState", "StartDrain",
    "StartRecover", "WithdrawAck",
]


@dataclass(frozen=True)
class ApprovalIntent:
    """An event the plan approves, with what the store's last check must find (``Store.approve``)."""

    event_id: str  # exactly as IMDS spelled it: it goes back in the POST
    key: str  # normalized id: the store key
    required: tuple[str, ...]  # VMs whose acks the store must see right before the POST
    as_leader: bool  # approving as the leader (it must still hold the lock)
    admission: bool = False  # the store must also see the event's admission right before the POST


@dataclass(frozen=True)
class Done:
    """How an operation went. ``ok``: carried out (a write the store found already done counts as carried
    out). ``posted``: the keys of the events whose approval POST IMDS accepted (``Approve``)."""

    ok: bool = True
    posted: frozenset[str] = frozenset()
    # A job carried out at once (a dry run's, which runs no action): when it finished, on the monotonic clock.
    # None for a job left running on the job thread, whose end the next cycles read from it.
    finished_at: float | None = None


DONE = Done()
FAILED = Done(ok=False)


@dataclass(frozen=True)
class _Operation:
    in_store: ClassVar[bool] = False
    changes: ClassVar[bool] = True


# -- this VM --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadImdsNow(_Operation):
    """Ask the poller for an early read: an approval waits for a document read after it became approvable,
    or a peer published an event this VM's documents do not show yet."""

    changes: ClassVar[bool] = False


@dataclass(frozen=True)
class SaveState(_Operation):
    """Write the drain state to the state file. ``ahead``: the write-ahead before a drain job starts, so that
    a crash in between never leaves "serving" behind for a VM that began to drain."""

    state: PersistedState
    ahead: bool = False


@dataclass(frozen=True)
class StartDrain(_Operation):
    """Start the drain job (every action's drain, in order) for the events that hold this VM."""

    events: tuple[ScheduledEvent, ...]


@dataclass(frozen=True)
class StartRecover(_Operation):
    """Start the recovery job: every action's recover (``every_action``), or only those that always
    recover (a VM that was serving when its agent stopped)."""

    every_action: bool


@dataclass(frozen=True)
class ConfirmPeers(_Operation):
    """Run the next cycle at once: an approval waits for the peers' probes to be asked again, which that
    cycle does before it decides (``decide.approval.confirmed_peers``)."""

    changes: ClassVar[bool] = False


@dataclass(frozen=True)
class ProbePeers(_Operation):
    """Probe the other live members' health probes in the background while ``wanted`` (an approver; the
    leader while anything waits), or stop."""

    changes: ClassVar[bool] = False
    members: frozenset[str]
    wanted: bool


# -- the coordination store, in the order they are sent -------------------------------------------------


@dataclass(frozen=True)
class _Write(_Operation):
    in_store: ClassVar[bool] = True


@dataclass(frozen=True)
class MarkOut(_Write):
    """Write ``/out/{me}``: this VM out of rotation for ``events`` (none: starting up)."""

    events: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class PublishEvent(_Write):
    record: EventRecord


@dataclass(frozen=True)
class Reopen(_Write):
    """An event back after its record was marked done (a reused EventId): open the record again."""

    key: str


@dataclass(frozen=True)
class Admit(_Write):
    """The leader admits the event into the maintenance budget."""

    key: str
    at: float


@dataclass(frozen=True)
class AdmitDrain(_Write):
    """The leader admits ``vm``'s drain by hand (its ``HandDrain.asked``) into the budget."""

    vm: str
    asked: int
    at: float


@dataclass(frozen=True)
class ForgetAdmission(_Write):
    """The leader forgets the admission of ``vm``'s drain by hand, undone since."""

    vm: str


@dataclass(frozen=True)
class Acknowledge(_Write):
    """This VM is drained for the event. ``drain_started`` and ``drained_for``: when its drain began, and for
    how long it had been drained (the drain latency metric)."""

    key: str
    at: float
    drain_started: float = 0.0
    drained_for: float = 0.0


@dataclass(frozen=True)
class WithdrawAck(_Write):
    """An ack stands for a drain that holds now: withdraw this VM's ack of an event that no longer holds it."""

    key: str


@dataclass(frozen=True)
class MarkDone(_Write):
    """The event is gone: close its record. ``started_at``: when this agent first saw it Started, for the
    group's history (None: never seen Started by this process)."""

    key: str
    at: float
    started_at: float | None = None


@dataclass(frozen=True)
class MarkAbsent(_Write):
    vm: str
    at: float


@dataclass(frozen=True)
class ClearAbsent(_Write):
    vm: str


@dataclass(frozen=True)
class MarkOtherOut(_Write):
    """Write ``/out/{vm}`` for another VM an approval goes ahead without (absent past the grace), before it
    does: its agent cannot say so (docs/safety.md S4)."""

    vm: str
    events: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class ClearOut(_Write):
    """Delete ``/out/{me}``: back in the load balancer's rotation, as the budget counts it."""


@dataclass(frozen=True)
class Archive(_Write):
    """The leader moves these done records into the history, and deletes the history's records done before
    ``history_from``."""

    keys: tuple[str, ...]
    history_from: float


@dataclass(frozen=True)
class Purge(_Write):
    """The leader deletes the records done before ``before``."""

    before: float


@dataclass(frozen=True)
class Approve(_Write):
    """Confirm each intent in the store (its last check, on this agent's session) and POST, in one
    ``StartRequests``, those it confirmed, fenced before every attempt. ``peers_confirmed_at``: when this
    cycle asked the peers' probes again before approving (None: it did not)."""

    intents: tuple[ApprovalIntent, ...]
    at: float
    peers_confirmed_at: float | None = field(default=None, compare=False)


Operation = (ReadImdsNow | SaveState | StartDrain | StartRecover | ConfirmPeers | ProbePeers | MarkOut
             | PublishEvent | Reopen | Admit | AdmitDrain | ForgetAdmission | Acknowledge | WithdrawAck | MarkDone
             | MarkAbsent | ClearAbsent | MarkOtherOut | ClearOut | Archive | Purge | Approve)
