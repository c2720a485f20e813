"""Small process helpers shared by the local launchers (ZooKeeper, HAProxy, the local cluster)."""

from __future__ import annotations

import signal
import socket
import subprocess

__all__ = ["free_port", "stop_process"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may still take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Stop exactly this child: continue it (a stopped process cannot act on ``sig``), send ``sig``,
    wait up to ``timeout``, then SIGKILL. Does nothing if it has already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
