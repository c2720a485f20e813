"""The Windows code paths run for real on this system where they can: the psutil connection source and
the /proc one count the same real loopback connections, the psutil process tree ends a real hook with
its child, and a real agent started by the service class stops on SvcStop."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordinator.actions.base import ActionContext
from coordinator.actions.command import CommandHook, SubprocessRunner
from coordinator.actions.connections import ConnectionsDrainedWait, established_ports_proc, established_ports_source
from coordinator.config import Settings
from coordinator.errors import ActionError
from coordinator.support.hostos import PsutilProcessTree
from coordinator.winservice import ServiceBody, service_class
from tests.integration.test_command_hook import SPAWN_AND_HANG, dead
from tests.plugins.zookeeper import wait_until
from tests.unit.test_winservice import STOP_PENDING, fake_win32

CTX = ActionContext(vm="vm0", events=())


@pytest.fixture
def connections() -> Iterator[tuple[int, list[socket.socket]]]:
    """A listener on 127.0.0.1 and two established connections to it.

    The socket tables are the whole network namespace's: another process's connection on another local
    address can hold the same port number. A port with such a socket is given back and another taken."""
    server = socket.create_server(("127.0.0.1", 0))
    for _ in range(20):
        if server.getsockname()[1] not in established_ports_proc():
            break
        server.close()
        server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    opened: list[socket.socket] = [server]
    try:
        for _ in range(2):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            accepted, _ = server.accept()
            opened += [client, accepted]
        yield port, opened
    finally:
        for sock in opened:
            sock.close()


def test_psutil_and_proc_count_the_same_real_connections(connections: tuple[int, list[socket.socket]]) -> None:
    port, _ = connections
    by_psutil = ConnectionsDrainedWait([port], deadline=0, established=established_ports_source("win32", psutil))
    by_proc = ConnectionsDrainedWait([port], deadline=0, established=established_ports_proc)
    by_default = ConnectionsDrainedWait([port], deadline=0)  # this system's default

    def counts() -> tuple[int, int, int]:
        return by_psutil.established(), by_proc.established(), by_default.established()

    # Read again while a foreign socket that came to share the port since the fixture took it is open.
    wait_until(lambda: counts() == (2, 2, 2), timeout=10, message=f"two connections on port {port}")


def test_the_psutil_wait_ends_when_the_connections_close(connections: tuple[int, list[socket.socket]]) -> None:
    port, opened = connections
    closer = threading.Timer(0.5, lambda: [s.close() for s in opened])
    closer.start()
    started = time.monotonic()
    ConnectionsDrainedWait([port], deadline=10, poll_interval=0.1,
                           established=established_ports_source("win32", psutil)).drain(CTX)
    assert time.monotonic() - started < 5
    closer.join()


def test_the_psutil_process_tree_ends_a_hook_and_its_child(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    # creationflags must be 0 off Windows; the tree is found through psutil alone, no process group.
    runner = SubprocessRunner(kill_grace=0.5, control=PsutilProcessTree(psutil, wait=2.0, creationflags=0))
    hook = CommandHook("stuck", drain_argv=[sys.executable, "-c", SPAWN_AND_HANG, str(pids_file), "ignore-term"],
                       recover_argv=None, timeout=2.0, runner=runner)
    with pytest.raises(ActionError, match="timed out after 2 s and was killed"):
        hook.drain(CTX)
    parent, child = (int(p) for p in pids_file.read_text().split())
    wait_until(lambda: dead(parent) and dead(child), timeout=5, message="hook and its child killed")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_real_agent_run_by_the_service_stops_on_svcstop(tmp_path: Path) -> None:
    settings = Settings.model_validate({
        "cluster": "svc",
        "vm_name": "vm0",
        "imds": {"url": f"http://127.0.0.1:{_closed_port()}"},
        "zookeeper": {"hosts": f"127.0.0.1:{_closed_port()}"},
        "probe": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
        "state_file": str(tmp_path / "state.json"),
    })
    logged: list[Any] = []

    def make_body() -> ServiceBody:
        return ServiceBody(tmp_path / "coordinator.yaml", log_file=tmp_path / "coordinator.log", stop_timeout=20,
                           load=lambda path: settings,
                           configure_logging=lambda level, fmt, file: logged.append(file))

    service = service_class(fake_win32(), body=make_body, exit_process=lambda code: None)(["coordinator"])
    thread = threading.Thread(target=service.SvcDoRun, daemon=True)
    thread.start()
    # Running: the agent's loop has begun (it keeps the VM on the safe side without ZooKeeper or IMDS).
    wait_until(lambda: service.body.stopper.attached, timeout=20, message="agent loop started")
    started = time.monotonic()
    service.SvcStop()
    thread.join(20)
    assert not thread.is_alive()
    assert time.monotonic() - started < service.body.stop_timeout
    assert service.statuses == [(STOP_PENDING, {"waitHint": 25000})]
    assert logged == [tmp_path / "coordinator.log"]
