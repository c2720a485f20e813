"""Drain this VM from Azure Load Balancer backend pools by their admin state, through Azure Resource Manager.

An Azure Load Balancer backend address (a pool instance) has an administrative state: ``Down`` sends it no
new connections from the next flow on, whatever the health probe says (established TCP flows go on, as with
a failed probe); ``None`` hands control back to the probe. ``AzureLbAction`` sets this VM's address
``Down`` in every configured pool when draining, and back to ``None`` when recovering:

* a token for ``https://management.azure.com/`` from the VM's managed identity, through IMDS
  (``GET /metadata/identity/oauth2/token``; a user-assigned identity by ``client_id``), cached until
  shortly before it expires (``ManagedIdentity``);
* for each pool, read-modify-write of the whole pool (``GET`` then ``PUT`` of the
  ``BackendAddressPool`` resource, api-version 2023-09-01), ``If-Match`` on the etag that was read: when
  another writer (another VM of the group draining at the same moment) changed the pool in between, ARM
  answers 412 and the pool is read again; 429 and 5xx are retried after ``Retry-After``; the write is
  asynchronous, and the ``Azure-AsyncOperation`` URL is polled until it reports ``Succeeded``
  (``ArmClient``);
* everything one drain or recovery does is bounded by ``deadline`` seconds.

It works **beside** the health probe action, never instead of it: the probe still fails while the VM is
drained. When ARM cannot be used (no token, no role, ARM unreachable, out of time), the drain logs one
error line naming the cause and goes on through the probe alone, waiting out the probe's lag
(``fallback_wait``) before it returns, so that the drain wait still holds even when it was shortened for
admin state. A recovery that fails raises ``ActionError``: the agent retries it until the address is back to
``None``, and the state file runs it again after a restart (``recover_after_probe``: it is recovered once the
probe serves again, as HAProxy is).

REST reference: Azure/azure-rest-api-specs,
``specification/network/resource-manager/Microsoft.Network/stable/2023-09-01/loadBalancer.json``
(``BackendAddressPool``, ``LoadBalancerBackendAddress``, ``adminState``).
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from coordinator.actions.base import ActionContext
from coordinator.errors import ActionError

__all__ = [
    "ARM_RESOURCE",
    "AdminState",
    "ArmClient",
    "ArmError",
    "AzureLbAction",
    "ManagedIdentity",
    "parse_retry_after",
    "token_lifetime",
    "with_admin_state",
]

log = logging.getLogger(__name__)

AdminState = Literal["None", "Up", "Down"]
ARM_RESOURCE = "https://management.azure.com/"
IDENTITY_API_VERSION = "2018-02-01"
_TOKEN_PATH = "/metadata/identity/oauth2/token"
# Read-only in the REST specification: an SDK drops them from a PUT body, and so does this client.
_POOL_READ_ONLY = ("provisioningState", "backendIPConfigurations", "loadBalancingRules", "outboundRule",
                   "outboundRules", "inboundNatRules")
_ADDRESS_READ_ONLY = ("networkInterfaceIPConfiguration", "inboundNatRulesPortMapping")
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_MAX_BACKOFF = 10.0
_EXCERPT = 300
_CONFLICT_PAUSE = 0.2  # x the conflicts met so far, at most 2 s, jittered: writers of one pool spread out


class ArmError(ActionError):
    """The managed identity or ARM refused, failed or ran out of time; the message names the cause."""


def _excerpt(response: httpx.Response) -> str:
    """The error an ARM or IMDS answer carries, in one short line."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip().replace("\n", " ")
        return text[:_EXCERPT] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):  # ARM: {"error": {"code", "message"}}
            return f"{error.get('code', '?')}: {str(error.get('message', ''))[:_EXCERPT]}"
        if isinstance(error, str):  # IMDS: {"error", "error_description"}
            return f"{error}: {str(body.get('error_description', ''))[:_EXCERPT]}"
    return str(body)[:_EXCERPT]


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP date); None if absent or
    unreadable. Never negative."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def token_lifetime(body: dict[str, Any], *, now: float | None = None) -> float:
    """Seconds a token answer of IMDS is valid for: ``expires_in`` (IMDS sends it as a string), else
    ``expires_on`` (epoch seconds) minus ``now``. Raises ``ValueError`` when neither is usable."""
    for key in ("expires_in",):
        value = body.get(key)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:
                seconds = float(value)
            except ValueError:
                break
            if math.isfinite(seconds) and seconds > 0:
                return seconds
    value = body.get("expires_on")
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            seconds = float(value) - (time.time() if now is None else now)
        except ValueError:
            seconds = float("nan")
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise ValueError("the token answer has no usable expires_in or expires_on")


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


@dataclass(frozen=True)
class _Token:
    value: str
    refresh_at: float  # on ``clock``: from then on a new one is asked for


class ManagedIdentity:
    """ARM tokens of this VM's managed identity, from IMDS, cached until ``margin`` before they expire (at
    most half their lifetime). Never through a proxy. Thread-safe."""

    def __init__(
        self,
        imds_url: str,
        *,
        client_id: str | None = None,
        resource: str = ARM_RESOURCE,
        timeout: float = 5.0,
        margin: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._url = imds_url.rstrip("/") + _TOKEN_PATH
        self._params = {"api-version": IDENTITY_API_VERSION, "resource": resource}
        if client_id:
            self._params["client_id"] = client_id
        self._client_id = client_id
        self._margin = margin
        self._clock = clock
        self._sleep = sleep
        self._http = httpx.Client(timeout=timeout, trust_env=False, transport=transport)
        self._lock = threading.Lock()
        self._token: _Token | None = None
        self.requests = 0  # token requests sent (for tests and logs)

    def close(self) -> None:
        self._http.close()

    def invalidate(self) -> None:
        """Forget the cached token (ARM said it is invalid or expired)."""
        with self._lock:
            self._token = None

    def token(self, deadline: float) -> str:
        """A valid access token; raises ``ArmError`` if IMDS refuses, or cannot give one before ``deadline``."""
        with self._lock:
            if self._token is not None and self._clock() < self._token.refresh_at:
                return self._token.value
            token = self._fetch(deadline)
            self._token = token
            return token.value

    def _fetch(self, deadline: float) -> _Token:
        backoff = 0.5
        who = f"user-assigned identity {self._client_id}" if self._client_id else "the system-assigned identity"
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ArmError(f"no token from IMDS for {who} before the deadline")
            self.requests += 1
            try:
                response = self._http.get(self._url, params=self._params, headers={"Metadata": "true"},
                                          timeout=remaining)
            except httpx.HTTPError as exc:
                wait, why = backoff, f"IMDS unreachable ({type(exc).__name__}: {exc})"
            else:
                if response.status_code == 200:
                    return self._parse(response)
                if response.status_code not in _RETRYABLE | {404, 410}:
                    hint = " (is it assigned to this VM?)" if response.status_code == 400 else ""
                    raise ArmError(f"IMDS refused a token for {who}: {response.status_code} "
                                   f"{_excerpt(response)}{hint}")
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                wait = backoff if retry_after is None else retry_after
                why = f"IMDS answered {response.status_code} {_excerpt(response)}"
            if self._clock() + wait >= deadline:
                raise ArmError(f"no token from IMDS for {who} before the deadline: {why}")
            log.debug("managed identity: %s; retrying in %.1f s", why, wait)
            self._sleep(wait)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _parse(self, response: httpx.Response) -> _Token:
        try:
            body = response.json()
            value = body["access_token"]
            lifetime = token_lifetime(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise ArmError(f"IMDS answered a token that cannot be read: {exc}") from None
        if not isinstance(value, str) or not value:
            raise ArmError("IMDS answered an empty access token")
        margin = min(self._margin, lifetime / 2)
        log.debug("managed identity: new token, valid %.0f s, refreshed %.0f s before it expires", lifetime, margin)
        return _Token(value, self._clock() + lifetime - margin)


class ArmClient:
    """Requests to ARM with this VM's token: 401 asks for a new token once, 429 and 5xx (and transport
    errors) are retried after ``Retry-After`` (else a doubling back-off), all before ``deadline``.
    Asynchronous operations are polled only on ARM's own host (the token goes nowhere else)."""

    def __init__(
        self,
        arm_url: str,
        identity: ManagedIdentity,
        *,
        api_version: str = "2023-09-01",
        timeout: float = 10.0,
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = arm_url.rstrip("/")
        split = urlsplit(self.base_url)
        self._origin = (split.scheme, split.netloc.lower())
        self._identity = identity
        self._api_version = api_version
        self._timeout = timeout
        self._poll_interval = poll_interval
        self._clock = clock
        self._sleep = sleep
        # The environment's proxy settings apply to ARM over HTTPS (a VM may have to leave through one),
        # never to a plain-HTTP ARM (the simulator on loopback).
        self._http = httpx.Client(timeout=timeout, trust_env=split.scheme == "https", transport=transport,
                                  follow_redirects=False)
        self.calls = 0

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, url: str, *, deadline: float, json: Any = None,
                headers: dict[str, str] | None = None, params: dict[str, str] | None = None) -> httpx.Response:
        """One logical request, retried as the class says; returns any answer that is not retried (the
        caller judges 4xx). Raises ``ArmError`` when out of time or refused a token."""
        backoff = 1.0
        renewed = False
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ArmError(f"{method} {self._short(url)}: out of time")
            token = self._identity.token(deadline)
            self.calls += 1
            try:
                response = self._http.request(
                    method, url, json=json, params=params,
                    headers={"Authorization": f"Bearer {token}", **(headers or {})},
                    timeout=min(self._timeout, remaining),
                )
            except httpx.HTTPError as exc:
                wait, why = backoff, f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 401 and not renewed:
                    renewed = True
                    self._identity.invalidate()
                    log.info("ARM refused the token (%s); asking IMDS for a new one", _excerpt(response))
                    continue
                if response.status_code not in _RETRYABLE:
                    return response
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                wait = backoff if retry_after is None else retry_after
                why = f"{response.status_code} {_excerpt(response)}"
            if self._clock() + wait >= deadline:
                raise ArmError(f"{method} {self._short(url)}: {why}; no time left to retry "
                               f"(Retry-After or back-off {wait:g} s)")
            log.info("ARM %s %s: %s; retrying in %.1f s", method, self._short(url), why, wait)
            self._sleep(wait)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def get_pool(self, pool_id: str, deadline: float) -> dict[str, Any]:
        response = self.request("GET", self.base_url + pool_id, params={"api-version": self._api_version},
                                deadline=deadline)
        if response.status_code != 200:
            raise ArmError(f"GET {pool_id}: {response.status_code} {_excerpt(response)}")
        try:
            body = response.json()
        except ValueError:
            raise ArmError(f"GET {pool_id}: the answer is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("etag"), str):
            raise ArmError(f"GET {pool_id}: the answer has no etag")
        return body

    def put_pool(self, pool_id: str, body: dict[str, Any], etag: str, deadline: float) -> httpx.Response:
        return self.request("PUT", self.base_url + pool_id, params={"api-version": self._api_version},
                            json=body, headers={"If-Match": etag}, deadline=deadline)

    def wait_operation(self, url: str, deadline: float, first_wait: float | None) -> int:
        """Poll an ``Azure-AsyncOperation`` URL until ``Succeeded``; returns the number of polls. Raises
        ``ArmError`` if it ends otherwise, points away from ARM's host, or outlasts ``deadline``."""
        split = urlsplit(url)
        if (split.scheme, split.netloc.lower()) != self._origin:
            raise ArmError(f"ARM's operation URL points to another host ({split.netloc}); not sending it the token")
        wait = self._poll_interval if first_wait is None else first_wait
        polls = 0
        while True:
            if self._clock() + wait >= deadline:
                raise ArmError("the ARM operation did not succeed before the deadline")
            self._sleep(wait)
            polls += 1
            response = self.request("GET", url, deadline=deadline)
            if response.status_code != 200:
                raise ArmError(f"operation status: {response.status_code} {_excerpt(response)}")
            try:
                status = response.json().get("status")
            except (ValueError, AttributeError):
                raise ArmError("operation status: the answer is not a JSON object") from None
            if status == "Succeeded":
                return polls
            if status in ("Failed", "Canceled"):
                raise ArmError(f"the ARM operation ended {status}: {_excerpt(response)}")
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            wait = self._poll_interval if retry_after is None else max(retry_after, 0.0)
            wait = wait or self._poll_interval

    def _short(self, url: str) -> str:
        path = urlsplit(url).path
        return path.rsplit("/providers/", 1)[-1] if "/providers/" in path else path


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

    def drain(self, ctx: ActionContext) -> None:
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
            pool = self._client.get_pool(pool_id, deadline)
            body, current = with_admin_state(pool, self.address, state)
            if all(c == state for c in current):
                log.info("%s: %s already %s in %s (vm=%s)", self.name, self.address, state, _pool_name(pool_id),
                         ctx.vm)
                return
            response = self._client.put_pool(pool_id, body, pool["etag"], deadline)
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
                raise ArmError(f"PUT {_pool_name(pool_id)}: {response.status_code} {_excerpt(response)}")
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
