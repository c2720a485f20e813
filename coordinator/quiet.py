"""Quiet cycles: a quiet group costs one cycle per idle cycle, not one per reading.

A cycle is quiet when it acted on nothing and found nothing to watch: no event in its document, no open
record, the VM serving with no job and nothing held, CONNECTED. A new reading that repeats the quiet
document (no events, the same incarnation) may then skip its cycle, unless something else woke the loop
(a watch, a job, a peer) or the last full cycle is ``idle_cycle`` old. A document with an event, an error,
a new incarnation or any other change runs the cycle at once. Skipping is about cost only: a skipped
reading is one that the next full cycle would have decided nothing on.
"""

from __future__ import annotations

from coordinator.poller import Reading
from coordinator.snapshot import LocalState, Phase, Plan, Snapshot
from coordinator.store.base import ConnectionState

__all__ = ["QuietCycles"]


class QuietCycles:
    def __init__(self, idle_cycle: float) -> None:
        self._idle_cycle = idle_cycle
        self.since: float | None = None  # when the last cycle found nothing at all to watch
        self._incarnation: int | None = None

    def skips(self, reading: Reading, last_seq: int, now: float) -> bool:
        """Whether a wake-up by ``reading`` alone (nothing else woke the loop) may skip its cycle."""
        if self.since is None or now - self.since >= self._idle_cycle:
            return False
        document = reading.document
        return (reading.seq != last_seq and document is not None and not document.events
                and document.document_incarnation == self._incarnation)

    def note(self, snap: Snapshot, local: LocalState, plan: Plan, *, holding_named: bool) -> None:
        """After a full cycle: whether it was quiet."""
        cluster, document = snap.cluster, snap.document
        quiet = (
            not plan.acts and not plan.blocked and not plan.waiting
            and document is not None and not document.events
            and cluster is not None and cluster.connection is ConnectionState.CONNECTED
            and all(record.done_at is not None for record in cluster.records.values())
            and local.phase is Phase.SERVING and not local.job_running and not local.draining_for
            and not holding_named
        )
        self.since = snap.mono if quiet else None
        self._incarnation = document.document_incarnation if quiet and document is not None else None
