"""Wait for established TCP connections to the VM's service ports to end before maintenance.

Once the load-balancer probe fails, Azure Load Balancer sends no *new* flows to the VM, but existing
ones continue (https://learn.microsoft.com/azure/load-balancer/load-balancer-custom-probe-overview).
``ConnectionsDrainedWait`` is the action that waits for those to finish: it counts ESTABLISHED sockets
whose *local* port is one of the service ports until there are none or its deadline passes. On Linux
it reads them from the kernel's tables ``/proc/net/tcp`` and ``/proc/net/tcp6`` (cheap, and readable
under the systemd unit's ``ProtectProc=invisible``); on every other system (Windows) from
``psutil.net_connections(kind="tcp")``.

Place it after the probe action: the probe stops new flows, this waits for the old ones.
``probe_wait_seconds`` gives the time the load balancer needs to notice the failing probe.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.actions.base import ActionContext
from coordinator.errors import ActionError

__all__ = [
    "AZURE_LB_PROBE_INTERVAL",
    "AZURE_LB_PROBE_THRESHOLD",
    "ConnectionsDrainedWait",
    "TcpSocket",
    "count_established",
    "established_ports_proc",
    "established_ports_psutil",
    "established_ports_source",
    "parse_proc_net_tcp",
    "probe_wait_seconds",
    "read_proc_net_tcp",
]

log = logging.getLogger(__name__)

# Azure Load Balancer health probe defaults: intervalInSeconds 15 (minimum 5) and 2 consecutive failures
# (numberOfProbes, now probeThreshold) before an instance is taken out of rotation.
# https://learn.microsoft.com/rest/api/load-balancer/load-balancers/create-or-update (ProbePropertiesFormat)
AZURE_LB_PROBE_INTERVAL = 15.0
AZURE_LB_PROBE_THRESHOLD = 2

TCP_ESTABLISHED = 0x01  # include/net/tcp_states.h
_PROC_FILES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def probe_wait_seconds(
    interval: float = AZURE_LB_PROBE_INTERVAL, threshold: int = AZURE_LB_PROBE_THRESHOLD, grace: float = 0.0
) -> float:
    """Worst-case seconds between the probe starting to fail and the load balancer sending no new flows.

    The last successful probe may have happened just before the probe endpoint started failing; the
    load balancer then needs ``threshold`` failed probes, ``interval`` seconds apart, the first one up
    to ``interval`` seconds later: ``interval * threshold``. ``grace`` is added for the load balancer's
    own propagation and clock differences. With Azure's defaults (15 s, 2) that is 30 s + grace.
    """
    if not (interval > 0 and math.isfinite(interval)):
        raise ValueError(f"interval must be a positive number, got {interval!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a positive integer, got {threshold!r}")
    if not (grace >= 0 and math.isfinite(grace)):
        raise ValueError(f"grace must be a non-negative number, got {grace!r}")
    return float(interval) * threshold + float(grace)


@dataclass(frozen=True)
class TcpSocket:
    """One row of ``/proc/net/tcp{,6}``: addresses as the kernel prints them (hex), ports decoded."""

    local_address: str
    local_port: int
    remote_address: str
    remote_port: int
    state: int

    @property
    def established(self) -> bool:
        return self.state == TCP_ESTABLISHED


def _split_endpoint(text: str, line: str) -> tuple[str, int]:
    address, sep, port = text.rpartition(":")
    if not sep or len(address) not in (8, 32) or len(port) != 4:
        raise ValueError(f"malformed address {text!r} in /proc/net/tcp line {line.strip()!r}")
    int(address, 16)  # validates the hex digits
    return address, int(port, 16)


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """Parse the content of ``/proc/net/tcp`` or ``/proc/net/tcp6``.

    The first line is the header; each further line is ``sl: local rem st ...`` where ``local`` and
    ``rem`` are ``HEXADDR:HEXPORT`` (8 hex digits for IPv4, 32 for IPv6) and ``st`` the state in hex.
    Blank lines are ignored. Raises ``ValueError`` on a line that does not have that shape.
    """
    sockets: list[TcpSocket] = []
    lines = text.splitlines()
    if lines and "local_address" not in lines[0]:
        raise ValueError(f"not a /proc/net/tcp table: first line is {lines[0].strip()!r}")
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 4 or not fields[0].endswith(":"):
            raise ValueError(f"malformed /proc/net/tcp line {line.strip()!r}")
        local, local_port = _split_endpoint(fields[1], line)
        remote, remote_port = _split_endpoint(fields[2], line)
        try:
            state = int(fields[3], 16)
        except ValueError:
            raise ValueError(f"malformed state in /proc/net/tcp line {line.strip()!r}") from None
        sockets.append(TcpSocket(local, local_port, remote, remote_port, state))
    return sockets


def count_established(tables: Iterable[str], ports: Collection[int]) -> int:
    """Number of ESTABLISHED sockets, over all ``tables``, whose local port is in ``ports``."""
    wanted = frozenset(ports)
    return sum(
        1 for text in tables for sock in parse_proc_net_tcp(text) if sock.established and sock.local_port in wanted
    )


def read_proc_net_tcp() -> list[str]:
    """The text of ``/proc/net/tcp`` and ``/proc/net/tcp6``; a missing one (IPv6 disabled) is skipped.

    Raises ``OSError`` if neither can be read.
    """
    tables: list[str] = []
    errors: list[str] = []
    for path in _PROC_FILES:
        try:
            tables.append(path.read_text(encoding="ascii"))
        except FileNotFoundError as exc:
            errors.append(f"{path}: {exc.strerror}")
    if not tables:
        raise FileNotFoundError(f"no TCP socket table readable ({'; '.join(errors)})")
    return tables


def established_ports_proc(reader: Callable[[], Iterable[str]] = read_proc_net_tcp) -> list[int]:
    """The local port of every ESTABLISHED socket in the tables ``reader`` returns (Linux).

    Raises ``OSError`` from the reader and ``ValueError`` for a table that does not parse."""
    return [sock.local_port for text in reader() for sock in parse_proc_net_tcp(text) if sock.established]


def established_ports_psutil(psutil: Any) -> list[int]:
    """The local port of every ESTABLISHED TCP socket (IPv4 and IPv6) as ``psutil.net_connections``
    lists them (any system psutil supports). ``psutil`` is the module or a fake with
    ``net_connections``, ``CONN_ESTABLISHED`` and ``Error``.

    Raises ``OSError`` when psutil cannot list them (``AccessDenied`` and the like are not ``OSError``)."""
    try:
        rows = psutil.net_connections(kind="tcp")
    except psutil.Error as exc:
        raise OSError(f"psutil.net_connections: {exc!r}") from exc
    return [int(row.laddr[1]) for row in rows if row.status == psutil.CONN_ESTABLISHED and row.laddr]


def established_ports_source(system: str | None = None, psutil: Any = None) -> Callable[[], Iterable[int]]:
    """The source of this system's established local ports: the ``/proc`` tables on Linux, psutil
    elsewhere (imported when not given; it is a dependency on every system but Linux)."""
    if (sys.platform if system is None else system).startswith("linux"):
        return established_ports_proc
    if psutil is None:
        import psutil as psutil_module

        psutil = psutil_module
    ps = psutil
    return lambda: established_ports_psutil(ps)


class ConnectionsDrainedWait:
    """An action whose drain waits until no ESTABLISHED connection has a local port in ``ports``.

    ``deadline`` is the longest wait in seconds, measured with ``clock`` from the start of the drain;
    reaching it is logged as a warning and is not a failure (the VM is drained as far as it will be).
    The sockets are listed again every ``poll_interval`` seconds through ``established`` (the local port
    of each established socket; default: ``established_ports_source()`` of this system). A failure to
    list or parse them (``OSError``, ``ValueError``) raises ``ActionError``. Recover does nothing.
    """

    always_recover = False

    def __init__(
        self,
        ports: Collection[int],
        *,
        deadline: float,
        poll_interval: float = 1.0,
        established: Callable[[], Iterable[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        name: str = "connections",
    ) -> None:
        if not ports:
            raise ValueError("ports must not be empty")
        for port in ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"ports must be TCP port numbers (1-65535), got {port!r}")
        if not (deadline >= 0 and math.isfinite(deadline)):
            raise ValueError(f"deadline must be a non-negative number, got {deadline!r}")
        if not (poll_interval > 0 and math.isfinite(poll_interval)):
            raise ValueError(f"poll_interval must be a positive number, got {poll_interval!r}")
        self.name = name
        self._ports = frozenset(ports)
        self._deadline = float(deadline)
        self._poll_interval = float(poll_interval)
        self._established = established if established is not None else established_ports_source()
        self._clock = clock
        self._sleep = sleep

    def established(self) -> int:
        """The current count. Raises ``ActionError`` if the sockets cannot be listed."""
        try:
            return sum(1 for port in self._established() if port in self._ports)
        except (OSError, ValueError) as exc:
            raise ActionError(f"cannot count connections on ports {sorted(self._ports)}: {exc}") from exc

    def drain(self, ctx: ActionContext) -> None:
        started = self._clock()
        until = started + self._deadline
        ports = ",".join(str(p) for p in sorted(self._ports))
        while True:
            count = self.established()
            now = self._clock()
            if count == 0:
                log.info(
                    "no established connections on ports %s after %.1f s (vm=%s events=%s)",
                    ports,
                    now - started,
                    ctx.vm,
                    ctx.event_ids,
                )
                return
            if now >= until:
                log.warning(
                    "%d connection(s) still established on ports %s after the %.1f s deadline; continuing "
                    "(vm=%s events=%s)",
                    count,
                    ports,
                    self._deadline,
                    ctx.vm,
                    ctx.event_ids,
                )
                return
            log.debug("%d connection(s) established on ports %s (vm=%s)", count, ports, ctx.vm)
            self._sleep(min(self._poll_interval, until - now))

    def recover(self, ctx: ActionContext) -> None:
        """Nothing to undo: waiting changed nothing."""
