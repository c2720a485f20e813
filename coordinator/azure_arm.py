"""Azure Resource Manager (ARM) with this VM's managed identity: tokens from IMDS and ARM requests.

Shared by the ``azure-lb`` drain action (``coordinator.actions.azure_lb``: it reads and writes backend
address pools) and by ``coordinator doctor`` (``coordinator.doctor.azure``: it reads load balancers, scale
sets and VMs):

* ``ManagedIdentity``: a token for ``https://management.azure.com/`` from IMDS
  (``GET /metadata/identity/oauth2/token``; a user-assigned identity by ``client_id``), never through a
  proxy, cached until shortly before it expires;
* ``ArmClient``: requests to ARM with that token. 401 asks for a new token once per request (a token
  that expires in the middle of an operation, ``ExpiredAuthenticationToken`` while its status is polled, is
  replaced and the polling goes on); 429, 5xx and transport errors are retried after ``Retry-After`` (else a
  doubling back-off), all before a deadline. ARM's ``Retry-After`` holds across requests and attempts: when
  it asks for longer than the deadline leaves, the client remembers until when (on its clock, logged once)
  and every request before then fails at once without being sent, so that a caller retrying every few
  seconds (a recovery) sends nothing until ARM's time. ``get_resource`` reads one resource (``ArmRefused``
  names the status and ARM's error code when ARM answers anything but 200); ``wait_operation`` polls an
  ``Azure-AsyncOperation`` URL, and ``wait_location`` a ``Location`` URL, on ARM's own host, until the
  operation is over: ``Failed`` and ``Canceled`` are errors, and an operation not over by the deadline is
  not confirmed.

Errors are ``ArmError`` (an ``ActionError``, so that an action's failure through ARM is handled as any
other action's), with a message that names the cause in one line, and a ``cause`` for metrics (one of
``ARM_CAUSES``: ``token``, ``forbidden``, ``not_found``, ``throttled``, ``unreachable``, ``server_error``,
``conflict``, ``operation_failed``, ``not_confirmed``, ``bad_answer``). Every ``ArmError`` is
``outside_vm``: the failure lies in Azure or in the identity's roles, and repairing or reimaging this VM
would not fix it.
"""

from __future__ import annotations

import email.utils
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import httpx

from coordinator.errors import ActionError

__all__ = [
    "ARM_CAUSES",
    "ARM_RESOURCE",
    "IDENTITY_API_VERSION",
    "ArmCause",
    "ArmClient",
    "ArmError",
    "ArmRefused",
    "ManagedIdentity",
    "cause_of_status",
    "error_code",
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


ArmCause = Literal["token", "forbidden", "not_found", "throttled", "unreachable", "server_error", "conflict",
                   "operation_failed", "not_confirmed", "bad_answer"]
ARM_CAUSES: tuple[str, ...] = get_args(ArmCause)


class ArmError(ActionError):
    """The managed identity or ARM refused, failed or ran out of time; the message names the cause, and
    ``cause`` (one of ``ARM_CAUSES``) classifies it for metrics."""

    #: The failure is outside this VM: repairing or reimaging the VM would not fix it.
    outside_vm = True

    def __init__(self, message: str, *, cause: ArmCause = "bad_answer") -> None:
        super().__init__(message)
        self.cause: ArmCause = cause


def cause_of_status(status: int) -> ArmCause:
    """The cause of an ARM answer that refuses with ``status``."""
    if status in (401, 403):
        return "forbidden"
    if status == 404:
        return "not_found"
    if status in (409, 412):
        return "conflict"
    if status == 429:
        return "throttled"
    if status >= 500:
        return "server_error"
    return "bad_answer"


class ArmRefused(ArmError):
    """ARM answered a request with a status other than the one expected: ``status`` and ARM's error
    ``code`` (``AuthorizationFailed``, ``ResourceNotFound``...; empty when the answer has none). Its cause
    follows the status (``cause_of_status``) unless given."""

    def __init__(self, message: str, status: int, code: str, *, cause: ArmCause | None = None) -> None:
        super().__init__(message, cause=cause_of_status(status) if cause is None else cause)
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
                raise ArmError(f"no token from IMDS for {who} before the deadline", cause="token")
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
                                   f"{error_excerpt(response)}{hint}", cause="token")
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                wait = backoff if retry_after is None else retry_after
                why = f"IMDS answered {response.status_code} {error_excerpt(response)}"
            if self._clock() + wait >= deadline:
                raise ArmError(f"no token from IMDS for {who} before the deadline: {why}", cause="token")
            log.info("managed identity: %s; retrying in %.1f s", why, wait)
            self._sleep(wait)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _parse(self, response: httpx.Response) -> _Token:
        try:
            body = response.json()
            value = body["access_token"]
            lifetime = token_lifetime(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise ArmError(f"IMDS answered a token that cannot be read: {exc}", cause="token") from None
        if not isinstance(value, str) or not value:
            raise ArmError("IMDS answered an empty access token", cause="token")
        margin = min(self._margin, lifetime / 2)
        log.debug("managed identity: new token, valid %.0f s, refreshed %.0f s before it expires", lifetime, margin)
        return _Token(value, self._clock() + lifetime - margin)


class ArmClient:
    """Requests to ARM with this VM's token: 401 asks for a new token once, 429 and 5xx (and transport
    errors) are retried after ``Retry-After`` (else a doubling back-off), all before ``deadline``. A
    ``Retry-After`` past the deadline is remembered: until then every request fails at once, unsent.
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
        self.poll_interval = poll_interval
        self._clock = clock
        self._sleep = sleep
        # The environment's proxy settings apply to ARM over HTTPS (a VM may have to leave through one),
        # never to a plain-HTTP ARM (the simulator on loopback).
        self._http = httpx.Client(timeout=timeout, trust_env=split.scheme == "https", transport=transport,
                                  follow_redirects=False)
        self.calls = 0
        #: ``Retry-After`` (seconds) of the last answer ``request`` returned; None when it had none.
        self.last_retry_after: float | None = None
        # ARM asked to be left alone until then (on ``clock``), after the status in ``_hold_reason``.
        self._hold_until: float | None = None
        self._hold_reason = ""
        self._hold_cause: ArmCause = "throttled"
        self._hold_lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def held_for(self) -> float:
        """Seconds ARM still asked this client to wait (a ``Retry-After`` past a deadline); 0 when none."""
        with self._hold_lock:
            return 0.0 if self._hold_until is None else max(0.0, self._hold_until - self._clock())

    def request(self, method: str, url: str, *, deadline: float, json: Any = None,
                headers: dict[str, str] | None = None, params: dict[str, str] | None = None) -> httpx.Response:
        """One logical request, retried as the class says; returns any answer that is not retried (the
        caller judges 4xx). Raises ``ArmError`` when out of time, refused a token, or asked by ARM to wait
        past now."""
        backoff = 1.0
        renewed = False
        cause: ArmCause = "not_confirmed"  # out of time before anything was sent: the caller's work took it
        why = ""
        while True:
            self._check_hold(method, url)
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ArmError(f"{method} {self._short(url)}: out of time{f' ({why})' if why else ''}", cause=cause)
            token = self._identity.token(deadline)
            self.calls += 1
            try:
                response = self._http.request(
                    method, url, json=json, params=params,
                    headers={"Authorization": f"Bearer {token}", **(headers or {})},
                    timeout=min(self._timeout, remaining),
                )
            except httpx.HTTPError as exc:
                wait, why, cause = backoff, f"{type(exc).__name__}: {exc}", "unreachable"
            else:
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                if response.status_code == 401 and not renewed:
                    renewed = True
                    self._identity.invalidate()
                    log.info("ARM refused the token (%s); asking IMDS for a new one", error_excerpt(response))
                    continue
                if response.status_code not in _RETRYABLE:
                    self.last_retry_after = retry_after
                    return response
                wait = backoff if retry_after is None else retry_after
                why = f"{response.status_code} {error_excerpt(response)}"
                cause = "throttled" if response.status_code == 429 else "server_error"
                if retry_after is not None and self._clock() + retry_after >= deadline:
                    self._hold(retry_after, f"{response.status_code} Retry-After", cause)
            if self._clock() + wait >= deadline:
                raise ArmError(f"{method} {self._short(url)}: {why}; no time left to retry "
                               f"(Retry-After or back-off {wait:g} s)", cause=cause)
            log.info("ARM %s %s: %s; retrying in %.1f s", method, self._short(url), why, wait)
            self._sleep(wait)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _hold(self, seconds: float, reason: str, cause: ArmCause) -> None:
        """Remember that ARM asked for ``seconds`` of quiet (logged once, here)."""
        with self._hold_lock:
            self._hold_until = self._clock() + seconds
            self._hold_reason, self._hold_cause = reason, cause
        log.warning("ARM asked to wait %.0f s (%s), past the deadline: no request is sent to ARM until %s",
                    seconds, reason, _wall_after(seconds))

    def _check_hold(self, method: str, url: str) -> None:
        with self._hold_lock:
            if self._hold_until is None:
                return
            rest = self._hold_until - self._clock()
            if rest <= 0:
                self._hold_until = None
                return
            reason, cause = self._hold_reason, self._hold_cause
        raise ArmError(f"{method} {self._short(url)} not sent: ARM asked to wait until {_wall_after(rest)}, "
                       f"{math.ceil(rest):.0f} s more ({reason})", cause=cause)

    def get_resource(self, resource_id: str, deadline: float, *, api_version: str | None = None) -> dict[str, Any]:
        """GET one resource by its id (``/subscriptions/...``): its JSON object. Raises ``ArmRefused`` when ARM
        answers anything but 200 (403 for a missing role, 404...), ``ArmError`` otherwise."""
        response = self.request("GET", self.base_url + resource_id,
                                params={"api-version": api_version or self.api_version}, deadline=deadline)
        if response.status_code != 200:
            raise ArmRefused(f"GET {resource_id}: {response.status_code} {error_excerpt(response)}",
                             response.status_code, error_code(response))
        try:
            body = response.json()
        except ValueError:
            raise ArmError(f"GET {resource_id}: the answer is not JSON", cause="bad_answer") from None
        if not isinstance(body, dict):
            raise ArmError(f"GET {resource_id}: the answer is not a JSON object", cause="bad_answer")
        return body

    def wait_operation(self, url: str, deadline: float, first_wait: float | None) -> int:
        """Poll an ``Azure-AsyncOperation`` URL until ``Succeeded``; returns the number of polls. Raises
        ``ArmError``: ``operation_failed`` if it ends ``Failed`` or ``Canceled``, ``not_confirmed`` if it
        outlasts ``deadline``, ``bad_answer`` if it points away from ARM's host."""
        self._check_origin(url)
        wait = self.poll_interval if first_wait is None else first_wait
        polls = 0
        status: object = "not polled"
        while True:
            if self._clock() + wait >= deadline:
                raise ArmError(f"the ARM operation did not report Succeeded before the deadline (last status: "
                               f"{status})", cause="not_confirmed")
            self._sleep(wait)
            polls += 1
            response = self.request("GET", url, deadline=deadline)
            if response.status_code != 200:
                raise ArmRefused(f"operation status: {response.status_code} {error_excerpt(response)}",
                                 response.status_code, error_code(response))
            try:
                status = response.json().get("status")
            except (ValueError, AttributeError):
                raise ArmError("operation status: the answer is not a JSON object", cause="bad_answer") from None
            if status == "Succeeded":
                return polls
            if status in ("Failed", "Canceled"):
                raise ArmError(f"the ARM operation ended {status}: {error_excerpt(response)}",
                               cause="operation_failed")
            wait = self.last_retry_after or self.poll_interval

    def wait_location(self, url: str, deadline: float, first_wait: float | None) -> int:
        """Poll a ``Location`` URL until the operation is over (any answer but 202: 200, 201 or 204; the
        caller then reads the resource back to see how it ended); returns the number of polls. Raises
        ``ArmError``: ``operation_failed`` on an error answer, ``not_confirmed`` past ``deadline``."""
        self._check_origin(url)
        wait = self.poll_interval if first_wait is None else first_wait
        polls = 0
        while True:
            if self._clock() + wait >= deadline:
                raise ArmError("the ARM operation (Location) was not over before the deadline",
                               cause="not_confirmed")
            self._sleep(wait)
            polls += 1
            response = self.request("GET", url, deadline=deadline)
            if response.status_code in (200, 201, 204):
                return polls
            if response.status_code != 202:
                raise ArmRefused(f"the ARM operation (Location) ended {response.status_code} "
                                 f"{error_excerpt(response)}", response.status_code, error_code(response),
                                 cause="operation_failed")
            wait = self.last_retry_after or self.poll_interval

    def _check_origin(self, url: str) -> None:
        split = urlsplit(url)
        if (split.scheme, split.netloc.lower()) != self._origin:
            raise ArmError(f"ARM's operation URL points to another host ({split.netloc}); not sending it the token",
                           cause="bad_answer")

    def _short(self, url: str) -> str:
        path = urlsplit(url).path
        return path.rsplit("/providers/", 1)[-1] if "/providers/" in path else path


def _wall_after(seconds: float) -> str:
    """The wall-clock time ``seconds`` from now, for messages (UTC, to the second)."""
    return datetime.fromtimestamp(time.time() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def error_code(response: httpx.Response) -> str:
    """ARM's error code in an answer (``AnotherOperationInProgress``...); empty when it has none."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", ""))
    return error if isinstance(error, str) else ""
