"""A real HAProxy on loopback in front of local servers: for the demo and the tests.

The backend's health check can probe another port than the one traffic goes to (``check port``): the
demo points it at each agent's health probe, the way an Azure Load Balancer probes the agent. Every
server can also be drained through the runtime API (``admin.sock``), which is what the HAProxy action
does. Only the PID started here is ever signalled.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.testbed.processes import free_port, stop_process

__all__ = ["BackendTarget", "LocalHAProxy"]

_CONFIG = """\
global
    stats socket {socket} mode 600 level admin
    stats socket ipv4@127.0.0.1:{stats_port} level admin
    stats timeout 10s

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server {server_timeout}
    timeout http-request 5s

frontend fe_app
    bind 127.0.0.1:{frontend_port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET {check_path}
    default-server inter {check_interval} fall 2 rise 2
{servers}
"""


@dataclass(frozen=True)
class BackendTarget:
    port: int  # where traffic goes
    check_port: int | None = None  # where the health check goes (default: the traffic port)


class LocalHAProxy:
    def __init__(
        self,
        directory: Path,
        servers: Mapping[str, BackendTarget],
        *,
        backend: str = "be_app",
        check_path: str = "/health",
        check_interval: str = "500ms",
        server_timeout: str = "60s",
    ) -> None:
        self.directory = directory
        self.servers = dict(servers)
        self.backend = backend
        self._check_path = check_path
        self._check_interval = check_interval
        self._server_timeout = server_timeout
        self.socket_path = directory / "admin.sock"
        self.config_path = directory / "haproxy.cfg"
        self.log_path = directory / "haproxy.log"
        self.frontend_port = 0
        self.stats_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def frontend_url(self) -> str:
        return f"http://127.0.0.1:{self.frontend_port}"

    @property
    def stats_address(self) -> str:
        return f"127.0.0.1:{self.stats_port}"

    def render(self) -> str:
        servers = "\n".join(
            f"    server {name} 127.0.0.1:{target.port} check"
            + (f" port {target.check_port}" if target.check_port else "")
            for name, target in self.servers.items()
        )
        return _CONFIG.format(socket=self.socket_path, stats_port=self.stats_port, frontend_port=self.frontend_port,
                              backend=self.backend, servers=servers, check_path=self._check_path,
                              check_interval=self._check_interval, server_timeout=self._server_timeout)

    def start(self, timeout: float = 15.0) -> None:
        """Write and check the configuration, start ``haproxy -db``, wait until its runtime API answers.

        Raises RuntimeError with HAProxy's own words when it is missing, rejects the configuration or
        exits during start-up. Retries with new ports if one was taken before HAProxy bound it."""
        if shutil.which("haproxy") is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
        self.directory.mkdir(parents=True, exist_ok=True)
        last = ""
        for _attempt in range(3):
            self.frontend_port, self.stats_port = free_port(), free_port()
            self.config_path.write_text(self.render())
            checked = subprocess.run(["haproxy", "-c", "-f", str(self.config_path)], capture_output=True,
                                     text=True, timeout=30, check=False)
            if checked.returncode != 0:
                raise RuntimeError(f"haproxy -c rejected {self.config_path}:\n{checked.stdout}{checked.stderr}")
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config_path)], stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.command("show info")
                    return
                except OSError:
                    time.sleep(0.05)
            last = self.log_path.read_text(errors="replace")
            self.stop()
            if "cannot bind" not in last.lower():
                break
        raise RuntimeError(f"haproxy did not start:\n{last}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=5)

    def command(self, line: str, timeout: float = 5.0) -> str:
        """One runtime API command over the UNIX socket (HAProxy closes the connection after answering)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def status(self, server: str) -> str:
        """The ``status`` column of ``show stat`` for ``server`` (UP, DOWN, DRAIN, MAINT, ...), or ""."""
        return self.statuses().get(server, "")

    def statuses(self) -> dict[str, str]:
        """The ``status`` column of ``show stat`` for every server of the backend, in one command."""
        lines = self.command(f"show stat {self.backend} 4 -1").splitlines()
        if not lines:
            return {}
        header = lines[0].lstrip("# ").split(",")
        found = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname"):
                found[row["svname"]] = row.get("status", "")
        return found
