"""The demo's app server and the IMDS simulator take a client that goes away quietly: no traceback on
their output (which the demo's logs and the simulator's stderr are), and they go on serving."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from coordinator.testbed.processes import free_port, stop_process
from tests.plugins.simulator import SimulatorFactory


def _hang_up_mid_request(host: str, port: int, times: int = 5) -> None:
    """Start a request and reset the connection (RST, as a client killed or timed out does)."""
    for _ in range(times):
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"GET /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.5)  # the server's threads meet the reset


def test_the_app_server_takes_a_client_hanging_up_quietly(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "app.log"
    with out.open("wb") as sink:
        app = subprocess.Popen([sys.executable, "-m", "coordinator.testbed.app", "--name", "vm0", "--port", str(port)],
                               stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/", timeout=1, trust_env=False).text == "vm0"
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        _hang_up_mid_request("127.0.0.1", port)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=2, trust_env=False).text == "vm0"
    finally:
        stop_process(app, timeout=5)
    text = out.read_text()
    assert "Traceback" not in text and "ConnectionResetError" not in text, text


def test_the_simulator_takes_a_client_hanging_up_quietly(imds_sim: SimulatorFactory) -> None:
    sim = imds_sim(vms=("vm0",))
    address = urlsplit(sim.urls["vm0"])
    assert address.hostname is not None and address.port is not None
    _hang_up_mid_request(address.hostname, address.port)
    answer = httpx.get(sim.url("vm0"), headers={"Metadata": "true"}, timeout=2, trust_env=False)
    assert answer.status_code == 200
    assert sim.stop() == 0
    text = sim.stderr()
    assert "Traceback" not in text and "ConnectionResetError" not in text, text
