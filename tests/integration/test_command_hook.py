"""The command hook with real subprocesses (``sys.executable -c ...`` scripts)."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr

from coordinator.actions.base import ActionContext
from coordinator.actions.command import CommandHook, SubprocessRunner
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent, parse_document
from tests.plugins.zookeeper import wait_until

PY = sys.executable
EVENTS = (
    ScheduledEvent(
        event_id="A1B2",
        event_type="Freeze",
        event_status="Scheduled",
        resource_type="VirtualMachine",
        resources=("vm0",),
        not_before=datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC),
    ),
    ScheduledEvent(event_id="C3D4", event_type="Reboot", event_status="Scheduled", resources=("vm0", "vm1")),
)
DRAIN = ActionContext(vm="vm0", events=EVENTS)
RECOVER = ActionContext(vm="vm0", events=())

RECORD = """
import json, os, sys
env = {k: v for k, v in os.environ.items() if k.startswith(("COORDINATOR_", "HOOK_"))}
with open(sys.argv[1], "w") as f:
    json.dump({"stdin": sys.stdin.read(), "env": env, "argv": sys.argv[1:]}, f)
print("recorded for", env["COORDINATOR_VM"])
"""


def dead(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (it runs no more code either way)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_drain_passes_the_context_on_stdin_and_in_the_environment(tmp_path: Path) -> None:
    out = tmp_path / "drain.json"
    hook = CommandHook(
        "failover",
        drain_argv=[PY, "-c", RECORD, str(out), "--flag with spaces; not a shell"],
        recover_argv=None,
        timeout=30,
        env={"HOOK_TOKEN": SecretStr("t0k"), "COORDINATOR_VM": SecretStr("ignored")},
    )
    hook.drain(DRAIN)

    record = json.loads(out.read_text())
    assert record["argv"] == [str(out), "--flag with spaces; not a shell"]
    assert json.loads(record["stdin"]) == {
        "vm": "vm0",
        "phase": "drain",
        "events": [event.to_imds() for event in EVENTS],
    }
    assert record["env"] == {
        "HOOK_TOKEN": "t0k",
        "COORDINATOR_VM": "vm0",
        "COORDINATOR_PHASE": "drain",
        "COORDINATOR_EVENT_IDS": "A1B2,C3D4",
        "COORDINATOR_EVENT_TYPES": "Freeze,Reboot",
    }


def test_recover_has_no_events_and_a_none_argv_does_nothing(tmp_path: Path) -> None:
    out = tmp_path / "recover.json"
    hook = CommandHook("warmup", drain_argv=None, recover_argv=[PY, "-c", RECORD, str(out)], timeout=30)
    hook.drain(DRAIN)
    assert not out.exists()  # drain-less hook: nothing ran

    hook.recover(RECOVER)
    record = json.loads(out.read_text())
    assert json.loads(record["stdin"]) == {"vm": "vm0", "phase": "recover", "events": []}
    assert record["env"]["COORDINATOR_PHASE"] == "recover"
    assert record["env"]["COORDINATOR_EVENT_IDS"] == ""
    assert record["env"]["COORDINATOR_EVENT_TYPES"] == ""


def test_output_is_captured_and_logged_with_vm_and_events(caplog: pytest.LogCaptureFixture) -> None:
    script = "import sys; print('checkpoint written'); print('a warning', file=sys.stderr)"
    hook = CommandHook("checkpoint", drain_argv=[PY, "-c", script], recover_argv=None, timeout=30)
    with caplog.at_level(logging.INFO, logger="coordinator.actions.command"):
        hook.drain(DRAIN)
    [record] = [r for r in caplog.records if "succeeded" in r.getMessage()]
    message = record.getMessage()
    assert "command hook checkpoint drain (vm=vm0 events=A1B2,C3D4) succeeded" in message
    assert "stdout='checkpoint written'" in message
    assert "stderr='a warning'" in message


def test_long_output_is_truncated_in_logs(caplog: pytest.LogCaptureFixture) -> None:
    script = "print('HEAD' + 'x' * 100000 + 'TAIL')"
    hook = CommandHook("noisy", drain_argv=[PY, "-c", script], recover_argv=None, timeout=30)
    with caplog.at_level(logging.INFO, logger="coordinator.actions.command"):
        hook.drain(DRAIN)
    message = next(r.getMessage() for r in caplog.records if "succeeded" in r.getMessage())
    assert len(message) < 5000
    assert "HEAD" in message and "TAIL" in message and "characters omitted" in message


def test_non_zero_exit_is_an_action_error_naming_the_status(caplog: pytest.LogCaptureFixture) -> None:
    script = "import sys; print('partial'); sys.stderr.write('database busy'); sys.exit(3)"
    hook = CommandHook("failover", drain_argv=[PY, "-c", script], recover_argv=None, timeout=30)
    with pytest.raises(ActionError) as info:
        hook.drain(DRAIN)
    assert "command hook failover drain (vm=vm0 events=A1B2,C3D4) exited with status 3" in str(info.value)
    assert "database busy" in str(info.value)
    assert "stdout='partial'" in caplog.text


def test_death_by_signal_is_reported() -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    hook = CommandHook("crashy", drain_argv=None, recover_argv=[PY, "-c", script], timeout=30)
    with pytest.raises(ActionError, match="was killed by signal SIGKILL"):
        hook.recover(RECOVER)


SPAWN_AND_HANG = """
import os, signal, subprocess, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("started", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["obey-term", "ignore-term"])
def test_timeout_kills_the_process_and_its_children(tmp_path: Path, mode: str) -> None:
    pids_file = tmp_path / "pids"
    hook = CommandHook(
        "stuck",
        drain_argv=[PY, "-c", SPAWN_AND_HANG, str(pids_file), mode],
        recover_argv=None,
        timeout=2.0,
        runner=SubprocessRunner(kill_grace=0.5),
    )
    started = time.monotonic()
    with pytest.raises(ActionError, match=r"timed out after 2 s and was killed") as info:
        hook.drain(DRAIN)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 2 * 0.5 + 2.0
    assert "command hook stuck drain (vm=vm0 events=A1B2,C3D4)" in str(info.value)

    assert pids_file.exists(), "the script did not get as far as starting its child"
    parent, child = (int(p) for p in pids_file.read_text().split())
    wait_until(lambda: dead(parent) and dead(child), timeout=5, message="hook and its child killed")


def test_timeout_keeps_the_output_so_far(caplog: pytest.LogCaptureFixture) -> None:
    script = "import time; print('step 1 done', flush=True); time.sleep(60)"
    hook = CommandHook(
        "slow", drain_argv=[PY, "-c", script], recover_argv=None, timeout=1.5, runner=SubprocessRunner(kill_grace=0.5)
    )
    with pytest.raises(ActionError, match="timed out"):
        hook.drain(DRAIN)
    assert "step 1 done" in caplog.text


def test_missing_executable_is_a_clear_action_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-hook")
    hook = CommandHook("ghost", drain_argv=[missing, "--now"], recover_argv=None, timeout=5)
    with pytest.raises(ActionError, match=rf"executable '{missing}' not found"):
        hook.drain(DRAIN)

    on_path = CommandHook("ghost", drain_argv=["no-such-hook-on-path-4711"], recover_argv=None, timeout=5)
    with pytest.raises(ActionError, match=r"executable 'no-such-hook-on-path-4711' not found"):
        on_path.drain(DRAIN)


def test_non_executable_file_is_a_clear_action_error(tmp_path: Path) -> None:
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    hook = CommandHook("noexec", drain_argv=[str(script)], recover_argv=None, timeout=5)
    with pytest.raises(ActionError, match=r"cannot be run"):
        hook.drain(DRAIN)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"drain_argv": "echo hi", "recover_argv": None},
        {"drain_argv": [], "recover_argv": None},
        {"drain_argv": None, "recover_argv": [""]},
        {"drain_argv": ["true"], "recover_argv": None, "timeout": 0},
    ],
)
def test_construction_rejects_shell_strings_and_empty_commands(kwargs: dict[str, object]) -> None:
    options: dict[str, object] = {"timeout": 5}
    options.update(kwargs)
    with pytest.raises(ValueError):
        CommandHook("bad", **options)  # type: ignore[arg-type]


def hostile_events(marker: Path) -> tuple[ScheduledEvent, ...]:
    """Events as IMDS could send them (the document model takes any string): each field tries to make
    a shell, a template or an argument parser create ``marker``."""
    touch = f"$(touch {marker})"
    document = parse_document({"DocumentIncarnation": 1, "Events": [{
        "EventId": f"{touch}`touch {marker}`;touch {marker}", "EventStatus": "Scheduled",
        "EventType": f"-rf --output={marker} '\"\n{touch}\x00", "ResourceType": "VirtualMachine",
        "Resources": ["vm-0.a_b", f"; touch {marker} #", "--help"], "NotBefore": "",
        "Description": f"line one\nline two\r\n' \" \\ {touch} {{vm}} %s \x00nul",
    }, {
        "EventId": "-", "EventStatus": "Scheduled", "EventType": "Reboot,Freeze", "Resources": ["vm-0.a_b"],
    }]})
    return document.events


def test_hostile_event_fields_reach_the_command_verbatim_and_run_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = tmp_path / "drain.json"
    events = hostile_events(marker)
    hook = CommandHook("failover", drain_argv=[PY, "-c", RECORD, str(out)], recover_argv=None, timeout=30)
    hook.drain(ActionContext(vm="vm-0.a_b", events=events))

    record = json.loads(out.read_text())
    assert record["argv"] == [str(out)]  # nothing from IMDS is ever an argument
    assert json.loads(record["stdin"])["events"] == [event.to_imds() for event in events]  # NUL and all
    assert record["env"]["COORDINATOR_VM"] == "vm-0.a_b"
    assert record["env"]["COORDINATOR_EVENT_IDS"] == ",".join(event.event_id for event in events)
    # An environment value cannot hold a NUL: it is left out there (and a drain does not fail on it).
    assert record["env"]["COORDINATOR_EVENT_TYPES"] == ",".join(event.event_type for event in events).replace("\0", "")
    assert "\n$(touch" in record["env"]["COORDINATOR_EVENT_TYPES"]
    assert not marker.exists()
