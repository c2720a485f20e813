"""Synchronous client for the Azure Instance Metadata Service (IMDS): Scheduled Events and compute metadata.

What IMDS requires, and how this client honours it (see Microsoft's Scheduled Events and IMDS pages):

* every request carries ``Metadata: true`` and exactly one ``api-version`` query parameter;
* IMDS must never be reached through a proxy: the underlying ``httpx.Client`` ignores proxy
  environment variables and system proxy settings (``trust_env=False``) and never follows redirects;
* the rate limit is 5 requests per second per VM, shared by every IMDS user on the VM: one client
  instance never sends more than ``max_requests_per_second`` requests in any one-second window,
  retries included, and waits (through the injected ``sleep``) when it would;
* the first Scheduled Events request enables the service and may take up to 2 minutes to answer:
  until the endpoint has answered 200 once, requests to it use ``first_request_timeout``;
* 410, 429 and 5xx, timeouts and connection errors are transient and retried; a 400 means the request
  is wrong (a bug), so it is never retried in a hot loop;
* an answer is read up to ``max_body_bytes`` (1 MiB by default; a real document is a few kB): a 200
  with a larger body is a ``MalformedDocument``, never read whole. The client asks for no content coding
  (``Accept-Encoding: identity``); gzip or deflate sent anyway is decoded within the same limit, and
  any other coding, or a body that does not decode, is a ``MalformedDocument`` too.

Every public method is synchronous and thread-safe; it blocks for at most the sum of its attempts'
timeouts, the back-off delays between them and any wait imposed by the rate limit.

The compute metadata document is parsed in ``coordinator.imds_compute``; the outcome of an attempt, its
``Retry-After`` and the 4xx cool-down record are in ``coordinator.imds_retry``. Their public names are
importable from here too.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import httpx

from coordinator.errors import ImdsBadRequest, ImdsFenced, ImdsUnavailable, MalformedDocument
from coordinator.imds_compute import BODY_LIMIT, InstanceCompute, parse_instance_compute
from coordinator.imds_retry import OUTCOMES, RETRYABLE, Cooldown, outcome_for_status, retry_after_of
from coordinator.models import Document, parse_document
from coordinator.support.ratelimit import RateLimiter

__all__ = [
    "DEFAULT_BASE_URL",
    "MAX_BODY_BYTES",
    "OUTCOMES",
    "ImdsClient",
    "InstanceCompute",
    "parse_instance_compute",
]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "http://169.254.169.254"

_SCHEDULED_EVENTS_PATH: Final = "/metadata/scheduledevents"
_COMPUTE_PATH: Final = "/metadata/instance/compute"
#: The default cap on the size of an answer's body, after any content decoding.
MAX_BODY_BYTES: Final = 1024 * 1024

_T = TypeVar("_T")


class ImdsClient:
    """Talks to IMDS; one instance per process, shared by every thread.

    Error contract, for every method:

    * ``ImdsUnavailable(outcome=...)``: transient trouble (timeout, connection error, 410, 429, 5xx)
      persisted through ``max_attempts`` attempts of this call; or IMDS gave an unexpected status (3xx
      (redirects are never followed), 1xx, a 2xx other than 200) which is not retried, outcome
      ``"other"``. ``outcome`` is the last attempt's outcome (one of ``OUTCOMES``).
    * ``ImdsBadRequest(status=, body=)``: IMDS answered 400 or another 4xx except 410/429; our request
      is wrong. Never retried. It arms a cool-down for that operation (``bad_request_cooldown`` seconds,
      doubling on each new 4xx up to ``bad_request_cooldown_max``, reset by a 200): calls within it raise
      ``ImdsBadRequest`` again at once, without sending anything. Operations are kept apart so that an
      approval IMDS refuses cannot stop the polling of the document.
    * ``MalformedDocument``: IMDS answered 200 with a body that does not parse, is larger than
      ``max_body_bytes`` or does not decode (see the module docstring). Not retried.

    Retries happen inside one call: full-jitter exponential back-off, attempt ``n`` waits a uniform
    random time in ``[0, min(backoff_max, backoff_base * 2**(n-1))]``, or, when the answer carries
    ``Retry-After`` in seconds, exactly that (capped at ``backoff_max``; the HTTP-date form is ignored).
    IMDS documents retrying 410 for up to 70 s in all: a call gives up sooner and the caller's next
    poll is the next retry.

    Timing: each attempt is bounded by ``request_timeout``, or, until the Scheduled Events endpoint has
    answered 200 once, by ``first_request_timeout`` (the first request enables the service). Connecting
    is always bounded by ``request_timeout``. Worst case per call with the defaults: 3 x 10 s plus at most
    1.5 s of back-off once warm; 3 x 120 s plus back-off before.

    ``on_request(method, outcome)`` is called after every HTTP attempt (not for calls refused by the
    cool-down) on the calling thread, and ``on_latency(method, seconds)`` with how long the attempt
    waited for its answer (or its error), on ``clock``; both must be quick and must not raise.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_version: str = "2020-07-01",
        compute_api_version: str = "2021-02-01",
        request_timeout: float = 10.0,
        first_request_timeout: float = 120.0,
        max_attempts: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_requests_per_second: float = 5.0,
        bad_request_cooldown: float = 5.0,
        bad_request_cooldown_max: float = 300.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        on_request: Callable[[str, str], None] | None = None,
        on_latency: Callable[[str, float], None] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {base_url!r}")
        for field, version in (("api_version", api_version), ("compute_api_version", compute_api_version)):
            if not version:
                raise ValueError(f"{field} must not be empty")
        for field, value in (
            ("request_timeout", request_timeout),
            ("first_request_timeout", first_request_timeout),
            ("max_requests_per_second", max_requests_per_second),
            ("bad_request_cooldown", bad_request_cooldown),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{field} must be a positive number, got {value!r}")
        for field, value in (("backoff_base", backoff_base), ("backoff_max", backoff_max)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{field} must be a non-negative number, got {value!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes!r}")
        if bad_request_cooldown_max < bad_request_cooldown:
            raise ValueError("bad_request_cooldown_max must not be below bad_request_cooldown")

        self._api_version = api_version
        self._compute_api_version = compute_api_version
        self._request_timeout = float(request_timeout)
        self._first_request_timeout = float(first_request_timeout)
        self._max_attempts = max_attempts
        self._max_body = int(max_body_bytes)
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._cooldown_initial = float(bad_request_cooldown)
        self._cooldown_max = float(bad_request_cooldown_max)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._on_request = on_request
        self._on_latency = on_latency
        self._limiter = RateLimiter.per_second(max_requests_per_second, clock=clock)
        self._lock = threading.Lock()
        self._warm = False
        self._cooldowns: dict[str, Cooldown] = {}
        # An explicit transport also keeps httpx from mounting proxies found in the environment; both
        # that and trust_env=False are needed to be sure IMDS is never reached through a proxy. IMDS
        # speaks plain HTTP: no certificate store is loaded for it (about 3 MiB per process), while an
        # https URL (a proxy of one's own in front of it) is verified as usual.
        plain = url.scheme == "http"
        self._client = httpx.Client(
            base_url=url,
            headers={"Metadata": "true", "Accept-Encoding": "identity"},
            timeout=httpx.Timeout(self._request_timeout),
            follow_redirects=False,
            trust_env=False,
            transport=transport if transport is not None else httpx.HTTPTransport(trust_env=False, verify=not plain),
        )

    # -- lifecycle ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool (and the transport). Idempotent."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- public operations -------------------------------------------------------------------------------

    def get_document(self, *, attempts: int | None = None) -> Document:
        """GET the Scheduled Events document.

        Returns the parsed ``Document``. Raises ``ImdsUnavailable``, ``ImdsBadRequest`` or
        ``MalformedDocument`` as described on the class; retries transient failures within the call,
        up to ``attempts`` (default ``max_attempts``). The agent's poller asks for 1: its next poll is
        the retry.
        """
        return self._call(
            "GET",
            _SCHEDULED_EVENTS_PATH,
            self._api_version,
            cooldown_key="GET scheduledevents",
            scheduled_events=True,
            parse=parse_document,
            attempts=attempts,
        )

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        """Approve events: POST ``{"StartRequests": [{"EventId": id}, ...]}`` to the Scheduled Events URL.

        Ids are sent exactly as given, in order, all in one request; an empty sequence sends nothing.
        Success is a 200, which IMDS also answers for an id already approved (by this or another VM),
        so retrying is safe and transient failures are retried like ``get_document``. An approval
        releases the event for every VM in its ``Resources``. Raises ``ImdsUnavailable`` or
        ``ImdsBadRequest`` (the cool-down is kept per set of ids), and ``TypeError`` if ``event_ids`` is
        a plain string or holds a non-string.

        ``fence``, when given, is called right before each attempt is sent (after any wait for the rate
        limit or a back-off): if it returns False, nothing more is sent and ``ImdsFenced`` is raised.
        The agent fences every approval with its last check of its ZooKeeper session.
        """
        if isinstance(event_ids, str | bytes):
            raise TypeError("event_ids must be a sequence of event ids, not a single string")
        ids = list(event_ids)
        for event_id in ids:
            if not isinstance(event_id, str):
                raise TypeError(f"event id must be a string, got {type(event_id).__name__}")
        if not ids:
            return
        self._call(
            "POST",
            _SCHEDULED_EVENTS_PATH,
            self._api_version,
            cooldown_key="POST scheduledevents " + ",".join(sorted(set(ids))),
            scheduled_events=True,
            parse=lambda body: None,
            json_body={"StartRequests": [{"EventId": event_id} for event_id in ids]},
            fence=fence,
        )

    def get_instance_compute(self) -> InstanceCompute:
        """GET ``/metadata/instance/compute``: this VM's name, scale set, fault/update domain and zone.

        Raises ``MalformedDocument``, ``ImdsUnavailable`` or ``ImdsBadRequest`` as for the document.
        Always uses ``request_timeout`` (the slow first answer concerns Scheduled Events only).
        """
        return self._call(
            "GET",
            _COMPUTE_PATH,
            self._compute_api_version,
            cooldown_key="GET compute",
            scheduled_events=False,
            parse=parse_instance_compute,
        )

    # -- internals ---------------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        api_version: str,
        *,
        cooldown_key: str,
        scheduled_events: bool,
        parse: Callable[[bytes], _T],
        json_body: dict[str, Any] | None = None,
        fence: Callable[[], bool] | None = None,
        attempts: int | None = None,
    ) -> _T:
        label = f"{method} {path}"
        max_attempts = self._max_attempts if attempts is None else attempts
        if max_attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts!r}")
        self._refuse_during_cooldown(cooldown_key, label)
        outcome = "other"
        detail = ""
        for attempt in range(1, max_attempts + 1):
            wait = self._limiter.reserve() - self._clock()
            if wait > 0:
                self._sleep(wait)
            retry_after: float | None = None
            if fence is not None and not fence():
                raise ImdsFenced(f"{label} not sent: the approval's fence closed (attempt {attempt})")
            sent = self._clock()
            try:
                response, content, unreadable = self._send(
                    self._client.build_request(
                        method,
                        path,
                        params={"api-version": api_version},
                        json=json_body,
                        timeout=self._timeout(scheduled_events),
                    )
                )
            except httpx.TimeoutException as exc:
                self._timed(method, sent)
                outcome, detail = "timeout", f"{type(exc).__name__}: {exc}"
                self._report(method, outcome)
            except httpx.RequestError as exc:
                self._timed(method, sent)
                outcome, detail = "connection_error", f"{type(exc).__name__}: {exc}"
                self._report(method, outcome)
            else:
                self._timed(method, sent)
                status = response.status_code
                outcome = outcome_for_status(status)
                if outcome == "ok":
                    self._succeeded(cooldown_key, scheduled_events)
                    try:
                        if unreadable is not None:
                            raise MalformedDocument(
                                f"IMDS answer to {label} not read: {unreadable}",
                                content=content[:BODY_LIMIT].decode("utf-8", "replace"),
                            )
                        result = parse(content)
                    except MalformedDocument:
                        self._report(method, "malformed")
                        raise
                    self._report(method, "ok")
                    return result
                self._report(method, outcome)
                body = content[:BODY_LIMIT].decode("utf-8", "replace")
                if 400 <= status < 500 and outcome not in RETRYABLE:
                    cooldown = self._arm_cooldown(cooldown_key, status, body)
                    logger.error(
                        "IMDS answered %d to %s: this is a bug in the request, not retried for %.0f s; "
                        "body: %s",
                        status,
                        label,
                        cooldown,
                        body,
                    )
                    raise ImdsBadRequest(
                        f"IMDS answered {status} to {label}: {body}", status=status, body=body
                    )
                if outcome not in RETRYABLE:
                    where = response.headers.get("Location")
                    raise ImdsUnavailable(
                        f"IMDS answered unexpected status {status} to {label}"
                        + (f" (redirect to {where!r}, not followed)" if where else ""),
                        outcome=outcome,
                    )
                retry_after = retry_after_of(response)
                detail = f"HTTP {status}"
            if attempt == max_attempts:
                break
            delay = self._backoff(attempt, retry_after)
            logger.debug(
                "IMDS %s attempt %d/%d failed (%s); retrying in %.2f s",
                label,
                attempt,
                max_attempts,
                detail,
                delay,
            )
            if delay > 0:
                self._sleep(delay)
        raise ImdsUnavailable(
            f"IMDS {label} failed after {max_attempts} attempt(s); last: {detail}", outcome=outcome
        )

    def _send(self, request: httpx.Request) -> tuple[httpx.Response, bytes, str | None]:
        """Send ``request`` and read at most ``max_body_bytes`` of the answer's body (decoded).

        Returns the response (closed), the body read, and why the body could not be read whole (None if
        it was). Raises what httpx raises for the request itself (timeouts, connection errors, a body cut
        short).
        """
        response = self._client.send(request, stream=True)
        try:
            declared = response.headers.get("Content-Length", "").strip()
            if declared.isdigit() and int(declared) > self._max_body:
                return response, b"", f"Content-Length {declared} exceeds the limit of {self._max_body} bytes"
            # A response built in memory (a test transport) is read, and decoded, already.
            read = response.is_stream_consumed
            coding = "identity" if read else response.headers.get("Content-Encoding", "identity").strip().lower()
            decoder: Any = None
            if coding in ("gzip", "x-gzip", "deflate"):
                decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
            elif coding not in ("", "identity"):
                return response, b"", f"unsupported Content-Encoding {coding[:40]!r} (none was asked for)"
            chunks: list[bytes] = []
            size = 0
            for raw in [response.content] if read else response.iter_raw():
                if decoder is not None:
                    try:
                        chunk = decoder.decompress(raw, self._max_body + 1 - size)
                    except zlib.error as exc:
                        return response, b"".join(chunks), f"{coding} body does not decode: {exc}"
                    if decoder.unconsumed_tail:
                        size = self._max_body + 1
                else:
                    chunk = raw
                size += len(chunk)
                chunks.append(chunk)
                if size > self._max_body:
                    return response, b"".join(chunks)[: self._max_body], (
                        f"body exceeds the limit of {self._max_body} bytes"
                    )
            if decoder is not None and not decoder.eof:
                return response, b"".join(chunks), f"{coding} body is truncated"
            return response, b"".join(chunks), None
        finally:
            response.close()

    def _timeout(self, scheduled_events: bool) -> httpx.Timeout:
        with self._lock:
            cold = scheduled_events and not self._warm
        total = self._first_request_timeout if cold else self._request_timeout
        return httpx.Timeout(total, connect=min(total, self._request_timeout))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self._backoff_max)
        cap = min(self._backoff_max, self._backoff_base * 2.0 ** min(attempt - 1, 64))
        return self._rng.uniform(0.0, cap)

    def _timed(self, method: str, sent: float) -> None:
        if self._on_latency is not None:
            self._on_latency(method, max(self._clock() - sent, 0.0))

    def _report(self, method: str, outcome: str) -> None:
        if self._on_request is not None:
            self._on_request(method, outcome)

    def _succeeded(self, cooldown_key: str, scheduled_events: bool) -> None:
        with self._lock:
            if scheduled_events:
                self._warm = True
            self._cooldowns.pop(cooldown_key, None)

    def _refuse_during_cooldown(self, cooldown_key: str, label: str) -> None:
        with self._lock:
            entry = self._cooldowns.get(cooldown_key)
            now = self._clock()
            if entry is None or now >= entry.until:
                return
            remaining = entry.until - now
        raise ImdsBadRequest(
            f"IMDS answered {entry.status} to {label} earlier; not sent again for {remaining:.1f} s "
            f"(cool-down): {entry.body}",
            status=entry.status,
            body=entry.body,
        )

    def _arm_cooldown(self, cooldown_key: str, status: int, body: str) -> float:
        """Start (or lengthen) the cool-down of one operation; return its length in seconds."""
        with self._lock:
            now = self._clock()
            # Forget cool-downs idle for longer than the longest one: keeps the table small (approvals
            # are keyed by id set) and lets a 4xx long after the last one start again from the bottom.
            for key in [k for k, e in self._cooldowns.items() if now - e.until > self._cooldown_max]:
                del self._cooldowns[key]
            previous = self._cooldowns.get(cooldown_key)
            delay = (
                self._cooldown_initial
                if previous is None
                else min(self._cooldown_max, max(self._cooldown_initial, previous.delay * 2))
            )
            self._cooldowns[cooldown_key] = Cooldown(
                until=now + delay, delay=delay, status=status, body=body
            )
            return delay
