"""What this VM has drained, and why, kept on disk so that restarts and reboots never strand it.

The file is rewritten (atomically: temporary file, fsync, rename) whenever the drain phase or the set
of events the VM is drained for changes. At start:

* the events it was drained for stay drained while the document still names them, whatever the
  budget says now (``LocalState.draining_for``);
* if it was not serving, or the file is missing or unreadable, the first recovery runs every
  action's ``recover``; if it was serving, only the actions marked ``always_recover`` (the probe),
  so that recover hooks do not run on every restart.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

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

    def load(self) -> PersistedState | None:
        """The saved state, or None if there is none or it cannot be read (logged)."""
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
            log.error("state file %s unreadable (%s): assuming the VM may be drained", self.path, exc)
            return None

    def save(self, state: PersistedState) -> None:
        """Write atomically. Raises OSError; the caller logs and counts it and goes on."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"phase": state.phase, "draining_for": sorted(state.draining_for),
                           "updated_at": state.updated_at})
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
