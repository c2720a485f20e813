"""The launchers' port choice: listening ports never come from the range outgoing connections use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from coordinator.testbed import processes
from coordinator.testbed.processes import free_port


def test_free_ports_are_unique_bindable_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(10000 <= port < low for port in ports), ports
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if it were taken


def test_a_port_taken_by_a_listener_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            spare = probe.getsockname()[1]
        draws = iter([taken, spare])
        monkeypatch.setattr(processes.random, "randrange", lambda a, b: next(draws))
        monkeypatch.setattr(processes, "_ephemeral_low", lambda: 65000)
        assert free_port() == spare
