"""What this VM has drained, and why, kept on disk so that restarts and reboots never strand it.

The file is rewritten (atomically: temporary file, fsync, rename) whenever the drain phase or the set
of events the VM is drained for changes. At start:

* the events it was drained for stay drained until they are gone from fresh documents, whatever the
  budget, ZooKeeper or the first (possibly failing) IMDS reads say (``LocalState.draining_for``);
* an unreadable file means "maybe drained for anything": every event naming the VM in the first
  fresh document holds it;
* if it was not serving, or the file is missing or unreadable, the first recovery runs every
  action's ``recover``; if it was serving, only the actions marked ``always_recover`` (the probe),
  so that recover hooks do not run on every restart.

The state is written *before* a drain starts (write-ahead): a crash between the two never leaves
``serving`` on disk for a VM that began draining. A failed save removes the file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from coordinator.support.files import atomic_write

__all__ = ["PersistedState", "StateFile"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PersistedState:
    phase: str
    draining_for: frozenset[str]
    updated_at: float

    @property
    def was_serving(self) -> bool:
        return self.phase == "serving" and not self.draining_for


class StateFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.unreadable = False  # set by ``load``: a file exists but cannot be trusted

    def load(self) -> PersistedState | None:
        """The saved state, or None if there is none or it cannot be read (logged, and ``unreadable``
        set: the caller must then assume the VM may be drained for anything)."""
        self.unreadable = False
        if self.path is None or not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return PersistedState(
                phase=str(data["phase"]),
                draining_for=frozenset(str(e) for e in data.get("draining_for", [])),
                updated_at=float(data.get("updated_at", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.unreadable = True
            log.error("state file %s unreadable (%s): assuming the VM may be drained", self.path, exc)
            return None

    def save(self, state: PersistedState) -> None:
        """Write atomically. Raises OSError; the caller logs and counts it and goes on."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"phase": state.phase, "draining_for": sorted(state.draining_for),
                           "updated_at": state.updated_at})
        atomic_write(self.path, body)

    def discard(self) -> None:
        """Remove the file after a failed save, so that a restart assumes the worst (a full recovery)
        rather than trust a state older than the drain. Raises OSError."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
