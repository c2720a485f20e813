"""The platform layer: default paths per system, the psutil process tree (the Windows path) with a fake
psutil, the POSIX process group, and the Windows branches of the state file's atomic write and of the
HAProxy client. The real psutil and real processes are in tests/integration/test_platform_layer.py."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.actions.haproxy import HAProxyRuntime
from coordinator.config import Settings
from coordinator.errors import ActionError
from coordinator.support.files import atomic_write
from coordinator.support.hostos import (
    CREATE_NEW_PROCESS_GROUP,
    PosixProcessGroup,
    PsutilProcessTree,
    default_config_file,
    default_log_file,
    default_state_file,
    is_windows,
    process_control,
    program_data_dir,
)

WINDOWS_ENV = {"ProgramData": r"D:\Data"}


# -- default paths ----------------------------------------------------------------------------------------


def test_default_paths_on_linux() -> None:
    assert not is_windows("linux")
    assert default_state_file("linux") == Path("/var/lib/coordinator/state.json")
    assert default_config_file("linux") == Path("/etc/coordinator/coordinator.yaml")


def test_default_paths_on_windows_follow_program_data() -> None:
    assert is_windows("win32")
    assert str(default_state_file("win32", WINDOWS_ENV)) == r"D:\Data\coordinator\state.json"
    assert str(default_config_file("win32", WINDOWS_ENV)) == r"D:\Data\coordinator\coordinator.yaml"
    assert str(default_log_file(WINDOWS_ENV)) == r"D:\Data\coordinator\coordinator.log"
    # Without the variable (a stripped service environment): the Windows default.
    assert str(program_data_dir({})) == r"C:\ProgramData\coordinator"
    assert str(default_state_file("win32", {})) == r"C:\ProgramData\coordinator\state.json"


def test_settings_default_state_file_follows_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.model_validate({"cluster": "web"}).state_file == Path("/var/lib/coordinator/state.json")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("ProgramData", r"C:\ProgramData")
    settings = Settings.model_validate({"cluster": "web"})
    assert str(settings.state_file) == r"C:\ProgramData\coordinator\state.json"
    # An explicit value, or null, wins over the default on every system.
    assert Settings.model_validate({"cluster": "web", "state_file": None}).state_file is None


# -- process control --------------------------------------------------------------------------------------


class NoSuchProcess(Exception):
    pass


class FakeProc:
    def __init__(self, ps: FakePsutil, pid: int, children: list[FakeProc] | None = None) -> None:
        self.ps, self.pid, self.kids = ps, pid, children or []
        self.alive = True

    def children(self, recursive: bool = False) -> list[FakeProc]:
        assert recursive
        if not self.alive:
            raise NoSuchProcess(self.pid)
        found = []
        for kid in self.kids:
            found.append(kid)
            found.extend(kid.children(recursive=True) if kid.alive else [])
        return found

    def terminate(self) -> None:
        self._end("terminate")

    def kill(self) -> None:
        self._end("kill")

    def _end(self, how: str) -> None:
        if not self.alive:
            raise NoSuchProcess(self.pid)
        self.ps.calls.append((how, self.pid))
        if how == "kill" or self.pid not in self.ps.ignore_terminate:
            self.alive = False


class FakePsutil:
    """The part of psutil a process tree uses: ``Process``, ``wait_procs``, ``Error``/``NoSuchProcess``."""

    Error = Exception
    NoSuchProcess = NoSuchProcess

    def __init__(self, procs: dict[int, FakeProc] | None = None) -> None:
        self.procs: dict[int, FakeProc] = procs or {}
        self.calls: list[tuple[str, Any]] = []
        self.ignore_terminate: set[int] = set()

    def Process(self, pid: int) -> FakeProc:
        if pid not in self.procs or not self.procs[pid].alive:
            raise NoSuchProcess(pid)
        return self.procs[pid]

    def wait_procs(self, procs: list[FakeProc], timeout: float) -> tuple[list[FakeProc], list[FakeProc]]:
        self.calls.append(("wait", (sorted(p.pid for p in procs), timeout)))
        return [p for p in procs if not p.alive], [p for p in procs if p.alive]


def tree() -> FakePsutil:
    """100 -> 101 -> 102, and 100 -> 103."""
    ps = FakePsutil()
    grandchild = FakeProc(ps, 102)
    child = FakeProc(ps, 101, [grandchild])
    other = FakeProc(ps, 103)
    leader = FakeProc(ps, 100, [child, other])
    ps.procs = {p.pid: p for p in (leader, child, grandchild, other)}
    return ps


def test_windows_control_starts_a_new_process_group_and_uses_psutil() -> None:
    control = process_control("win32", psutil=tree(), wait=1.5)
    assert isinstance(control, PsutilProcessTree)
    assert control.popen_options() == {"creationflags": CREATE_NEW_PROCESS_GROUP}
    assert CREATE_NEW_PROCESS_GROUP == 0x200


def test_posix_control_is_a_new_session_and_its_process_group() -> None:
    control = process_control("linux")
    assert isinstance(control, PosixProcessGroup)
    assert control.popen_options() == {"start_new_session": True}


def test_terminate_reaches_every_descendant_children_first() -> None:
    ps = tree()
    PsutilProcessTree(ps, wait=1.5).terminate(100)
    assert [pid for how, pid in ps.calls if how == "terminate"] == [103, 102, 101, 100]
    assert not any(p.alive for p in ps.procs.values())


def test_kill_after_terminate_finds_what_survived_and_waits_for_it() -> None:
    ps = tree()
    ps.ignore_terminate = {101, 102}  # (no such thing on Windows, where terminate is kill; POSIX psutil)
    control = PsutilProcessTree(ps, wait=1.5)
    control.terminate(100)
    assert (ps.procs[100].alive, ps.procs[101].alive) == (False, True)
    control.kill(100)  # the leader is gone, but the tree listed at terminate is remembered
    assert [c for c in ps.calls if c[0] == "kill"] == [("kill", 102), ("kill", 101)]
    assert ps.calls[-1] == ("wait", ([100, 101, 102, 103], 1.5))
    assert not any(p.alive for p in ps.procs.values())


def test_a_child_started_after_terminate_is_killed_too() -> None:
    ps = tree()
    ps.ignore_terminate = {101}
    control = PsutilProcessTree(ps, wait=1.0)
    control.terminate(100)
    late = FakeProc(ps, 104)
    ps.procs[101].kids.append(late)
    ps.procs[104] = late
    control.kill(100)
    assert ("kill", 104) in ps.calls and not late.alive


def test_a_tree_already_gone_is_no_error() -> None:
    ps = FakePsutil()
    control = PsutilProcessTree(ps, wait=1.0)
    control.terminate(4242)
    control.kill(4242)
    assert ps.calls == [("wait", ([], 1.0))]


# -- the state file's atomic write on Windows --------------------------------------------------------------


class FlakyReplace:
    """os.replace that fails with PermissionError (a scanner holding the file) a number of times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, src: str, dst: Path) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise PermissionError(13, "The process cannot access the file because it is being used")
        Path(src).replace(dst)


def test_windows_retries_a_replace_refused_while_the_file_is_open(tmp_path: Path) -> None:
    path, sleeps = tmp_path / "state.json", []
    replace = FlakyReplace(failures=3)
    atomic_write(path, "new", system="win32", replace=replace, sleep=sleeps.append)
    assert path.read_text() == "new"
    assert replace.calls == 4
    assert sleeps == pytest.approx([0.1, 0.2, 0.3])


def test_windows_gives_up_after_six_attempts_and_leaves_the_old_file(tmp_path: Path) -> None:
    path, sleeps = tmp_path / "state.json", []
    path.write_text("old")
    replace = FlakyReplace(failures=100)
    with pytest.raises(PermissionError):
        atomic_write(path, "new", system="win32", replace=replace, sleep=sleeps.append)
    assert (replace.calls, len(sleeps), path.read_text()) == (6, 5, "old")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_posix_does_not_retry_a_refused_replace(tmp_path: Path) -> None:
    path, sleeps = tmp_path / "state.json", []
    replace = FlakyReplace(failures=1)
    with pytest.raises(PermissionError):
        atomic_write(path, "new", system="linux", replace=replace, sleep=sleeps.append)
    assert (replace.calls, sleeps, path.exists()) == (1, [], False)


def test_windows_skips_the_directory_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[object] = []
    real_open = __import__("os").open

    def spy_open(path: Any, flags: int, *args: Any) -> int:
        if Path(path).is_dir():
            opened.append(path)
        return int(real_open(path, flags, *args))

    monkeypatch.setattr("coordinator.support.files.os.open", spy_open)
    atomic_write(tmp_path / "a", "x", system="win32")
    assert opened == []  # a directory cannot be opened for fsync on Windows
    atomic_write(tmp_path / "b", "x", system="linux")
    assert opened == [tmp_path]


# -- HAProxy over a UNIX socket where there are none --------------------------------------------------------


def test_unix_socket_address_without_af_unix_is_an_action_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(socket, "AF_UNIX")
    runtime = HAProxyRuntime("/run/haproxy/admin.sock", timeout=1)
    with pytest.raises(ActionError, match="UNIX sockets are not available on this system: use a TCP address"):
        runtime.execute("show info")
