"""Observe-only mode: one wrapper per side-effect adapter, no ``if dry_run`` anywhere else.

A dry-run agent reads IMDS and ZooKeeper, decides exactly as a real one would from exactly what a real one
reads (membership as it is, the operator's pause, the ``/out`` marks, the windows), and logs what it would
do. It is invisible to the cluster: it does not join (so it is never anyone's approver, and a VM whose
agent only observes counts as running no agent, in its own decisions too), writes nothing to ZooKeeper
(not even the base layout) or to its state file, POSTs nothing, and its actions only log. It serves no
health probe (``coordinator.runtime.run_agent``): the load balancer keeps seeing what the VM's real agent
answers, or no answer where none runs. Observing never moves a VM in or out of rotation.

Since nothing is written, the decision plans the same writes again every cycle (the view never shows
them done). Each "would ..." line, and each "held: ..." line saying what keeps an event of this VM's
document from being approved now, is said once, when it becomes planned: again only if its words change,
or after a cycle that did not plan it (``Planned``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from coordinator.agent import Imds
from coordinator.decide import Plan
from coordinator.errors import DuplicateMember
from coordinator.models import Document
from coordinator.state import PersistedState, StateFile
from coordinator.store.base import (
    BY_HAND,
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    Part,
    Pause,
    Store,
    WriteResult,
)

__all__ = ["DryRunImds", "DryRunStateFile", "DryRunStore", "Planned"]

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


class DryRunStateFile(StateFile):
    """Reads the real state file; never writes or removes it."""

    def save(self, state: PersistedState) -> None:
        log.info("dry-run: would save the drain state %s%s", state.phase,
                 f" for {', '.join(sorted(state.draining_for))}" if state.draining_for else "")

    def discard(self) -> None:
        log.info("dry-run: would remove the state file")


class DryRunImds:
    def __init__(self, inner: Imds) -> None:
        self._inner = inner

    def get_document(self) -> Document:
        return self._inner.get_document()

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        log.info("dry-run: would POST StartRequests for %s", ",".join(event_ids))


class DryRunStore:
    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self._would_ack: dict[str, tuple[str, float]] = {}  # event id -> (vm, at): shown in read_view
        self.planned = Planned()

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
        # Always the whole view: one read per cycle (the planned writes are said per cycle), and what a
        # dry run costs one agent's reads does not matter.
        view = self._inner.read_view(vm)
        self.planned.next_cycle()  # one view per cycle, read before the cycle's writes are planned
        # The view as read (members, pause, /out marks...), with the acks it would have written, so that
        # what it says next follows from its own drain: nothing else is made up.
        records = dict(view.records)
        for key, (who, at) in self._would_ack.items():
            if key in records:
                records[key] = replace(records[key], acks={**records[key].acks, who: at})
        return replace(view, records=records)

    def narrate(self, plan: Plan, document: Document | None) -> None:
        """Say what holds each event of this VM's document from being approved now (the words the group's
        real agents show in their status), once per change."""
        if document is None:
            return
        for event in document.events:
            reasons = plan.reasons(event.event_id.upper())
            if reasons:
                self.planned.say(("held", event.event_id), f"event {event.event_id} held: {'; '.join(reasons)}")

    def publish_event(self, record: EventRecord) -> WriteResult:
        self.planned.say(("publish", record.event_id), f"would publish event {record.event_id}")
        return WriteResult.DONE

    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        self.planned.say(("ack", event_id), f"would acknowledge event {event_id} for {vm}")
        self._would_ack[event_id] = (vm, at)
        return WriteResult.DONE

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        self.planned.say(("ack", event_id), f"would withdraw the ack of {vm} for event {event_id}")
        self._would_ack.pop(event_id, None)
        return WriteResult.DONE

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
        admission: bool = False,
    ) -> ApprovalResult:
        self.planned.say(("approve", event_id),
                         f"would approve event {event_id} "
                         + (f"(required acks: {', '.join(sorted(required))})" if required else "(no ack required)"))
        return ApprovalResult(ApprovalOutcome.REFUSED, "dry-run")

    def vouch(self, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
        return WriteResult.DONE

    def approve_vouched(self, event_id: str, by: str, required: Collection[str], vouched: Collection[str], *,
                        reason: str, at: float) -> ApprovalResult:
        return ApprovalResult(ApprovalOutcome.REFUSED, "dry-run")

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        return WriteResult.DONE

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        return WriteResult.DONE

    def clear_absent(self, vm: str) -> WriteResult:
        return WriteResult.DONE

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        return WriteResult.DONE

    def reopen(self, event_id: str) -> WriteResult:
        return WriteResult.DONE

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        named = ["its drain by hand" if e == BY_HAND else e for e in events]
        why = (f"for {', '.join(named)}" if events else
               "while it starts (the budget counts it serving once its return wait ends)")
        self.planned.say(("rotation", vm), f"would mark {vm} out of rotation {why}")
        return WriteResult.DONE

    def clear_out(self, vm: str) -> WriteResult:
        self.planned.say(("rotation", vm), f"would mark {vm} back in rotation")
        return WriteResult.DONE

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        self.planned.say(("admit-drain", vm), f"would admit the drain by hand of {vm} into the maintenance budget")
        return WriteResult.DONE

    def forget_drain_admission(self, vm: str) -> WriteResult:
        return WriteResult.DONE

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        return 0

    def purge_done(self, older_than: float) -> int:
        return 0
