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
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from coordinator.sim.azure import ArmAnswer, AzureModel, EffectiveChange
from coordinator.sim.catalogue import INSTANCE_API_VERSIONS, SCHEDULED_EVENTS_API_VERSIONS
from coordinator.sim.clock import Clock
from coordinator.sim.errors import InvalidRequest, UnknownEvent, UnknownVm
from coordinator.sim.faults import Fault, mutate_document
from coordinator.sim.group import SimulatedGroup
from coordinator.sim.lb_haproxy import HAProxyDataPlane
from coordinator.sim.schema import (
    AzureFaultRequest,
    FaultRequest,
    IdentityRequest,
    ImpactRequest,
    LoadBalancerRequest,
    PidsRequest,
    PoolRequest,
    PoolWriteRequest,
    ReplayRequest,
    Request,
    ResetIncarnationRequest,
    RoleRequest,
    RolloutRequest,
    ScaleSetRequest,
    ScheduleRequest,
    SkipIncarnationRequest,
    VmResourceRequest,
    parse,
)
from coordinator.support.quiethttp import QuietThreadingHTTPServer
from coordinator.support.ratelimit import RateLimiter

__all__ = ["DEFAULT_RATE_LIMIT", "SimulatorServer", "format_url"]

log = logging.getLogger(__name__)

DEFAULT_RATE_LIMIT = 5
_SCHEDULED_EVENTS = "/metadata/scheduledevents"
_COMPUTE = "/metadata/instance/compute"
_INSTANCE = "/metadata/instance"
_TOKEN = "/metadata/identity/oauth2/token"
_ARM = "\0arm"  # the ARM server's key among the servers (no VM name can contain a NUL)
_MAX_BODY = 64 * 1024
_HEADER_ERROR = "Bad request. Required metadata header not specified"

_R = TypeVar("_R", bound=Request)


def format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(QuietThreadingHTTPServer):  # a client hanging up is a debug line, not a traceback
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        owner: SimulatorServer,
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections are closed after this many seconds, freeing their thread.
    timeout = 30
    server: _Server

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

    def _send_answer(self, answer: ArmAnswer) -> int:
        if answer.body is None:
            return self._send(answer.status, extra=answer.headers)
        return self._send_json(answer.status, answer.body, extra=answer.headers)


class _ArmHandler(_Handler):
    """Azure Resource Manager, as far as ``coordinator.sim.azure.AzureModel`` models it."""

    def version_string(self) -> str:
        return "ARM-simulator"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        azure = self.server.owner.azure
        assert azure is not None
        split = urlsplit(self.path)
        body = self._read_body()
        if body is None:
            self._send_json(413, {"error": {"code": "RequestEntityTooLarge", "message": "The body is too large."}})
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            answer = azure.arm(method, split.path, dict(parse_qsl(split.query, keep_blank_values=True)), headers,
                               body, self.server.owner.arm_url)
        except Exception:
            log.exception("bug in the ARM simulator for %s %s", method, self.path)
            answer = ArmAnswer(500, {"error": {"code": "InternalServerError", "message": "simulator bug"}})
        log.debug("arm %s %s -> %s", method, split.path, answer.status)
        self._send_answer(answer)


class _VmHandler(_Handler):
    """One VM's IMDS. Every request is logged as a ``request`` entry after it is answered."""

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header of every answer: the real clock, off by the server's ``date_skew`` (a VM whose
        # own clock drifted sees IMDS's Date that far from it).
        if timestamp is None:
            timestamp = time.time() + self.server.owner.date_skew
        return super().date_time_string(timestamp)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def __getattr__(self, name: str) -> Callable[[], None]:
        # Any other method (PUT, DELETE, PATCH, HEAD, OPTIONS, made-up ones) gets the same
        # treatment as GET/POST so that it is checked and answered 405, not 501.
        if name.startswith("do_") and name[3:].isalpha():
            method = name[3:]
            return lambda: self._handle(method)
        raise AttributeError(name)

    def _handle(self, method: str) -> None:
        owner = self.server.owner
        group = owner.group
        vm = self.server.vm
        assert vm is not None
        split = urlsplit(self.path)
        status: int | None = None
        try:
            status = self._dispatch(method, split.path, split.query)
        finally:
            group.record("request", vm=vm, method=method, path=split.path, query=split.query, status=status)

    def _dispatch(self, method: str, path: str, query: str) -> int | None:
        owner = self.server.owner
        group = owner.group
        vm = self.server.vm
        assert vm is not None
        body = self._read_body()
        if body is None:
            return self._send_json(400, {"error": "Bad request. Request body too large"})
        if not owner.limiter(vm).admit():
            return self._send_json(429, {"error": "Too many requests"})
        if "X-Forwarded-For" in self.headers:
            return self._send_json(
                400, {"error": "Bad request. Requests with X-Forwarded-For header are not allowed"}
            )
        if path == _TOKEN and owner.azure is not None:
            metadata = (self.headers.get("Metadata") or "").strip().lower() == "true"
            token_query = dict(parse_qsl(query, keep_blank_values=True))
            return self._send_answer(owner.azure.token(vm, method, token_query, metadata))
        if (self.headers.get("Metadata") or "").strip().lower() != "true":
            return self._send_json(400, {"error": _HEADER_ERROR})
        versions: tuple[str, ...]
        allowed: tuple[str, ...]
        if path == _SCHEDULED_EVENTS:
            versions, allowed = SCHEDULED_EVENTS_API_VERSIONS, ("GET", "POST")
        elif path in (_COMPUTE, _INSTANCE):
            versions, allowed = INSTANCE_API_VERSIONS, ("GET",)
        else:
            return self._send_json(404, {"error": "Not found"})
        if method not in allowed:
            return self._send_json(405, {"error": "Method not allowed"}, extra={"Allow": ", ".join(allowed)})
        params = parse_qsl(query, keep_blank_values=True)
        seen: set[str] = set()
        for key, _ in params:
            if key.lower() in seen:
                return self._send_json(400, {"error": f"Bad request. Duplicate query parameter {key!r}"})
            seen.add(key.lower())
        api_version = next((v for k, v in params if k.lower() == "api-version"), None)
        if api_version is None or api_version not in versions:
            what = "was not specified" if api_version is None else "is invalid"
            return self._send_json(
                400,
                {
                    "error": f"Bad request. api-version {what} in the request. "
                    "For more information refer to aka.ms/azureimds",
                    "newest-versions": list(reversed(versions[-3:])),
                },
            )
        if path == _COMPUTE:
            return self._send_json(200, group.compute(vm))
        if path == _INSTANCE:
            return self._send_json(200, {"compute": group.compute(vm)})

        hold = group.begin_request(vm)
        if hold > 0 and owner.stopping.wait(group.real_seconds(hold)):
            self.close_connection = True
            return None
        fault = group.take_fault(vm, method, path)
        if fault is not None:
            if fault.kind == "status":
                assert fault.status is not None
                return self._send_json(fault.status, {"error": f"Simulated fault {fault.status}"})
            if fault.kind == "malformed":
                return self._send(200, b'{"DocumentIncarnation": 7, "Events": [{"EventId": ')
            if fault.kind == "wrong_type" and method == "GET":
                assert fault.field is not None
                return self._send_json(200, mutate_document(group.document(vm, api_version), fault.field))
            if fault.kind == "body":
                return self._send_served(fault)
            if fault.kind == "drop":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if fault.kind == "delay" and fault.seconds and owner.stopping.wait(fault.seconds):
                self.close_connection = True
                return None
        if method == "GET":
            return self._send_json(200, group.document(vm, api_version))
        return self._approve(vm, body)

    def _send_served(self, fault: Fault) -> int:
        """Answer with a ``body`` fault's exact bytes and headers; a declared length larger than the body
        cuts the answer short (the connection is closed after it)."""
        body = fault.body or b""
        status = fault.status or 200
        declared = len(body) if fault.content_length is None else fault.content_length
        self.send_response(status)
        content_type = "application/json; charset=utf-8" if fault.content_type is None else fault.content_type
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(declared))
        for name, value in fault.headers:
            self.send_header(name, value)
        if declared != len(body):
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body[:declared])
        return status

    def _approve(self, vm: str, body: bytes) -> int:
        group = self.server.owner.group
        ids, problem = _parse_start_requests(body)
        if problem is not None:
            group.reject_approval(vm, problem)
            return self._send_json(400, {"error": f"Bad request. {problem}"})
        results = group.approve(vm, ids)
        status = group.approval_status(results)
        if status == 200:
            return self._send(200)
        unknown = [i for i, r in results.items() if r == "unknown"]
        return self._send_json(status, {"error": f"Unknown EventId: {', '.join(unknown)}"})


def _parse_start_requests(body: bytes) -> tuple[list[str], str | None]:
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return [], "the body is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("StartRequests"), list):
        return [], "the body has no StartRequests list"
    incarnation = data.get("DocumentIncarnation")
    if incarnation is not None and (isinstance(incarnation, bool) or not isinstance(incarnation, int)):
        return [], "DocumentIncarnation must be an integer"
    ids = []
    for item in data["StartRequests"]:
        if not isinstance(item, dict) or not isinstance(item.get("EventId"), str) or not item["EventId"]:
            return [], "every StartRequests entry needs an EventId string"
        ids.append(item["EventId"])
    return ids, None


class _ControlHandler(_Handler):
    """The JSON control API used by tests and the demo.

    Request bodies are checked against the models of ``coordinator.sim.schema``; a malformed request
    (``InvalidRequest``) answers 400, an unknown event or VM 404, both as ``{"error": message}``.
    """

    def do_GET(self) -> None:
        self._control("GET")

    def do_POST(self) -> None:
        self._control("POST")

    def do_DELETE(self) -> None:
        self._control("DELETE")

    def _control(self, method: str) -> None:
        split = urlsplit(self.path)
        parts = [p for p in split.path.split("/") if p]
        try:
            query = dict(parse_qsl(split.query))
            body = self._read_body()
            if body is None:
                raise InvalidRequest("body too large")
            route = self._route(method, parts)
            if route is None:
                self._send_json(404, {"error": f"no such endpoint: {method} {split.path}"})
                return
            status, data = route(query, body)
            self._send_json(status, data)
        except InvalidRequest as exc:
            self._send_json(400, {"error": str(exc)})
        except (UnknownEvent, UnknownVm) as exc:
            self._send_json(404, {"error": str(exc)})
        except Exception:
            log.exception("bug in control handler for %s %s", method, self.path)
            self._send_json(500, {"error": "internal error, see the simulator's log"})

    def _route(
        self, method: str, parts: list[str]
    ) -> Callable[[dict[str, str], bytes], tuple[int, Any]] | None:
        owner = self.server.owner
        group = owner.group
        match method, parts:
            case "GET", ["healthz"]:
                return lambda q, b: (200, owner.health())
            case "GET", ["events"]:
                return lambda q, b: (200, group.events())
            case "POST", ["events"]:
                return lambda q, b: (201, group.schedule(**_fields(ScheduleRequest, b)))
            case "GET", ["events", event_id]:
                return lambda q, b: (200, group.event(event_id))
            case "DELETE", ["events", event_id]:
                return lambda q, b: (200, group.cancel(event_id))
            case "POST", ["events", event_id, "impact"]:
                return lambda q, b: (200, group.impact(event_id, **_fields(ImpactRequest, b)))
            case "GET", ["rollouts"]:
                return lambda q, b: (200, {"rollouts": group.rollouts()})
            case "POST", ["rollouts"]:
                return lambda q, b: (201, group.rollout(**_fields(RolloutRequest, b)))
            case "GET", ["vms", vm, "pids"]:
                return lambda q, b: (200, {"vm": group.vm(vm).name, "pids": group.pids(vm)})
            case "POST", ["vms", vm, "pids"]:
                return lambda q, b: (200, group.register_pids(vm, **_fields(PidsRequest, b)))
            case "POST", ["incarnation", "skip"]:
                return lambda q, b: (200, {"entries": group.skip_incarnation(**_fields(SkipIncarnationRequest, b))})
            case "POST", ["incarnation", "reset"]:
                return lambda q, b: (200, {"entries": group.reset_incarnation(**_fields(ResetIncarnationRequest, b))})
            case "GET", ["replay"]:
                return lambda q, b: (200, group.replay())
            case "POST", ["replay"]:
                return lambda q, b: (200, _load_replay(group, _body(ReplayRequest, b)))
            case "POST", ["replay", "next"]:
                return lambda q, b: (200, group.replay_next())
            case "GET", ["log"]:
                return lambda q, b: (200, _log_view(group, q))
            case "GET", ["faults"]:
                return lambda q, b: (200, {"faults": group.faults()})
            case "POST", ["faults"]:
                return lambda q, b: (201, {"queued": group.add_fault(**_fields(FaultRequest, b))})
            case "DELETE", ["faults"]:
                return lambda q, b: (200, {"cleared": group.clear_faults(q.get("vm"))})
            case "GET", ["document", vm]:
                return lambda q, b: (200, group.document(vm, q.get("api-version")))
        if owner.azure is not None:
            return _azure_route(owner.azure, owner.data_plane, method, parts)
        return None


def _azure_route(
    azure: AzureModel, plane: HAProxyDataPlane | None, method: str, parts: list[str]
) -> Callable[[dict[str, str], bytes], tuple[int, Any]] | None:
    """Control of the managed-identity and ARM model (see ``docs/simulator.md``)."""
    match method, parts:
        case "POST", ["identities"]:
            return lambda q, b: (201, azure.add_identity(**_fields(IdentityRequest, b)))
        case "POST", ["arm", "roles"]:
            return lambda q, b: (200, azure.set_role(**_fields(RoleRequest, b)))
        case "GET", ["arm", "pools"]:
            return lambda q, b: (200, {"pools": azure.pools()})
        case "POST", ["arm", "pools"]:
            return lambda q, b: (201, azure.add_pool(**_fields(PoolRequest, b)))
        case "POST", ["arm", "pools", "write"]:
            return lambda q, b: (200, azure.write_address(**_fields(PoolWriteRequest, b)))
        case "POST", ["arm", "loadbalancers"]:
            return lambda q, b: (201, azure.add_load_balancer(**_fields(LoadBalancerRequest, b)))
        case "POST", ["arm", "scalesets"]:
            return lambda q, b: (201, azure.add_scale_set(**_fields(ScaleSetRequest, b)))
        case "POST", ["arm", "vms"]:
            return lambda q, b: (201, azure.add_vm(**_fields(VmResourceRequest, b)))
        case "GET", ["arm", "resources"]:
            return lambda q, b: (200, {"resources": azure.resources()})
        case "GET", ["arm", "calls"]:
            return lambda q, b: (200, {**azure.calls(), "data_plane": plane.view() if plane else None})
        case "POST", ["arm", "faults"]:
            return lambda q, b: (201, azure.add_fault(**_fields(AzureFaultRequest, b)))
        case "DELETE", ["arm", "faults"]:
            return lambda q, b: (200, {"cleared": azure.clear_faults()})
        case "POST", ["identities", "expire-tokens"]:
            return lambda q, b: (200, {"expired": azure.expire_tokens()})
    return None


def _load_replay(group: SimulatedGroup, request: ReplayRequest) -> dict[str, Any]:
    if request.timeline is not None:
        return {"pending": group.load_timeline(request.timeline)}
    assert request.documents is not None
    return group.load_documents(request.documents, request.interval)


def _log_view(group: SimulatedGroup, query: Mapping[str, str]) -> dict[str, Any]:
    try:
        since = int(query.get("since", "0"))
    except ValueError:
        raise InvalidRequest("since must be an integer") from None
    return {"entries": group.log(since=since, kind=query.get("kind")), "last_seq": group.last_seq}


def _body(model: type[_R], body: bytes) -> _R:
    """The JSON object ``body`` checked against ``model``; raises ``InvalidRequest``."""
    try:
        data = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidRequest("the body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return parse(model, data)


def _fields(model: type[Request], body: bytes) -> dict[str, Any]:
    """The fields ``body`` sets, checked against ``model``: the arguments of the group method it calls."""
    return _body(model, body).given()


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
    with ``data_plane``, applied to HAProxy.
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
        self._arm_address = arm_address
        self._vm_addresses = resolved
        self._control_address = control_address
        self._limiters = {name: RateLimiter(rate_limit, clock=monotonic) for name in names}
        self._tick_interval = tick_interval
        self._arm_tick_interval = arm_tick_interval
        self.data_plane = data_plane
        self._outer_hook: Callable[[EffectiveChange], None] | None = None
        self.stopping = threading.Event()
        self._servers: dict[str | None, _Server] = {}
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
                self._servers[vm] = _Server(address, _VmHandler, self, vm)
            self._servers[None] = _Server(self._control_address, _ControlHandler, self)
            if self._arm_address is not None:
                self._servers[_ARM] = _Server(self._arm_address, _ArmHandler, self)
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
            self._outer_hook = self.azure.on_effective  # a hook the model was built with is still called
            self.azure.on_effective = self._on_effective
            arm_ticker = threading.Thread(target=self._arm_tick_loop, args=(self.azure,), name="imds-sim-arm-ticker",
                                          daemon=True)
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

    def _serve(self, name: str | None, server: _Server) -> None:
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
                        reopened = _Server(address, _VmHandler, self, vm)
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

    def _arm_tick_loop(self, azure: AzureModel) -> None:
        while not self.stopping.wait(self._arm_tick_interval):
            try:
                azure.tick()
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
    def _bound(server: _Server) -> tuple[str, int]:
        host, port = server.server_address[:2]
        return str(host), int(port)
