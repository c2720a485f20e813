"""The records of the Azure model (backend addresses and pools, asynchronous operations, read-only
resources, identities, tokens, queued faults, throttling's limits and token buckets) and ``AzureState``,
the state ``AzureModel``'s parts share."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from azuresim.azure.answers import EffectiveChange, new_etag
from azuresim.errors import InvalidRequest

__all__ = [
    "Address",
    "ArmFault",
    "AzureState",
    "Bucket",
    "Identity",
    "Limits",
    "Operation",
    "Pool",
    "Resource",
    "Stalled",
    "Token",
]


@dataclass
class Address:
    name: str
    ip_address: str
    admin_state: str = "None"
    effective: str = "None"


@dataclass
class Pool:
    id: str
    location: str
    addresses: list[Address]
    etag: str = field(default_factory=new_etag)
    provisioning: str = "Succeeded"
    writes: int = 0


@dataclass
class Operation:
    id: str
    pool_id: str
    due: float  # when it ends
    done: bool
    states: dict[str, str]  # the admin states this operation makes effective (if it succeeds)
    outcome: str = "Succeeded"  # how it ends: Succeeded, Failed or Canceled


@dataclass
class Resource:
    """A read-only resource (load balancer, scale set, VM): its id, location and what GET answers."""

    id: str
    location: str
    build: Callable[[Resource], dict[str, Any]]
    config: dict[str, Any]
    etag: str = field(default_factory=new_etag)
    unique_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Identity:
    principal: str  # "vm0" for vm0's system-assigned identity, else the client id
    client_id: str
    msi_res_id: str | None
    object_id: str
    vms: frozenset[str] | None  # the VMs it is assigned to; None: every VM


@dataclass
class Token:
    identity: Identity
    expires_at: float


@dataclass
class ArmFault:
    target: str  # "token", "arm" or "graph"
    kind: str  # one of faults.FAULT_KINDS
    status: int | None
    retry_after: int | None
    remaining: int | None
    methods: tuple[str, ...]
    # slow_operation: how long; stalled_write: how long the write is held; lost_answer: the delay (None: no answer)
    seconds: float | None = None
    end: str | None = None  # operation_end: Failed or Canceled


@dataclass(frozen=True)
class Stalled:
    """A PUT held on its way (a ``stalled_write`` fault): it reaches its pool at ``due``, and is handled then."""

    due: float
    pool_id: str
    headers: dict[str, str]
    body: bytes
    base_url: str


@dataclass(frozen=True)
class Limits:
    """ARM's token buckets: how many requests a full bucket holds, and how many tokens come back a second."""

    read_capacity: int = 250
    read_refill: float = 25.0
    write_capacity: int = 200
    write_refill: float = 10.0


@dataclass
class Bucket:
    tokens: float
    at: float  # when ``tokens`` was last brought up to date


class AzureState:
    """The state every part of ``AzureModel`` works on (set by ``AzureModel.__init__``), declared here so
    that each part, a mixin of its own module, is type-checked against it."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _vms: dict[str, str]
    token_lifetime: float
    async_seconds: float
    retry_after: int
    conflict_while_updating: bool
    _limits: Limits | None  # None: no throttling
    _buckets: dict[tuple[str, str], Bucket]  # by (subscription, "reads" or "writes")
    _identities: list[Identity]
    _roles: dict[str, frozenset[str]]
    _resources: dict[str, Resource]
    _tokens: dict[str, Token]
    _pools: dict[str, Pool]
    _operations: dict[str, Operation]
    _stalled: list[Stalled]  # PUTs on their way to their pool, in the order they will reach it
    _faults: list[ArmFault]
    _calls: Counter[str]
    _statuses: Counter[str]
    on_effective: Callable[[EffectiveChange], None] | None
    _changes: list[EffectiveChange]
    _deliver_lock: threading.Lock

    def _vm(self, name: str) -> str:
        vm = self._vms.get(name.lower())
        if vm is None:
            raise InvalidRequest(f"no VM {name!r} in the group")
        return vm
