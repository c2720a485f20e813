"""The IMDS simulator as a process of a benchmark.

``start_simulator`` runs ``python -m azuresim`` for the named VMs on free loopback ports, its
output in a log file of the bench's work directory, and waits for the ready file the simulator writes
once it listens: the control URL, each VM's IMDS URL and, when ``--arm`` is among the extra arguments,
the ARM endpoint. A simulator that exits or does not get ready in time is killed and named with its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["start_simulator"]


def start_simulator(workdir: Path, vms: Sequence[str], extra: Sequence[str] = (), *, name: str = "simulator",
                    timeout: float = 60.0) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The simulator's process and its ready file's contents (``control``, ``vms``, ``arm``)."""
    ready = workdir / f"{name}.ready.json"
    log_path = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "azuresim", "--vms", ",".join(vms), "--base-port", "0",
               "--control", "127.0.0.1:0", "--ready-file", str(ready), *extra]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=ROOT)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"the simulator {name} did not get ready within {timeout:g} s "
                               f"(exit status {process.returncode}); see {log_path}")
        time.sleep(0.05)
    info: dict[str, Any] = json.loads(ready.read_text())
    return process, info
