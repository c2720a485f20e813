"""Run an external command on drain and/or recover (a failover, a checkpoint, a service stop...).

The command is an argv list, executed directly (never through a shell), started so that a timeout can
end it together with every child it started (a new session on POSIX systems, a new process group on
Windows: ``coordinator.support.hostos``). It receives the context twice:

* on stdin, as one JSON object: ``{"vm": ..., "phase": "drain"|"recover", "events": [...]}`` where each
  event is serialized as IMDS does (``ScheduledEvent.to_imds()``);
* in its environment (the agent's own environment, plus ``env``, plus): ``COORDINATOR_VM``,
  ``COORDINATOR_PHASE``, ``COORDINATOR_EVENT_IDS`` and ``COORDINATOR_EVENT_TYPES`` (comma-separated, one
  entry per event in the same order; empty on recovery, which has no events).

Event fields from IMDS reach the command only as data, verbatim (but for NUL characters, which no
environment value can hold): in the JSON and in environment values, never in its argv and never through
a shell, so ``$(...)``, quotes or a leading ``-`` in them mean nothing.

Exit status 0 is success; anything else, a timeout or a missing executable raises ``ActionError``.
Standard output and error are captured and logged, truncated, with the VM name and event ids. ``env``
values are secrets (``SecretStr``): read only to start the command, and masked in the output it logs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr

from coordinator.actions.base import ActionContext, mask_secrets
from coordinator.errors import ActionError
from coordinator.support.hostos import ProcessControl, process_control

__all__ = ["CommandHook", "CommandResult", "CommandRunner", "SubprocessRunner"]

log = logging.getLogger(__name__)

_LOG_LIMIT = 2000  # characters of each output stream kept in a log line or an error message


@dataclass(frozen=True)
class CommandResult:
    """What a command did. ``returncode`` is negative (-signal) when a signal ended it; ``timed_out`` is
    True when the runner killed it for running past its timeout."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


class CommandRunner(Protocol):
    """Runs ``argv`` with ``stdin`` as input and ``env`` as the whole environment, for at most
    ``timeout`` seconds. Raises ``OSError`` (``FileNotFoundError``, ``PermissionError``...) when the
    command cannot be started."""

    def __call__(
        self, argv: Sequence[str], *, stdin: bytes, env: Mapping[str, str], timeout: float
    ) -> CommandResult: ...


class SubprocessRunner:
    """The real runner: ``subprocess.Popen`` started as ``control`` says (default: this system's
    ``process_control()``), so that the command and its children can be ended together.

    On timeout the command's processes are asked to end (POSIX: SIGTERM to the process group), then
    forced (SIGKILL; on Windows the process tree is terminated and killed) after ``kill_grace`` seconds
    if its output is still open; the output produced until then is kept. A child out of reach (one
    that left the group with its own ``setsid``; on Windows one whose parent had already exited) keeps
    the output pipes open: they are then given up after ``kill_grace``. A command counts as running
    until its output pipes close, so a background child that keeps them open makes it run into the
    timeout even after the leader exited.
    """

    def __init__(self, *, kill_grace: float = 2.0, control: ProcessControl | None = None) -> None:
        if not (kill_grace >= 0 and math.isfinite(kill_grace)):
            raise ValueError(f"kill_grace must be a non-negative number, got {kill_grace!r}")
        self._kill_grace = float(kill_grace)
        self._control = control if control is not None else process_control(wait=self._kill_grace)

    def __call__(self, argv: Sequence[str], *, stdin: bytes, env: Mapping[str, str], timeout: float) -> CommandResult:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            close_fds=True,
            **self._control.popen_options(),
        )
        try:
            stdout, stderr = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = self._kill(proc)
            return CommandResult(proc.returncode if proc.returncode is not None else -9, stdout, stderr, True)
        except BaseException:
            self._kill(proc)
            raise
        return CommandResult(proc.returncode, stdout, stderr)

    def _kill(self, proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
        # The whole group or tree, not just the leader. communicate() keeps what it read before a
        # TimeoutExpired, so each later call returns the whole output so far.
        self._control.terminate(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=self._kill_grace)
        except subprocess.TimeoutExpired:
            self._control.kill(proc.pid)
            try:
                stdout, stderr = proc.communicate(timeout=self._kill_grace)
            except subprocess.TimeoutExpired:
                # Someone out of reach still holds the pipes: stop reading rather than hang.
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                proc.wait()
                stdout, stderr = b"", b""
        else:
            self._control.kill(proc.pid)  # children that ignored the request but closed the pipes
        return stdout or b"", stderr or b""


class CommandHook:
    """An action that runs ``drain_argv`` on drain and ``recover_argv`` on recover.

    A ``None`` argv means the hook does nothing in that phase (a drain-only failover hook, a recover-only
    warm-up hook). The command must be idempotent itself: a restarted agent may run a phase again.

    Raises ``ActionError`` naming the hook, the phase and: the exit status (or the signal), the timeout,
    or the executable that could not be started. ``env`` entries override the agent's environment; the
    ``COORDINATOR_*`` variables override both.
    """

    always_recover = False

    def __init__(
        self,
        name: str,
        *,
        drain_argv: Sequence[str] | None,
        recover_argv: Sequence[str] | None,
        timeout: float,
        env: Mapping[str, SecretStr] | None = None,
        runner: CommandRunner | None = None,
    ) -> None:
        if not name:
            raise ValueError("name must not be empty")
        for field, argv in (("drain_argv", drain_argv), ("recover_argv", recover_argv)):
            if argv is None:
                continue
            if isinstance(argv, str | bytes):
                raise ValueError(f"{field} must be a list of arguments, not a string (no shell is used)")
            if not argv or not all(isinstance(arg, str) for arg in argv) or not argv[0]:
                raise ValueError(f"{field} must be a non-empty list of strings, got {argv!r}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number, got {timeout!r}")
        self.name = name
        self._argv = {
            "drain": tuple(drain_argv) if drain_argv is not None else None,
            "recover": tuple(recover_argv) if recover_argv is not None else None,
        }
        self._timeout = float(timeout)
        self._env = dict(env or {})
        self._runner: CommandRunner = runner if runner is not None else SubprocessRunner()

    def drain(self, ctx: ActionContext) -> None:
        self._run("drain", ctx)

    def recover(self, ctx: ActionContext) -> None:
        self._run("recover", ctx)

    def _run(self, phase: str, ctx: ActionContext) -> None:
        argv = self._argv[phase]
        if argv is None:
            log.debug("command hook %s has nothing to run on %s (vm=%s)", self.name, phase, ctx.vm)
            return
        payload = {"vm": ctx.vm, "phase": phase, "events": [event.to_imds() for event in ctx.events]}
        env = {
            **os.environ,
            **{name: value.get_secret_value() for name, value in self._env.items()},
            "COORDINATOR_VM": ctx.vm,
            "COORDINATOR_PHASE": phase,
            "COORDINATOR_EVENT_IDS": _env_text(event.event_id for event in ctx.events),
            "COORDINATOR_EVENT_TYPES": _env_text(event.event_type for event in ctx.events),
        }
        where = f"command hook {self.name} {phase} (vm={ctx.vm} events={ctx.event_ids})"
        started = time.monotonic()
        try:
            result = self._runner(argv, stdin=json.dumps(payload).encode(), env=env, timeout=self._timeout)
        except FileNotFoundError as exc:
            raise ActionError(f"{where}: executable {argv[0]!r} not found ({exc.strerror})") from exc
        except PermissionError as exc:
            raise ActionError(f"{where}: executable {argv[0]!r} cannot be run ({exc.strerror})") from exc
        except OSError as exc:
            raise ActionError(f"{where}: could not start {argv[0]!r}: {exc}") from exc
        elapsed = time.monotonic() - started
        stdout, stderr = self._shown(result.stdout), self._shown(result.stderr)
        if result.timed_out:
            # The output in full, as a warning: the failure itself is the agent's one ERROR line, from the error.
            log.warning("%s killed after %.1f s timeout; stdout=%r stderr=%r", where, self._timeout, stdout, stderr)
            raise ActionError(f"{where} timed out after {self._timeout:g} s and was killed; stderr: {stderr!r}")
        if result.returncode != 0:
            status = _describe_status(result.returncode)
            log.warning("%s %s after %.1f s; stdout=%r stderr=%r", where, status, elapsed, stdout, stderr)
            raise ActionError(f"{where} {status}; stderr: {stderr!r}")
        log.info("%s succeeded in %.1f s; stdout=%r stderr=%r", where, elapsed, stdout, stderr)


    def _shown(self, output: bytes) -> str:
        """Output for a log line or an error: masked first, so that a cut never leaves part of a secret."""
        return _shorten(mask_secrets(output.decode("utf-8", "replace"), self._env.values()))


def _env_text(values: Iterable[str]) -> str:
    """Comma-separated, without NUL characters: an environment value cannot hold one, and a NUL in a field
    from IMDS must not fail every drain. The JSON on stdin keeps the values exactly."""
    return ",".join(values).replace("\0", "")


def _describe_status(returncode: int) -> str:
    if returncode < 0:  # POSIX only: Windows exit codes are never negative
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _shorten(text: str, limit: int = _LOG_LIMIT) -> str:
    """Keep the head and the tail of long output (the tail usually holds the error)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ...[{len(text) - 2 * half} characters omitted]... {text[-half:]}"
