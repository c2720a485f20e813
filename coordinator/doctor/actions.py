"""The ``actions`` check of ``coordinator doctor``: each configured drain action tried without changing
anything, so that a drain does not first fail in the middle of a maintenance.

* ``haproxy``: its runtime API answers ``show servers state`` for the backend and lists the server (a read:
  the server's state is not touched);
* ``command``: each argv's program exists and is executable by this user (nothing is run);
* ``webhook``: its host resolves and accepts a TCP connection on its port (no request is sent: a request
  would be a drain notice);
* ``connections`` and ``azure-lb``: nothing here (the ``azure-lb`` check reads the pools and rights).

``observe`` does the I/O; ``actions_verdict`` is pure.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from coordinator.config import CommandActionConfig, HAProxyActionConfig, Settings, WebhookActionConfig
from coordinator.doctor.context import Context
from coordinator.doctor.outcome import Status, Verdict
from coordinator.errors import ActionError

__all__ = ["ActionSeen", "actions_verdict", "check_actions", "observe"]


@dataclass(frozen=True)
class ActionSeen:
    """What trying one action showed: ``problem`` is empty when it is usable."""

    action: str  # as the logs name it: "haproxy web/vm0", "command lb-off", "webhook pager"
    problem: str = ""
    seen: str = ""  # what was found, for the PASS line (the server's state, the program's path)


def _haproxy(item: HAProxyActionConfig, timeout: float) -> ActionSeen:
    from coordinator.actions.haproxy import HAProxyRuntime

    name = f"haproxy {item.backend}/{item.server}"
    try:
        state = HAProxyRuntime(item.runtime, timeout=min(item.timeout_seconds, timeout)).server_state(
            item.backend, item.server)
    except (ActionError, OSError) as exc:
        return ActionSeen(name, f"{exc} (runtime {item.runtime})")
    return ActionSeen(name, seen=f"{state.admin}, {state.operational}")


def _program(argv: Sequence[str]) -> tuple[str, str]:
    """(the program's path, "") or ("", why it cannot be run)."""
    program = argv[0]
    path = program if os.sep in program else shutil.which(program)
    if path is None:
        return "", f"{program!r} is not on PATH ({os.environ.get('PATH', '')})"
    if not os.path.isfile(path):
        return "", f"{path} does not exist or is not a file"
    if not os.access(path, os.X_OK):
        return "", f"{path} is not executable by this user"
    return path, ""


def _command(item: CommandActionConfig) -> ActionSeen:
    name = f"command {item.name}"
    found: list[str] = []
    for phase, argv in (("drain", item.drain), ("recover", item.recover)):
        if not argv:
            continue
        path, problem = _program(argv)
        if problem:
            return ActionSeen(name, f"its {phase} argv cannot run: {problem}")
        found.append(f"{phase} {path}")
    return ActionSeen(name, seen=", ".join(found))


def _webhook(item: WebhookActionConfig, timeout: float) -> ActionSeen:
    name = f"webhook {item.name}"
    parts = urlsplit(item.url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        return ActionSeen(name, f"{host}:{port} does not accept a connection: {exc.strerror or exc}")
    return ActionSeen(name, seen=f"{host}:{port} accepts connections")


def observe(settings: Settings, timeout: float) -> list[ActionSeen]:
    """Try each action of ``settings`` that can be tried without changing anything."""
    seen: list[ActionSeen] = []
    for item in settings.actions:
        if isinstance(item, HAProxyActionConfig):
            seen.append(_haproxy(item, timeout))
        elif isinstance(item, CommandActionConfig):
            seen.append(_command(item))
        elif isinstance(item, WebhookActionConfig):
            seen.append(_webhook(item, timeout))
    return seen


def actions_verdict(seen: Sequence[ActionSeen], configured: int) -> Verdict:
    """FAIL when an action cannot be used (its drain would fail: no ack, the event waits for NotBefore)."""
    details = {"actions": [{"action": s.action, "problem": s.problem, "seen": s.seen} for s in seen]}
    failing = [s for s in seen if s.problem]
    if failing:
        return Verdict(Status.FAIL, "; ".join(f"{s.action}: {s.problem}" for s in failing),
                       "fix what each names: a drain that fails is no acknowledgement, and the event waits for "
                       "NotBefore", details)
    if not seen:
        what = "no action but the probe" if not configured else "no action that can be tried from here"
        return Verdict(Status.PASS, what, details=details)
    return Verdict(Status.PASS, "; ".join(f"{s.action}: {s.seen}" for s in seen), details=details)


def check_actions(ctx: Context) -> Verdict:
    return actions_verdict(observe(ctx.settings, ctx.remaining(5.0)), len(ctx.settings.actions))
