"""Run a document's `bash` blocks as written: in order, in one shell, on free loopback ports.

A page of copy-paste steps names fixed ports (2181, 18100, ...). ``free_ports`` gives each of them a port
that is free now, keeping runs of consecutive ports consecutive (the simulator's ``--base-port`` gives its
VMs consecutive ports), and ``substitute`` rewrites only those numbers. ``run_blocks`` runs the result with
``bash -euo pipefail`` in a session of its own: every process the page starts belongs to that session, and
whatever is still running once the script ends (or times out) is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.testbed.processes import free_port

__all__ = ["ScriptRun", "bash_blocks", "free_ports", "run_blocks", "section", "substitute"]

_FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)


def section(text: str, title: str) -> str:
    """The section under the heading ``title`` (any level), up to the next heading of the same or a higher
    level; lines inside fenced blocks (a shell comment, say) are never headings."""
    lines = text.splitlines(keepends=True)
    fenced = False
    start: int | None = None
    level = 0
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"(#+) (.*)$", line.rstrip("\n"))
        if heading is None:
            continue
        if start is None:
            if heading.group(2) == title:
                start, level = number + 1, len(heading.group(1))
        elif len(heading.group(1)) <= level:
            return "".join(lines[start:number])
    if start is None:
        raise AssertionError(f"no heading {title!r}")
    return "".join(lines[start:])


def bash_blocks(text: str) -> list[str]:
    """Every fenced `bash` block, in order (other fences, such as `yaml` or plain output, are not run)."""
    return _FENCE.findall(text)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(single: Iterable[int], runs: Mapping[int, int] | None = None) -> dict[int, int]:
    """A free loopback port for each of ``single``, and for each ``first: length`` of ``runs`` as many
    consecutive free ports, first to first."""
    mapping = {port: free_port() for port in single}
    for first, length in (runs or {}).items():
        for _ in range(200):
            base = free_port()
            if all(_bindable(base + i) for i in range(1, length)):
                mapping.update({first + i: base + i for i in range(length)})
                break
        else:
            raise RuntimeError(f"no {length} consecutive free ports")
    return mapping


def substitute(text: str, ports: Mapping[int, int]) -> str:
    """``text`` with each of ``ports`` (a whole number, not part of a longer one) replaced by its free port."""
    return re.sub(r"(?<![\w.])(\d{4,5})(?![\w])",
                  lambda m: str(ports.get(int(m.group(1)), m.group(1))), text)


@dataclass
class ScriptRun:
    returncode: int | None  # None: stopped at the deadline
    output: str
    seconds: float
    left_running: list[str]  # what the script had not stopped when it ended: "PID command line"


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] != "Z":  # field 6 of stat: the session id
            members.append(int(entry.name))
    return members


def _command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def run_blocks(script: str, *, cwd: Path, workdir: Path, timeout: float,
               env: Mapping[str, str] | None = None) -> ScriptRun:
    """Run ``script`` with ``bash -x -euo pipefail`` from ``cwd``, ``TMPDIR`` set to ``workdir`` (so that the
    page's ``mktemp -d`` lands there), in a session of its own. Once it ends, or at ``timeout``, every
    process of that session still running is listed in ``left_running`` and stopped by its PID."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "page.sh"
    path.write_text(script)
    log = workdir / "page.out"
    began = time.monotonic()
    with log.open("wb") as output:
        proc = subprocess.Popen(
            ["bash", "-x", "-euo", "pipefail", str(path)], cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TMPDIR": str(workdir), **(env or {})},
        )
        try:
            returncode: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            left = [pid for pid in _session_members(proc.pid) if pid != proc.pid]
            described = [f"{pid} {_command_line(pid)}" for pid in left]
            _stop([*left, *([proc.pid] if proc.poll() is None else [])])
            proc.wait(10)
    return ScriptRun(returncode, log.read_text(errors="replace"), time.monotonic() - began, described)
