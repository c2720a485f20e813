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
  answers 412, and while another write to the pool is in progress 409 ``AnotherOperationInProgress``;
  both are conflicts: the pool is read again after ``Retry-After`` (if any) and a jittered pause that grows
  with the conflicts met, so that many writers of one pool spread out; 429 and 5xx are retried after
  ``Retry-After``, and a ``Retry-After`` past the deadline holds every later attempt back until ARM's time
  (``ArmClient`` of ``coordinator.azure_arm``);
* **done means confirmed**: a pool is done only when ARM confirms that the write applied, never because
  a read shows the wanted state. Confirmation is the write's asynchronous operation
  (``Azure-AsyncOperation``) reporting ``Succeeded``, or the pool read back with ``provisioningState``
  ``Succeeded`` and the address in the wanted state. A read that shows the wanted state while the pool
  is ``Updating`` says what was asked for, not what the data plane does (an earlier attempt whose answer
  was lost, a write that outlived an earlier deadline): the pool is read again (after ``Retry-After``,
  else the client's poll interval) until ``Succeeded``. An operation that ends ``Failed`` or ``Canceled``
  is an error; a pool read back ``Failed`` (or ``Canceled``) with the wanted state is written again, ARM's
  documented remedy, and a pool that reads ``Failed`` after this attempt's own write is an error. A write
  answered without an operation URL is confirmed by polling its ``Location`` (if any), then the pool;
* **a write still on its way is fenced**: a read counts only once the pool's etag has moved past the etag
  of this action's last write of the wanted state (a write that may still reach ARM, a drain's PUT held on
  its way past the drain's deadline, carries an etag from before it); so a drain or a recovery whose last
  write was of the other state, or that is the first since the agent started, always writes, even to a
  pool that already reads the wanted state ``Succeeded``. ARM judges ``If-Match`` when a write reaches the
  pool and every write changes the etag: a write sent earlier that lands after this one is refused 412, and
  cannot undo a recovery that was counted (``docs/safety.md``, "late writes"). A retry of the same state in
  the same process waits for its own earlier write instead of adding one more, so an operation slower than
  the deadline is confirmed on a later attempt;
* everything one drain or recovery does is bounded by ``deadline`` seconds: not confirmed by then is an
  ``ArmError`` (cause ``not_confirmed``).

It works **beside** the health probe action, never instead of it: the probe still fails while the VM is
drained. When ARM cannot be used (no token, no role, ARM unreachable, out of time), the drain logs one
error line naming the cause and goes on through the probe alone, waiting out the probe's lag
(``fallback_wait``) before it returns, so that the drain wait still holds even when it was shortened for
admin state; it returns that fallback and its cause, which the agent shows in ``/status``
(``action_fallback``; ``coordinator.actions.base``). A recovery that fails raises ``ArmError``: the agent
retries it until the address is confirmed back to ``None``, and the state file runs it again after a
restart (``recover_after_probe``: it is recovered once the probe serves again, as HAProxy is). So a drain
that returns None means the load balancer sends this VM no new flows, and a recovery that returns means
it routes to the VM again. ``on_failure`` is told the ``ArmError``'s cause once per drain that fell back
and once per failed recovery (for a metric).

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
    ArmCause,
    ArmClient,
    ArmError,
    ArmRefused,
    ManagedIdentity,
    error_code,
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
    "provisioning_state",
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
_SUCCEEDED = "Succeeded"
_ENDED_BADLY = ("Failed", "Canceled")  # a pool's provisioningState after a write that did not apply


def with_admin_state(pool: dict[str, Any], address: str, state: AdminState) -> tuple[dict[str, Any], list[str]]:
    """The PUT body that sets ``address`` (a backend address's name, or its IP address) to ``state`` in
    ``pool`` (a ``BackendAddressPool`` as ARM answered it), and the address's current states. Every other
    address, and every other writable field, is sent back as read; read-only fields are left out. Raises
    ``ArmError`` when the pool has no such address."""
    properties = pool.get("properties")
    addresses = properties.get("loadBalancerBackendAddresses") if isinstance(properties, dict) else None
    if not isinstance(properties, dict) or not isinstance(addresses, list):
        raise ArmError(f"pool {pool.get('id', '?')} has no loadBalancerBackendAddresses", cause="bad_answer")
    current: list[str] = []
    new_addresses = []
    for entry in addresses:
        if not isinstance(entry, dict):
            raise ArmError(f"pool {pool.get('id', '?')} has a malformed backend address: {entry!r:.100}",
                           cause="bad_answer")
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
                       f"address (its addresses: {names})", cause="not_found")
    body_properties = {k: v for k, v in properties.items() if k not in _POOL_READ_ONLY}
    body_properties["loadBalancerBackendAddresses"] = new_addresses
    body = {k: v for k, v in pool.items() if k in ("id", "name")}
    body["properties"] = body_properties
    return body, current


def get_pool(client: ArmClient, pool_id: str, deadline: float) -> dict[str, Any]:
    """The ``BackendAddressPool`` as ARM answers it; raises ``ArmError`` unless it is 200 with an etag."""
    body = client.get_resource(pool_id, deadline)
    if not isinstance(body.get("etag"), str):
        raise ArmError(f"GET {pool_id}: the answer has no etag", cause="bad_answer")
    return body


def provisioning_state(pool: dict[str, Any]) -> str:
    """The pool's ``provisioningState`` as ARM answered it (``Succeeded``, ``Updating``, ``Failed``...);
    empty when it has none."""
    properties = pool.get("properties")
    state = properties.get("provisioningState") if isinstance(properties, dict) else None
    return state if isinstance(state, str) else ""


def put_pool(client: ArmClient, pool_id: str, body: dict[str, Any], etag: str, deadline: float) -> httpx.Response:
    return client.request("PUT", client.base_url + pool_id, params={"api-version": client.api_version},
                          json=body, headers={"If-Match": etag}, deadline=deadline)


class AzureLbAction:
    """Set this VM's backend address ``Down`` in each pool when draining, ``None`` when recovering.

    ``pools``: backend address pool resource ids; ``address``: this VM's backend address in them, by name
    or IP address. ``deadline``: seconds for all the ARM work of one drain or recovery, confirmation
    included. ``fallback_wait``: how long a drain that could not use ARM lasts at least (the probe's lag).
    ``max_conflicts``: conflicts (412, 409 ``AnotherOperationInProgress``) tolerated per pool before giving
    up (each one is a re-read). ``on_failure``: told the cause of each drain that fell back and of each
    failed recovery (``ArmError.cause``). See the module documentation.
    """

    always_recover = False

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
        on_failure: Callable[[str], None] | None = None,
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
        self._on_failure = on_failure
        self.conflicts = 0  # 412s and 409s met, over this action's life (for tests and logs)
        # Pool id -> the state of this action's last write to it and the etag that write was sent against.
        self._written: dict[str, tuple[AdminState, str]] = {}

    def drain(self, ctx: ActionContext) -> str | None:
        """Set the address ``Down``; None once ARM confirmed it. When ARM cannot be used, the drain holds
        through the probe alone (see the module documentation) and returns that fallback and its cause, for
        ``/status``."""
        started = self._clock()
        try:
            self.set_state("Down", ctx)
        except ArmError as exc:
            self._failed(exc.cause)
            rest = self._fallback_wait - (self._clock() - started)
            log.error("%s: cannot set backend address %s Down through ARM (%s: %s); draining through the health "
                      "probe alone, waiting out its lag (%.0f s more) (vm=%s events=%s)", self.name, self.address,
                      exc.cause, exc, max(rest, 0.0), ctx.vm, ctx.event_ids)
            if rest > 0:
                self._sleep(rest)
            return (f"{self.name} drain fell back to the health probe alone: cannot set backend address "
                    f"{self.address} Down through ARM ({exc.cause}: {exc})")
        return None

    def recover(self, ctx: ActionContext) -> None:
        """Set the address back to ``None``; returns once ARM confirmed it, else raises ``ArmError``."""
        try:
            self.set_state("None", ctx)
        except ArmError as exc:
            self._failed(exc.cause)
            raise ArmError(f"{self.name}: backend address {self.address} may still be Down: cannot set it back "
                           f"to None through ARM ({exc.cause}: {exc})", cause=exc.cause) from exc

    def set_state(self, state: AdminState, ctx: ActionContext) -> None:
        """Set the address to ``state`` in every pool, confirmed, before the deadline; raises ``ArmError``."""
        deadline = self._clock() + self._deadline
        for pool_id in self.pools:
            self._set(pool_id, state, deadline, ctx)

    def _failed(self, cause: str) -> None:
        if self._on_failure is None:
            return
        try:
            self._on_failure(cause)
        except Exception:  # a metric's hook never decides a drain
            log.exception("%s: the failure hook raised", self.name)

    def _set(self, pool_id: str, state: AdminState, deadline: float, ctx: ActionContext) -> None:
        """Write ``state`` into one pool and return once ARM confirmed this write (the module documentation).

        A read counts only once the pool's etag has moved past the etag of this action's last write of
        ``state`` (sent by this attempt, or by an earlier one when no write of the other state came between);
        otherwise the pool is written, with ``If-Match`` on the etag just read, however it reads. Every write
        this agent sent before (a drain's PUT still on its way after the drain gave up, a write from before
        a restart) was sent against an etag no later than that one: once the etag has moved past it, each of
        them is refused 412 if it lands (ARM judges ``If-Match`` when a write reaches the pool, and every
        write changes the etag)."""
        pool_name = _pool_name(pool_id)
        conflicts = polls = 0
        wrote = False  # a write of this attempt was accepted: a Failed read-back is its own failure
        last = self._written.get(pool_id)
        written_against = last[1] if last is not None and last[0] == state else None
        while True:
            pool = get_pool(self._client, pool_id, deadline)
            body, current = with_admin_state(pool, self.address, state)
            provisioning = provisioning_state(pool) or "(none)"
            reads_wanted = all(c == state for c in current)
            # Applied after this attempt's write was sent: that write, or a later one that kept this state.
            moved = written_against is not None and pool["etag"] != written_against
            if moved and reads_wanted:
                if provisioning == _SUCCEEDED:
                    log.info("%s: %s %s in %s, confirmed (provisioningState Succeeded; %d poll(s), %d "
                             "conflict(s)) (vm=%s)", self.name, self.address, state, pool_name, polls, conflicts,
                             ctx.vm)
                    return
                if provisioning not in _ENDED_BADLY:  # Updating: asked for, not applied yet
                    polls += 1
                    self._pause(self._client.last_retry_after or self._client.poll_interval, deadline,
                                f"{pool_name} reads {self.address} {state} but is still {provisioning}: the write "
                                f"is not confirmed", "not_confirmed")
                    continue
                if wrote:
                    raise ArmError(f"{pool_name}: the write of {self.address} {state} ended {provisioning}",
                                   cause="operation_failed")
            if reads_wanted and provisioning in _ENDED_BADLY:
                log.warning("%s: %s reads %s in %s but the pool is %s: writing it again (vm=%s)", self.name,
                            self.address, state, pool_name, provisioning, ctx.vm)
            written_against = pool["etag"]
            self._written[pool_id] = (state, written_against)
            response = put_pool(self._client, pool_id, body, pool["etag"], deadline)
            status, code = response.status_code, error_code(response)
            if status == 412 or (status == 409 and code == "AnotherOperationInProgress"):
                conflicts += 1
                self.conflicts += 1
                what = "changed since it was read (412)" if status == 412 else f"busy with another write (409 {code})"
                if conflicts > self._max_conflicts:
                    raise ArmError(f"{pool_name} {what}, {conflicts} times in a row", cause="conflict")
                asked = parse_retry_after(response.headers.get("Retry-After")) or 0.0
                pause = asked + random.uniform(0, min(2.0, _CONFLICT_PAUSE * conflicts))
                log.info("%s: %s %s; reading it again in %.2f s (vm=%s)", self.name, pool_name, what, pause, ctx.vm)
                self._pause(pause, deadline, f"{pool_name} {what}", "conflict")
                continue
            if status not in (200, 201, 202):
                raise ArmRefused(f"PUT {pool_name}: {status} {error_excerpt(response)}", status, code)
            wrote = True
            first_wait = parse_retry_after(response.headers.get("Retry-After"))
            operation = response.headers.get("Azure-AsyncOperation")
            if operation:
                polls += self._client.wait_operation(operation, deadline, first_wait)
                log.info("%s: %s set %s in %s, confirmed (operation Succeeded; %d poll(s), %d conflict(s)) "
                         "(vm=%s)", self.name, self.address, state, pool_name, polls, conflicts, ctx.vm)
                return
            location = response.headers.get("Location")
            if location:
                polls += self._client.wait_location(location, deadline, first_wait)
            elif first_wait:
                self._pause(first_wait, deadline, f"the write of {pool_name} is not confirmed", "not_confirmed")
            # Confirmed by reading the pool back (above): Succeeded with the wanted state.

    def _pause(self, seconds: float, deadline: float, why: str, cause: ArmCause) -> None:
        if self._clock() + seconds >= deadline:
            raise ArmError(f"{why}; no time left before the deadline", cause=cause)
        self._sleep(seconds)


def _pool_name(pool_id: str) -> str:
    """``lb/pool`` of a pool resource id, for log lines."""
    parts = pool_id.rstrip("/").split("/")
    return f"{parts[-3]}/{parts[-1]}" if len(parts) >= 3 else pool_id
