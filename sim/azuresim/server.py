"""HTTP front of the simulator: one IMDS port per VM, plus a control port.

Real IMDS knows which VM asks because each VM reaches it from its own NIC. On one test machine every
agent talks to loopback, so the simulator gives each VM its own listening port: whatever reaches
port P is a request from the VM bound to P. The agent sends exactly what it would send to
169.254.169.254, nothing more.

VM ports answer what IMDS answers:

* ``GET /metadata/scheduledevents?api-version=V`` and ``POST`` of the same URL with
  ``{"StartRequests": [{"EventId": "..."}]}``;
* ``GET /metadata/instance/compute?api-version=V`` and ``GET /metadata/instance?api-version=V``.

Request rules, checked in this order: the per-VM rate limit (429), ``X-Forwarded-For`` (400), the
``Metadata: true`` header (400), the path (404), the method (405), duplicate query parameters (400),
the api-version (400). A Scheduled Events request that passed them enables the VM's service (the
first one is held ``first_call_delay``, scaled to real time); queued faults are served after that.

A ``refuse`` fault closes the VM's listening socket (and its open connections) for some real
seconds, then listens again on the same port: clients meet "connection refused" meanwhile.

The control port speaks JSON; see ``docs/simulator.md`` for every endpoint.

This module runs the sockets and threads (``SimulatorServer``); the routes live in
``routes_vm`` (a VM's IMDS), ``routes_control`` (the control API), ``routes_arm``
(the simulated ARM) and ``routes_common`` (what they share).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from azuresim.azure import AzureModel, EffectiveChange
from azuresim.clock import Clock
from azuresim.graph import ResourceGraph
from azuresim.group import SimulatedGroup
from azuresim.lb_haproxy import HAProxyDataPlane
from azuresim.ratelimit import RateLimiter
from azuresim.routes_arm import ArmHandler
from azuresim.routes_common import Server
from azuresim.routes_control import ControlHandler
from azuresim.routes_vm import VmHandler

__all__ = ["DEFAULT_RATE_LIMIT", "SimulatorServer", "format_url"]

log = logging.getLogger(__name__)

DEFAULT_RATE_LIMIT = 5
_ARM = "\0arm"  # the ARM server's key among the servers (no VM name can contain a NUL)


def format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class SimulatorServer:
    """Serves ``group`` over HTTP: one port per VM, one control port, and a ticker thread.

    ``vm_addresses`` maps each VM of the group to ``(host, port)``; port 0 picks a free port.
    ``start`` binds every socket (raising ``OSError`` if one cannot be bound, after closing the
    others) and returns once all of them are listening; ``stop`` shuts everything down, continues
    every process an impact paused, and is idempotent. ``rate_limit`` requests per (real) second per
    VM (0 disables the limit). The server carries out the group's ``refuse`` faults. ``date_skew``
    seconds are added to the real clock in the ``Date`` header of every VM port's answers.

    With ``azure``, a second ticker settles its due ARM operations every ``arm_tick_interval`` real
    seconds, so effective admin states change on time; every change is logged (kind ``admin_state``) and,
    with ``data_plane``, applied to HAProxy. ARM's port also serves the Resource Graph query of the group's
    scheduled events (``graph``, ``azuresim.graph``; ``graph_page_size`` rows a page), its rows brought
    up to date by the same ticker.
    """

    def __init__(
        self,
        group: SimulatedGroup,
        vm_addresses: Mapping[str, tuple[str, int]],
        control_address: tuple[str, int] = ("127.0.0.1", 0),
        *,
        rate_limit: int = DEFAULT_RATE_LIMIT,
        tick_interval: float = 0.05,
        monotonic: Clock = time.monotonic,
        date_skew: float = 0.0,
        azure: AzureModel | None = None,
        arm_address: tuple[str, int] | None = None,
        data_plane: HAProxyDataPlane | None = None,
        arm_tick_interval: float = 0.1,
        graph_page_size: int = 1000,
    ) -> None:
        names = {info.name for info in group.vms}
        resolved = {group.vm(name).name: address for name, address in vm_addresses.items()}
        if set(resolved) != names:
            raise ValueError(f"vm_addresses must cover exactly the group's VMs: {sorted(names)}")
        if arm_address is not None and azure is None:
            raise ValueError("arm_address needs an azure model")
        if data_plane is not None and azure is None:
            raise ValueError("data_plane needs an azure model")
        self.group = group
        self.date_skew = date_skew
        self.azure = azure
        self.graph = ResourceGraph(group, azure, page_size=graph_page_size) if azure is not None else None
        self._arm_address = arm_address
        self._vm_addresses = resolved
        self._control_address = control_address
        self._limiters = {name: RateLimiter(rate_limit, clock=monotonic) for name in names}
        self._tick_interval = tick_interval
        self._arm_tick_interval = arm_tick_interval
        self.data_plane = data_plane
        self._outer_hook: Callable[[EffectiveChange], None] | None = None
        self.stopping = threading.Event()
        self._servers: dict[str | None, Server] = {}
        self._threads: list[threading.Thread] = []
        self._started = False
        self._refuse_lock = threading.Lock()
        self._refused_until: dict[str, float] = {}
        self._monotonic = monotonic

    def limiter(self, vm: str) -> RateLimiter:
        return self._limiters[vm]

    @property
    def urls(self) -> dict[str, str]:
        """Base URL of each VM's IMDS (``http://host:port``), once started."""
        return {
            vm: format_url(*self._bound(server)) for vm, server in self._servers.items() if vm not in (None, _ARM)
        }

    @property
    def control_url(self) -> str:
        return format_url(*self._bound(self._servers[None]))

    @property
    def arm_url(self) -> str:
        """Base URL of the simulated ARM (``""`` when it is not served)."""
        server = self._servers.get(_ARM)
        return format_url(*self._bound(server)) if server is not None else ""

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "vms": self.urls,
            "incarnation": self.group.incarnation,
            "time_scale": self.group.time_scale,
            "now": self.group.now(),
            "replay": self.group.replay()["active"],
        }

    def refused(self) -> list[str]:
        """VMs whose port refuses connections now."""
        with self._refuse_lock:
            return sorted(self._refused_until)

    def start(self) -> None:
        if self._started:
            raise RuntimeError("already started")
        try:
            for vm, address in self._vm_addresses.items():
                self._servers[vm] = Server(address, VmHandler, self, vm)
            self._servers[None] = Server(self._control_address, ControlHandler, self)
            if self._arm_address is not None:
                self._servers[_ARM] = Server(self._arm_address, ArmHandler, self)
        except OSError:
            for server in self._servers.values():
                server.server_close()
            self._servers.clear()
            raise
        self._started = True
        self.group.set_refuse_handler(self._refuse)
        for name, server in self._servers.items():
            self._serve(name, server)
        ticker = threading.Thread(target=self._tick_loop, name="imds-sim-ticker", daemon=True)
        ticker.start()
        self._threads.append(ticker)
        if self.azure is not None:
            self.group.set_platform_policy(self.azure.approves_user_event)
            self._outer_hook = self.azure.on_effective  # a hook the model was built with is still called
            self.azure.on_effective = self._on_effective
            arm_ticker = threading.Thread(target=self._arm_tick_loop, args=(self.azure, self.graph),
                                          name="imds-sim-arm-ticker", daemon=True)
            arm_ticker.start()
            self._threads.append(arm_ticker)

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        with self._refuse_lock:
            servers = list(self._servers.values())
        # shutdown() waits for the serve_forever loop to notice; do all servers at once.
        stoppers = [threading.Thread(target=server.shutdown, daemon=True) for server in servers]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(timeout=5)
        for server in servers:
            server.server_close()
        for thread in list(self._threads):
            thread.join(timeout=5)
        self.group.set_refuse_handler(None)
        # Never leave a process stopped behind us.
        self.group.release_paused()

    def __enter__(self) -> SimulatorServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, name: str | None, server: Server) -> None:
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"imds-sim-{'arm' if name == _ARM else name or 'control'}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)

    def _refuse(self, vm: str, seconds: float) -> None:
        # Called under the group's lock: only book-keeping here, the sockets are handled on a thread.
        with self._refuse_lock:
            if self.stopping.is_set():
                return
            until = self._monotonic() + seconds
            running = vm in self._refused_until
            self._refused_until[vm] = max(until, self._refused_until.get(vm, until))
        if not running:
            threading.Thread(target=self._refuse_and_reopen, args=(vm,), name=f"imds-sim-refuse-{vm}",
                             daemon=True).start()

    def _refuse_and_reopen(self, vm: str) -> None:
        with self._refuse_lock:
            server = self._servers[vm]
        address = self._bound(server)
        server.shutdown()
        server.close_connections()
        server.server_close()
        log.info("vm %s: port %s refuses connections", vm, address[1])
        while True:
            with self._refuse_lock:
                if self.stopping.is_set():
                    self._refused_until.pop(vm, None)
                    return
                remaining = self._refused_until[vm] - self._monotonic()
                if remaining <= 0:
                    try:
                        reopened = Server(address, VmHandler, self, vm)
                    except OSError as exc:  # the port is briefly unavailable: try again soon
                        log.warning("vm %s: cannot listen again on %s yet: %s", vm, address[1], exc)
                        remaining = 0.05
                    else:
                        self._servers[vm] = reopened
                        self._serve(vm, reopened)
                        del self._refused_until[vm]
                        break
            self.stopping.wait(min(remaining, 0.05) if remaining > 0 else 0.05)
        self.group.record("fault", vm=vm, method=None, path=None, fault="refuse_ended", status=None,
                          seconds=None, remaining=0)
        log.info("vm %s: port %s accepts connections again", vm, address[1])

    def _tick_loop(self) -> None:
        while not self.stopping.wait(self._tick_interval):
            try:
                self.group.tick()
            except Exception:
                log.exception("bug in the simulator's ticker")

    def _arm_tick_loop(self, azure: AzureModel, graph: ResourceGraph | None) -> None:
        while not self.stopping.wait(self._arm_tick_interval):
            try:
                azure.tick()
                if graph is not None:
                    graph.sync()
            except Exception:
                log.exception("bug in the simulator's ARM ticker")

    def _on_effective(self, change: EffectiveChange) -> None:
        """An effective admin state changed: log it, then have the data plane (if any) apply it."""
        applied = self.data_plane(change) if self.data_plane is not None else None
        self.group.record("admin_state", address=change.address, pool=change.pool_id, before=change.before,
                          after=change.after, changed_t=change.t, haproxy=applied)
        if self._outer_hook is not None:
            self._outer_hook(change)

    @staticmethod
    def _bound(server: Server) -> tuple[str, int]:
        host, port = server.server_address[:2]
        return str(host), int(port)
