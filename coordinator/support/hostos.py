"""The few places where the agent depends on the operating system, behind one small layer.

Everything here takes the system (``sys.platform``) and, where it needs one, the ``psutil`` module as
arguments, so that tests on Linux exercise the Windows branches with a fake, and the code that uses
them never asks ``sys.platform`` itself.

* Default paths: ``/var/lib/coordinator/state.json`` on POSIX systems; under ``%ProgramData%\\coordinator``
  on Windows (state file, configuration and the service's log file).
* Ending a command together with every process it started (``ProcessControl``): on POSIX the command
  runs in a new session and its process group is signalled (``os.killpg``: SIGTERM, then SIGKILL), which
  also reaches grandchildren whose parent already exited. Windows has neither sessions nor signals: the
  command starts in a new process group (``CREATE_NEW_PROCESS_GROUP``) and its process tree, as psutil
  sees it (``Process.children(recursive=True)``), is terminated and then killed, with a bounded wait.
* Who this agent process is (``agent_identity``: host name, Linux boot id, pid and the pid's start time),
  written into its member node, and whether a process seen there still runs (``process_running``): with
  them the store tells this VM's previous agent process (gone) from another agent configured with the
  same VM name (alive). Anything that cannot be read is None: the store then proves nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path, PureWindowsPath
from typing import Any, Protocol

__all__ = [
    "CREATE_NEW_PROCESS_GROUP",
    "PosixProcessGroup",
    "ProcessControl",
    "PsutilProcessTree",
    "agent_identity",
    "boot_id",
    "default_config_file",
    "default_log_file",
    "default_state_file",
    "is_windows",
    "process_control",
    "process_running",
    "process_start",
    "program_data_dir",
]

# subprocess.CREATE_NEW_PROCESS_GROUP exists only on Windows; its value is fixed by the Win32 API
# (https://learn.microsoft.com/windows/win32/procthread/process-creation-flags).
CREATE_NEW_PROCESS_GROUP: int = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x00000200)


def is_windows(system: str | None = None) -> bool:
    """Whether ``system`` (default ``sys.platform``) is Windows."""
    return (sys.platform if system is None else system) == "win32"


def program_data_dir(environ: Mapping[str, str] | None = None) -> PureWindowsPath:
    """``%ProgramData%\\coordinator``: machine-wide data, writable by services, not by users by default."""
    env = os.environ if environ is None else environ
    return PureWindowsPath(env.get("ProgramData") or env.get("PROGRAMDATA") or r"C:\ProgramData") / "coordinator"


def _native(path: PureWindowsPath | str) -> Path:
    return Path(str(path))


def default_state_file(system: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Where the drain state is kept when ``state_file`` is not set."""
    if is_windows(system):
        return _native(program_data_dir(environ) / "state.json")
    return Path("/var/lib/coordinator/state.json")


def default_config_file(system: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The configuration file the installers write and the Windows service reads."""
    if is_windows(system):
        return _native(program_data_dir(environ) / "coordinator.yaml")
    return Path("/etc/coordinator/coordinator.yaml")


def default_log_file(environ: Mapping[str, str] | None = None) -> Path:
    """The Windows service's log file (a service has no console; on Linux the journal keeps stderr)."""
    return _native(program_data_dir(environ) / "coordinator.log")


class ProcessControl(Protocol):
    """How a command is started so that it can be ended with everything it started, and how it is ended.

    ``terminate`` asks the command's processes to end; ``kill`` forces them. Both are no-ops for
    processes already gone and never raise for them.
    """

    def popen_options(self) -> dict[str, Any]: ...

    def terminate(self, pid: int) -> None: ...

    def kill(self, pid: int) -> None: ...


class PosixProcessGroup:
    """A new session per command (its pid is the process group id); the group is signalled."""

    def popen_options(self) -> dict[str, Any]:
        return {"start_new_session": True}

    def terminate(self, pid: int) -> None:
        self._signal(pid, signal.SIGTERM)

    def kill(self, pid: int) -> None:
        self._signal(pid, signal.SIGKILL)

    @staticmethod
    def _signal(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the whole group is already gone
            os.killpg(pgid, sig)  # type: ignore[attr-defined,unused-ignore]  # POSIX only


class PsutilProcessTree:
    """The command and its descendants as psutil lists them: terminated, then killed, then waited for.

    ``psutil`` is the module (or a fake with ``Process``, ``wait_procs``, ``NoSuchProcess`` and
    ``Error``). The tree is listed when ``terminate`` is called, while the command still runs, and again
    at ``kill`` from every member still alive: a child started in between is caught, but a grandchild
    whose parent had already exited is not (Windows does not re-parent it). ``kill`` waits at most
    ``wait`` seconds for the killed processes to be gone. On Windows, psutil's ``terminate`` and ``kill``
    are both ``TerminateProcess``: the command gets no chance to clean up.
    """

    def __init__(self, psutil: Any, *, wait: float = 2.0, creationflags: int = CREATE_NEW_PROCESS_GROUP) -> None:
        self._psutil = psutil
        self._wait = wait
        self._creationflags = creationflags
        self._trees: dict[int, list[Any]] = {}

    def popen_options(self) -> dict[str, Any]:
        return {"creationflags": self._creationflags}

    def _tree(self, pid: int) -> list[Any]:
        ps = self._psutil
        known = list(self._trees.get(pid, []))
        if not known:
            with contextlib.suppress(ps.Error):
                known = [ps.Process(pid)]
        found: dict[int, Any] = {p.pid: p for p in known}
        for proc in known:
            try:
                for child in proc.children(recursive=True):
                    found.setdefault(child.pid, child)
            except ps.Error:  # gone (NoSuchProcess), or not ours to look at (AccessDenied)
                continue
        self._trees[pid] = list(found.values())
        return self._trees[pid]

    def terminate(self, pid: int) -> None:
        # Children first: a parent that dies first may start nothing more, but its children would be
        # harder to find afterwards.
        for proc in reversed(self._tree(pid)):
            with contextlib.suppress(self._psutil.Error):
                proc.terminate()

    def kill(self, pid: int) -> None:
        tree = self._tree(pid)
        for proc in reversed(tree):
            with contextlib.suppress(self._psutil.Error):
                proc.kill()
        with contextlib.suppress(self._psutil.Error):
            self._psutil.wait_procs(tree, timeout=self._wait)
        self._trees.pop(pid, None)


def process_control(system: str | None = None, psutil: Any = None, *, wait: float = 2.0) -> ProcessControl:
    """The process control of ``system``: a POSIX process group, or on Windows the psutil process tree
    (``psutil`` imported when not given; it is a dependency on Windows)."""
    if not is_windows(system):
        return PosixProcessGroup()
    if psutil is None:
        import psutil as psutil_module

        psutil = psutil_module
    return PsutilProcessTree(psutil, wait=wait)


# -- who this agent process is ------------------------------------------------------------------------------

_PROC = Path("/proc")


def boot_id(system: str | None = None, proc: Path = _PROC) -> str | None:
    """The Linux boot id (random, new at every boot; shared by containers on one kernel), or None
    elsewhere or when unreadable."""
    if (sys.platform if system is None else system) != "linux":
        return None
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int, system: str | None = None, proc: Path = _PROC) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of ``/proc/{pid}/stat``, as a
    string): with the pid it names one process of one boot. None elsewhere than Linux, or when there is
    no such process or it cannot be read."""
    if (sys.platform if system is None else system) != "linux":
        return None
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def process_running(pid: int, start: str | None, system: str | None = None, proc: Path = _PROC) -> bool | None:
    """Whether the process ``pid`` that started at ``start`` (``process_start``; None: unknown) runs on
    this machine: False if no process has that pid, or the one that has it started at another time (the
    pid was reused); True if it runs; None if this cannot be told (Windows, where signalling a pid would
    end it; a ``/proc`` that cannot be read)."""
    system = sys.platform if system is None else system
    if pid <= 0:
        return False
    if system == "linux":
        if not (proc / str(pid)).exists():
            return False
        current = process_start(pid, system, proc)
        if current is None:
            return None if (proc / str(pid)).exists() else False
        return start is None or current == start
    if is_windows(system):
        return None
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the existence and permission checks
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def agent_identity(system: str | None = None, proc: Path = _PROC) -> dict[str, object]:
    """This process as its member node names it: ``host`` (the host name), ``boot_id`` (see
    ``boot_id``), ``pid`` and ``pid_start`` (see ``process_start``). Unreadable parts are None."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(system, proc),
        "pid": pid,
        "pid_start": process_start(pid, system, proc),
    }
