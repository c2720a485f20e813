"""HTTP surface: the load-balancer probe and the admin endpoints, on stdlib threading servers.

Handlers only read: the probe flag, the metrics registry, the last status snapshot, the agent's
liveness and readiness. They never block on the agent loop. A client that hangs up before reading the
answer, or resets its connection while sending its request (health checkers often close right after
the status line), is counted, not reported as an error: no traceback on stderr.

Admin endpoints: ``/metrics``, ``/status``, ``/livez`` (503 once the loop has completed no cycle for too
long), ``/readyz`` (200 once a cycle has completed with a ZooKeeper view and a valid IMDS document), and
the probe path. The load balancer's probe is on its own listener and answers the probe path only.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from coordinator.actions.probe import ProbeState
from coordinator.peers import PHASE_HEADER

__all__ = ["HttpSurface", "ListenError", "split_host_port"]

log = logging.getLogger(__name__)


def split_host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


_Answer = tuple[int, str, bytes, dict[str, str]]  # status, content type, body, extra headers

_HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class ListenError(Exception):
    """A listener could not be opened. ``which``: "probe" or "admin"; ``address``: as configured."""

    def __init__(self, which: str, address: str, cause: OSError) -> None:
        super().__init__(f"cannot listen on {address} ({which}): {cause.strerror or cause}")
        self.which = which
        self.address = address
        self.reason = str(cause.strerror or cause)


class Check(Protocol):
    """A liveness or readiness answer: ``ok`` and a one-line ``detail``."""

    @property
    def ok(self) -> bool: ...

    @property
    def detail(self) -> str: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    hung_up = 0  # clients that closed before their answer was written

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called by socketserver for an exception out of a handler: logged once, never a raw traceback
        on stderr; a client that hung up is only counted."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _HUNG_UP):
            self.hung_up += 1
            return
        log.warning("HTTP request from %s failed: %r", client_address, exc)


class HttpSurface:
    """Two listeners: ``probe`` (what the load balancer polls) and ``admin`` (/metrics, /status, /livez,
    /readyz). Raises ``ListenError`` (having closed what it opened) when either cannot listen.

    ``live`` and ``ready`` answer ``/livez`` and ``/readyz`` (without them: live, and not ready)."""

    def __init__(
        self,
        *,
        probe_listen: str,
        probe_path: str,
        admin_listen: str,
        probe: ProbeState,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        phase: Callable[[], str] | None = None,
        live: Callable[[], Check] | None = None,
        ready: Callable[[], Check] | None = None,
    ) -> None:
        self._probe = probe
        self._phase = phase
        self._probe_path = probe_path
        self._registry = registry
        self._status = status
        self._live = live
        self._ready = ready
        self._servers: list[_Server] = []
        for which, listen, routes in (("probe", probe_listen, self._probe_routes),
                                      ("admin", admin_listen, self._admin_routes)):
            try:
                self._servers.append(_Server(split_host_port(listen), self._handler(routes)))
            except OSError as exc:
                for server in self._servers:
                    server.server_close()
                raise ListenError(which, listen, exc) from exc
        self._threads: list[threading.Thread] = []

    @property
    def probe_address(self) -> tuple[str, int]:
        host, port = self._servers[0].server_address[:2]
        return str(host), int(port)

    @property
    def clients_hung_up(self) -> int:
        return sum(server.hung_up for server in self._servers)

    @property
    def admin_address(self) -> tuple[str, int]:
        host, port = self._servers[1].server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _probe_routes(self, path: str) -> _Answer:
        if path != self._probe_path:
            return 404, "text/plain", b"not found\n", {}
        # The agent's phase goes with every answer: peers count this VM as in rotation only while it
        # says "serving" (see coordinator.peers); the load balancer looks at the status alone.
        headers = {PHASE_HEADER: self._phase()} if self._phase is not None else {}
        if self._probe.serving:
            return 200, "text/plain", b"serving\n", headers
        return 503, "text/plain", b"draining\n", headers

    def _admin_routes(self, path: str) -> _Answer:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry), {}
        if path == "/status":
            body = json.dumps(self._status(), indent=2, sort_keys=True).encode()
            return 200, "application/json", body + b"\n", {}
        if path == "/livez":
            return self._check(self._live, default_ok=True)
        if path == "/readyz":
            return self._check(self._ready, default_ok=False)
        if path == self._probe_path:
            return self._probe_routes(path)
        return 404, "text/plain", b"not found\n", {}

    @staticmethod
    def _check(check: Callable[[], Check] | None, *, default_ok: bool) -> _Answer:
        if check is None:
            ok, detail = default_ok, "no agent to ask"
        else:
            answer = check()
            ok, detail = answer.ok, answer.detail
        return (200 if ok else 503), "text/plain", f"{'ok' if ok else 'failing'}: {detail}\n".encode(), {}

    @staticmethod
    def _handler(routes: Callable[[str], _Answer]) -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                try:
                    status, ctype, body, headers = routes(self.path.split("?", 1)[0])
                except Exception:
                    log.exception("HTTP handler failed for %s", self.path)
                    status, ctype, body, headers = 500, "text/plain", b"internal error\n", {}
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except _HUNG_UP:
                    self.close_connection = True
                    if isinstance(self.server, _Server):
                        self.server.hung_up += 1

            do_HEAD = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes arrive every few seconds; access logs would drown the agent's own

        return Handler
