"""The agent's HTTP surface on real sockets: a client that hangs up early costs a counter, not a traceback;
liveness and readiness on the admin listener; a port already taken is one line and exit code 2."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeState
from coordinator.httpserver import HttpSurface
from coordinator.testbed.waiting import wait_until


def test_a_client_that_hangs_up_before_the_answer_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    answering = threading.Event()
    client_gone = threading.Event()

    def status() -> dict[str, Any]:
        answering.set()
        client_gone.wait(10)  # the answer is written only once the client has reset its connection
        return {"phase": "serving", "padding": "x" * 200_000}

    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=True), registry=CollectorRegistry(), status=status)
    surface.start()
    try:
        host, port = surface.admin_address
        sock = socket.create_connection((host, port))
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answering.wait(10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        sock.close()
        client_gone.set()
        assert wait_until(lambda: surface.clients_hung_up >= 1, 10)
        probe_host, probe_port = surface.probe_address
        assert httpx.get(f"http://{probe_host}:{probe_port}/health").status_code == 200  # still answering
    finally:
        client_gone.set()
        surface.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_agent_whose_probe_port_is_taken_says_so_and_exits(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "cluster": "web", "vm_name": "vm0", "probe": {"listen": f"127.0.0.1:{port}"},
            "http": {"listen": "127.0.0.1:0"}, "zookeeper": {"hosts": "127.0.0.1:1"},
            "state_file": str(tmp_path / "state.json"),
        }))
        run = subprocess.run([sys.executable, "-m", "coordinator", "run", "--config", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert f"cannot listen on probe.listen 127.0.0.1:{port}" in run.stderr + run.stdout
    assert "Traceback" not in run.stderr + run.stdout


def test_a_client_that_resets_while_sending_its_request_leaves_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=True), registry=CollectorRegistry(), status=dict)
    surface.start()
    try:
        for host, port in (surface.probe_address, surface.admin_address):
            sock = socket.create_connection((host, port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nUser-Ag")  # the headers are not finished
            time.sleep(0.3)  # the handler is reading them
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # reset
        assert wait_until(lambda: surface.clients_hung_up >= 2, 10)
        host, port = surface.admin_address
        assert httpx.get(f"http://{host}:{port}/health").status_code == 200  # still answering
    finally:
        surface.stop()
    assert "Traceback" not in capfd.readouterr().err


@dataclass
class Answer:
    ok: bool
    detail: str
    lead: str | None = None


def test_livez_and_readyz_answer_on_the_admin_listener_only() -> None:
    live = Answer(True, "last cycle completed 0.4 s ago")
    ready = Answer(False, "no cycle yet with both a ZooKeeper view and a valid IMDS document")
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=False), registry=CollectorRegistry(), status=dict,
                          live=lambda: live, ready=lambda: ready)
    surface.start()
    try:
        host, port = surface.admin_address
        admin = f"http://{host}:{port}"
        answer = httpx.get(admin + "/livez")
        assert (answer.status_code, answer.text) == (200, "ok: last cycle completed 0.4 s ago\n")
        answer = httpx.get(admin + "/readyz")
        assert answer.status_code == 503 and answer.text.startswith("failing: no cycle yet")
        ready = Answer(True, "coordinating")
        live = Answer(False, "no cycle completed for 31 s (bound 30 s)")
        assert httpx.get(admin + "/readyz").status_code == 200
        # Ready, but not coordinating now (ZooKeeper is out): 200, and the body leads with what is true.
        ready = Answer(True, "no ZooKeeper view for 60 s", lead="not coordinating")
        answer = httpx.get(admin + "/readyz")
        assert (answer.status_code, answer.text) == (200, "not coordinating: no ZooKeeper view for 60 s\n")
        answer = httpx.get(admin + "/livez")
        assert (answer.status_code, answer.text) == (503, "failing: no cycle completed for 31 s (bound 30 s)\n")
        # The load balancer's listener answers its probe (503: draining) and nothing else.
        host, port = surface.probe_address
        assert httpx.get(f"http://{host}:{port}/health").status_code == 503
        assert httpx.get(f"http://{host}:{port}/livez").status_code == 404
        assert httpx.get(f"http://{host}:{port}/readyz").status_code == 404
    finally:
        surface.stop()


def test_agent_whose_admin_port_is_taken_says_which_in_one_line_and_exits(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "cluster": "web", "vm_name": "vm0", "probe": {"listen": "127.0.0.1:0"},
            "http": {"listen": f"127.0.0.1:{port}"}, "zookeeper": {"hosts": "127.0.0.1:1"},
            "state_file": str(tmp_path / "state.json"),
        }))
        run = subprocess.run([sys.executable, "-m", "coordinator", "run", "--config", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    output = run.stderr + run.stdout
    [line] = [line for line in output.splitlines() if "cannot listen" in line]
    assert line.endswith(f"cannot listen on http.listen 127.0.0.1:{port}: Address already in use")
    assert "Traceback" not in output
