"""The Azure side a VM's agent reaches besides Scheduled Events: managed-identity tokens from IMDS, and
Azure Resource Manager (ARM) load balancer backend address pools. A small, honest model (see
``docs/simulator.md``, "Managed identity and ARM"):

* **Identities.** Every VM of the group has a system-assigned identity (unless disabled); user-assigned
  identities (a ``client_id`` and an ``msi_res_id``) are added through the control API and assigned to some
  or all VMs. ``token(vm, client_id, msi_res_id, resource)`` answers what
  ``GET /metadata/identity/oauth2/token`` answers: an opaque access token for ``https://management.azure.com/``
  with ``expires_in``/``expires_on`` as strings, as IMDS sends them. Tokens last ``token_lifetime`` real
  seconds.
* **Roles.** Each identity (its principal: ``vm0`` for vm0's system identity, the client id for a
  user-assigned one) holds roles over every resource: ``network-contributor`` (read and write of
  ``Microsoft.Network`` resources, nothing of ``Microsoft.Compute``; the default), ``reader`` (read of
  everything) or ``none``; ``network-contributor`` and ``reader`` together read everything and write pools.
* **Backend address pools**, by resource id, with their ``loadBalancerBackendAddresses`` (name, IP address,
  ``adminState``), an ``etag`` that changes on every write and a ``provisioningState``. A PUT replaces the
  addresses (read-only fields sent back are ignored), is checked against ``If-Match``, and completes
  asynchronously: the answer carries ``Azure-AsyncOperation``, whose status reads ``InProgress`` until
  ``async_seconds`` have passed since the PUT, then ``Succeeded``. The pool's new content is what GET
  answers from the PUT on (``provisioningState`` ``Updating`` until the operation succeeds); its *effective*
  admin states, the data plane, change only when the operation succeeds.
* **Load balancers, scale sets and VMs, read only** (what ``coordinator doctor`` reads): a load balancer
  with its health probes (``LoadBalancer`` and ``Probe`` of loadBalancer.json, its ``backendAddressPools``
  the pools above under its id), a virtual machine scale set (``VirtualMachineScaleSet`` of
  virtualMachineScaleSet.json: ``automaticRepairsPolicy``, ``scheduledEventsPolicy``,
  ``virtualMachineProfile.priority``, ``.scheduledEventsProfile``, ``.networkProfile.healthProbe`` and an
  Application Health extension) and a virtual machine (``priority``, ``scheduledEventsPolicy``), created
  through the control API and served by GET.
* **The data plane**: an address's *effective* admin state changes when the operation that set it is due
  (``tick()``, called by the simulator server's ARM ticker, settles due operations on time even when no
  client asks), or at once for a control-API write. Every change is handed to ``on_effective`` (an
  ``EffectiveChange``), outside the model's lock, one at a time and in the order the changes happened:
  what a load balancer's data plane would apply (``coordinator.sim.lb_haproxy`` applies it to HAProxy).
* **Faults**: queued status answers (429 with ``Retry-After``, 500...) on the token endpoint or on ARM, and
  ``concurrent_write``: another writer changes the pool just before the next PUT, whose ``If-Match`` then
  fails with 412.

Time is real (wall clock) seconds: tokens expire, and operations complete, in the client's time.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.sim.errors import InvalidRequest

__all__ = [
    "ADMIN_STATES",
    "ARM_API_VERSIONS",
    "COMPUTE_API_VERSIONS",
    "IDENTITY_API_VERSIONS",
    "POOL_ID",
    "ROLES",
    "ArmAnswer",
    "AzureModel",
    "EffectiveChange",
]

log = logging.getLogger(__name__)

IDENTITY_API_VERSIONS = ("2018-02-01", "2019-08-01")
#: api-versions of Microsoft.Network the simulated ARM accepts (backend address admin state is in all).
ARM_API_VERSIONS = ("2023-09-01", "2023-11-01", "2024-01-01", "2024-03-01", "2024-05-01")
#: api-versions of Microsoft.Compute the simulated ARM accepts (``scheduledEventsPolicy`` is in all).
COMPUTE_API_VERSIONS = ("2024-03-01", "2024-07-01", "2024-11-01")
ADMIN_STATES = ("None", "Up", "Down")
ROLES = ("network-contributor", "reader", "none")
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
_PROBE = re.compile(
    r"^(?P<lb>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/loadBalancers/[^/]+)/"
    r"probes/(?P<probe>[^/]+)$",
    re.IGNORECASE,
)
SCALE_SET_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"virtualMachineScaleSets/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"virtualMachines/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
_DURATION = re.compile(r"^PT(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?$")
PROBE_PROTOCOLS = ("Http", "Https", "Tcp")
PRIORITIES = ("Regular", "Low", "Spot")
REPAIR_ACTIONS = ("Replace", "Restart", "Reimage")
_OPERATION = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Network/locations/(?P<loc>[^/]+)/"
    r"operations/(?P<op>[^/]+)$",
    re.IGNORECASE,
)
# Read-only per the REST specification (loadBalancer.json, 2023-09-01): ignored when a client sends them.
_POOL_READ_ONLY = ("backendIPConfigurations", "loadBalancingRules", "outboundRule", "outboundRules",
                   "inboundNatRules", "provisioningState")
_ADDRESS_READ_ONLY = ("networkInterfaceIPConfiguration", "inboundNatRulesPortMapping")


@dataclass(frozen=True)
class ArmAnswer:
    """An HTTP answer: status, JSON body (None: empty) and headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


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


def _arm_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> ArmAnswer:
    return ArmAnswer(status, {"error": {"code": code, "message": message}}, headers or {})


def _new_etag() -> str:
    return f'W/"{uuid.uuid4()}"'


def _resource_kind(path: str) -> str | None:
    """Which read-only resource a path names: ``lb``, ``probe``, ``scale_set``, ``vm``, or None."""
    if LB_ID.match(path):
        return "lb"
    if _PROBE.match(path):
        return "probe"
    if SCALE_SET_ID.match(path):
        return "scale_set"
    if VM_ID.match(path):
        return "vm"
    return None


@dataclass
class _Address:
    name: str
    ip_address: str
    admin_state: str = "None"
    effective: str = "None"


@dataclass
class _Pool:
    id: str
    location: str
    addresses: list[_Address]
    etag: str = field(default_factory=_new_etag)
    provisioning: str = "Succeeded"
    writes: int = 0


@dataclass
class _Operation:
    id: str
    pool_id: str
    due: float  # when it succeeds
    done: bool
    states: dict[str, str]  # the admin states this operation makes effective


def _duration_seconds(value: str) -> float | None:
    """Seconds of an ISO 8601 duration of the form ARM uses here (``PT10M``, ``PT1H30M``); None if not one."""
    match = _DURATION.match(value)
    if match is None or not any(match.groups()):
        return None
    return float(int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0))


@dataclass
class _Resource:
    """A read-only resource (load balancer, scale set, VM): its id, location and what GET answers."""

    id: str
    location: str
    build: Callable[[_Resource], dict[str, Any]]
    config: dict[str, Any]
    etag: str = field(default_factory=_new_etag)
    unique_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class _Identity:
    principal: str  # "vm0" for vm0's system-assigned identity, else the client id
    client_id: str
    msi_res_id: str | None
    object_id: str
    vms: frozenset[str] | None  # the VMs it is assigned to; None: every VM


@dataclass
class _Token:
    identity: _Identity
    expires_at: float


@dataclass
class _Fault:
    target: str  # "token" or "arm"
    kind: str  # "status" or "concurrent_write"
    status: int | None
    retry_after: int | None
    remaining: int | None
    methods: tuple[str, ...]


class AzureModel:
    """Identities, tokens, backend pools and asynchronous operations; thread-safe. See the module doc."""

    def __init__(
        self,
        vms: Sequence[str],
        *,
        system_identity: bool = True,
        token_lifetime: float = 86399.0,
        async_seconds: float = 1.0,
        retry_after: int = 1,
        clock: Callable[[], float] = time.time,
        on_effective: Callable[[EffectiveChange], None] | None = None,
    ) -> None:
        if token_lifetime <= 0:
            raise InvalidRequest("token_lifetime must be > 0")
        if async_seconds < 0 or retry_after < 0:
            raise InvalidRequest("async_seconds and retry_after must be >= 0")
        self._lock = threading.Lock()
        self._clock = clock
        self._vms = {vm.lower(): vm for vm in vms}
        self.token_lifetime = float(token_lifetime)
        self.async_seconds = float(async_seconds)
        self.retry_after = retry_after
        self._identities: list[_Identity] = []
        if system_identity:
            self._identities += [_Identity(vm, str(uuid.uuid4()), None, str(uuid.uuid4()), frozenset({vm}))
                                 for vm in vms]
        self._roles: dict[str, frozenset[str]] = {}
        self._resources: dict[str, _Resource] = {}  # load balancers, scale sets and VMs by lower-case id
        self._tokens: dict[str, _Token] = {}
        self._pools: dict[str, _Pool] = {}
        self._operations: dict[str, _Operation] = {}
        self._faults: list[_Fault] = []
        self._calls: Counter[str] = Counter()
        self._statuses: Counter[str] = Counter()
        self.on_effective = on_effective
        self._changes: list[EffectiveChange] = []  # made under the lock, not yet handed to on_effective
        # Held while handing changes over: one deliverer at a time keeps them in the order they happened.
        self._deliver_lock = threading.Lock()

    # -- control ---------------------------------------------------------------------------------------

    def add_identity(self, client_id: str, msi_res_id: str | None = None,
                     vms: Sequence[str] | None = None) -> dict[str, Any]:
        """A user-assigned identity, assigned to ``vms`` (None: every VM)."""
        if not client_id:
            raise InvalidRequest("client_id must be a non-empty string")
        with self._lock:
            assigned = None if vms is None else frozenset(self._vm(v) for v in vms)
            identity = _Identity(client_id, client_id, msi_res_id, str(uuid.uuid4()), assigned)
            self._identities = [i for i in self._identities if i.client_id.lower() != client_id.lower()]
            self._identities.append(identity)
            return self._identity_view(identity)

    def set_role(self, principal: str, role: str | None = None, roles: Sequence[str] | None = None) -> dict[str, Any]:
        """``principal``: a VM name (its system identity) or a user-assigned identity's client id; ``role`` one
        role, or ``roles`` several (``["network-contributor", "reader"]``), replacing what it held."""
        given = ([role] if role is not None else []) + list(roles or [])
        if not given or any(r not in ROLES for r in given):
            raise InvalidRequest(f"role (or every one of roles) must be one of {', '.join(ROLES)}")
        with self._lock:
            if not any(i.principal.lower() == principal.lower() for i in self._identities):
                raise InvalidRequest(f"no identity {principal!r}")
            held = frozenset(given) - {"none"} if len(given) > 1 else frozenset(given)
            self._roles[principal.lower()] = held
            return {"principal": principal, "role": given[0] if len(given) == 1 else None, "roles": sorted(held)}

    # -- read-only resources: load balancers, scale sets, VMs -------------------------------------------

    def add_load_balancer(self, lb_id: str, probes: Sequence[dict[str, Any]],
                          location: str = "westeurope") -> dict[str, Any]:
        """A load balancer with its health probes: ``{"name", "protocol" (Http, Https, Tcp), "port",
        "interval_in_seconds" (default 15), "number_of_probes", "probe_threshold", "request_path"}``."""
        if not LB_ID.match(lb_id):
            raise InvalidRequest("id must be a load balancer resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Network/loadBalancers/{lb}")
        parsed = [self._probe_config(item) for item in probes]
        if len({p["name"].lower() for p in parsed}) != len(parsed):
            raise InvalidRequest("two probes have the same name")
        return self._add_resource(lb_id, location, self._lb_resource, {"probes": parsed})

    def add_scale_set(self, scale_set_id: str, location: str = "westeurope", **settings: Any) -> dict[str, Any]:
        """A virtual machine scale set; ``settings`` (all optional): ``automatic_repairs`` ``{"enabled",
        "grace_period" (ISO 8601, PT10M to PT90M), "repair_action"}``, ``terminate_notification`` ``{"enable",
        "not_before_timeout" (PT5M to PT15M)}``, ``os_image_notification`` ``{"enable", "not_before_timeout"}``,
        ``scheduled_events_policy`` ``{"user_initiated_reboot": bool, "user_initiated_redeploy": bool}``,
        ``priority`` (Regular, Low, Spot), ``health_probe`` (a load balancer probe's id) and
        ``health_extension`` ``{"protocol", "port", "request_path"}`` (the Application Health extension)."""
        if not SCALE_SET_ID.match(scale_set_id):
            raise InvalidRequest("id must be a scale set resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Compute/virtualMachineScaleSets/{name}")
        known = {"automatic_repairs", "terminate_notification", "os_image_notification", "scheduled_events_policy",
                 "priority", "health_probe", "health_extension"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidRequest(f"unknown scale set setting(s) {', '.join(unknown)}")
        config = {k: v for k, v in settings.items() if v is not None}
        repairs = config.get("automatic_repairs")
        if repairs is not None:
            self._check_object(repairs, "automatic_repairs", {"enabled", "grace_period", "repair_action"})
            grace = repairs.get("grace_period")
            if grace is not None:
                seconds = _duration_seconds(grace) if isinstance(grace, str) else None
                if seconds is None or not 600 <= seconds <= 5400:
                    raise InvalidRequest("automatic_repairs.grace_period must be an ISO 8601 duration from PT10M to "
                                         "PT90M (what ARM accepts)")
            if repairs.get("repair_action", "Replace") not in REPAIR_ACTIONS:
                raise InvalidRequest(f"automatic_repairs.repair_action must be one of {', '.join(REPAIR_ACTIONS)}")
        for key, bounds in (("terminate_notification", (300, 900)), ("os_image_notification", (900, 900))):
            profile = config.get(key)
            if profile is None:
                continue
            self._check_object(profile, key, {"enable", "not_before_timeout"})
            timeout = profile.get("not_before_timeout")
            if timeout is not None:
                seconds = _duration_seconds(timeout) if isinstance(timeout, str) else None
                if seconds is None or not bounds[0] <= seconds <= bounds[1]:
                    raise InvalidRequest(f"{key}.not_before_timeout must be an ISO 8601 duration from "
                                         f"PT{bounds[0] // 60}M to PT{bounds[1] // 60}M")
        self._check_policy(config.get("scheduled_events_policy"))
        if config.get("priority", "Regular") not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}")
        probe = config.get("health_probe")
        if probe is not None and (not isinstance(probe, str) or not _PROBE.match(probe)):
            raise InvalidRequest("health_probe must be a load balancer probe's resource id (.../loadBalancers/{lb}/"
                                 "probes/{probe})")
        extension = config.get("health_extension")
        if extension is not None:
            self._check_object(extension, "health_extension", {"protocol", "port", "request_path"})
            if extension.get("protocol", "http") not in ("http", "https", "tcp"):
                raise InvalidRequest("health_extension.protocol must be http, https or tcp")
        return self._add_resource(scale_set_id, location, self._scale_set_resource, config)

    def add_vm(self, vm_id: str, location: str = "westeurope", *, priority: str | None = None,
               scheduled_events_policy: dict[str, Any] | None = None,
               availability_set: str | None = None) -> dict[str, Any]:
        """A virtual machine (not of a scale set): its ``priority`` and ``scheduled_events_policy``
        (``{"user_initiated_reboot": bool, "user_initiated_redeploy": bool}``)."""
        if not VM_ID.match(vm_id):
            raise InvalidRequest("id must be a virtual machine resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Compute/virtualMachines/{name}")
        if (priority or "Regular") not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}")
        self._check_policy(scheduled_events_policy)
        config = {"priority": priority, "scheduled_events_policy": scheduled_events_policy,
                  "availability_set": availability_set}
        given = {k: v for k, v in config.items() if v is not None}
        return self._add_resource(vm_id, location, self._vm_resource, given)

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": r.id, "location": r.location, "config": r.config} for r in self._resources.values()]

    def _add_resource(self, resource_id: str, location: str, build: Callable[[_Resource], dict[str, Any]],
                      config: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            resource = _Resource(resource_id, location, build, config)
            self._resources[resource_id.lower()] = resource
            return {"id": resource.id, "location": location, "config": config}

    @staticmethod
    def _check_object(value: Any, name: str, keys: set[str]) -> None:
        if not isinstance(value, dict):
            raise InvalidRequest(f"{name} must be an object")
        unknown = sorted(set(value) - keys)
        if unknown:
            raise InvalidRequest(f"{name}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(keys))})")

    def _check_policy(self, policy: Any) -> None:
        if policy is None:
            return
        self._check_object(policy, "scheduled_events_policy", {"user_initiated_reboot", "user_initiated_redeploy"})
        if not all(isinstance(v, bool) for v in policy.values()):
            raise InvalidRequest("scheduled_events_policy values must be true or false")

    @staticmethod
    def _probe_config(item: Any) -> dict[str, Any]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidRequest("every probe needs a name")
        known = {"name", "protocol", "port", "interval_in_seconds", "number_of_probes", "probe_threshold",
                 "request_path"}
        unknown = sorted(set(item) - known)
        if unknown:
            raise InvalidRequest(f"probe {item['name']}: unknown field(s) {', '.join(unknown)}")
        protocol = item.get("protocol", "Http")
        if protocol not in PROBE_PROTOCOLS:
            raise InvalidRequest(f"probe protocol must be one of {', '.join(PROBE_PROTOCOLS)}")
        port = item.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidRequest("probe port must be 1 to 65535")
        interval = item.get("interval_in_seconds", 15)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 5:
            raise InvalidRequest("interval_in_seconds must be an integer >= 5 (the specification's minimum)")
        for key in ("number_of_probes", "probe_threshold"):
            value = item.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidRequest(f"{key} must be an integer >= 1")
        path = item.get("request_path")
        if protocol == "Tcp" and path is not None:
            raise InvalidRequest("request_path is not allowed for a Tcp probe")
        if protocol != "Tcp" and not (isinstance(path, str) and path.startswith("/")):
            raise InvalidRequest("an Http or Https probe needs a request_path starting with /")
        return {"name": item["name"], "protocol": protocol, "port": port, "interval_in_seconds": interval,
                "number_of_probes": item.get("number_of_probes"), "probe_threshold": item.get("probe_threshold"),
                "request_path": path}

    def add_pool(
        self, pool_id: str, addresses: Sequence[dict[str, Any]], location: str = "westeurope"
    ) -> dict[str, Any]:
        if not POOL_ID.match(pool_id):
            raise InvalidRequest("id must be a backend address pool resource id: /subscriptions/{sub}/resourceGroups/"
                                 "{rg}/providers/Microsoft.Network/loadBalancers/{lb}/backendAddressPools/{pool}")
        parsed = []
        for item in addresses:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                raise InvalidRequest("every address needs a name")
            state = item.get("admin_state", "None")
            if state not in ADMIN_STATES:
                raise InvalidRequest(f"admin_state must be one of {', '.join(ADMIN_STATES)}")
            parsed.append(_Address(item["name"], str(item.get("ip_address", "")), state, state))
        with self._lock:
            pool = _Pool(pool_id, location, parsed)
            self._pools[pool_id.lower()] = pool
            return self._pool_view(pool)

    def write_address(self, pool_id: str, address: str, admin_state: str) -> dict[str, Any]:
        """Another writer (the portal, another tool) changes one address at once: the etag changes."""
        if admin_state not in ADMIN_STATES:
            raise InvalidRequest(f"admin_state must be one of {', '.join(ADMIN_STATES)}")
        with self._lock:
            pool = self._pool(pool_id)
            entry = next((a for a in pool.addresses if a.name == address), None)
            if entry is None:
                raise InvalidRequest(f"pool has no address {address!r}")
            entry.admin_state = admin_state
            self._make_effective(pool, entry, admin_state)
            pool.etag = _new_etag()
            pool.writes += 1
            view = self._pool_view(pool)
        self._deliver()
        return view

    def pools(self) -> list[dict[str, Any]]:
        with self._lock:
            self._settle()
            views = [self._pool_view(p) for p in self._pools.values()]
        self._deliver()
        return views

    def tick(self) -> list[EffectiveChange]:
        """Settle every operation that is due and hand the changes to ``on_effective``; returns them.

        Without it an operation would complete only when some request arrives: a load balancer driven by
        the effective states would then lag behind ARM's own answers by however long the clients wait."""
        with self._lock:
            self._settle()
        return self._deliver()

    def add_fault(self, target: str, kind: str = "status", *, status: int | None = None,
                  retry_after: int | None = None, count: int | None = 1,
                  methods: Sequence[str] = ("GET", "PUT")) -> dict[str, Any]:
        if target not in ("token", "arm"):
            raise InvalidRequest("target must be token or arm")
        if kind not in ("status", "concurrent_write"):
            raise InvalidRequest("kind must be status or concurrent_write")
        if kind == "status" and (status is None or not 400 <= status <= 599):
            raise InvalidRequest("a status fault needs a status between 400 and 599")
        if kind == "concurrent_write" and target != "arm":
            raise InvalidRequest("concurrent_write applies to arm")
        if count is not None and count < 1:
            raise InvalidRequest("count must be >= 1 or null")
        if retry_after is not None and retry_after < 0:
            raise InvalidRequest("retry_after must be >= 0")
        # Another writer matters only to a write: a concurrent_write waits for the next PUT.
        verbs = ("PUT",) if kind == "concurrent_write" else tuple(m.upper() for m in methods)
        fault = _Fault(target, kind, status, retry_after, count, verbs)
        with self._lock:
            self._faults.append(fault)
        return self._fault_view(fault)

    def clear_faults(self) -> int:
        with self._lock:
            cleared = len(self._faults)
            self._faults.clear()
            return cleared

    def expire_tokens(self) -> int:
        """Every token issued so far expires now (ARM then answers 401 ExpiredAuthenticationToken)."""
        with self._lock:
            now = self._clock()
            for token in self._tokens.values():
                token.expires_at = min(token.expires_at, now - 1)
            return len(self._tokens)

    def calls(self) -> dict[str, Any]:
        """Requests served, by kind (token, pool_get, pool_put, operation_get, other), and by status."""
        with self._lock:
            return {"calls": dict(self._calls), "statuses": dict(self._statuses),
                    "total_arm": sum(n for k, n in self._calls.items() if k != "token")}

    # -- IMDS: /metadata/identity/oauth2/token ---------------------------------------------------------

    def token(self, vm: str, method: str, query: dict[str, str], metadata_header: bool) -> ArmAnswer:
        """IMDS's answer to a token request from ``vm`` (the rate limit and the path are checked before)."""
        with self._lock:
            answer = self._token(vm, method, query, metadata_header)
            self._calls["token"] += 1
            self._statuses[f"token {answer.status}"] += 1
            return answer

    def _token(self, vm: str, method: str, query: dict[str, str], metadata_header: bool) -> ArmAnswer:
        if not metadata_header:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Required metadata header not specified"})
        if method != "GET":
            return ArmAnswer(405, {"error": "invalid_request", "error_description": "Method not allowed"},
                             {"Allow": "GET"})
        version = query.get("api-version")
        if version not in IDENTITY_API_VERSIONS:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Invalid or missing api-version (supported: "
                                   + ", ".join(IDENTITY_API_VERSIONS) + ")"})
        resource = query.get("resource")
        if not resource:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Required query variable 'resource' is missing"})
        if resource not in ARM_RESOURCES:
            return ArmAnswer(400, {"error": "invalid_resource",
                                   "error_description": f"AADSTS500011: The resource principal named {resource} "
                                   "was not found in the tenant (the simulator issues tokens for ARM only)"})
        fault = self._take_fault("token", "GET")
        if fault is not None and fault.status is not None:
            return self._fault_answer(fault, token=True)
        client_id = query.get("client_id") or query.get("object_id")
        msi_res_id = query.get("msi_res_id") or query.get("mi_res_id")
        identity = self._find_identity(vm, client_id, msi_res_id)
        if identity is None:
            # What IMDS answers for an identity the VM does not have (the Azure SDKs read 400 so).
            return ArmAnswer(400, {"error": "invalid_request", "error_description": "Identity not found"})
        now = self._clock()
        expires_in = int(self.token_lifetime)
        access = "sim." + secrets.token_urlsafe(24)
        self._tokens[access] = _Token(identity, now + self.token_lifetime)
        return ArmAnswer(200, {
            "access_token": access,
            "client_id": identity.client_id,
            "expires_in": str(expires_in),
            "expires_on": str(int(now + self.token_lifetime)),
            "ext_expires_in": str(expires_in),
            "not_before": str(int(now)),
            "resource": resource,
            "token_type": "Bearer",
        })

    def _find_identity(self, vm: str, client_id: str | None, msi_res_id: str | None) -> _Identity | None:
        mine = [i for i in self._identities if i.vms is None or vm in i.vms]
        if client_id:
            return next((i for i in mine if i.client_id.lower() == client_id.lower()), None)
        if msi_res_id:
            return next((i for i in mine if (i.msi_res_id or "").lower() == msi_res_id.lower()), None)
        system = [i for i in mine if i.msi_res_id is None and i.principal == vm]
        if system:
            return system[0]
        # No system identity: IMDS uses the only user-assigned one, and refuses to choose among several.
        return mine[0] if len(mine) == 1 else None

    # -- ARM --------------------------------------------------------------------------------------------

    def arm(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes,
            base_url: str) -> ArmAnswer:
        """ARM's answer to one request; ``headers`` with lower-case names; ``base_url`` for the operation URL."""
        with self._lock:
            self._settle()
            pool_match = POOL_ID.match(path)
            kind = ("pool_get" if method == "GET" else "pool_put" if method == "PUT" else "other") if pool_match \
                else "operation_get" if _OPERATION.match(path) and method == "GET" \
                else "resource_get" if _resource_kind(path) is not None and method == "GET" else "other"
            self._calls[kind] += 1
            answer = self._arm(method, path, query, headers, body, base_url)
            self._statuses[f"{kind} {answer.status}"] += 1
        # Before the answer goes out: a client told "Succeeded" finds the data plane already changed.
        self._deliver()
        return answer

    def _arm(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes,
             base_url: str) -> ArmAnswer:
        version = query.get("api-version")
        resource_kind = _resource_kind(path)
        versions = COMPUTE_API_VERSIONS if resource_kind in ("scale_set", "vm") else ARM_API_VERSIONS
        if version is None:
            return _arm_error(400, "MissingApiVersionParameter",
                              "The api-version query parameter (?api-version=) is required for all requests.")
        if version not in versions:
            return _arm_error(400, "InvalidApiVersionParameter",
                              f"The api-version '{version}' is invalid. The supported versions are "
                              f"'{', '.join(versions)}'.")
        auth = headers.get("authorization", "")
        if not auth:
            return _arm_error(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is "
                              "missing.", {"WWW-Authenticate": 'Bearer authorization_uri="https://login.'
                                           'microsoftonline.com/common", error="invalid_token"'})
        scheme, _, credential = auth.partition(" ")
        token = self._tokens.get(credential.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            return _arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.",
                              {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        now = self._clock()
        if token.expires_at <= now:
            return _arm_error(401, "ExpiredAuthenticationToken",
                              "The access token expiry UTC time is earlier than current UTC time.",
                              {"WWW-Authenticate": 'Bearer error="invalid_token", error_description='
                               '"The access token expiry UTC time is earlier than current UTC time"'})
        fault = self._take_fault("arm", method)
        if fault is not None and fault.status is not None:
            return self._fault_answer(fault, token=False)
        operation = _OPERATION.match(path)
        if operation is not None and method == "GET":
            return self._operation(operation.group("op"))
        if resource_kind is not None:
            return self._read_resource(method, path, resource_kind, token.identity)
        pool_match = POOL_ID.match(path)
        if pool_match is None:
            return _arm_error(404, "InvalidResourceType", "The resource type could not be found in the namespace "
                              "'Microsoft.Network' for api version '" + version + "'.")
        if method not in ("GET", "PUT"):
            return _arm_error(405, "MethodNotAllowed", f"The simulator serves GET and PUT of pools, not {method}.")
        action = "Microsoft.Network/loadBalancers/backendAddressPools/" + ("read" if method == "GET" else "write")
        if not self._may(token.identity, action):
            return self._forbidden(token.identity, action, path)
        pool = self._pools.get(path.lower())
        if pool is None:
            return _arm_error(404, "NotFound", f"Resource {path} not found.")
        if method == "GET":
            return ArmAnswer(200, self._pool_resource(pool))
        if fault is not None and fault.kind == "concurrent_write":
            # Another writer got in between this client's read and its write.
            pool.etag = _new_etag()
            pool.writes += 1
        return self._put(pool, headers, body, base_url)

    def _may(self, identity: _Identity, action: str) -> bool:
        roles = self._roles.get(identity.principal.lower(), frozenset({"network-contributor"}))
        return ("reader" in roles and action.endswith("/read")) or \
            ("network-contributor" in roles and action.startswith("Microsoft.Network/"))

    @staticmethod
    def _forbidden(identity: _Identity, action: str, scope: str) -> ArmAnswer:
        return _arm_error(403, "AuthorizationFailed",
                          f"The client '{identity.object_id}' with object id '{identity.object_id}' does not have "
                          f"authorization to perform action '{action}' over scope '{scope}' or the scope is invalid. "
                          "If access was recently granted, please refresh your credentials.")

    def _read_resource(self, method: str, path: str, kind: str, identity: _Identity) -> ArmAnswer:
        """GET of a load balancer, one of its probes, a scale set or a VM."""
        if method != "GET":
            return _arm_error(405, "MethodNotAllowed", f"The simulator serves only GET of this resource, not {method}.")
        probe = _PROBE.match(path)
        top = probe.group("lb") if probe else path
        action = {"lb": "Microsoft.Network/loadBalancers/read", "probe": "Microsoft.Network/loadBalancers/probes/read",
                  "scale_set": "Microsoft.Compute/virtualMachineScaleSets/read",
                  "vm": "Microsoft.Compute/virtualMachines/read"}[kind]
        if not self._may(identity, action):
            return self._forbidden(identity, action, path)
        resource = self._resources.get(top.lower())
        if resource is None:
            parts = top.strip("/").split("/")
            return _arm_error(404, "ResourceNotFound", f"The Resource '{parts[5]}/{parts[6]}/{parts[7]}' under "
                              f"resource group '{parts[3]}' was not found. For more details please go to "
                              "https://aka.ms/ARMResourceNotFoundFix")
        body = resource.build(resource)
        if probe is None:
            return ArmAnswer(200, body)
        found = next((p for p in body["properties"]["probes"] if p["name"].lower() == probe.group("probe").lower()),
                     None)
        if found is None:
            return _arm_error(404, "NotFound", f"Resource {path} not found.")
        return ArmAnswer(200, found)

    def _lb_resource(self, lb: _Resource) -> dict[str, Any]:
        """``LoadBalancer`` of loadBalancer.json: its probes, and the pools under its id."""
        match = LB_ID.match(lb.id)
        assert match is not None
        pools = [self._pool_resource(p) for p in self._pools.values() if p.id.lower().startswith(lb.id.lower() + "/")]
        probes = []
        for item in lb.config["probes"]:
            properties: dict[str, Any] = {"provisioningState": "Succeeded", "protocol": item["protocol"],
                                          "port": item["port"], "intervalInSeconds": item["interval_in_seconds"],
                                          "loadBalancingRules": []}
            for key, name in (("number_of_probes", "numberOfProbes"), ("probe_threshold", "probeThreshold"),
                              ("request_path", "requestPath")):
                if item[key] is not None:
                    properties[name] = item[key]
            probes.append({"name": item["name"], "id": f"{lb.id}/probes/{item['name']}", "etag": lb.etag,
                           "type": "Microsoft.Network/loadBalancers/probes", "properties": properties})
        return {"name": match.group("lb"), "id": lb.id, "etag": lb.etag, "type": "Microsoft.Network/loadBalancers",
                "location": lb.location, "sku": {"name": "Standard", "tier": "Regional"},
                "properties": {"provisioningState": "Succeeded", "resourceGuid": lb.unique_id,
                               "frontendIPConfigurations": [], "backendAddressPools": pools, "probes": probes,
                               "loadBalancingRules": [], "inboundNatRules": [], "outboundRules": []}}

    @staticmethod
    def _policy_resource(policy: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for key, name in (("user_initiated_reboot", "userInitiatedReboot"),
                          ("user_initiated_redeploy", "userInitiatedRedeploy")):
            if key in policy:
                body[name] = {"automaticallyApprove": policy[key]}
        return body

    def _scale_set_resource(self, scale_set: _Resource) -> dict[str, Any]:
        """``VirtualMachineScaleSet`` of virtualMachineScaleSet.json, the parts configured (absent ones are left
        out, as ARM leaves out what was never set)."""
        match = SCALE_SET_ID.match(scale_set.id)
        assert match is not None
        config = scale_set.config
        profile: dict[str, Any] = {"osProfile": {"computerNamePrefix": match.group("name")[:9]},
                                   "networkProfile": {}}
        if "priority" in config:
            profile["priority"] = config["priority"]
            if config["priority"] in ("Spot", "Low"):
                profile["evictionPolicy"] = "Deallocate"
                profile["billingProfile"] = {"maxPrice": -1}
        if "health_probe" in config:
            profile["networkProfile"]["healthProbe"] = {"id": config["health_probe"]}
        events: dict[str, Any] = {}
        for key, name in (("terminate_notification", "terminateNotificationProfile"),
                          ("os_image_notification", "osImageNotificationProfile")):
            if key in config:
                item = config[key]
                events[name] = {k: v for k, v in (("notBeforeTimeout", item.get("not_before_timeout")),
                                                  ("enable", item.get("enable"))) if v is not None}
        if events:
            profile["scheduledEventsProfile"] = events
        if "health_extension" in config:
            extension = config["health_extension"]
            settings = {"protocol": extension.get("protocol", "http"), "port": extension.get("port")}
            if extension.get("request_path") is not None:
                settings["requestPath"] = extension["request_path"]
            profile["extensionProfile"] = {"extensions": [{
                "name": "HealthExtension",
                "properties": {"publisher": "Microsoft.ManagedServices", "type": "ApplicationHealthLinux",
                               "typeHandlerVersion": "2.0", "autoUpgradeMinorVersion": True, "settings": settings,
                               "provisioningState": "Succeeded"}}]}
        properties: dict[str, Any] = {"provisioningState": "Succeeded", "uniqueId": scale_set.unique_id,
                                      "orchestrationMode": "Uniform", "upgradePolicy": {"mode": "Manual"},
                                      "singlePlacementGroup": True, "virtualMachineProfile": profile}
        if "automatic_repairs" in config:
            repairs = config["automatic_repairs"]
            properties["automaticRepairsPolicy"] = {
                "enabled": bool(repairs.get("enabled", False)), "gracePeriod": repairs.get("grace_period", "PT10M"),
                "repairAction": repairs.get("repair_action", "Replace")}
        if "scheduled_events_policy" in config:
            properties["scheduledEventsPolicy"] = self._policy_resource(config["scheduled_events_policy"])
        return {"name": match.group("name"), "id": scale_set.id, "type": "Microsoft.Compute/virtualMachineScaleSets",
                "location": scale_set.location, "etag": scale_set.etag.removeprefix("W/").strip('"'),
                "sku": {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": 3}, "properties": properties}

    def _vm_resource(self, vm: _Resource) -> dict[str, Any]:
        """``VirtualMachine`` of virtualMachine.json: ``priority``, ``scheduledEventsPolicy``, the availability set."""
        match = VM_ID.match(vm.id)
        assert match is not None
        config = vm.config
        properties: dict[str, Any] = {"provisioningState": "Succeeded", "vmId": vm.unique_id,
                                      "hardwareProfile": {"vmSize": "Standard_D2s_v5"}}
        if "priority" in config:
            properties["priority"] = config["priority"]
            if config["priority"] in ("Spot", "Low"):
                properties["evictionPolicy"] = "Deallocate"
        if "scheduled_events_policy" in config:
            properties["scheduledEventsPolicy"] = self._policy_resource(config["scheduled_events_policy"])
        if "availability_set" in config:
            properties["availabilitySet"] = {"id": config["availability_set"]}
        return {"name": match.group("name"), "id": vm.id, "type": "Microsoft.Compute/virtualMachines",
                "location": vm.location, "properties": properties}

    def _put(self, pool: _Pool, headers: dict[str, str], body: bytes, base_url: str) -> ArmAnswer:
        if_match = headers.get("if-match")
        if if_match is not None and if_match != "*" and if_match != pool.etag:
            return _arm_error(412, "PreconditionFailed", "The condition specified using HTTP conditional header(s) "
                              "is not met.")
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return _arm_error(400, "InvalidRequestFormat", "Cannot parse the request.")
        addresses, problem = self._addresses_of(data, pool)
        if problem is not None:
            return _arm_error(400, "InvalidRequestFormat", problem)
        assert addresses is not None
        pool.addresses = addresses
        pool.etag = _new_etag()
        pool.writes += 1
        pool.provisioning = "Updating"
        operation_id = str(uuid.uuid4())
        match = POOL_ID.match(pool.id)
        assert match is not None
        self._operations[operation_id] = _Operation(operation_id, pool.id, self._clock() + self.async_seconds,
                                                    False, {a.name: a.admin_state for a in addresses})
        operation_url = (f"{base_url}/subscriptions/{match.group('sub')}/providers/Microsoft.Network/locations/"
                         f"{pool.location}/operations/{operation_id}?api-version=2023-09-01")
        self._settle()
        resource = self._pool_resource(pool)
        return ArmAnswer(200, resource, {"Azure-AsyncOperation": operation_url,
                                         "Retry-After": str(self.retry_after)})

    def _addresses_of(self, data: Any, pool: _Pool) -> tuple[list[_Address] | None, str | None]:
        if not isinstance(data, dict):
            return None, "The request body must be a JSON object."
        name = data.get("name")
        pool_name = pool.id.rsplit("/", 1)[1]
        if name is not None and name != pool_name:
            return None, f"The name in the body ({name}) does not match the pool in the URL ({pool_name})."
        properties = data.get("properties", {})
        if not isinstance(properties, dict):
            return None, "properties must be an object."
        items = properties.get("loadBalancerBackendAddresses", [])
        if not isinstance(items, list):
            return None, "properties.loadBalancerBackendAddresses must be an array."
        known = {a.name: a for a in pool.addresses}
        result = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                return None, "Every backend address needs a name."
            props = item.get("properties", {})
            if not isinstance(props, dict):
                return None, f"properties of backend address {item['name']} must be an object."
            state = props.get("adminState", "None")
            if state not in ADMIN_STATES:
                return None, (f"Value '{state}' of adminState of backend address {item['name']} is invalid: "
                              f"expected one of {', '.join(ADMIN_STATES)}.")
            before = known.get(item["name"])
            ip_address = str(props.get("ipAddress", before.ip_address if before else ""))
            result.append(_Address(item["name"], ip_address, state, before.effective if before else "None"))
        return result, None

    def _operation(self, operation_id: str) -> ArmAnswer:
        operation = self._operations.get(operation_id)
        if operation is None:
            return _arm_error(404, "NotFound", f"Operation {operation_id} not found.")
        if not operation.done:
            self._statuses["operation InProgress"] += 1
            return ArmAnswer(200, {"status": "InProgress"}, {"Retry-After": str(self.retry_after)})
        self._statuses["operation Succeeded"] += 1
        return ArmAnswer(200, {"status": "Succeeded"})

    def _settle(self) -> None:
        """Complete every operation that is due, in the order they were accepted: their admin states
        become effective (the data plane), and a pool with no operation left is Succeeded again."""
        now = self._clock()
        for operation in self._operations.values():
            if operation.done or operation.due > now:
                continue
            operation.done = True
            pool = self._pools.get(operation.pool_id.lower())
            if pool is None:
                continue
            for address in pool.addresses:
                if address.name in operation.states:
                    self._make_effective(pool, address, operation.states[address.name])
            if not any(not o.done for o in self._operations.values() if o.pool_id == operation.pool_id):
                pool.provisioning = "Succeeded"

    def _make_effective(self, pool: _Pool, address: _Address, state: str) -> None:
        """Set ``address``'s effective state (the lock is held), queueing the change if it is one."""
        if address.effective == state:
            return
        self._changes.append(EffectiveChange(pool.id, address.name, address.ip_address, address.effective, state,
                                             self._clock()))
        address.effective = state

    def _deliver(self) -> list[EffectiveChange]:
        """Hand the queued changes to ``on_effective``, outside the model's lock (the hook may do I/O, and
        ARM requests must not wait on it), in order. Raises nothing: a hook that raises is a bug, logged."""
        with self._deliver_lock:
            with self._lock:
                changes, self._changes = self._changes, []
            hook = self.on_effective
            if hook is not None:
                for change in changes:
                    try:
                        hook(change)
                    except Exception:
                        log.exception("bug in the effective admin state hook (pool %s, address %s)",
                                      change.pool_id, change.address)
            return changes

    # -- helpers ----------------------------------------------------------------------------------------

    def _take_fault(self, target: str, method: str) -> _Fault | None:
        for fault in self._faults:
            if fault.target == target and method in fault.methods:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _fault_answer(fault: _Fault, *, token: bool) -> ArmAnswer:
        assert fault.status is not None
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        if token:
            return ArmAnswer(fault.status, {"error": "simulated_fault",
                                            "error_description": f"Simulated fault {fault.status}"}, headers)
        code = "TooManyRequests" if fault.status == 429 else "InternalServerError" if fault.status >= 500 \
            else "SimulatedFault"
        return _arm_error(fault.status, code, f"Simulated fault {fault.status}", headers)

    def _vm(self, name: str) -> str:
        vm = self._vms.get(name.lower())
        if vm is None:
            raise InvalidRequest(f"no VM {name!r} in the group")
        return vm

    def _pool(self, pool_id: str) -> _Pool:
        pool = self._pools.get(pool_id.lower())
        if pool is None:
            raise InvalidRequest(f"no pool {pool_id!r}")
        return pool

    def _pool_resource(self, pool: _Pool) -> dict[str, Any]:
        """The pool as ARM serves it (``BackendAddressPool`` of loadBalancer.json)."""
        match = POOL_ID.match(pool.id)
        assert match is not None
        return {
            "name": match.group("pool"),
            "id": pool.id,
            "etag": pool.etag,
            "type": "Microsoft.Network/loadBalancers/backendAddressPools",
            "properties": {
                "provisioningState": pool.provisioning,
                "loadBalancerBackendAddresses": [
                    {"name": a.name, "properties": {"ipAddress": a.ip_address, "adminState": a.admin_state}}
                    for a in pool.addresses
                ],
                "loadBalancingRules": [],
            },
        }

    @staticmethod
    def _pool_view(pool: _Pool) -> dict[str, Any]:
        return {"id": pool.id, "etag": pool.etag, "provisioning_state": pool.provisioning, "writes": pool.writes,
                "admin_states": {a.name: a.admin_state for a in pool.addresses},
                "effective": {a.name: a.effective for a in pool.addresses}}

    @staticmethod
    def _identity_view(identity: _Identity) -> dict[str, Any]:
        return {"principal": identity.principal, "client_id": identity.client_id, "msi_res_id": identity.msi_res_id,
                "object_id": identity.object_id, "vms": None if identity.vms is None else sorted(identity.vms)}

    @staticmethod
    def _fault_view(fault: _Fault) -> dict[str, Any]:
        return {"target": fault.target, "kind": fault.kind, "status": fault.status, "retry_after": fault.retry_after,
                "count": fault.remaining, "methods": list(fault.methods)}
