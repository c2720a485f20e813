"""Azure Resource Manager (ARM) with this VM's managed identity: tokens from IMDS and ARM requests.

Shared by the ``azure-lb`` drain action (``coordinator.actions.azure_lb``: it reads and writes backend
address pools) and by ``coordinator doctor`` (``coordinator.doctor.azure``: it reads load balancers, scale
sets and VMs):

* ``ManagedIdentity``: a token for ``https://management.azure.com/`` from IMDS
  (``GET /metadata/identity/oauth2/token``; a user-assigned identity by ``client_id``), never through a
  proxy, cached until shortly before it expires;
* ``ArmClient``: requests to ARM with that token. 401 asks for a new token once; 429, 5xx and transport
  errors are retried after ``Retry-After`` (else a doubling back-off), all before a deadline;
  ``get_resource`` reads one resource (``ArmRefused`` names the status and ARM's error code when ARM
  answers anything but 200); ``wait_operation`` polls an ``Azure-AsyncOperation`` URL on ARM's own host.

Errors are ``ArmError`` (an ``ActionError``, so that an action's failure through ARM is handled as any
other action's), with a message that names the cause in one line.
"""

from __future__ import annotations

import email.utils
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from coordinator.errors import ActionError

__all__ = [
    "ARM_RESOURCE",
    "IDENTITY_API_VERSION",
    "ArmClient",
    "ArmError",
    "ArmRefused",
    "ManagedIdentity",
    "error_excerpt",
    "parse_retry_after",
    "token_lifetime",
]

log = logging.getLogger(__name__)

ARM_RESOURCE = "https://management.azure.com/"
IDENTITY_API_VERSION = "2018-02-01"
_TOKEN_PATH = "/metadata/identity/oauth2/token"
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
_MAX_BACKOFF = 10.0
_EXCERPT = 300


class ArmError(ActionError):
    """The managed identity or ARM refused, failed or ran out of time; the message names the cause."""


class ArmRefused(ArmError):
    """ARM answered a request with a status other than the one expected: ``status`` and ARM's error
    ``code`` (``AuthorizationFailed``, ``ResourceNotFound``...; empty when the answer has none)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def error_excerpt(response: httpx.Response) -> str:
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
                                   f"{error_excerpt(response)}{hint}")
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                wait = backoff if retry_after is None else retry_after
                why = f"IMDS answered {response.status_code} {error_excerpt(response)}"
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
        self.api_version = api_version
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
                    log.info("ARM refused the token (%s); asking IMDS for a new one", error_excerpt(response))
                    continue
                if response.status_code not in _RETRYABLE:
                    return response
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                wait = backoff if retry_after is None else retry_after
                why = f"{response.status_code} {error_excerpt(response)}"
            if self._clock() + wait >= deadline:
                raise ArmError(f"{method} {self._short(url)}: {why}; no time left to retry "
                               f"(Retry-After or back-off {wait:g} s)")
            log.info("ARM %s %s: %s; retrying in %.1f s", method, self._short(url), why, wait)
            self._sleep(wait)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def get_resource(self, resource_id: str, deadline: float, *, api_version: str | None = None) -> dict[str, Any]:
        """GET one resource by its id (``/subscriptions/...``): its JSON object. Raises ``ArmRefused`` when ARM
        answers anything but 200 (403 for a missing role, 404...), ``ArmError`` otherwise."""
        response = self.request("GET", self.base_url + resource_id,
                                params={"api-version": api_version or self.api_version}, deadline=deadline)
        if response.status_code != 200:
            raise ArmRefused(f"GET {resource_id}: {response.status_code} {error_excerpt(response)}",
                             response.status_code, _error_code(response))
        try:
            body = response.json()
        except ValueError:
            raise ArmError(f"GET {resource_id}: the answer is not JSON") from None
        if not isinstance(body, dict):
            raise ArmError(f"GET {resource_id}: the answer is not a JSON object")
        return body

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
                raise ArmError(f"operation status: {response.status_code} {error_excerpt(response)}")
            try:
                status = response.json().get("status")
            except (ValueError, AttributeError):
                raise ArmError("operation status: the answer is not a JSON object") from None
            if status == "Succeeded":
                return polls
            if status in ("Failed", "Canceled"):
                raise ArmError(f"the ARM operation ended {status}: {error_excerpt(response)}")
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            wait = self._poll_interval if retry_after is None else max(retry_after, 0.0)
            wait = wait or self._poll_interval

    def _short(self, url: str) -> str:
        path = urlsplit(url).path
        return path.rsplit("/providers/", 1)[-1] if "/providers/" in path else path


def _error_code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", ""))
    return error if isinstance(error, str) else ""
