"""``AzureModel``: the simulated managed identity and Azure Resource Manager, assembled from its parts
(faults, identities and tokens, pools, read-only resources, throttling), with ARM's entry point (``arm``)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from azuresim.azure.answers import (
    ARM_API_VERSIONS,
    AUTHORIZATION_API_VERSIONS,
    COMPUTE_API_VERSIONS,
    MAINTENANCE_ACK,
    MAINTENANCE_API_VERSIONS,
    OPERATION,
    POOL_ID,
    ArmAnswer,
    EffectiveChange,
    arm_error,
    dropped_answer,
    new_etag,
    permissions_scope,
    resource_kind_of,
)
from azuresim.azure.faults import FaultsMixin
from azuresim.azure.identity import IdentityMixin
from azuresim.azure.pools import PoolsMixin
from azuresim.azure.records import (
    ArmFault,
    Bucket,
    Identity,
    Limits,
    Operation,
    Pool,
    Resource,
    Stalled,
    Token,
)
from azuresim.azure.resources import ResourcesMixin
from azuresim.azure.throttle import ThrottleMixin
from azuresim.errors import InvalidRequest

__all__ = ["AzureModel"]


class AzureModel(ResourcesMixin, PoolsMixin, IdentityMixin, ThrottleMixin, FaultsMixin):
    """Identities, tokens, backend pools and asynchronous operations; thread-safe. See ``azuresim.azure``.

    ``conflict_while_updating``: a PUT to a pool while an operation on it (or on another pool of its load
    balancer) is in progress is refused 409 ``AnotherOperationInProgress`` (see ``configure``)."""

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
        conflict_while_updating: bool = False,
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
        self.conflict_while_updating = bool(conflict_while_updating)
        self._limits: Limits | None = None
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._identities: list[Identity] = []
        if system_identity:
            self._identities += [Identity(vm, str(uuid.uuid4()), None, str(uuid.uuid4()), frozenset({vm}))
                                 for vm in vms]
        self._roles: dict[str, frozenset[str]] = {}
        self._resources: dict[str, Resource] = {}  # load balancers, scale sets and VMs by lower-case id
        self._tokens: dict[str, Token] = {}
        self._pools: dict[str, Pool] = {}
        self._operations: dict[str, Operation] = {}
        self._stalled: list[Stalled] = []
        self._faults: list[ArmFault] = []
        self._calls: Counter[str] = Counter()
        self._statuses: Counter[str] = Counter()
        self.on_effective = on_effective
        self._changes: list[EffectiveChange] = []  # made under the lock, not yet handed to on_effective
        # Held while handing changes over: one deliverer at a time keeps them in the order they happened.
        self._deliver_lock = threading.Lock()

    def configure(self, *, conflict_while_updating: bool | None = None, async_seconds: float | None = None,
                  retry_after: int | None = None) -> dict[str, Any]:
        """Change ARM's settings (those not given stay); returns them all."""
        if conflict_while_updating is not None and not isinstance(conflict_while_updating, bool):
            raise InvalidRequest("conflict_while_updating must be true or false")
        if async_seconds is not None and not async_seconds >= 0:
            raise InvalidRequest("async_seconds must be >= 0")
        if retry_after is not None and retry_after < 0:
            raise InvalidRequest("retry_after must be >= 0")
        with self._lock:
            if conflict_while_updating is not None:
                self.conflict_while_updating = conflict_while_updating
            if async_seconds is not None:
                self.async_seconds = float(async_seconds)
            if retry_after is not None:
                self.retry_after = retry_after
            return {"conflict_while_updating": self.conflict_while_updating, "async_seconds": self.async_seconds,
                    "retry_after": self.retry_after}

    def calls(self) -> dict[str, Any]:
        """Requests served, by kind (token, pool_get, pool_put, operation_get, resource_get, permissions_get,
        other), and by status (``dropped``: the connection was closed without an answer)."""
        with self._lock:
            return {"calls": dict(self._calls), "statuses": dict(self._statuses),
                    "total_arm": sum(n for k, n in self._calls.items() if k != "token")}

    # -- ARM --------------------------------------------------------------------------------------------

    def arm(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes,
            base_url: str) -> ArmAnswer:
        """ARM's answer to one request; ``headers`` with lower-case names; ``base_url`` for the operation URL."""
        with self._lock:
            self._settle()
            kind = _request_kind(method, path)
            self._calls[kind] += 1
            answer = self._with_ratelimit(self._arm(method, path, query, headers, body, base_url), method, path)
            self._statuses[f"{kind} {'dropped' if answer.drop else answer.status}"] += 1
        # Before the answer goes out: a client told "Succeeded" finds the data plane already changed.
        self._deliver()
        return answer

    def graph_caller(self, headers: dict[str, str]) -> tuple[Identity | None, ArmAnswer | None]:
        """For the simulated Resource Graph (``azuresim.graph``), on ARM's port: who sends a request
        with these (lower-case) ``headers``, and whether it may read, as ARM judges any request: ``(identity,
        None)``, or ``(identity or None, the answer that refuses it)``. A ``graph`` fault (``unreachable`` or
        ``status``) is taken here, after authentication; every call is counted (``graph_query``)."""
        with self._lock:
            self._calls["graph_query"] += 1
            if self._take_fault("graph", "POST", ("unreachable",)) is not None:
                return None, dropped_answer()
            identity, refused = self._authenticate(headers)
            if refused is not None:
                return identity, refused
            assert identity is not None
            fault = self._take_fault("graph", "POST", ("status",))
            if fault is not None:
                return identity, self._fault_answer(fault, token=False)
            if not self._may(identity, "Microsoft.Maintenance/scheduledEvents/read"):
                return identity, self._forbidden(identity, "Microsoft.ResourceGraph/resources/read",
                                                 "/providers/Microsoft.ResourceGraph")
            return identity, None

    def count_graph_answer(self, status: int | str) -> None:
        with self._lock:
            self._statuses[f"graph_query {status}"] += 1

    def _authenticate(self, headers: dict[str, str]) -> tuple[Identity | None, ArmAnswer | None]:
        """The identity of a request's bearer token, or the 401 ARM answers (missing, unknown, expired)."""
        auth = headers.get("authorization", "")
        if not auth:
            return None, arm_error(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header "
                                    "is missing.", {"WWW-Authenticate": 'Bearer authorization_uri="https://login.'
                                                    'microsoftonline.com/common", error="invalid_token"'})
        scheme, _, credential = auth.partition(" ")
        token = self._tokens.get(credential.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            return None, arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.",
                                    {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if token.expires_at <= self._clock():
            return token.identity, arm_error(
                401, "ExpiredAuthenticationToken", "The access token expiry UTC time is earlier than current UTC time.",
                {"WWW-Authenticate": 'Bearer error="invalid_token", error_description='
                 '"The access token expiry UTC time is earlier than current UTC time"'})
        return token.identity, None

    def _arm(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes,
             base_url: str) -> ArmAnswer:
        if self._take_fault("arm", method, ("unreachable",)) is not None:
            return dropped_answer()
        version = query.get("api-version")
        resource_kind = resource_kind_of(path)
        permissions = permissions_scope(path) is not None
        maintenance = MAINTENANCE_ACK.match(path) if method == "POST" else None
        versions = MAINTENANCE_API_VERSIONS if maintenance is not None else AUTHORIZATION_API_VERSIONS if permissions \
            else COMPUTE_API_VERSIONS if resource_kind in ("scale_set", "availability_set", "vm") else ARM_API_VERSIONS
        if version is None:
            return arm_error(400, "MissingApiVersionParameter",
                              "The api-version query parameter (?api-version=) is required for all requests.")
        if version not in versions:
            return arm_error(400, "InvalidApiVersionParameter",
                              f"The api-version '{version}' is invalid. The supported versions are "
                              f"'{', '.join(versions)}'.")
        identity, refused = self._authenticate(headers)
        if refused is not None:
            return refused
        assert identity is not None
        now = self._clock()
        throttled = self._throttle(method, path, identity.object_id)
        if throttled is not None:
            return throttled
        fault = self._take_fault("arm", method, ("status", "concurrent_write"))
        if fault is not None and fault.kind == "status":
            return self._fault_answer(fault, token=False)
        if maintenance is not None:
            return self._acknowledge(maintenance.group("id"), body, identity)
        operation = OPERATION.match(path)
        if operation is not None and method == "GET":
            return self._operation(operation.group("op"))
        if permissions:
            return self._permissions(method, identity)
        if resource_kind is not None:
            return self._read_resource(method, path, resource_kind, identity)
        pool_match = POOL_ID.match(path)
        if pool_match is None:
            return arm_error(404, "InvalidResourceType", "The resource type could not be found in the namespace "
                              "'Microsoft.Network' for api version '" + version + "'.")
        if method not in ("GET", "PUT"):
            return arm_error(405, "MethodNotAllowed", f"The simulator serves GET and PUT of pools, not {method}.")
        action = "Microsoft.Network/loadBalancers/backendAddressPools/" + ("read" if method == "GET" else "write")
        if not self._may(identity, action):
            return self._forbidden(identity, action, path)
        pool = self._pools.get(path.lower())
        if pool is None:
            return arm_error(404, "NotFound", f"Resource {path} not found.")
        if method == "GET":
            return ArmAnswer(200, self._pool_resource(pool))
        if fault is not None and fault.kind == "concurrent_write":
            # Another writer got in between this client's read and its write.
            pool.etag = new_etag()
            pool.writes += 1
        stall = self._take_fault("arm", "PUT", ("stalled_write",))
        if stall is not None and stall.seconds is not None:
            # Held on its way: nothing of it shows until it reaches the pool (``PoolsMixin._land``); the
            # connection is closed then, unanswered (a client that waited that long learns nothing either).
            due = now + stall.seconds
            self._stalled.append(Stalled(due, pool.id, dict(headers), body, base_url))
            self._stalled.sort(key=lambda s: s.due)
            return dataclasses.replace(dropped_answer(), delay=stall.seconds)
        return self._put(pool, headers, body, base_url)

    def _acknowledge(self, event_id: str | None, body: bytes, identity: Identity) -> ArmAnswer:
        """The Maintenance API's acknowledgement: the caller's role, and the ids (one in the path, or the body's
        ``{"value": [ids]}``), handed to the server to approve (``ArmAnswer.acknowledge``)."""
        action = "Microsoft.Maintenance/scheduledevents/acknowledge/action"
        if not self._may(identity, action):
            return arm_error(403, "AuthorizationFailed", f"The client '{identity.object_id}' does not have "
                              f"authorization to perform action '{action}' over the scope, or the scope is invalid.")
        if event_id is not None:
            return ArmAnswer(200, {"value": "Successfully Approved"}, acknowledge=(event_id,), single=True)
        try:
            ids = json.loads(body or b"null").get("value")
        except (ValueError, AttributeError):
            ids = None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            return arm_error(400, "InvalidRequestContent", 'The request body must be {"value": [event ids]}.')
        return ArmAnswer(200, {"value": "Successfully Approved"}, acknowledge=tuple(ids))



def _request_kind(method: str, path: str) -> str:
    """What ``calls()`` counts a request as."""
    if POOL_ID.match(path):
        return "pool_get" if method == "GET" else "pool_put" if method == "PUT" else "other"
    if method != "GET":
        return "other"
    if OPERATION.match(path):
        return "operation_get"
    if resource_kind_of(path) is not None:
        return "resource_get"
    return "permissions_get" if permissions_scope(path) is not None else "other"
