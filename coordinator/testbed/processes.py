"""Small process helpers shared by the local launchers (ZooKeeper, HAProxy, the local cluster)."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import threading
from pathlib import Path

__all__ = ["free_port", "stop_process"]


_LOWEST = 10000
_handed_out: set[int] = set()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range, from which outgoing connections take theirs."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a process to listen on.

    Chosen at random below the kernel's ephemeral range: a port from that range (what binding port 0
    returns) can be taken by any outgoing connection (an agent probing its peers opens one a second)
    between this choice and the listener binding it. Never the same port twice in one process. Another
    listener may still take it first; the launchers then see the process exit and say so."""
    low = _ephemeral_low()
    with _lock:
        for _ in range(200):
            port = random.randrange(_LOWEST, low) if low > _LOWEST + 1000 else 0
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                found: int = sock.getsockname()[1]
            _handed_out.add(found)
            return found
    raise RuntimeError(f"no free TCP port found on {host} between {_LOWEST} and {low}")


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
