"""The agent's HTTP surface on real sockets: a client that hangs up early costs a counter, not a traceback."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import httpx
import pytest
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
