"""The simulator's JSON control port: its endpoints (see ``docs/simulator.md``), each a method of the group
or of the Azure model, with request bodies checked against ``azuresim.schema``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from azuresim.azure import AzureModel
from azuresim.errors import InvalidRequest, UnknownEvent, UnknownVm
from azuresim.graph import GraphSettingsRequest
from azuresim.group import SimulatedGroup
from azuresim.lb_haproxy import HAProxyDataPlane
from azuresim.routes_common import Handler
from azuresim.schema import (
    ArmSettingsRequest,
    AvailabilitySetRequest,
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
    ThrottlingRequest,
    VmResourceRequest,
    parse,
)

__all__ = ["ControlHandler"]

# Every part of the simulator's HTTP front logs under the server's name.
log = logging.getLogger("azuresim.server")

_R = TypeVar("_R", bound=Request)


class ControlHandler(Handler):
    """The JSON control API used by tests and the demo.

    Request bodies are checked against the models of ``azuresim.schema``; a malformed request
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
            case "GET", ["vms"]:
                return lambda q, b: (200, group.layout())
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
        if owner.graph is not None and parts == ["arm", "graph"]:
            graph = owner.graph
            if method == "GET":
                return lambda q, b: (200, {**graph.configure(), "rows": graph.rows()})
            if method == "POST":
                return lambda q, b: (200, graph.configure(**_fields(GraphSettingsRequest, b)))
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
        case "POST", ["arm", "availabilitysets"]:
            return lambda q, b: (201, azure.add_availability_set(**_fields(AvailabilitySetRequest, b)))
        case "POST", ["arm", "vms"]:
            return lambda q, b: (201, azure.add_vm(**_fields(VmResourceRequest, b)))
        case "GET", ["arm", "resources"]:
            return lambda q, b: (200, {"resources": azure.resources()})
        case "GET", ["arm", "calls"]:
            return lambda q, b: (200, {**azure.calls(), "data_plane": plane.view() if plane else None})
        case "GET", ["arm", "faults"]:
            return lambda q, b: (200, {"faults": azure.faults()})
        case "POST", ["arm", "faults"]:
            return lambda q, b: (201, azure.add_fault(**_fields(AzureFaultRequest, b)))
        case "DELETE", ["arm", "faults"]:
            return lambda q, b: (200, {"cleared": azure.clear_faults()})
        case "GET", ["arm", "settings"]:
            return lambda q, b: (200, azure.configure())
        case "POST", ["arm", "settings"]:
            return lambda q, b: (200, azure.configure(**_fields(ArmSettingsRequest, b)))
        case "GET", ["arm", "throttling"]:
            return lambda q, b: (200, azure.throttling())
        case "POST", ["arm", "throttling"]:
            return lambda q, b: (200, azure.set_throttling(**_body(ThrottlingRequest, b).model_dump()))
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
