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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from coordinator.testbed.haproxy import BackendTarget, LocalHAProxy
from tests.plugins.zookeeper import wait_until

__all__ = ["BACKEND", "SERVERS", "BackendServer", "RunningHAProxy", "haproxy"]

BACKEND = "be_app"
SERVERS = ("web0", "web1")
SLOW_REQUEST_LIMIT = 30.0  # a held /slow request answers by itself after this long, whatever the test does

def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"HAProxy is required in CI: {reason}", pytrace=False)
    pytest.skip(f"HAProxy not available: {reason}")


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
    """What the ``haproxy`` fixture yields: the launcher's view plus the test's backend servers."""

    proxy: LocalHAProxy
    backends: dict[str, BackendServer] = field(default_factory=dict)
    backend: str = BACKEND
    servers: tuple[str, ...] = SERVERS

    @property
    def pid(self) -> int:
        assert self.proxy.pid is not None
        return self.proxy.pid

    @property
    def socket_path(self) -> Path:
        return self.proxy.socket_path

    @property
    def stats_address(self) -> str:
        """host:port of the TCP runtime socket."""
        return self.proxy.stats_address

    @property
    def frontend_url(self) -> str:
        return self.proxy.frontend_url

    @property
    def config_path(self) -> Path:
        return self.proxy.config_path

    @property
    def log_path(self) -> Path:
        return self.proxy.log_path

    def command(self, line: str, timeout: float = 5.0) -> str:
        """One runtime API command over the UNIX socket, independent of the code under test."""
        return self.proxy.command(line, timeout)

    def status(self, server: str) -> str:
        """The ``status`` column of ``show stat`` for ``server`` (UP, DOWN, DRAIN, MAINT...)."""
        status = self.proxy.status(server)
        if not status:
            raise AssertionError(f"{server} not in show stat")
        return status

    def request(self, path: str = "/", timeout: float = 5.0) -> str:
        """One request through the frontend on a fresh connection; returns the server that answered."""
        response = httpx.get(self.frontend_url + path, timeout=timeout, trust_env=False)
        response.raise_for_status()
        return response.headers["X-Served-By"]

    def served_by(self, count: int) -> list[str]:
        return [self.request() for _ in range(count)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _ready(instance: RunningHAProxy) -> bool:
    try:
        if any(instance.status(server) != "UP" for server in instance.servers):
            return False
        instance.request("/health", timeout=1.0)
    except (OSError, httpx.HTTPError, AssertionError, IndexError, KeyError):
        return False
    return True


@pytest.fixture
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHAProxy]:
    if shutil.which("haproxy") is None:
        _unavailable("no 'haproxy' on PATH (apt-get install haproxy)")
    # A short directory: UNIX socket paths are limited to 107 bytes.
    directory = tmp_path_factory.mktemp("haproxy")
    backends = {name: BackendServer(name) for name in SERVERS}
    proxy: LocalHAProxy | None = None
    try:
        for backend in backends.values():
            backend.start()
        started = time.monotonic()
        proxy = LocalHAProxy(directory, {name: BackendTarget(b.port) for name, b in backends.items()},
                             backend=BACKEND)
        try:
            proxy.start()
        except RuntimeError as exc:
            pytest.fail(str(exc))
        instance = RunningHAProxy(proxy, backends)
        wait_until(lambda: _ready(instance), timeout=15, message="HAProxy up with both servers UP")
        print(f"haproxy pid {proxy.pid} ready in {time.monotonic() - started:.2f}s")
        yield instance
    finally:
        for backend in backends.values():
            backend.release.set()
        if proxy is not None:
            proxy.stop()
        for backend in backends.values():
            backend.stop()
