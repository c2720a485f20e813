"""The shapes of the simulator's control input, as pydantic models.

One model per request body of the control API (see ``docs/simulator.md``), one per timeline step, and
the options of a group. ``SimulatedGroup`` checks its own arguments with the same models, so the HTTP
API, timelines and Python callers obey one set of rules. ``parse`` turns a validation failure into
``InvalidRequest`` naming every field at fault; unknown fields are refused.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from azuresim.catalogue import (
    MAX_FAULT_BODY,
    MAX_FAULT_SECONDS,
    STARTED,
    TERMINATE_NOTICE_RANGE,
    Delivery,
    EventStatus,
    FaultKind,
    ImpactKind,
    NotBeforeClock,
    WrongTypeField,
)
from azuresim.errors import InvalidRequest

__all__ = [
    "TIMELINE_ACTIONS",
    "ApproveRequest",
    "ArmSettingsRequest",
    "AzureFaultRequest",
    "CancelRequest",
    "FaultRequest",
    "GroupOptions",
    "IdentityRequest",
    "ImpactRequest",
    "LoadBalancerRequest",
    "PidsRequest",
    "PoolRequest",
    "PoolWriteRequest",
    "ReplayRequest",
    "Request",
    "ResetIncarnationRequest",
    "RoleRequest",
    "RolloutRequest",
    "ScaleSetRequest",
    "ScheduleRequest",
    "Seconds",
    "SkipIncarnationRequest",
    "ThrottlingRequest",
    "TimelineImpact",
    "TimelineStep",
    "VmResourceRequest",
    "parse",
    "parse_timeline",
]

_M = TypeVar("_M", bound=BaseModel)


def _seconds(value: object) -> float:
    # Stricter than pydantic's float: no booleans, no numeric strings, no NaN or infinity.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PydanticCustomError("seconds", "must be a finite number of seconds >= 0")
    return float(value)


def _positive(value: float) -> float:
    if value <= 0:
        raise PydanticCustomError("positive", "must be > 0")
    return value


def _printable(value: str) -> str:
    if not value.isprintable():
        raise PydanticCustomError("printable", "must be printable (no control characters)")
    return value


def _header_name(value: str) -> str:
    if not value or not all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in value):
        raise PydanticCustomError("header", "must be an HTTP header name")
    return value


def _header_value(value: str) -> str:
    if any(c in value for c in "\r\n\0") or not value.isascii():
        raise PydanticCustomError("header", "must be ASCII without CR, LF or NUL")
    return value


def _not_our_pid(value: int) -> int:
    if value == os.getpid():
        raise PydanticCustomError("own_pid", "the simulator does not signal itself")
    return value


def _upper(value: object) -> object:
    if isinstance(value, list | tuple):
        return [m.upper() if isinstance(m, str) else m for m in value]
    return value


def _terminate_notice(value: float) -> float:
    low, high = TERMINATE_NOTICE_RANGE
    if not low <= value <= high:
        raise PydanticCustomError("terminate_notice", "must be between 300 and 900 seconds (5 to 15 minutes)")
    return value


#: A duration or time in seconds: a finite number >= 0 (not a boolean, not a string).
Seconds = Annotated[float, BeforeValidator(_seconds)]
_PositiveSeconds = Annotated[float, BeforeValidator(_seconds), AfterValidator(_positive)]
_Name = Annotated[StrictStr, Field(min_length=1)]
_EventId = Annotated[StrictStr, Field(min_length=1), AfterValidator(_printable)]
_Pid = Annotated[StrictInt, Field(gt=1), AfterValidator(_not_our_pid)]
_VmGroup = Annotated[list[StrictStr], Field(min_length=1)]
_HeaderName = Annotated[StrictStr, AfterValidator(_header_name)]
_HeaderValue = Annotated[StrictStr, AfterValidator(_header_value)]


class Request(BaseModel):
    """Base of the simulator's input models: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    def given(self) -> dict[str, Any]:
        """The fields the input set, checked: keyword arguments for the group method of the same request."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class _EventFields(Request):
    event_type: _Name
    not_before_in: Seconds | None = None
    duration_in_seconds: Annotated[StrictInt, Field(ge=-1)] | None = None
    started_for: Seconds | None = None
    description: StrictStr | None = None
    source: _Name = "Platform"
    status: EventStatus = "Scheduled"
    resource_type: _Name = "VirtualMachine"
    impact: ImpactKind | None = None
    impact_seconds: Seconds | None = None
    deliver_to_named_only: StrictBool = False


class ScheduleRequest(_EventFields):
    """``POST /events``, a timeline's ``schedule`` and ``SimulatedGroup.schedule``: one new event.

    ``unit`` places an event in a delivery unit of the group; it is needed only for an event naming no VM
    of the group (the unit of the VMs it names decides otherwise, and must agree with it).
    """

    resources: list[StrictStr]
    event_id: _EventId | None = None
    not_before_at: Seconds | None = None
    unit: Annotated[StrictStr, AfterValidator(_printable)] | None = None

    @model_validator(mode="after")
    def _one_not_before(self) -> Self:
        if self.not_before_in is not None and self.not_before_at is not None:
            raise PydanticCustomError("not_before", "give not_before_in or not_before_at, not both")
        if self.status == STARTED and self.not_before_at is not None:
            raise PydanticCustomError("not_before", "a Started event has no NotBefore (not_before_at)")
        return self


class RolloutRequest(_EventFields):
    """``POST /rollouts``: one event per group of VMs, the fields of ``ScheduleRequest`` for each.

    ``groups`` None means one group per fault domain; ``gap`` separates one removal from the next creation.
    """

    groups: Annotated[list[_VmGroup], Field(min_length=1)] | None = None
    gap: Seconds = 0.0

    def step(self, resources: list[str]) -> ScheduleRequest:
        """The event of the rollout that names ``resources``."""
        fields = {name: getattr(self, name) for name in _EventFields.model_fields}
        return parse(ScheduleRequest, {**fields, "resources": resources})


class ImpactRequest(Request):
    """``POST /events/{id}/impact``: a second impact, pausing the VMs again for ``seconds`` if ``pause``."""

    seconds: Seconds | None = None
    pause: StrictBool = False


class TimelineImpact(ImpactRequest):
    """A timeline's ``impact``: ``ImpactRequest`` with the event it hits."""

    event_id: StrictStr


class PidsRequest(Request):
    """``POST /vms/{vm}/pids``: the processes that stand for the VM (integers > 1, not the simulator's own)."""

    pids: list[_Pid]


class SkipIncarnationRequest(Request):
    """``POST /incarnation/skip``: raise what ``vm`` (None: every VM) is served by ``by``."""

    vm: StrictStr | None = None
    by: Annotated[StrictInt, Field(ge=1)] = 1


class ResetIncarnationRequest(Request):
    """``POST /incarnation/reset``: serve ``vm`` (None: every VM) an incarnation that starts again from 1."""

    vm: StrictStr | None = None


class IdentityRequest(Request):
    """``POST /identities``: a user-assigned identity, assigned to ``vms`` (None: every VM of the group)."""

    client_id: Annotated[StrictStr, Field(min_length=1)]
    msi_res_id: StrictStr | None = None
    vms: list[StrictStr] | None = None


class RoleRequest(Request):
    """``POST /arm/roles``: the role, or roles, of an identity over every resource (a VM name for its system
    identity)."""

    principal: Annotated[StrictStr, Field(min_length=1)]
    role: Literal["network-contributor", "reader", "scheduled-event-contributor", "none"] | None = None
    roles: list[Literal["network-contributor", "reader", "scheduled-event-contributor", "none"]] | None = None


class LoadBalancerRequest(Request):
    """``POST /arm/loadbalancers``: a load balancer by resource id, with its health probes."""

    lb_id: StrictStr = Field(alias="id")
    probes: list[dict[str, Any]]
    location: StrictStr = "westeurope"

    def given(self) -> dict[str, Any]:
        return {"lb_id": self.lb_id, "probes": self.probes, "location": self.location}


class ScaleSetRequest(Request):
    """``POST /arm/scalesets``: a scale set by resource id, with the settings ``coordinator doctor`` reads."""

    scale_set_id: StrictStr = Field(alias="id")
    location: StrictStr = "westeurope"
    automatic_repairs: dict[str, Any] | None = None
    terminate_notification: dict[str, Any] | None = None
    os_image_notification: dict[str, Any] | None = None
    scheduled_events_policy: dict[str, Any] | None = None
    priority: StrictStr | None = None
    health_probe: StrictStr | None = None
    health_extension: dict[str, Any] | None = None

    def given(self) -> dict[str, Any]:
        return {"scale_set_id": self.scale_set_id, "location": self.location,
                **{k: v for k, v in self.model_dump().items() if k not in ("scale_set_id", "location")}}


class AvailabilitySetRequest(Request):
    """``POST /arm/availabilitysets``: an availability set by resource id, with its ``scheduled_events_policy``."""

    availability_set_id: StrictStr = Field(alias="id")
    location: StrictStr = "westeurope"
    scheduled_events_policy: dict[str, Any] | None = None

    def given(self) -> dict[str, Any]:
        return {"availability_set_id": self.availability_set_id, "location": self.location,
                "scheduled_events_policy": self.scheduled_events_policy}


class VmResourceRequest(Request):
    """``POST /arm/vms``: a virtual machine (not of a scale set) by resource id."""

    vm_id: StrictStr = Field(alias="id")
    location: StrictStr = "westeurope"
    priority: StrictStr | None = None
    scheduled_events_policy: dict[str, Any] | None = None
    availability_set: StrictStr | None = None

    def given(self) -> dict[str, Any]:
        return {"vm_id": self.vm_id, "location": self.location, "priority": self.priority,
                "scheduled_events_policy": self.scheduled_events_policy, "availability_set": self.availability_set}


class PoolRequest(Request):
    """``POST /arm/pools``: a backend address pool by resource id, with its addresses
    (``{"name", "ip_address", "admin_state"}``)."""

    pool_id: StrictStr = Field(alias="id")
    addresses: list[dict[str, Any]]
    location: StrictStr = "westeurope"

    def given(self) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "addresses": self.addresses, "location": self.location}


class PoolWriteRequest(Request):
    """``POST /arm/pools/write``: another writer sets one address's admin state (the pool's etag changes)."""

    pool_id: StrictStr = Field(alias="id")
    address: StrictStr
    admin_state: Literal["None", "Up", "Down"]

    def given(self) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "address": self.address, "admin_state": self.admin_state}


_GET_PUT: list[Literal["GET", "PUT"]] = ["GET", "PUT"]


class AzureFaultRequest(Request):
    """``POST /arm/faults``: a fault on the token endpoint or on ARM (``AzureModel.add_fault``, which checks
    which fields a kind takes): ``status`` (``retry_after`` adds ``Retry-After``), ``unreachable``,
    ``concurrent_write``, for an applied PUT ``lost_answer`` (``delay_seconds``), ``status_after_apply``,
    ``slow_operation`` (``seconds``) and ``operation_end`` (``end``), and ``stalled_write`` (``seconds``)."""

    target: Literal["token", "arm", "graph"]
    kind: Literal["status", "unreachable", "concurrent_write", "lost_answer", "status_after_apply", "slow_operation",
                  "operation_end", "stalled_write"] = "status"
    status: Annotated[StrictInt, Field(ge=400, le=599)] | None = None
    retry_after: Annotated[StrictInt, Field(ge=0, le=3600)] | None = None
    count: Annotated[StrictInt, Field(ge=1)] | None = 1
    methods: list[Literal["GET", "PUT"]] = Field(default_factory=lambda: _GET_PUT.copy())
    seconds: Seconds | None = None
    delay_seconds: _PositiveSeconds | None = None
    end: Literal["Failed", "Canceled"] | None = None


class ArmSettingsRequest(Request):
    """``POST /arm/settings``: ARM's settings (``AzureModel.configure``); those not given stay."""

    conflict_while_updating: StrictBool | None = None
    async_seconds: Seconds | None = None
    retry_after: Annotated[StrictInt, Field(ge=0, le=3600)] | None = None


class ThrottlingRequest(Request):
    """``POST /arm/throttling``: ARM's token buckets per subscription (``AzureModel.set_throttling``)."""

    enabled: StrictBool = True
    read_capacity: Annotated[StrictInt, Field(ge=1)] = 250
    read_refill: _PositiveSeconds = 25.0
    write_capacity: Annotated[StrictInt, Field(ge=1)] = 200
    write_refill: _PositiveSeconds = 10.0


class FaultRequest(Request):
    """``POST /faults``: a fault for ``vm`` (None: every VM). Which fields a kind takes is in ``docs/simulator.md``."""

    kind: FaultKind
    vm: StrictStr | None = None
    count: Annotated[StrictInt, Field(ge=1)] | None = 1
    status: StrictInt | None = None
    seconds: Seconds | None = None
    methods: Annotated[tuple[Literal["GET", "POST"], ...], BeforeValidator(_upper), Field(min_length=1)] = ("GET",)
    field: WrongTypeField | None = None
    # ``body`` faults: the bytes served (base64), ``repeat`` times, with these headers.
    body: StrictStr | None = None
    repeat: Annotated[StrictInt, Field(ge=1)] | None = None
    content_type: _HeaderValue | None = None
    headers: dict[_HeaderName, _HeaderValue] | None = None
    content_length: Annotated[StrictInt, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _fits_kind(self) -> Self:
        kind = self.kind
        if kind == "status":
            if self.status is None or not 400 <= self.status <= 599:
                raise PydanticCustomError("fault", "a status fault needs a status between 400 and 599")
        elif kind == "body":
            if self.status is not None and not 200 <= self.status <= 599:
                raise PydanticCustomError("fault", "a body fault's status must be between 200 and 599")
        elif self.status is not None:
            raise PydanticCustomError("fault", "status is only for status faults, not {kind}", {"kind": kind})
        if kind in ("delay", "refuse"):
            if self.seconds is None:
                raise PydanticCustomError("fault", "a {kind} fault needs seconds", {"kind": kind})
            if self.seconds > MAX_FAULT_SECONDS:
                raise PydanticCustomError("fault", f"seconds must be at most {MAX_FAULT_SECONDS:g}")
        elif self.seconds is not None:
            raise PydanticCustomError(
                "fault", "seconds is only for delay and refuse faults, not {kind}", {"kind": kind}
            )
        if kind == "wrong_type":
            if self.field is None:
                self.field = "DocumentIncarnation"
        elif self.field is not None:
            raise PydanticCustomError("fault", "field is only for wrong_type faults, not {kind}", {"kind": kind})
        body_fields = ("body", "repeat", "content_type", "headers", "content_length")
        if kind == "body":
            if self.body is None:
                raise PydanticCustomError("fault", "a body fault needs body (base64)")
            if len(self.served_body()) * (self.repeat or 1) > MAX_FAULT_BODY:
                raise PydanticCustomError("fault", f"body times repeat must be at most {MAX_FAULT_BODY} bytes")
        elif any(getattr(self, name) is not None for name in body_fields):
            raise PydanticCustomError(
                "fault", "body, repeat, content_type, headers and content_length are only for body faults"
            )
        return self

    def served_body(self) -> bytes:
        """The bytes of a ``body`` fault, before ``repeat`` (b"" for other kinds)."""
        if self.body is None:
            return b""
        try:
            return base64.b64decode(self.body, validate=True)
        except (binascii.Error, ValueError):
            raise PydanticCustomError("fault", "body must be base64") from None


class ApproveRequest(Request):
    """A timeline's ``approve``: an approval from ``vm`` that did not come through its port."""

    vm: StrictStr
    event_ids: list[StrictStr]


class CancelRequest(Request):
    """A timeline's ``cancel``, written as the event id alone or as ``{"event_id": ID}``."""

    event_id: StrictStr


def _object(value: object) -> object:
    if not isinstance(value, dict | BaseModel):
        raise PydanticCustomError("object", "takes an object")
    return value


def _object_or_none(value: object) -> object:
    # `skip_incarnation:` with nothing after it in YAML means "every VM, the defaults".
    return _object({} if value is None else value)


def _event_id(value: object) -> object:
    if isinstance(value, str):
        return {"event_id": value}
    if not isinstance(value, dict | BaseModel):
        raise PydanticCustomError("event_id", 'takes an event id, or {"event_id": ID}')
    return value


class TimelineStep(Request):
    """``{"at": S, ACTION: ARGUMENTS}``: one control operation ``at`` seconds after the timeline is loaded."""

    at: Seconds
    schedule: Annotated[ScheduleRequest | None, BeforeValidator(_object)] = None
    cancel: Annotated[CancelRequest | None, BeforeValidator(_event_id)] = None
    approve: Annotated[ApproveRequest | None, BeforeValidator(_object)] = None
    impact: Annotated[TimelineImpact | None, BeforeValidator(_object)] = None
    fault: Annotated[FaultRequest | None, BeforeValidator(_object)] = None
    rollout: Annotated[RolloutRequest | None, BeforeValidator(_object)] = None
    skip_incarnation: Annotated[SkipIncarnationRequest | None, BeforeValidator(_object_or_none)] = None
    reset_incarnation: Annotated[ResetIncarnationRequest | None, BeforeValidator(_object_or_none)] = None

    @model_validator(mode="after")
    def _one_action(self) -> Self:
        if len(self.model_fields_set - {"at"}) != 1:
            raise PydanticCustomError(
                "timeline_step",
                "a step needs exactly one action among {actions}",
                {"actions": ", ".join(TIMELINE_ACTIONS)},
            )
        return self

    @property
    def action(self) -> tuple[str, Request]:
        """The step's action and its arguments."""
        [name] = self.model_fields_set - {"at"}
        request = getattr(self, name)
        assert isinstance(request, Request)
        return name, request


#: The actions a timeline step may take, in the order the documentation lists them.
TIMELINE_ACTIONS: tuple[str, ...] = tuple(name for name in TimelineStep.model_fields if name != "at")


class ReplayRequest(Request):
    """``POST /replay``: recorded ``documents`` (moved on every ``interval`` seconds if > 0), or a ``timeline``."""

    documents: Annotated[list[Any], Field(min_length=1)] | None = None
    interval: Seconds = 0.0
    timeline: list[TimelineStep] | None = None

    @model_validator(mode="after")
    def _documents_or_timeline(self) -> Self:
        if (self.documents is None) == (self.timeline is None):
            raise PydanticCustomError("replay", "give either documents or timeline")
        if self.timeline is not None and "interval" in self.model_fields_set:
            raise PydanticCustomError("replay", "interval is only for documents")
        return self


class GroupOptions(Request):
    """The options of a ``SimulatedGroup`` (see its constructor)."""

    time_scale: _PositiveSeconds = 1.0
    approval_delay: Seconds = 0.0
    started_for: Seconds = 5.0
    unknown_approval_status: Literal[200, 400, 404] = 200
    terminate_notice: Annotated[float, BeforeValidator(_seconds), AfterValidator(_terminate_notice)] = 300.0
    first_call_delay: Seconds = 0.0
    idle_reset_after: _PositiveSeconds | None = None
    not_before_clock: NotBeforeClock = "simulated"
    delivery: Delivery = "unit"


_TIMELINE: TypeAdapter[list[TimelineStep]] = TypeAdapter(list[TimelineStep])


def parse(model: type[_M], data: object) -> _M:
    """``data`` checked against ``model``; raises ``InvalidRequest`` naming each field at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(_describe(exc.errors(), "", model)) from None


def parse_timeline(steps: object) -> list[TimelineStep]:
    """A timeline, every step checked now; raises ``InvalidRequest`` naming the step and field at fault."""
    try:
        return _TIMELINE.validate_python(steps)
    except ValidationError as exc:
        raise InvalidRequest(_describe(exc.errors(), "timeline", None)) from None


def _describe(errors: list[ErrorDetails], root: str, model: type[BaseModel] | None) -> str:
    problems = []
    for error in errors:
        where = _where(root, error["loc"])
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown field {where}")
        elif error["type"] == "missing":
            problems.append(f"missing field {where}")
        else:
            problems.append(f"{where}: {error['msg']}" if where else error["msg"])
    if model is not None and any(e["type"] == "extra_forbidden" and len(e["loc"]) == 1 for e in errors):
        problems.append(f"allowed: {', '.join(sorted(model.model_fields))}")
    return "; ".join(problems)


def _where(root: str, loc: tuple[int | str, ...]) -> str:
    text = root
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text
