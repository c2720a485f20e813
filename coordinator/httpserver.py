"""HTTP surface: the load-balancer probe and the admin endpoints, on stdlib threading servers.

Handlers only read: the probe flag, the metrics registry, the last status snapshot, the agent's
liveness and readiness. They never block on the agent loop. A client that hangs up before reading the
answer, or resets its connection while sending its request (health checkers often close right after
the status line), is counted, not reported as an error: no traceback on stderr.

Admin endpoints: ``/metrics``, ``/status``, ``/livez`` (503 once the loop has completed no cycle for too
long), ``/readyz`` (200 once a cycle has completed with a ZooKeeper view and a valid IMDS document), the
probe path, and the application health path (``coordinator.apphealth``: always 200, the state in the
JSON body, for Azure's Application Health extension). The load balancer's probe is on its own listener
and answers the probe path only; the application health endpoint may have a listener of its own too,
which answers its path only.

Both listeners are read-only and face clients nobody vouches for (the probe listens on every address),
so each request is held to small limits before any of it is parsed: GET and HEAD only (405 otherwise),
no body (413), a bounded request line (414) and header block (431), HTTP/1.0 or 1.1 (400 or 505
otherwise), and a whole request head within ``ConnectionLimits.timeout`` seconds, idle keep-alive
included. Each listener serves at most ``ConnectionLimits.connections`` connections at once, and
``connections_per_client`` from one address, so that one slow or hostile client (a slowloris) cannot
starve the load balancer's probe: beyond them a connection is answered 503 at once and closed, without
a thread. Refusals, timeouts and hang-ups are counted, never logged one by one.
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import re
import selectors
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from coordinator.actions.probe import ProbeState
from coordinator.apphealth import Verdict, reason_header
from coordinator.apphealth import body as app_health_body
from coordinator.peers import PHASE_HEADER

__all__ = [
    "APP_HEALTH_REASON_HEADER",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_REQUEST_LINE",
    "ConnectionLimits",
    "HttpSurface",
    "ListenError",
    "admin_exposure_warning",
    "split_host_port",
]

log = logging.getLogger(__name__)

# A probe or a scrape needs a few hundred bytes; these leave room for any honest client and keep what
# one connection can make the agent buffer to about 12 KiB.
MAX_REQUEST_LINE = 4096  # bytes of "METHOD /path HTTP/1.1\r\n": 414 beyond
MAX_HEADERS = 32  # header lines: 431 beyond
MAX_HEADER_BYTES = 8192  # all header lines together: 431 beyond
MAX_CONNECTIONS = 64  # connections served at once by one listener
MAX_CONNECTIONS_PER_CLIENT = 16  # ... from one source address (the load balancer probes from one)
CONNECTION_TIMEOUT = 5.0  # seconds for a request head to arrive whole (idle keep-alive too), and for an answer
ALLOWED_METHODS = ("GET", "HEAD")

_RECEIVE = 4096  # bytes asked of the socket at a time
_DECIMAL = re.compile(r"[0-9]+")  # not str.isdigit: "\xb2" is a digit to it, and no number to int()


def split_host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class ConnectionLimits:
    """Per listener: connections served at once, in all and from one source address, and the seconds a
    connection may take to send a request head or to take its answer."""

    connections: int = MAX_CONNECTIONS
    connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    timeout: float = CONNECTION_TIMEOUT


def admin_exposure_warning(host: str) -> str | None:
    """The warning to log when the admin listener is bound to ``host``, or None on a loopback address.

    The admin endpoints change nothing, but /status names the group's VMs and events and /metrics
    describes the agent: bound beyond loopback, anyone who can reach the port reads them."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a name that is not an address: it was resolved when binding; say what was configured
    return (f"the admin listener is bound to {host}, not a loopback address: /status and /metrics are "
            "readable from the network by anyone who can reach the port (set http.listen to 127.0.0.1:PORT "
            "unless that is intended)")


_Answer = tuple[int, str, bytes, dict[str, str]]  # status, content type, body, extra headers

_HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"Connection: close\r\n\r\nbusy\n")


APP_HEALTH_REASON_HEADER = "X-Coordinator-Health-Reason"


class ListenError(Exception):
    """A listener could not be opened. ``which``: "probe", "admin" or "app_health"; ``address``: as
    configured."""

    def __init__(self, which: str, address: str, cause: OSError) -> None:
        super().__init__(f"cannot listen on {address} ({which}): {cause.strerror or cause}")
        self.which = which
        self.address = address
        self.reason = str(cause.strerror or cause)


class Check(Protocol):
    """A liveness or readiness answer: ``ok`` and a one-line ``detail``; the body leads with ``lead``, else
    with ``ok`` or ``failing``."""

    @property
    def ok(self) -> bool: ...

    @property
    def detail(self) -> str: ...

    @property
    def lead(self) -> str | None: ...


class _Refusal(Exception):
    """A request refused before it is parsed; ``status`` is the answer."""

    def __init__(self, status: HTTPStatus) -> None:
        super().__init__(status.phrase)
        self.status = status


def _parse_head(data: bytes) -> tuple[bytes, bytes, int] | None:
    """Split a request head off the start of ``data``: (request line, header lines up to and including the
    blank line, bytes used), or None while more is needed.

    Raises ``_Refusal`` as soon as ``data`` breaks a limit, or when the request line is not three words
    (HTTP/0.9, garbage): such a request is answered at once, not waited for."""
    end = data.find(b"\n")
    if end < 0:
        if len(data) > MAX_REQUEST_LINE:
            raise _Refusal(HTTPStatus.REQUEST_URI_TOO_LONG)
        return None
    if end + 1 > MAX_REQUEST_LINE:
        raise _Refusal(HTTPStatus.REQUEST_URI_TOO_LONG)
    request_line = data[: end + 1]
    if len(request_line.split()) != 3:
        raise _Refusal(HTTPStatus.BAD_REQUEST)
    start = headers_start = end + 1
    count = 0
    while (end := data.find(b"\n", start)) >= 0:
        line, start = data[start : end + 1], end + 1
        if line in (b"\r\n", b"\n"):
            return request_line, data[headers_start:start], start
        count += 1
        if count > MAX_HEADERS or start - headers_start > MAX_HEADER_BYTES:
            raise _Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    if len(data) - headers_start > MAX_HEADER_BYTES:
        raise _Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    return None


def _body_refusal(command: str, headers: Any) -> tuple[HTTPStatus, dict[str, str]] | None:
    """Why a parsed request is refused: a method other than GET and HEAD, or a body (never read)."""
    if command not in ALLOWED_METHODS:
        return HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": ", ".join(ALLOWED_METHODS)}
    if headers.get("Transfer-Encoding") is not None:
        return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {}
    length = headers.get_all("Content-Length") or []
    if not all(_DECIMAL.fullmatch(value.strip()) for value in length) or len(set(length)) > 1:
        return HTTPStatus.BAD_REQUEST, {}
    if length and int(length[0]) > 0:
        return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {}
    return None


class _Server(ThreadingHTTPServer):
    """A threading server that admits at most ``limits.connections`` connections at once (and
    ``limits.connections_per_client`` from one address); it turns the others away from the accepting
    thread, with a 503 written without blocking, instead of starting a thread for them."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = MAX_CONNECTIONS  # a burst of connections waits for accept(), not for a SYN retry

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 limits: ConnectionLimits) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self.hung_up = 0  # clients that closed before their answer was written
        self.refused = 0  # connections turned away: too many open
        self.timed_out = 0  # connections closed because no whole request head came in time

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        with self._lock:
            admitted = (self._open.total() < self.limits.connections
                        and self._open[client] < self.limits.connections_per_client)
            if admitted:
                self._open[client] += 1
            else:
                self.refused += 1
        if not admitted:
            _turn_away(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the handler's thread
        except BaseException:
            self._release(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def _release(self, client: str) -> None:
        with self._lock:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called by socketserver for an exception out of a handler: logged once, never a raw traceback
        on stderr; a client that hung up is only counted."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _HUNG_UP):
            self.hung_up += 1
            return
        log.warning("HTTP request from %s failed: %r", client_address, exc)


def _turn_away(request: socket.socket) -> None:
    """Write the 503 if the socket takes it at once: the accepting thread must never wait on a client."""
    try:
        request.setblocking(False)
        request.send(_BUSY)
    except OSError:
        pass  # the client is gone or its window is full: closing is answer enough


class HttpSurface:
    """Two listeners: ``probe`` (what the load balancer polls) and ``admin`` (/metrics, /status, /livez,
    /readyz). Raises ``ListenError`` (having closed what it opened) when either cannot listen. Without
    ``probe_listen`` (a dry run: the VM's real agent, or nothing, answers the load balancer) there is no
    probe listener.

    ``live`` and ``ready`` answer ``/livez`` and ``/readyz`` (without them: live, and not ready).
    ``app_health`` answers ``app_health_path`` on the admin listener and, when ``app_health_listen`` is
    given, on a third listener of its own (without it the path is not served).
    ``limits`` bound each listener's connections (see the module's docstring)."""

    def __init__(
        self,
        *,
        probe_listen: str | None,
        probe_path: str,
        admin_listen: str,
        probe: ProbeState,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        phase: Callable[[], str] | None = None,
        live: Callable[[], Check] | None = None,
        ready: Callable[[], Check] | None = None,
        app_health: Callable[[], Verdict] | None = None,
        app_health_path: str = "/apphealth",
        app_health_listen: str | None = None,
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> None:
        self._probe = probe
        self._phase = phase
        self._probe_path = probe_path
        self._registry = registry
        self._status = status
        self._live = live
        self._ready = ready
        self._app_health = app_health
        self._app_health_path = app_health_path
        self._servers: dict[str, _Server] = {}
        listeners = [("probe", probe_listen, self._probe_routes), ("admin", admin_listen, self._admin_routes)]
        if app_health is not None:
            listeners.append(("app_health", app_health_listen, self._app_health_routes))
        for which, listen, routes in listeners:
            if listen is None:
                continue
            try:
                self._servers[which] = _Server(split_host_port(listen), _handler(routes, limits.timeout), limits)
            except OSError as exc:
                for server in self._servers.values():
                    server.server_close()
                raise ListenError(which, listen, exc) from exc
        self._thread: threading.Thread | None = None
        # Wakes the accepting thread to stop: it waits on its listeners with no timeout, never polling.
        self._waker, self._wakee = socket.socketpair()

    def _address(self, which: str) -> tuple[str, int] | None:
        server = self._servers.get(which)
        if server is None:
            return None
        host, port = server.server_address[:2]
        return str(host), int(port)

    @property
    def probe_address(self) -> tuple[str, int] | None:
        """The health probe's listener, if it has one."""
        return self._address("probe")

    @property
    def admin_address(self) -> tuple[str, int]:
        address = self._address("admin")
        assert address is not None  # always listened on
        return address

    @property
    def app_health_address(self) -> tuple[str, int] | None:
        """The application health endpoint's own listener, if it has one."""
        return self._address("app_health")

    @property
    def clients_hung_up(self) -> int:
        return sum(server.hung_up for server in self._servers.values())

    @property
    def connections_refused(self) -> int:
        """Connections answered 503 and closed at once because their listener had too many open."""
        return sum(server.refused for server in self._servers.values())

    @property
    def requests_timed_out(self) -> int:
        """Connections closed because no whole request head arrived in time (stalled, or idle keep-alive)."""
        return sum(server.timed_out for server in self._servers.values())

    @property
    def running(self) -> bool:
        """The listeners' thread is serving (False before ``start`` and after ``stop``)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        warning = admin_exposure_warning(self.admin_address[0])
        if warning is not None:
            log.warning("%s", warning)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Accept on both listeners from one thread, each request then served on a thread of its own (as
        ``serve_forever`` does, without its twice-a-second timeout: an idle agent's listeners wake nothing)."""
        with selectors.DefaultSelector() as selector:
            for server in self._servers.values():
                selector.register(server, selectors.EVENT_READ, server)
            selector.register(self._wakee, selectors.EVENT_READ, None)
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    key.data._handle_request_noblock()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._waker.send(b"x")
            thread.join()
        for server in self._servers.values():
            server.server_close()
        self._waker.close()
        self._wakee.close()

    def _probe_routes(self, path: str) -> _Answer:
        if path != self._probe_path:
            return 404, "text/plain", b"not found\n", {}
        # The agent's phase goes with every answer: peers count this VM as in rotation only while it
        # says "serving" (see coordinator.peers); the load balancer looks at the status alone.
        phase = self._phase() if self._phase is not None else None
        headers = {PHASE_HEADER: phase} if phase is not None else {}
        if self._probe.serving:
            return 200, "text/plain", b"serving\n", headers
        # The body says what the header says: "unknown" while starting, before a document cleared the VM.
        return 503, "text/plain", f"{phase or 'draining'}\n".encode(), headers

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
        if path == self._app_health_path and self._app_health is not None:
            return self._app_health_routes(path)
        return 404, "text/plain", b"not found\n", {}

    def _app_health_routes(self, path: str) -> _Answer:
        if path != self._app_health_path or self._app_health is None:
            return 404, "text/plain", b"not found\n", {}
        # 200 whatever the state: the extension reads any other status as Unknown, which repairs treat as
        # Unhealthy; the state is in the body, why in a header for people (the body stays as documented).
        verdict = self._app_health()
        return 200, "application/json", app_health_body(verdict), {APP_HEALTH_REASON_HEADER: reason_header(verdict)}

    @staticmethod
    def _check(check: Callable[[], Check] | None, *, default_ok: bool) -> _Answer:
        lead: str | None = None
        if check is None:
            ok, detail = default_ok, "no agent to ask"
        else:
            answer = check()
            ok, detail, lead = answer.ok, answer.detail, answer.lead
        return (200 if ok else 503), "text/plain", f"{lead or ('ok' if ok else 'failing')}: {detail}\n".encode(), {}


def _handler(routing: Callable[[str], _Answer], timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(_LimitedHandler):
        routes = staticmethod(routing)
        deadline_seconds = timeout

    return Handler


class _LimitedHandler(BaseHTTPRequestHandler):
    """Reads each request head itself, straight from the socket, against a deadline and the size limits,
    then lets the stdlib parse it; answers GET and HEAD through ``routes``, everything else with an error
    status and a closed connection (an unread body must never be taken for the next request)."""

    protocol_version = "HTTP/1.1"
    routes: Callable[[str], _Answer]
    deadline_seconds: float  # for a request head to arrive whole, and for an answer to be taken

    def setup(self) -> None:
        super().setup()
        self._pending = b""  # bytes received after the last request head (a pipelined request)

    def handle_one_request(self) -> None:
        self.close_connection = True
        self.request_version = self.protocol_version  # error answers are HTTP/1.1, whatever came in
        self.command, self.requestline = "", ""
        try:
            head = self._read_head()
        except _Refusal as refusal:
            self._answer(refusal.status, b"", {})
            return
        except TimeoutError:
            self._count("timed_out")
            return
        except _HUNG_UP:
            self._count("hung_up")
            return
        if head is None:
            return  # closed between requests
        self.raw_requestline, header_block = head
        socket_file, self.rfile = self.rfile, io.BytesIO(header_block)
        try:
            if not self.parse_request():
                return
        finally:
            self.rfile = socket_file
        refused = _body_refusal(self.command, self.headers)
        if refused is not None:
            self.close_connection = True
            self._answer(refused[0], b"", refused[1])
            return
        try:
            status, ctype, body, headers = self.routes(self.path.split("?", 1)[0])
        except Exception:
            log.exception("HTTP handler failed for %r", self.path[:200])
            status, ctype, body, headers = 500, "text/plain", b"internal error\n", {}
        self._answer(status, body, headers, ctype)

    def _read_head(self) -> tuple[bytes, bytes] | None:
        """The next request's line and header block, within the deadline; None if the client closed
        before sending a byte. Raises ``TimeoutError``, ``_Refusal`` or a hang-up error."""
        deadline = time.monotonic() + self.deadline_seconds
        data = self._pending
        while (head := _parse_head(data)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no whole request head in time")
            self.connection.settimeout(remaining)
            chunk = self.connection.recv(_RECEIVE)
            if not chunk:
                return None
            data += chunk
        request_line, header_block, used = head
        self._pending = data[used:]
        return request_line, header_block

    def _answer(self, status: int, body: bytes, headers: dict[str, str], ctype: str = "text/plain") -> None:
        if status >= 400 and not body:
            body = f"{status} {HTTPStatus(status).phrase}\n".encode()
        if self.close_connection:
            headers = {**headers, "Connection": "close"}
        self.connection.settimeout(self.deadline_seconds)  # a client that does not read is given up on
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except _HUNG_UP:
            self.close_connection = True
            self._count("hung_up")
        except TimeoutError:
            self.close_connection = True
            self._count("timed_out")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's parser reports here (400, 505, 431): a short plain answer that never echoes
        the request back, and the connection closed."""
        self.close_connection = True
        self.request_version = self.protocol_version  # the parser may have left HTTP/0.9: no status line
        self._answer(code, b"", {})

    def handle_expect_100(self) -> bool:
        return True  # no body is ever read, so none is invited; the request is refused if it has one

    def _count(self, what: str) -> None:
        if isinstance(self.server, _Server):
            setattr(self.server, what, getattr(self.server, what) + 1)

    def version_string(self) -> str:
        return "coordinator"  # the Python version is nobody's business

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return  # probes arrive every few seconds; access logs would drown the agent's own

    def log_message(self, format: str, *args: Any) -> None:
        return
