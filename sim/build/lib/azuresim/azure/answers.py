"""What the simulated ARM and token endpoint answer with: ``ArmAnswer``, ``EffectiveChange`` (a change of
the data plane), ARM's error body, etags, the api-versions served, and the resource ids ARM knows
(``POOL_ID``, ``LB_ID``, ``SCALE_SET_ID``, ``VM_ID``, which kind of read-only resource a path names, the
scope of a ``Microsoft.Authorization/permissions`` list)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ADMIN_STATES",
    "ARM_API_VERSIONS",
    "ARM_RESOURCES",
    "AUTHORIZATION_API_VERSIONS",
    "AVAILABILITY_SET_ID",
    "COMPUTE_API_VERSIONS",
    "IDENTITY_API_VERSIONS",
    "LB_ID",
    "MAINTENANCE_ACK",
    "MAINTENANCE_API_VERSIONS",
    "OPERATION",
    "POOL_ID",
    "PRIORITIES",
    "PROBE",
    "PROBE_PROTOCOLS",
    "REPAIR_ACTIONS",
    "ROLES",
    "SCALE_SET_ID",
    "SERVER_ERRORS",
    "VM_ID",
    "ArmAnswer",
    "EffectiveChange",
    "arm_error",
    "dropped_answer",
    "duration_seconds",
    "new_etag",
    "permissions_scope",
    "resource_kind_of",
]

IDENTITY_API_VERSIONS = ("2018-02-01", "2019-08-01")
#: api-versions of Microsoft.Network the simulated ARM accepts (backend address admin state is in all).
ARM_API_VERSIONS = ("2023-09-01", "2023-11-01", "2024-01-01", "2024-03-01", "2024-05-01")
#: api-versions of Microsoft.Compute the simulated ARM accepts. It serves every field of ``scheduledEventsPolicy``
#: at each; Azure has all of them (``allInstancesDown`` among them) only from 2025-04-01.
COMPUTE_API_VERSIONS = ("2024-03-01", "2024-07-01", "2024-11-01", "2025-04-01")
#: api-versions of Microsoft.Authorization (``permissions``) the simulated ARM accepts.
AUTHORIZATION_API_VERSIONS = ("2015-07-01", "2022-04-01")
ADMIN_STATES = ("None", "Up", "Down")
ROLES = ("network-contributor", "reader", "scheduled-event-contributor", "none")
#: api-versions of Microsoft.Maintenance (``scheduledevents/{id}/acknowledge``) the simulated ARM accepts.
MAINTENANCE_API_VERSIONS = ("2023-10-01-preview", "2025-10-01-preview", "2025-11-01")
ARM_RESOURCES = frozenset({"https://management.azure.com/", "https://management.azure.com",
                           "https://management.core.windows.net/", "https://management.core.windows.net"})

POOL_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/"
    r"loadBalancers/(?P<lb>[^/]+)/backendAddressPools/(?P<pool>[^/]+)$",
    re.IGNORECASE,
)
LB_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/"
    r"loadBalancers/(?P<lb>[^/]+)$",
    re.IGNORECASE,
)
PROBE = re.compile(
    r"^(?P<lb>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/loadBalancers/[^/]+)/"
    r"probes/(?P<probe>[^/]+)$",
    re.IGNORECASE,
)
SCALE_SET_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"virtualMachineScaleSets/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
AVAILABILITY_SET_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"availabilitySets/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"virtualMachines/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
# Permissions_ListForResourceGroup and Permissions_ListForResource (authorization-RoleDefinitionsCalls.json,
# 2022-04-01): a resource group, or a resource in it, then /providers/Microsoft.Authorization/permissions.
_PERMISSIONS = re.compile(
    r"^(?P<scope>/subscriptions/[^/]+/resourceGroups/[^/]+(?:/providers/[^/]+(?:/[^/]+/[^/]+)+)?)/"
    r"providers/Microsoft\.Authorization/permissions$",
    re.IGNORECASE,
)
_DURATION = re.compile(r"^PT(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?$")
PROBE_PROTOCOLS = ("Http", "Https", "Tcp")
PRIORITIES = ("Regular", "Low", "Spot")
REPAIR_ACTIONS = ("Replace", "Restart", "Reimage")
#: The Maintenance resource provider's acknowledgement of scheduled events of a VM, scale set or availability
#: set: one event (``.../scheduledevents/{id}/acknowledge``) or a list (``.../scheduledevents``, body
#: ``{"value": [ids]}``).
MAINTENANCE_ACK = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
    r"(?:virtualMachines|virtualMachineScaleSets|availabilitySets)/[^/]+/providers/Microsoft\.Maintenance/"
    r"scheduledevents(?:/(?P<id>[^/]+)/acknowledge)?$",
    re.IGNORECASE,
)
OPERATION = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Network/locations/(?P<loc>[^/]+)/"
    r"operations/(?P<op>[^/]+)$",
    re.IGNORECASE,
)
# Read-only per the REST specification (loadBalancer.json, 2023-09-01): ignored when a client sends them.
_POOL_READ_ONLY = ("backendIPConfigurations", "loadBalancingRules", "outboundRule", "outboundRules",
                   "inboundNatRules", "provisioningState")
_ADDRESS_READ_ONLY = ("networkInterfaceIPConfiguration", "inboundNatRulesPortMapping")


#: ARM's error codes of the server errors it may answer (``status`` and ``status_after_apply`` faults).
SERVER_ERRORS = {500: "InternalServerError", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


@dataclass(frozen=True)
class ArmAnswer:
    """An HTTP answer: status, JSON body (None: empty) and headers.

    ``drop``: no answer at all, the server closes the connection (``status`` is then what was not sent, or 0);
    ``delay``: the answer is sent (or the connection closed) only after that many seconds."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    delay: float = 0.0
    # Event ids the Maintenance API approves: the simulator's server approves them in the group once the
    # model's lock is released, and answers for each (``routes_arm``); ``single``: the one-event form.
    acknowledge: tuple[str, ...] = ()
    single: bool = False


@dataclass(frozen=True)
class EffectiveChange:
    """An address's effective admin state changed: what the load balancer's data plane now applies.

    ``address`` is the backend address's name (the simulator's pools name addresses after their VMs);
    ``t`` the wall-clock time of the change (when the operation was settled, or the control write)."""

    pool_id: str
    address: str
    ip_address: str
    before: str
    after: str
    t: float


def arm_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> ArmAnswer:
    return ArmAnswer(status, {"error": {"code": code, "message": message}}, headers or {})


def dropped_answer() -> ArmAnswer:
    """No answer: the connection is closed before anything is sent (an endpoint that cannot be reached)."""
    return ArmAnswer(0, drop=True)


def new_etag() -> str:
    return f'W/"{uuid.uuid4()}"'


def resource_kind_of(path: str) -> str | None:
    """Which read-only resource a path names: ``lb``, ``probe``, ``scale_set``, ``availability_set``, ``vm``,
    or None."""
    if LB_ID.match(path):
        return "lb"
    if PROBE.match(path):
        return "probe"
    if SCALE_SET_ID.match(path):
        return "scale_set"
    if AVAILABILITY_SET_ID.match(path):
        return "availability_set"
    if VM_ID.match(path):
        return "vm"
    return None


def permissions_scope(path: str) -> str | None:
    """The scope whose permissions ``path`` lists (``.../providers/Microsoft.Authorization/permissions``), or
    None. An empty parent resource path, as the SDKs send it (``Microsoft.Network//loadBalancers``), is one
    slash."""
    match = _PERMISSIONS.match(re.sub("/{2,}", "/", path))
    return match["scope"] if match else None


def duration_seconds(value: str) -> float | None:
    """Seconds of an ISO 8601 duration of the form ARM uses here (``PT10M``, ``PT1H30M``); None if not one."""
    match = _DURATION.match(value)
    if match is None or not any(match.groups()):
        return None
    return float(int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0))
