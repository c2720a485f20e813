"""Drain this VM from Azure Load Balancer backend pools by their admin state, through Azure Resource Manager.

An Azure Load Balancer backend address (a pool instance) has an administrative state: ``Down`` sends it no
new connections from the next flow on, whatever the health probe says (established TCP flows go on, as with
a failed probe); ``None`` hands control back to the probe. ``AzureLbAction`` sets this VM's address
``Down`` in every configured pool when draining, and back to ``None`` when recovering:

* a token for ``https://management.azure.com/`` from the VM's managed identity, through IMDS
  (``GET /metadata/identity/oauth2/token``; a user-assigned identity by ``client_id``), cached until
  shortly before it expires (``ManagedIdentity``, shared with ``coordinator doctor`` in
  ``coordinator.azure_arm``);
* for each pool, read-modify-write of the whole pool (``GET`` then ``PUT`` of the
  ``BackendAddressPool`` resource, api-version 2023-09-01), ``If-Match`` on the etag that was read: when
  another writer (another VM of the group draining at the same moment) changed the pool in between, ARM
  answers 412 and the pool is read again; 429 and 5xx are retried after ``Retry-After``; the write is
  asynchronous, and the ``Azure-AsyncOperation`` URL is polled until it reports ``Succeeded``
  (``ArmClient`` of ``coordinator.azure_arm``);
* everything one drain or recovery does is bounded by ``deadline`` seconds.

It works **beside** the health probe action, never instead of it: the probe still fails while the VM is
drained. When ARM cannot be used (no token, no role, ARM unreachable, out of time), the drain logs one
error line naming the cause and goes on through the probe alone, waiting out the probe's lag
(``fallback_wait``) before it returns, so that the drain wait still holds even when it was shortened for
admin state; it returns that fallback and its cause, which the agent shows in ``/status``
(``action_fallback``; ``coordinator.actions.base``). A recovery that fails raises ``ActionError``: the agent
retries it until the address is back to ``None``, and the state file runs it again after a restart
(``recover_after_probe``: it is recovered once the probe serves again, as HAProxy is).

REST reference: Azure/azure-rest-api-specs,
``specification/network/resource-manager/Microsoft.Network/stable/2023-09-01/loadBalancer.json``
(``BackendAddressPool``, ``LoadBalancerBackendAddress``, ``adminState``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx

from coordinator.actions.base import ActionContext
from coordinator.azure_arm import (
    ARM_RESOURCE,
    ArmClient,
    ArmError,
    ManagedIdentity,
    error_excerpt,
    parse_retry_after,
    token_lifetime,
)

__all__ = [
    "ARM_RESOURCE",
    "AdminState",
    "ArmClient",
    "ArmError",
    "AzureLbAction",
    "ManagedIdentity",
    "get_pool",
    "parse_retry_after",
    "put_pool",
    "token_lifetime",
    "with_admin_state",
]

log = logging.getLogger(__name__)

AdminState = Literal["None", "Up", "Down"]
# Read-only in the REST specification: an SDK drops them from a PUT body, and so does this client.
_POOL_READ_ONLY = ("provisioningState", "backendIPConfigurations", "loadBalancingRules", "outboundRule",
                   "outboundRules", "inboundNatRules")
_ADDRESS_READ_ONLY = ("networkInterfaceIPConfiguration", "inboundNatRulesPortMapping")
_CONFLICT_PAUSE = 0.2  # x the conflicts met so far, at most 2 s, jittered: writers of one pool spread out


def with_admin_state(pool: dict[str, Any], address: str, state: AdminState) -> tuple[dict[str, Any], list[str]]:
    """The PUT body that sets ``address`` (a backend address's name, or its IP address) to ``state`` in
    ``pool`` (a ``BackendAddressPool`` as ARM answered it), and the address's current states. Every other
    address, and every other writable field, is sent back as read; read-only fields are left out. Raises
    ``ArmError`` when the pool has no such address."""
    properties = pool.get("properties")
    addresses = properties.get("loadBalancerBackendAddresses") if isinstance(properties, dict) else None
    if not isinstance(properties, dict) or not isinstance(addresses, list):
        raise ArmError(f"pool {pool.get('id', '?')} has no loadBalancerBackendAddresses")
    current: list[str] = []
    new_addresses = []
    for entry in addresses:
        if not isinstance(entry, dict):
            raise ArmError(f"pool {pool.get('id', '?')} has a malformed backend address: {entry!r:.100}")
        props = entry.get("properties") if isinstance(entry.get("properties"), dict) else {}
        assert isinstance(props, dict)
        kept = {k: v for k, v in props.items() if k not in _ADDRESS_READ_ONLY}
        if entry.get("name") == address or props.get("ipAddress") == address:
            current.append(str(props.get("adminState", "None")))
            kept["adminState"] = state
        new_addresses.append({**{k: v for k, v in entry.items() if k != "properties"}, "properties": kept})
    if not current:
        names = ", ".join(str(e.get("name")) for e in addresses if isinstance(e, dict)) or "none"
        raise ArmError(f"pool {pool.get('id', '?')} has no backend address named {address!r} or with that IP "
                       f"address (its addresses: {names})")
    body_properties = {k: v for k, v in properties.items() if k not in _POOL_READ_ONLY}
    body_properties["loadBalancerBackendAddresses"] = new_addresses
    body = {k: v for k, v in pool.items() if k in ("id", "name")}
    body["properties"] = body_properties
    return body, current


def get_pool(client: ArmClient, pool_id: str, deadline: float) -> dict[str, Any]:
    """The ``BackendAddressPool`` as ARM answers it; raises ``ArmError`` unless it is 200 with an etag."""
    body = client.get_resource(pool_id, deadline)
    if not isinstance(body.get("etag"), str):
        raise ArmError(f"GET {pool_id}: the answer has no etag")
    return body


def put_pool(client: ArmClient, pool_id: str, body: dict[str, Any], etag: str, deadline: float) -> httpx.Response:
    return client.request("PUT", client.base_url + pool_id, params={"api-version": client.api_version},
                          json=body, headers={"If-Match": etag}, deadline=deadline)


class AzureLbAction:
    """Set this VM's backend address ``Down`` in each pool when draining, ``None`` when recovering.

    ``pools``: backend address pool resource ids; ``address``: this VM's backend address in them, by name
    or IP address. ``deadline``: seconds for all the ARM work of one drain or recovery. ``fallback_wait``:
    how long a drain that could not use ARM lasts at least (the probe's lag). ``max_conflicts``: 412s
    tolerated per pool before giving up (each one is a re-read). See the module documentation.
    """

    #: Recovered after the health probe serves again (``coordinator.actions.base.run_recover``).
    recover_after_probe = True

    def __init__(
        self,
        name: str,
        pools: Sequence[str],
        address: str,
        client: ArmClient,
        *,
        deadline: float = 60.0,
        fallback_wait: float = 0.0,
        max_conflicts: int = 20,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not pools:
            raise ValueError("pools must name at least one backend address pool")
        if not address:
            raise ValueError("address must be a backend address name or IP address")
        if not (deadline > 0 and math.isfinite(deadline)):
            raise ValueError(f"deadline must be a positive number, got {deadline!r}")
        if not (fallback_wait >= 0 and math.isfinite(fallback_wait)):
            raise ValueError(f"fallback_wait must be a non-negative number, got {fallback_wait!r}")
        self.name = name
        self.pools = tuple(pools)
        self.address = address
        self._client = client
        self._deadline = float(deadline)
        self._fallback_wait = float(fallback_wait)
        self._max_conflicts = max_conflicts
        self._clock = clock
        self._sleep = sleep
        self.conflicts = 0  # 412s met, over this action's life (for tests and logs)

    def drain(self, ctx: ActionContext) -> str | None:
        """Set the address ``Down``; None once done. When ARM cannot be used, the drain holds through the
        probe alone (see the module documentation) and returns that fallback and its cause, for ``/status``."""
        started = self._clock()
        try:
            self.set_state("Down", ctx)
        except ArmError as exc:
            rest = self._fallback_wait - (self._clock() - started)
            log.error("%s: cannot set backend address %s Down through ARM (%s); draining through the health "
                      "probe alone, waiting out its lag (%.0f s more) (vm=%s events=%s)", self.name, self.address,
                      exc, max(rest, 0.0), ctx.vm, ctx.event_ids)
            if rest > 0:
                self._sleep(rest)
            return (f"{self.name} drain fell back to the health probe alone: cannot set backend address "
                    f"{self.address} Down through ARM ({exc})")
        return None

    def recover(self, ctx: ActionContext) -> None:
        try:
            self.set_state("None", ctx)
        except ArmError as exc:
            raise ArmError(f"{self.name}: backend address {self.address} may still be Down: cannot set it back "
                           f"to None through ARM ({exc})") from exc

    def set_state(self, state: AdminState, ctx: ActionContext) -> None:
        """Set the address to ``state`` in every pool, before the deadline; raises ``ArmError``."""
        deadline = self._clock() + self._deadline
        for pool_id in self.pools:
            self._set(pool_id, state, deadline, ctx)

    def _set(self, pool_id: str, state: AdminState, deadline: float, ctx: ActionContext) -> None:
        conflicts = 0
        while True:
            pool = get_pool(self._client, pool_id, deadline)
            body, current = with_admin_state(pool, self.address, state)
            if all(c == state for c in current):
                log.info("%s: %s already %s in %s (vm=%s)", self.name, self.address, state, _pool_name(pool_id),
                         ctx.vm)
                return
            response = put_pool(self._client, pool_id, body, pool["etag"], deadline)
            if response.status_code == 412:
                conflicts += 1
                self.conflicts += 1
                if conflicts > self._max_conflicts:
                    raise ArmError(f"{_pool_name(pool_id)} changed under {conflicts} writes in a row (412)")
                pause = random.uniform(0, min(2.0, _CONFLICT_PAUSE * conflicts))
                log.info("%s: %s changed since it was read (412); reading it again in %.2f s (vm=%s)", self.name,
                         _pool_name(pool_id), pause, ctx.vm)
                if self._clock() + pause < deadline:
                    self._sleep(pause)
                continue
            if response.status_code not in (200, 201, 202):
                raise ArmError(f"PUT {_pool_name(pool_id)}: {response.status_code} {error_excerpt(response)}")
            operation = response.headers.get("Azure-AsyncOperation")
            polls = 0
            if operation:
                polls = self._client.wait_operation(operation, deadline,
                                                    parse_retry_after(response.headers.get("Retry-After")))
            log.info("%s: %s set %s in %s (%d operation poll(s), %d conflict(s)) (vm=%s)", self.name, self.address,
                     state, _pool_name(pool_id), polls, conflicts, ctx.vm)
            return


def _pool_name(pool_id: str) -> str:
    """``lb/pool`` of a pool resource id, for log lines."""
    parts = pool_id.rstrip("/").split("/")
    return f"{parts[-3]}/{parts[-1]}" if len(parts) >= 3 else pool_id
