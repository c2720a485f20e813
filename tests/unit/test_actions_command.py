"""The command hook with a fake runner (no processes); real subprocesses are in
tests/integration/test_command_hook.py."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from pydantic import SecretStr

from coordinator.actions.base import ActionContext
from coordinator.actions.command import CommandHook, CommandResult
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent

CTX = ActionContext(
    vm="vm7",
    events=(
        ScheduledEvent(event_id="E-1", event_type="Freeze", event_status="Scheduled"),
        ScheduledEvent(event_id="E-2", event_type="Freeze", event_status="Started"),
    ),
)


@dataclass
class Call:
    argv: tuple[str, ...]
    stdin: bytes
    env: dict[str, str]
    timeout: float


class FakeRunner:
    def __init__(self, result: CommandResult | OSError) -> None:
        self.result = result
        self.calls: list[Call] = []

    def __call__(self, argv: Sequence[str], *, stdin: bytes, env: Mapping[str, str], timeout: float) -> CommandResult:
        self.calls.append(Call(tuple(argv), stdin, dict(env), timeout))
        if isinstance(self.result, OSError):
            raise self.result
        return self.result


def hook(runner: FakeRunner, **kwargs: object) -> CommandHook:
    options: dict[str, object] = {"drain_argv": ["/opt/hooks/drain", "--fast"], "recover_argv": None, "timeout": 42}
    options.update(kwargs)
    return CommandHook("h", runner=runner, **options)  # type: ignore[arg-type]


def test_runner_gets_argv_stdin_env_and_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_AGENT", "1")
    runner = FakeRunner(CommandResult(0, b"", b""))
    hook(runner, env={"EXTRA": SecretStr("x"), "COORDINATOR_PHASE": SecretStr("spoofed")}).drain(CTX)
    [call] = runner.calls
    assert call.argv == ("/opt/hooks/drain", "--fast")
    assert call.timeout == 42
    assert json.loads(call.stdin) == {"vm": "vm7", "phase": "drain", "events": [e.to_imds() for e in CTX.events]}
    assert call.env["FROM_AGENT"] == "1"  # the agent's environment is inherited
    assert call.env["EXTRA"] == "x"
    assert call.env["COORDINATOR_PHASE"] == "drain"  # ours win
    assert call.env["COORDINATOR_EVENT_IDS"] == "E-1,E-2"
    assert call.env["COORDINATOR_EVENT_TYPES"] == "Freeze,Freeze"  # one entry per event, in order


def test_none_argv_never_calls_the_runner() -> None:
    runner = FakeRunner(CommandResult(0, b"", b""))
    hook(runner).recover(CTX)
    hook(runner, drain_argv=None, recover_argv=["/bin/true"]).drain(CTX)
    assert runner.calls == []


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (CommandResult(2, b"", b"usage"), r"exited with status 2; stderr: 'usage'"),
        (CommandResult(-15, b"", b""), r"was killed by signal SIGTERM"),
        (CommandResult(-9, b"", b"late", timed_out=True), r"timed out after 42 s and was killed; stderr: 'late'"),
        (FileNotFoundError(2, "No such file or directory"), r"executable '/opt/hooks/drain' not found"),
        (PermissionError(13, "Permission denied"), r"executable '/opt/hooks/drain' cannot be run"),
        (OSError(8, "Exec format error"), r"could not start '/opt/hooks/drain'"),
    ],
)
def test_failures_are_action_errors_naming_hook_phase_vm_and_events(
    result: CommandResult | OSError, match: str
) -> None:
    with pytest.raises(ActionError, match=match) as info:
        hook(FakeRunner(result)).drain(CTX)
    assert str(info.value).startswith("command hook h drain (vm=vm7 events=E-1,E-2)")


def test_env_values_are_masked_in_what_the_command_printed(caplog: pytest.LogCaptureFixture) -> None:
    env = {"API_TOKEN": SecretStr("tok-12345"), "TOKEN_PART": SecretStr("tok-"), "DEBUG": SecretStr("1")}
    runner = FakeRunner(CommandResult(1, b"using tok-12345", b"401 for tok-12345 (debug 1)"))
    with pytest.raises(ActionError) as info:
        hook(runner, env=env).drain(CTX)
    assert runner.calls[0].env["API_TOKEN"] == "tok-12345"  # the command gets the real value
    # The longest value first, so no part of it is left; one too short to be a secret is left alone.
    assert str(info.value).endswith("exited with status 1; stderr: '401 for <redacted> (debug 1)'")
    assert "stdout='using <redacted>'" in caplog.text and "12345" not in caplog.text
