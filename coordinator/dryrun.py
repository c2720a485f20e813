"""Observe-only mode: an executor that carries out nothing, and a store that is only read.

A dry-run agent (``Agent(dry_run=True)``, ``coordinator run --dry-run``) reads IMDS and ZooKeeper, decides
exactly as a real one would from exactly what a real one reads (membership as it is, the operator's pause,
the ``/out`` marks, the windows), and its executor (``DryRunExecutor``) is handed the same operations a real
agent's would carry out (``coordinator.operations``), in the same order: it says "would ..." for each one
that changes anything, and carries out only the reads (an early read of IMDS, the peers' probes). It cannot
drift from the agent: there is no other decision to drift from. It is invisible to the cluster: its store
(``DryRunStore``) does not join (so it is never anyone's approver, and a VM whose agent only observes counts
as running no agent, in its own decisions too) and refuses every write (not even the base layout is
created); nothing is written to the state file, nothing is POSTed, no drain or recover action runs. It serves
no health probe (``coordinator.runtime.run_agent``): the load balancer keeps seeing what the VM's real agent
answers, or no answer where none runs. Observing never moves a VM in or out of rotation.

What it says follows from its own (would-be) drain: the acks it would write are shown in the views it reads
next, a drain or recovery it would start counts as done at once, and a save it would make as made; nothing
else is made up. Since nothing is written, the decision plans the same writes again every cycle (the view
never shows them done). Each "would ..." line, and each "held: ..." line saying what keeps an event of this
VM's document from being approved now, is said once, when it becomes planned: again only if its words
change, or after a cycle that did not plan it (``Planned``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import NoReturn

from coordinator.errors import DuplicateMember, StoreError
from coordinator.execute import LiveExecutor
from coordinator.operations import (
    DONE,
    Acknowledge,
    Admit,
    AdmitDrain,
    Approve,
    Archive,
    ClearAbsent,
    ClearOut,
    Done,
    ForgetAdmission,
    MarkAbsent,
    MarkDone,
    MarkOtherOut,
    MarkOut,
    Operation,
    PublishEvent,
    Purge,
    Reopen,
    SaveState,
    StartDrain,
    StartRecover,
    WithdrawAck,
)
from coordinator.snapshot import Plan, Snapshot
from coordinator.store.base import (
    BY_HAND,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    Part,
    Pause,
    Store,
    WriteResult,
)

__all__ = ["DryRunExecutor", "DryRunStore", "Planned"]

log = logging.getLogger(__name__)


class Planned:
    """What a dry run would do, said once per planned action rather than every cycle.

    ``say(key, message)`` logs ``message`` unless the previous cycle said the same for ``key``;
    ``next_cycle()`` starts a cycle. An action planned cycle after cycle is said once; one that changes
    (its events, its required acks) or comes back after a cycle without it is said again."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, str], str] = {}
        self._current: dict[tuple[str, str], str] = {}

    def next_cycle(self) -> None:
        self._previous, self._current = self._current, {}

    def say(self, key: tuple[str, str], message: str) -> None:
        if self._previous.get(key) != message and self._current.get(key) != message:
            log.info("dry-run: %s", message)
        self._current[key] = message


class DryRunExecutor:
    """Carries out nothing that changes anything: says what it would do, from the operations a real agent
    would carry out. Reads (an early read of IMDS, the peers' probes) go to ``inner``, the live executor,
    which is handed nothing else."""

    def __init__(self, inner: LiveExecutor, store: DryRunStore) -> None:
        self._inner = inner
        self._store = store
        self.vm = inner.vm
        self.planned_said = Planned()

    def planned(self, plan: Plan, snap: Snapshot) -> None:
        """Start a cycle of sayings, and say what holds each event of this VM's fresh document from being
        approved now (the words the group's real agents show in their status), once per change."""
        self.planned_said.next_cycle()
        if snap.document is None:
            return
        for event in snap.document.events:
            reasons = plan.reasons(event.event_id.upper())
            if reasons:
                self._say(("held", event.event_id), f"event {event.event_id} held: {'; '.join(reasons)}")

    def carry(self, op: Operation, snap: Snapshot) -> Done:
        if not op.changes:
            return self._inner.carry(op, snap)
        for key, message in self.words(op):
            self._say(key, message)
        if isinstance(op, Acknowledge):
            self._store.would_ack(op.key, self.vm, op.at)
        elif isinstance(op, WithdrawAck):
            self._store.would_withdraw(op.key)
        elif isinstance(op, StartDrain | StartRecover):
            return Done(finished_at=snap.mono)  # no action runs: the job is over as soon as it is said
        return DONE

    def words(self, op: Operation) -> list[tuple[tuple[str, str], str]]:
        """What the dry run says of ``op``, each line under the key it is said once for (an approval: one line
        an event)."""
        if isinstance(op, Approve):
            return [(("approve", intent.event_id), f"would approve event {intent.event_id} "
                     + (f"(required acks: {', '.join(sorted(intent.required))})" if intent.required
                        else "(no ack required)")) for intent in op.intents]
        line = self._line(op)
        return [] if line is None else [line]

    def _line(self, op: Operation) -> tuple[tuple[str, str], str] | None:
        vm = self.vm
        if isinstance(op, SaveState):
            held = f" for {', '.join(sorted(op.state.draining_for))}" if op.state.draining_for else ""
            return ("state", "save"), f"would save the drain state {op.state.phase}{held}"
        if isinstance(op, StartDrain):
            via = ", ".join(a.name for a in self._inner.actions) or "no action"
            events = ", ".join(e.event_id for e in op.events) or "no event"
            return ("job", "drain"), f"would drain {vm} via {via} for {events}"
        if isinstance(op, StartRecover):
            via = ", ".join(a.name for a in self._inner.recover_actions(op)) or "no action"
            return ("job", "recover"), f"would recover {vm} via {via}"
        if isinstance(op, MarkOut | MarkOtherOut):
            who = vm if isinstance(op, MarkOut) else op.vm
            named = ["its drain by hand" if e == BY_HAND else e for e in op.events]
            why = (f"for {', '.join(named)}" if op.events else
                   "while it starts (the budget counts it serving once its return wait ends)")
            return ("rotation", who), f"would mark {who} out of rotation {why}"
        if isinstance(op, ClearOut):
            return ("rotation", vm), f"would mark {vm} back in rotation"
        if isinstance(op, PublishEvent):
            return ("publish", op.record.event_id), f"would publish event {op.record.event_id}"
        if isinstance(op, Reopen):
            return ("reopen", op.key), f"would reopen the record of event {op.key} (back after it was done)"
        if isinstance(op, Admit):
            return ("admit", op.key), f"would admit event {op.key} into the maintenance budget"
        if isinstance(op, AdmitDrain):
            return ("admit-drain", op.vm), f"would admit the drain by hand of {op.vm} into the maintenance budget"
        if isinstance(op, ForgetAdmission):
            return ("admit-drain", op.vm), f"would forget the admission of {op.vm}'s drain by hand"
        if isinstance(op, Acknowledge):
            return ("ack", op.key), f"would acknowledge event {op.key} for {vm}"
        if isinstance(op, WithdrawAck):
            return ("ack", op.key), f"would withdraw the ack of {vm} for event {op.key}"
        if isinstance(op, MarkDone):
            return ("done", op.key), f"would mark the record of event {op.key} done"
        if isinstance(op, MarkAbsent):
            return ("absent", op.vm), f"would record {op.vm} as absent"
        if isinstance(op, ClearAbsent):
            return ("absent", op.vm), f"would clear {op.vm}'s absence"
        if isinstance(op, Archive):
            return ("archive", ""), f"would move {len(op.keys)} finished event record(s) to the history"
        if isinstance(op, Purge):
            return ("purge", ""), "would purge old finished event records"
        return None

    def _say(self, key: tuple[str, str], message: str) -> None:
        self.planned_said.say(key, message)


class DryRunStore:
    """The store as a dry run sees it: read as it is, with the acks the dry run would have written shown
    (``would_ack``); it never joins or campaigns, and refuses every write."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self._would_ack: dict[str, tuple[str, float]] = {}  # event key -> (vm, at): shown in read_view

    def executor(self, live: LiveExecutor) -> DryRunExecutor:
        """The dry run's executor over this store, reading through ``live`` (built on this store too)."""
        return DryRunExecutor(live, self)

    def would_ack(self, key: str, vm: str, at: float) -> None:
        self._would_ack[key] = (vm, at)

    def would_withdraw(self, key: str) -> None:
        self._would_ack.pop(key, None)

    def start(self) -> None:
        self._inner.start()

    def stop(self) -> None:
        self._inner.stop()

    @property
    def connection_state(self) -> ConnectionState:
        return self._inner.connection_state

    @property
    def duplicate(self) -> DuplicateMember | None:
        return None  # a dry run never joins: it watches beside the VM's real agent, if any

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._inner.set_wakeup(callback)

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        return WriteResult.EXISTS

    def campaign(self, vm: str) -> bool:
        return False

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        return self._inner.member_info(vms)

    def read_pause(self) -> Pause | None:
        return self._inner.read_pause()

    @property
    def granted_session_timeout(self) -> float | None:
        return self._inner.granted_session_timeout

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        # Always the whole view: what a dry run costs one agent's reads does not matter.
        view = self._inner.read_view(vm)
        # The view as read (members, pause, /out marks...), with the acks it would have written, so that
        # what it says next follows from its own drain: nothing else is made up.
        records = dict(view.records)
        for key, (who, at) in self._would_ack.items():
            if key in records:
                records[key] = replace(records[key], acks={**records[key].acks, who: at})
        return replace(view, records=records)

    # -- writes: refused (the dry run's executor carries none out; a caller that tries writes nothing) --

    def _refuse(self, what: str) -> NoReturn:
        raise StoreError(f"a dry run writes nothing to ZooKeeper (refused: {what})")

    def publish_event(self, record: EventRecord) -> WriteResult:
        self._refuse("publish_event")

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        self._refuse("acknowledge")

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        self._refuse("withdraw_ack")

    def approve(self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
                admission: bool = False) -> ApprovalResult:
        self._refuse("approve")

    def vouch(self, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
        self._refuse("vouch")

    def approve_vouched(self, event_id: str, by: str, required: Collection[str], vouched: Collection[str], *,
                        reason: str, at: float) -> ApprovalResult:
        self._refuse("approve_vouched")

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        self._refuse("admit")

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        self._refuse("mark_absent")

    def clear_absent(self, vm: str) -> WriteResult:
        self._refuse("clear_absent")

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        self._refuse("mark_done")

    def reopen(self, event_id: str) -> WriteResult:
        self._refuse("reopen")

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        self._refuse("mark_out")

    def clear_out(self, vm: str) -> WriteResult:
        self._refuse("clear_out")

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        self._refuse("admit_drain")

    def forget_drain_admission(self, vm: str) -> WriteResult:
        self._refuse("forget_drain_admission")

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        self._refuse("archive_done")

    def purge_done(self, older_than: float) -> int:
        self._refuse("purge_done")
