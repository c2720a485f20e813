"""What every HTTP route of the simulator shares: ``Server`` (one listening socket, with the connections
a ``refuse`` fault cuts), ``Handler`` (reading bodies, sending answers) and ``_Owner``, what the handlers use
of the ``SimulatorServer`` that owns their socket."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from azuresim.azure import ArmAnswer, AzureModel
from azuresim.graph import ResourceGraph
from azuresim.group import SimulatedGroup
from azuresim.lb_haproxy import HAProxyDataPlane
from azuresim.quiethttp import QuietThreadingHTTPServer
from azuresim.ratelimit import RateLimiter

__all__ = ["Handler", "Server"]

# Every part of the simulator's HTTP front logs under the server's name.
log = logging.getLogger("azuresim.server")

_MAX_BODY = 64 * 1024


class _Owner(Protocol):
    """What the handlers use of the ``SimulatorServer`` (``azuresim.server``) that owns their socket."""

    @property
    def group(self) -> SimulatedGroup: ...

    @property
    def azure(self) -> AzureModel | None: ...

    @property
    def data_plane(self) -> HAProxyDataPlane | None: ...

    @property
    def graph(self) -> ResourceGraph | None: ...

    @property
    def date_skew(self) -> float: ...

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def arm_url(self) -> str: ...

    def limiter(self, vm: str) -> RateLimiter: ...

    def health(self) -> dict[str, Any]: ...


class Server(QuietThreadingHTTPServer):  # a client hanging up is a debug line, not a traceback
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        owner: _Owner,
        vm: str | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.owner = owner
        self.vm = vm
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    # Open connections are tracked so that a `refuse` fault can cut keep-alive connections too.
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections are closed after this many seconds, freeing their thread.
    timeout = 30
    server: Server

    def version_string(self) -> str:
        return "IMDS-simulator"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _read_body(self) -> bytes | None:
        """The request body, or None if it is too large or its length unreadable (connection closed)."""
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else b""

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json; charset=utf-8",
        extra: Mapping[str, str] | None = None,
    ) -> int:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        return status

    def _send_json(self, status: int, data: object, extra: Mapping[str, str] | None = None) -> int:
        return self._send(status, json.dumps(data, separators=(",", ":")).encode(), extra=extra)

    def _send_answer(self, answer: ArmAnswer) -> int | None:
        """Send the Azure model's ``answer`` after its ``delay``; None when nothing was sent: ``drop`` (the
        connection is closed without an answer) or a ``delay`` cut short by the server stopping."""
        if answer.delay > 0 and self.server.owner.stopping.wait(answer.delay):
            self.close_connection = True
            return None
        if answer.drop:  # after the delay, if any: a stalled write's connection is held that long
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if answer.body is None:
            return self._send(answer.status, extra=answer.headers)
        return self._send_json(answer.status, answer.body, extra=answer.headers)
