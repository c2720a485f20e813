"""A client of HAProxy's runtime API, for the simulated load balancer's data plane (``--lb-haproxy``).

The simulator drives HAProxy as Azure's data plane would, with its own small client: one command per
connection, HAProxy's whole answer back. ``address`` is a UNIX socket path (``/run/haproxy/admin.sock``,
``unix:/path``, any ``os.PathLike``) or a TCP endpoint (``127.0.0.1:9999``, ``[::1]:9999``,
``tcp:host:port``); a string with no ``:`` is a path.
"""

from __future__ import annotations

import math
import os
import socket
import time

from azuresim.errors import SimulatorError

__all__ = ["HAProxyRuntime", "HAProxyUnreachable"]

_MAX_ANSWER = 16 * 1024 * 1024


class HAProxyUnreachable(SimulatorError):
    """HAProxy's runtime API cannot be reached, or does not answer in time."""


class HAProxyRuntime:
    """One command at a time to HAProxy's runtime API; ``timeout`` (seconds) bounds connecting, sending and
    reading the whole answer together. Raises ``ValueError`` for a malformed address."""

    def __init__(self, address: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number, got {timeout!r}")
        self._timeout = float(timeout)
        self._unix_path: str | None = None
        self._tcp: tuple[str, int] | None = None
        if isinstance(address, os.PathLike):
            self._unix_path = os.fspath(address)
        elif isinstance(address, str) and address:
            self._parse_address(address)
        else:
            raise ValueError(f"address must be a socket path or host:port, got {address!r}")

    def _parse_address(self, address: str) -> None:
        if address.startswith("unix:"):
            path = address[len("unix:") :]
            if not path:
                raise ValueError(f"empty UNIX socket path in {address!r}")
            self._unix_path = path
            return
        text = address[len("tcp:") :] if address.startswith("tcp:") else address
        if not address.startswith("tcp:") and (":" not in text or text.startswith(("/", "."))):
            self._unix_path = text
            return
        host, sep, port_text = text.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"TCP runtime address must be host:port, got {address!r}")
        self._tcp = (host, int(port_text))

    @property
    def address(self) -> str:
        """The address in a form fit for log lines."""
        if self._unix_path is not None:
            return f"unix:{self._unix_path}"
        assert self._tcp is not None
        host, port = self._tcp
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def execute(self, command: str) -> str:
        """Send one command (one line) and return HAProxy's whole answer, uninterpreted.

        Raises ``HAProxyUnreachable`` if the socket cannot be reached or the answer does not complete within
        ``timeout``; ``ValueError`` if ``command`` is not one non-empty line.
        """
        if not command.strip() or "\n" in command or "\r" in command:
            raise ValueError(f"a runtime API command is one non-empty line, got {command!r}")
        deadline = time.monotonic() + self._timeout
        try:
            with self._connect() as sock:
                sock.sendall(command.encode() + b"\n")
                chunks: list[bytes] = []
                size = 0
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    sock.settimeout(remaining)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > _MAX_ANSWER:
                        raise HAProxyUnreachable(f"HAProxy at {self.address} answered more than {_MAX_ANSWER} bytes")
        except TimeoutError:
            raise HAProxyUnreachable(
                f"HAProxy runtime API at {self.address} did not answer {command!r} within {self._timeout:g} s"
            ) from None
        except OSError as exc:
            raise HAProxyUnreachable(f"HAProxy runtime API at {self.address} unreachable: {exc}") from exc
        return b"".join(chunks).decode("utf-8", "replace")

    def _connect(self) -> socket.socket:
        if self._unix_path is not None:
            family = getattr(socket, "AF_UNIX", None)
            if family is None:  # Python on Windows has no AF_UNIX
                raise OSError("UNIX sockets are not available on this system: use a TCP address (host:port)")
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self._timeout)
                sock.connect(self._unix_path)
            except BaseException:
                sock.close()
                raise
            return sock
        assert self._tcp is not None
        return socket.create_connection(self._tcp, timeout=self._timeout)
