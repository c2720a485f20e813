"""A real HAProxy in front of two small HTTP servers, for the HAProxy action's tests.

``haproxy`` (function scope) starts, for one test:

* two HTTP servers in threads on 127.0.0.1 (``web0`` and ``web1``), answering ``/health`` (health
  checks), ``/`` (names themselves in the ``X-Served-By`` header and the body) and ``/slow`` (holds
  the request open until the test releases it: a long-lived session);
* ``haproxy -db -f cfg`` with an admin runtime socket (UNIX, plus TCP on loopback), a frontend on a
  free loopback port and a backend ``be_app`` with ``web0`` and ``web1``, ``option httpchk GET /health``
  and ``default-server inter 500ms fall 2 rise 2``. The configuration is checked with ``haproxy -c``
  first, and the fixture waits until both servers are UP and the frontend answers.

Teardown releases held requests and stops exactly the PID it started. Without an ``haproxy`` binary
the test is skipped, or fails if the ``CI`` environment variable is set.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from tests.plugins.zookeeper import wait_until

__all__ = ["BACKEND", "SERVERS", "BackendServer", "RunningHAProxy", "haproxy"]

BACKEND = "be_app"
SERVERS = ("web0", "web1")
SLOW_REQUEST_LIMIT = 30.0  # a held /slow request answers by itself after this long, whatever the test does

_CONFIG = """\
global
    stats socket {socket} mode 600 level admin
    stats socket ipv4@127.0.0.1:{stats_port} level admin
    stats timeout 10s

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 5s

frontend fe_app
    bind 127.0.0.1:{frontend_port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET /health
    default-server inter 500ms fall 2 rise 2
{servers}
"""


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"HAProxy is required in CI: {reason}", pytrace=False)
    pytest.skip(f"HAProxy not available: {reason}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class BackendServer:
    """One HTTP server behind HAProxy. ``hits`` counts requests other than health checks."""

    name: str
    httpd: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    hits: int = 0
    slow_in_flight: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        assert self.httpd is not None
        port: int = self.httpd.server_address[1]
        return port

    def start(self) -> None:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self._answer(b"ok")
                    return
                with backend.lock:
                    backend.hits += 1
                if self.path == "/slow":
                    with backend.lock:
                        backend.slow_in_flight += 1
                    try:
                        backend.release.wait(SLOW_REQUEST_LIMIT)
                    finally:
                        with backend.lock:
                            backend.slow_in_flight -= 1
                self._answer(backend.name.encode())

            def _answer(self, body: bytes) -> None:
                try:
                    self.send_response(200)
                    self.send_header("X-Served-By", backend.name)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # HAProxy's health checks hang up as soon as they have the status line

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep the test output for assertions

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"backend-{self.name}", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def in_flight(self) -> int:
        with self.lock:
            return self.slow_in_flight


@dataclass
class RunningHAProxy:
    """What the ``haproxy`` fixture yields."""

    pid: int
    socket_path: Path
    stats_address: str  # host:port of the TCP runtime socket
    frontend_url: str
    config_path: Path
    log_path: Path
    backend: str = BACKEND
    servers: tuple[str, ...] = SERVERS
    backends: dict[str, BackendServer] = field(default_factory=dict)

    def command(self, line: str, timeout: float = 5.0) -> str:
        """One runtime API command over the UNIX socket, independent of the code under test."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def status(self, server: str) -> str:
        """The ``status`` column of ``show stat`` for ``server`` (UP, DOWN, DRAIN, MAINT...)."""
        lines = self.command(f"show stat {self.backend} 4 -1").splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname") == server:
                return row["status"]
        raise AssertionError(f"{server} not in show stat: {lines}")

    def request(self, path: str = "/", timeout: float = 5.0) -> str:
        """One request through the frontend on a fresh connection; returns the server that answered."""
        response = httpx.get(self.frontend_url + path, timeout=timeout, trust_env=False)
        response.raise_for_status()
        return response.headers["X-Served-By"]

    def served_by(self, count: int) -> list[str]:
        return [self.request() for _ in range(count)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _check_config(config_path: Path) -> None:
    checked = subprocess.run(
        ["haproxy", "-c", "-f", str(config_path)], capture_output=True, text=True, timeout=30, check=False
    )
    if checked.returncode != 0:
        pytest.fail(f"haproxy -c rejected the test configuration:\n{checked.stdout}{checked.stderr}")


def _ready(instance: RunningHAProxy, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        return True  # exited: the caller looks at the exit status
    try:
        if any(instance.status(server) != "UP" for server in instance.servers):
            return False
        instance.request("/health", timeout=1.0)
    except (OSError, httpx.HTTPError, AssertionError, IndexError, KeyError):
        return False
    return True


def _start_haproxy(
    directory: Path, backends: dict[str, BackendServer]
) -> tuple[RunningHAProxy, subprocess.Popen[bytes]]:
    socket_path = directory / "admin.sock"
    config_path = directory / "haproxy.cfg"
    log_path = directory / "haproxy.log"
    last_log = ""
    for _attempt in range(3):  # a free port can be taken between choosing it and HAProxy binding it
        frontend_port, stats_port = _free_port(), _free_port()
        servers = "\n".join(f"    server {name} 127.0.0.1:{backend.port} check" for name, backend in backends.items())
        config_path.write_text(
            _CONFIG.format(
                socket=socket_path,
                stats_port=stats_port,
                frontend_port=frontend_port,
                backend=BACKEND,
                servers=servers,
            )
        )
        _check_config(config_path)
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(config_path)], stdout=log_file, stderr=subprocess.STDOUT
            )
        instance = RunningHAProxy(
            pid=proc.pid,
            socket_path=socket_path,
            stats_address=f"127.0.0.1:{stats_port}",
            frontend_url=f"http://127.0.0.1:{frontend_port}",
            config_path=config_path,
            log_path=log_path,
            backends=backends,
        )
        try:
            wait_until(
                lambda i=instance, p=proc: _ready(i, p),  # type: ignore[misc]
                timeout=15,
                message="HAProxy up with both servers UP",
            )
        except BaseException:
            _stop(proc)
            raise
        if proc.poll() is None:
            return instance, proc
        last_log = instance.log()
        if "cannot bind" not in last_log.lower():
            break
    pytest.fail(f"haproxy exited during start-up:\n{last_log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to exactly the PID we started
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHAProxy]:
    if shutil.which("haproxy") is None:
        _unavailable("no 'haproxy' on PATH (apt-get install haproxy)")
    # A short directory: UNIX socket paths are limited to 107 bytes.
    directory = tmp_path_factory.mktemp("haproxy")
    backends = {name: BackendServer(name) for name in SERVERS}
    proc: subprocess.Popen[bytes] | None = None
    try:
        for backend in backends.values():
            backend.start()
        started = time.monotonic()
        instance, proc = _start_haproxy(directory, backends)
        print(f"haproxy pid {proc.pid} ready in {time.monotonic() - started:.2f}s")
        yield instance
    finally:
        for backend in backends.values():
            backend.release.set()
        if proc is not None:
            _stop(proc)
        for backend in backends.values():
            backend.stop()
