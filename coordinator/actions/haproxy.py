"""Drain one HAProxy server through the runtime API (the "stats socket" with ``level admin``).

``HAProxyRuntime`` is a small client: one command per connection (HAProxy answers and closes), over a
UNIX socket or TCP, every call bounded by ``timeout``. ``HAProxyAction`` uses it to take a server out of
rotation before maintenance and put it back afterwards:

* drain: ``set server B/S state drain`` (no new sessions; existing ones finish), then poll ``show stat``
  until the server's current sessions (``scur``) reach 0 or ``drain_timeout`` passes, then optionally
  ``set server B/S state maint``;
* recover: once the VM's own probe serves again (``recover_after_probe``: the agent recovers this action
  after the probe), out of maintenance into ``drain`` (health checks run again), then wait until HAProxy's
  health checks report the server up, then ``set server B/S state ready``. Setting it ready while its
  checks still fail would leave it down (HAProxy warns of exactly that); the wait is bounded by
  ``recover_timeout``, after which it is set ready all the same, with a warning: a server is never left
  in drain or maintenance by a recovery.

Runtime API reference: https://docs.haproxy.org/2.6/management.html#9.3 (``set server``, ``show stat``,
``show servers state``). ``show stat <proxy> <type> <sid>`` with a proxy name needs HAProxy 1.8 or later.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from coordinator.actions.base import ActionContext
from coordinator.errors import ActionError

__all__ = ["HAProxyAction", "HAProxyRuntime", "ServerState"]

log = logging.getLogger(__name__)

AdminState = Literal["ready", "drain", "maint"]
_STATES: frozenset[str] = frozenset({"ready", "drain", "maint"})

# Proxy and server names as HAProxy accepts them in its configuration. Anything else (spaces, ';' which
# separates commands on one line, newlines) could smuggle a second command into the runtime API.
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")

# srv_admin flags from HAProxy's include/haproxy/server-t.h: FMAINT 0x01, IMAINT 0x02, RMAINT 0x20 form
# the "in maintenance" mask (CMAINT 0x04 only remembers the "disabled" keyword); FDRAIN 0x08 and
# IDRAIN 0x10 the "draining" mask.
_ADMF_MAINT = 0x23
_ADMF_DRAIN = 0x18
_OPERATIONAL = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}

#: ``show stat`` statuses of a server whose health checks pass (or that has none), whatever its admin state.
_CHECKS_UP = frozenset({"UP", "DRAIN", "no check"})

_MAX_ANSWER = 16 * 1024 * 1024  # "show stat" of a large configuration is a few MB at most


@dataclass(frozen=True)
class ServerState:
    """One server as ``show servers state`` reports it.

    ``admin`` is the administrative state set through the runtime API ("ready", "drain" or "maint",
    inherited states included); ``operational`` is what health checks say ("stopped", "starting",
    "running", "stopping", or "unknown(N)"); ``admin_flags`` the raw ``srv_admin_state`` bits.
    """

    backend: str
    server: str
    admin: AdminState
    operational: str
    admin_flags: int
    weight: int


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{kind} name must match {_NAME.pattern}, got {value!r}")
    return value


def _excerpt(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


class HAProxyRuntime:
    """Client of HAProxy's runtime API.

    ``address`` is a UNIX socket path (``/run/haproxy/admin.sock``, ``unix:/path``, any ``os.PathLike``)
    or a TCP endpoint (``127.0.0.1:9999``, ``[::1]:9999``, ``tcp:host:port``). A string with no ``:``
    is a path. Each command opens its own connection; ``timeout`` (seconds) bounds connecting, sending
    and reading the whole answer together.

    Every method raises ``ActionError`` when HAProxy cannot be reached, does not answer in time, or
    refuses the command (the message includes HAProxy's answer, e.g. ``No such server.``), and
    ``ValueError`` for a backend or server name HAProxy would not accept (a caller bug). Nothing is
    retried here: the caller decides.
    """

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

    # -- raw commands ------------------------------------------------------------------------------------

    def execute(self, command: str) -> str:
        """Send one command and return HAProxy's whole answer (decoded, as sent).

        Raises ``ActionError`` if the socket cannot be reached or the answer does not complete within
        ``timeout``; ``ValueError`` if ``command`` spans several lines. The answer is not interpreted:
        the typed methods below do that.
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
                        raise ActionError(f"HAProxy at {self.address} answered more than {_MAX_ANSWER} bytes")
        except TimeoutError:
            raise ActionError(
                f"HAProxy runtime API at {self.address} did not answer {command!r} within {self._timeout:g} s"
            ) from None
        except OSError as exc:
            raise ActionError(f"HAProxy runtime API at {self.address} unreachable: {exc}") from exc
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

    # -- typed operations --------------------------------------------------------------------------------

    def set_state(self, backend: str, server: str, state: AdminState) -> None:
        """``set server <backend>/<server> state <state>``; idempotent on HAProxy's side.

        HAProxy answers nothing on success; any answer (``No such server.``, ``No such backend.``,
        ``Permission denied``...) raises ``ActionError`` quoting it.
        """
        _check_name("backend", backend)
        _check_name("server", server)
        if state not in _STATES:
            raise ValueError(f"state must be one of {sorted(_STATES)}, got {state!r}")
        command = f"set server {backend}/{server} state {state}"
        answer = self.execute(command)
        if answer.strip():
            raise ActionError(f"HAProxy at {self.address} refused {command!r}: {_excerpt(answer)}")

    def server_stats(self, backend: str, server: str) -> dict[str, str]:
        """The server's row of ``show stat`` as a mapping from CSV column (``scur``, ``status``...) to text.

        Raises ``ActionError`` if HAProxy refuses (``No such proxy.``) or has no such server.
        """
        _check_name("backend", backend)
        _check_name("server", server)
        # Type 4 = servers only; -1 = every server of that proxy.
        command = f"show stat {backend} 4 -1"
        answer = self.execute(command)
        if not answer.startswith("# "):
            raise ActionError(f"HAProxy at {self.address} refused {command!r}: {_excerpt(answer)}")
        lines = answer[2:].splitlines()
        for row in csv.DictReader(line for line in lines if line.strip()):
            if row.get("pxname") == backend and row.get("svname") == server:
                return {k: v or "" for k, v in row.items() if k}
        raise self._missing(backend, server)

    def current_sessions(self, backend: str, server: str) -> int:
        """Current sessions on the server (``show stat`` column ``scur``). Raises ``ActionError``."""
        value = self.server_stats(backend, server).get("scur", "")
        try:
            return int(value)
        except ValueError:
            raise ActionError(
                f"HAProxy at {self.address} reported a non-numeric scur {value!r} for {backend}/{server}"
            ) from None

    def server_state(self, backend: str, server: str) -> ServerState:
        """The server's administrative and operational state from ``show servers state <backend>``.

        Raises ``ActionError`` if HAProxy refuses (``Can't find backend.``), has no such server (the
        message then quotes HAProxy's ``No such server.``), or answers in a format this client does not
        know.
        """
        _check_name("backend", backend)
        _check_name("server", server)
        command = f"show servers state {backend}"
        answer = self.execute(command)
        lines = answer.splitlines()
        # Format version 1: a "1" line, a "# be_id be_name ..." header, then one row per server.
        if len(lines) < 2 or lines[0].strip() != "1" or not lines[1].startswith("# "):
            raise ActionError(f"HAProxy at {self.address} refused {command!r}: {_excerpt(answer)}")
        header = lines[1][2:].split()
        for line in lines[2:]:
            row = dict(zip(header, line.split(), strict=False))
            if row.get("be_name") != backend or row.get("srv_name") != server:
                continue
            try:
                flags = int(row["srv_admin_state"])
                op = int(row["srv_op_state"])
                weight = int(row.get("srv_uweight", "0"))
            except (KeyError, ValueError):
                raise ActionError(
                    f"HAProxy at {self.address} answered an unexpected row to {command!r}: {_excerpt(line)}"
                ) from None
            admin: AdminState = "maint" if flags & _ADMF_MAINT else "drain" if flags & _ADMF_DRAIN else "ready"
            return ServerState(
                backend=backend,
                server=server,
                admin=admin,
                operational=_OPERATIONAL.get(op, f"unknown({op})"),
                admin_flags=flags,
                weight=weight,
            )
        raise self._missing(backend, server)

    def _missing(self, backend: str, server: str) -> ActionError:
        # Not listed: ask a read-only command that names the problem in HAProxy's own words.
        answer = self.execute(f"get weight {backend}/{server}")
        return ActionError(
            f"HAProxy at {self.address} has no server {backend}/{server}: {_excerpt(answer) or 'not listed'}"
        )


class HAProxyAction:
    """Drain (and recover) one HAProxy server.

    drain: unless the server is already in maintenance, ``state drain``; then poll ``scur`` every
    ``poll_interval`` seconds until it is 0 or ``drain_timeout`` seconds (measured with ``clock``) have
    passed; then, if ``use_maint``, ``state maint``. Running out of time is logged as a warning and the
    drain still succeeds, unless ``fail_on_timeout`` is set, in which case it raises ``ActionError``
    (and the server stays draining). A server already in maintenance is not moved back to drain: that
    would reopen it to persistent sessions.

    recover: out of maintenance into drain, wait (at most ``recover_timeout`` seconds, polling every
    ``poll_interval``) until HAProxy's health checks report the server up, then ``state ready``; a warning
    is logged if they still report it down then. Recovered after the health probe (``recover_after_probe``):
    HAProxy's check of the server is commonly that probe.

    Both are idempotent. Any runtime API failure raises ``ActionError`` at once; nothing is retried
    here (the agent retries recovery, and an unfinished drain is never acknowledged).
    """

    always_recover = False

    def __init__(
        self,
        runtime: HAProxyRuntime,
        backend: str,
        server: str,
        *,
        drain_timeout: float,
        use_maint: bool = False,
        poll_interval: float = 1.0,
        fail_on_timeout: bool = False,
        recover_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        name: str = "haproxy",
    ) -> None:
        _check_name("backend", backend)
        _check_name("server", server)
        if not (drain_timeout >= 0 and math.isfinite(drain_timeout)):
            raise ValueError(f"drain_timeout must be a non-negative number, got {drain_timeout!r}")
        if not (recover_timeout >= 0 and math.isfinite(recover_timeout)):
            raise ValueError(f"recover_timeout must be a non-negative number, got {recover_timeout!r}")
        if not (poll_interval > 0 and math.isfinite(poll_interval)):
            raise ValueError(f"poll_interval must be a positive number, got {poll_interval!r}")
        self.name = name
        self._runtime = runtime
        self._backend = backend
        self._server = server
        self._drain_timeout = float(drain_timeout)
        self._use_maint = use_maint
        self._poll_interval = float(poll_interval)
        self._fail_on_timeout = fail_on_timeout
        self._recover_timeout = float(recover_timeout)
        self._clock = clock
        self._sleep = sleep

    #: Recovered after the VM's health probe serves again (see ``coordinator.actions.base.run_recover``):
    #: HAProxy's health check of the server is commonly that probe, and must pass before the server is ready.
    recover_after_probe = True

    @property
    def target(self) -> str:
        return f"{self._backend}/{self._server}"

    def drain(self, ctx: ActionContext) -> None:
        state = self._runtime.server_state(self._backend, self._server)
        if state.admin == "maint":
            log.info(
                "haproxy %s already in maintenance; not moving it back to drain (vm=%s events=%s)",
                self.target,
                ctx.vm,
                ctx.event_ids,
            )
        else:
            self._runtime.set_state(self._backend, self._server, "drain")
            log.info("haproxy %s set to drain (vm=%s events=%s)", self.target, ctx.vm, ctx.event_ids)
        self._wait_for_sessions(ctx)
        if self._use_maint and state.admin != "maint":
            self._runtime.set_state(self._backend, self._server, "maint")
            log.info("haproxy %s set to maint (vm=%s events=%s)", self.target, ctx.vm, ctx.event_ids)

    def _wait_for_sessions(self, ctx: ActionContext) -> None:
        started = self._clock()
        deadline = started + self._drain_timeout
        while True:
            sessions = self._runtime.current_sessions(self._backend, self._server)
            now = self._clock()
            if sessions == 0:
                log.info(
                    "haproxy %s has no sessions left after %.1f s (vm=%s events=%s)",
                    self.target,
                    now - started,
                    ctx.vm,
                    ctx.event_ids,
                )
                return
            if now >= deadline:
                message = (
                    f"haproxy {self.target} still has {sessions} session(s) after the drain timeout of "
                    f"{self._drain_timeout:g} s"
                )
                if self._fail_on_timeout:
                    raise ActionError(message)
                log.warning("%s; continuing (vm=%s events=%s)", message, ctx.vm, ctx.event_ids)
                return
            log.debug("haproxy %s: %d session(s) left (vm=%s)", self.target, sessions, ctx.vm)
            self._sleep(min(self._poll_interval, deadline - now))

    def recover(self, ctx: ActionContext) -> None:
        state = self._runtime.server_state(self._backend, self._server)
        if state.admin == "maint":
            # Health checks do not run in maintenance: drain lets them run, still without new sessions.
            self._runtime.set_state(self._backend, self._server, "drain")
            log.info("haproxy %s out of maintenance, draining until its health checks pass (vm=%s)",
                     self.target, ctx.vm)
        status = self._wait_for_checks(ctx) if state.admin != "ready" else ""
        self._runtime.set_state(self._backend, self._server, "ready")
        if status and status not in _CHECKS_UP:
            log.warning("haproxy %s set to ready although its health checks still report it %s after %g s "
                        "(vm=%s): HAProxy routes to it once they pass", self.target, status, self._recover_timeout,
                        ctx.vm)
        else:
            log.info("haproxy %s set to ready (vm=%s)", self.target, ctx.vm)

    def _wait_for_checks(self, ctx: ActionContext) -> str:
        """Until HAProxy's health checks report the server fully up, or ``recover_timeout`` passes; returns
        the last ``status`` of ``show stat``. Leaving maintenance, HAProxy counts a server up on no check at
        all ("DRAIN 1/2": one failed check from down): only a passing check makes it "DRAIN" or "UP"."""
        started = self._clock()
        deadline = started + self._recover_timeout
        while True:
            status = self._runtime.server_stats(self._backend, self._server).get("status", "")
            now = self._clock()
            if status in _CHECKS_UP:
                log.info("haproxy %s: health checks report it up after %.1f s (vm=%s)", self.target,
                         now - started, ctx.vm)
                return status
            if now >= deadline:
                return status
            log.debug("haproxy %s: %s, waiting for its health checks (vm=%s)", self.target, status, ctx.vm)
            self._sleep(min(self._poll_interval, deadline - now))
