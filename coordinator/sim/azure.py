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
  user-assigned one) holds one role over every pool: ``network-contributor`` (read and write; the default),
  ``reader`` (read only) or ``none``.
* **Backend address pools**, by resource id, with their ``loadBalancerBackendAddresses`` (name, IP address,
  ``adminState``), an ``etag`` that changes on every write and a ``provisioningState``. A PUT replaces the
  addresses (read-only fields sent back are ignored), is checked against ``If-Match``, and completes
  asynchronously: the answer carries ``Azure-AsyncOperation``, whose status reads ``InProgress`` until
  ``async_seconds`` have passed since the PUT, then ``Succeeded``. The pool's new content is what GET
  answers from the PUT on (``provisioningState`` ``Updating`` until the operation succeeds); its *effective*
  admin states, the data plane, change only when the operation succeeds.
* **Faults**: queued status answers (429 with ``Retry-After``, 500...) on the token endpoint or on ARM, and
  ``concurrent_write``: another writer changes the pool just before the next PUT, whose ``If-Match`` then
  fails with 412.

Time is real (wall clock) seconds: tokens expire, and operations complete, in the client's time.
"""

from __future__ import annotations

import json
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
    "IDENTITY_API_VERSIONS",
    "POOL_ID",
    "ROLES",
    "ArmAnswer",
    "AzureModel",
]

IDENTITY_API_VERSIONS = ("2018-02-01", "2019-08-01")
#: api-versions of Microsoft.Network the simulated ARM accepts (backend address admin state is in all).
ARM_API_VERSIONS = ("2023-09-01", "2023-11-01", "2024-01-01", "2024-03-01", "2024-05-01")
ADMIN_STATES = ("None", "Up", "Down")
ROLES = ("network-contributor", "reader", "none")
ARM_RESOURCES = frozenset({"https://management.azure.com/", "https://management.azure.com",
                           "https://management.core.windows.net/", "https://management.core.windows.net"})

POOL_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/"
    r"loadBalancers/(?P<lb>[^/]+)/backendAddressPools/(?P<pool>[^/]+)$",
    re.IGNORECASE,
)
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


def _arm_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> ArmAnswer:
    return ArmAnswer(status, {"error": {"code": code, "message": message}}, headers or {})


def _new_etag() -> str:
    return f'W/"{uuid.uuid4()}"'


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
        self._roles: dict[str, str] = {}
        self._tokens: dict[str, _Token] = {}
        self._pools: dict[str, _Pool] = {}
        self._operations: dict[str, _Operation] = {}
        self._faults: list[_Fault] = []
        self._calls: Counter[str] = Counter()
        self._statuses: Counter[str] = Counter()

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

    def set_role(self, principal: str, role: str) -> dict[str, Any]:
        """``principal``: a VM name (its system identity) or a user-assigned identity's client id."""
        if role not in ROLES:
            raise InvalidRequest(f"role must be one of {', '.join(ROLES)}")
        with self._lock:
            if not any(i.principal.lower() == principal.lower() for i in self._identities):
                raise InvalidRequest(f"no identity {principal!r}")
            self._roles[principal.lower()] = role
            return {"principal": principal, "role": role}

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
            entry.admin_state = entry.effective = admin_state
            pool.etag = _new_etag()
            pool.writes += 1
            return self._pool_view(pool)

    def pools(self) -> list[dict[str, Any]]:
        with self._lock:
            self._settle()
            return [self._pool_view(p) for p in self._pools.values()]

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
                else "operation_get" if _OPERATION.match(path) and method == "GET" else "other"
            self._calls[kind] += 1
            answer = self._arm(method, path, query, headers, body, base_url)
            self._statuses[f"{kind} {answer.status}"] += 1
            return answer

    def _arm(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes,
             base_url: str) -> ArmAnswer:
        version = query.get("api-version")
        if version is None:
            return _arm_error(400, "MissingApiVersionParameter",
                              "The api-version query parameter (?api-version=) is required for all requests.")
        if version not in ARM_API_VERSIONS:
            return _arm_error(400, "InvalidApiVersionParameter",
                              f"The api-version '{version}' is invalid. The supported versions are "
                              f"'{', '.join(ARM_API_VERSIONS)}'.")
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
        pool_match = POOL_ID.match(path)
        if pool_match is None:
            return _arm_error(404, "InvalidResourceType", "The resource type could not be found in the namespace "
                              "'Microsoft.Network' for api version '" + version + "'.")
        if method not in ("GET", "PUT"):
            return _arm_error(405, "MethodNotAllowed", f"The simulator serves GET and PUT of pools, not {method}.")
        role = self._roles.get(token.identity.principal.lower(), "network-contributor")
        action = "read" if method == "GET" else "write"
        if role == "none" or (role == "reader" and action == "write"):
            return _arm_error(403, "AuthorizationFailed",
                              f"The client '{token.identity.object_id}' with object id '{token.identity.object_id}' "
                              "does not have authorization to perform action 'Microsoft.Network/loadBalancers/"
                              f"backendAddressPools/{action}' over scope '{path}' or the scope is invalid. If access "
                              "was recently granted, please refresh your credentials.")
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
                    address.effective = operation.states[address.name]
            if not any(not o.done for o in self._operations.values() if o.pool_id == operation.pool_id):
                pool.provisioning = "Succeeded"

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
