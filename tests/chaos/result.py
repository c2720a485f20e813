"""What a chaos run hands back, and the agents' logs it reads for the oracle.

``RunResult`` is one run's outcome: its plan, the ensemble's tickTime and the session timeout it grants
the agents, whether they drained through the load balancer's admin state, the faults carried out (and
skipped) by kind, each link fault with its target, each ARM fault with its body, the delivery layout (its
units, the delivery, whether the agents were told their unit), the oracle's verdict (or
why the run could not be done), and its JSON form.
``read_agent_log`` reads an agent's log into the oracle's ``LogLine``s, with
``short_paths`` trimming the absolute paths that tracebacks name.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.chaos.planning import Step
from tests.oracle import LogLine, Verdict

__all__ = ["RunResult", "read_agent_log", "short_paths"]


@dataclass
class RunResult:
    seed: int
    steps: list[Step]
    origin: float
    wall_seconds: float
    verdict: Verdict | None
    error: str | None = None
    workdir: Path | None = None
    tick_time_ms: int | None = None
    session_granted_ms: int | None = None
    faults: dict[str, int] = field(default_factory=dict)
    faults_skipped: dict[str, int] = field(default_factory=dict)
    link_faults: list[dict[str, Any]] = field(default_factory=list)
    admin_state: bool = False  # the agents drained through the load balancer's admin state too
    arm_faults: list[dict[str, Any]] = field(default_factory=list)
    # The delivery layout (``planning.DeliveryLayout.to_json``): its name, units, delivery, whether the agents
    # were told their unit.
    layout: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.verdict is not None and self.verdict.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "wall_seconds": round(self.wall_seconds, 1),
            "tick_time_ms": self.tick_time_ms,
            "session_granted_ms": self.session_granted_ms,
            "plan": [{"at": round(s.at, 2), "step": s.describe()} for s in self.steps],
            "faults": dict(sorted(self.faults.items())),
            "faults_skipped": dict(sorted(self.faults_skipped.items())),
            "link_faults": self.link_faults,
            "admin_state": self.admin_state,
            "arm_faults": self.arm_faults,
            "layout": self.layout,
            "error": self.error,
            "verdict": self.verdict.to_json(self.origin) if self.verdict is not None else None,
        }


_FILE = re.compile(r'File "([^"]+)"')


def short_paths(text: str) -> str:
    """Tracebacks name files by absolute path: keep the part from the package on, or the file name."""

    def shorten(match: re.Match[str]) -> str:
        path = match.group(1)
        index = path.rfind("/coordinator/")
        return f'File "{path[index + 1:] if index >= 0 else path.rsplit("/", 1)[-1]}"'

    return _FILE.sub(shorten, text)


def read_agent_log(vm: str, path: Path) -> list[LogLine]:
    """The agent's JSON log lines with their time, and the other lines it wrote (to stderr: a traceback
    printed by a server thread, for instance), each with the time of the log line before it. Threads
    write such lines concurrently, so they are kept one by one, not reassembled."""
    if not path.exists():
        return []
    out: list[LogLine] = []
    last_t: float | None = None
    for raw in path.read_text(errors="replace").splitlines():
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError(raw)
        except ValueError:
            line = raw.strip()
            if line and set(line) != {"-"}:
                out.append(LogLine(last_t, vm, short_paths(line), stderr=True))
            continue
        with contextlib.suppress(ValueError):
            last_t = datetime.strptime(str(body.get("ts")), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        text = f"{body.get('level')} {body.get('logger')}: {body.get('message')}"
        if body.get("exc"):
            text += " | " + str(body["exc"]).replace("\n", " | ")
        out.append(LogLine(last_t, vm, short_paths(text)))
    return out
