"""Azure Resource Graph: the scheduled events of whole subscriptions, as Azure publishes them to the
``maintenanceresources`` table (``type == "microsoft.maintenance/scheduledevents"``, one row per event,
updated at each state change, ``EventStatus`` ``Scheduled``, ``Started``, ``Completed`` or ``Canceled``).

``ResourceGraphClient.scheduled_events`` runs one fixed query (``scheduled_events_query``: every pending
event, and those finished in the last ``hours``) through ``POST {arm}/providers/Microsoft.ResourceGraph/
resources?api-version=2022-10-01`` (``QueryRequest`` / ``QueryResponse`` of the REST specification), follows
``$skipToken`` from page to page, and turns each row into a ``GraphEvent``.

Tokens: ``ManagedIdentity`` of ``coordinator.azure_arm`` (IMDS, on an Azure VM), or ``CliToken`` (``az
account get-access-token``, where an operator is logged in with the Azure CLI). Both give a token for
``https://management.azure.com/``.

Throttling: Resource Graph allows about 15 queries per 5 s per user; its answers say what is left
(``x-ms-user-quota-remaining``) and when the window ends (``x-ms-user-quota-resets-after``, ``hh:mm:ss``).
A quota used up makes the next query wait for the window's end; a 429 is retried after ``Retry-After``
(else the window's end), as long as the wait fits in ``max_wait`` seconds, else it is an error. A 401 asks
for a new token once; 5xx and transport errors are retried twice.

Every failure is a ``GraphError`` whose message is one line naming the cause and what to do, and whose
``cause`` is one of ``token``, ``forbidden``, ``throttled``, ``unreachable``, ``bad_query``,
``server_error``, ``bad_answer``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol

import httpx

from coordinator.azure_arm import ARM_RESOURCE, ArmError, error_excerpt, parse_retry_after

__all__ = [
    "DEFAULT_ARM_URL",
    "FINISHED",
    "GRAPH_API_VERSION",
    "GRAPH_PATH",
    "PENDING",
    "CliToken",
    "GraphCause",
    "GraphError",
    "GraphEvent",
    "GraphResult",
    "ResourceGraphClient",
    "TokenSource",
    "parse_row",
    "quota_resets_after",
    "scheduled_events_query",
]

DEFAULT_ARM_URL = "https://management.azure.com"
GRAPH_PATH = "/providers/Microsoft.ResourceGraph/resources"
GRAPH_API_VERSION = "2022-10-01"
PENDING = ("Scheduled", "Started")
FINISHED = ("Completed", "Canceled")
_MAX_PAGES = 100
_EVENT_SUFFIX = re.compile(r"/providers/microsoft\.maintenance/scheduledevents/[^/]+$", re.IGNORECASE)
_RESETS = re.compile(r"^(?:(\d+)\.)?(\d+):(\d+):(\d+(?:\.\d+)?)$")

GraphCause = Literal["token", "forbidden", "throttled", "unreachable", "bad_query", "server_error", "bad_answer"]


class GraphError(Exception):
    """Resource Graph could not be queried: a one-line ``message`` and its ``cause``."""

    def __init__(self, message: str, cause: GraphCause) -> None:
        super().__init__(message)
        self.cause: GraphCause = cause


class TokenSource(Protocol):
    """Where ARM tokens come from (``ManagedIdentity``, ``CliToken``)."""

    def token(self, deadline: float) -> str: ...

    def invalidate(self) -> None: ...


def scheduled_events_query(hours: float) -> str:
    """The KQL of every pending scheduled event, and of those finished in the last ``hours`` (a row whose
    update time is not given is kept: the client filters what it can)."""
    return (
        "maintenanceresources\n"
        '| where type == "microsoft.maintenance/scheduledevents"\n'
        "| extend status = tostring(properties.EventStatus), updated = todatetime(properties.LastUpdateTime)\n"
        f'| where status in~ ("Scheduled", "Started") or isnull(updated) or updated > ago({hours:g}h)\n'
        "| project id, name, subscriptionId, resourceGroup, location, properties\n"
        "| order by id asc"
    )


@dataclass(frozen=True)
class GraphEvent:
    """One scheduled event as Resource Graph shows it.

    ``unit``: the resource the event is published for (its scale set, availability set or VM), from
    ``properties.TargetResourceId`` or else the row's ``id`` without its scheduledevents suffix.
    ``not_before`` and ``updated_at`` are unix times (None when blank or unreadable)."""

    event_id: str
    event_type: str
    status: str
    resources: tuple[str, ...]
    not_before: float | None
    unit: str
    subscription: str
    resource_group: str
    description: str = ""
    source: str = ""
    duration: int | None = None
    updated_at: float | None = None
    row_id: str = ""

    @property
    def pending(self) -> bool:
        return self.status in PENDING


@dataclass(frozen=True)
class GraphResult:
    events: list[GraphEvent]
    pages: int
    read_at: float  # unix time of the last page
    skipped: list[str] = field(default_factory=list)  # rows that could not be read, why


def parse_row(row: object) -> GraphEvent:
    """A ``maintenanceresources`` row as a ``GraphEvent``; raises ``ValueError`` naming what is missing."""
    if not isinstance(row, dict):
        raise ValueError("a row is not an object")
    properties = row.get("properties")
    if not isinstance(properties, dict):
        raise ValueError(f"row {str(row.get('id'))[:120]!r} has no properties")
    event_id = properties.get("EventId") or row.get("name")
    if not isinstance(event_id, str) or not event_id:
        raise ValueError(f"row {str(row.get('id'))[:120]!r} has no EventId")
    resources = properties.get("Resources") or []
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise ValueError(f"event {event_id}: Resources is not a list of names")
    row_id = str(row.get("id") or "")
    target = properties.get("TargetResourceId")
    unit = target if isinstance(target, str) and target else _EVENT_SUFFIX.sub("", row_id)
    duration = properties.get("DurationInSeconds")
    return GraphEvent(
        event_id=event_id, event_type=str(properties.get("EventType") or "?"),
        status=str(properties.get("EventStatus") or "?"), resources=tuple(resources),
        not_before=_http_date(properties.get("NotBefore")), unit=unit,
        subscription=str(row.get("subscriptionId") or ""), resource_group=str(row.get("resourceGroup") or ""),
        description=str(properties.get("Description") or ""), source=str(properties.get("EventSource") or ""),
        duration=duration if isinstance(duration, int) and not isinstance(duration, bool) else None,
        updated_at=_iso_time(properties.get("LastUpdateTime")), row_id=row_id,
    )


def _http_date(value: object) -> float | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return _iso_time(value)


def _iso_time(value: object) -> float | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def quota_resets_after(value: str | None) -> float | None:
    """Seconds of an ``x-ms-user-quota-resets-after`` header (``hh:mm:ss``, maybe ``d.hh:mm:ss``)."""
    match = _RESETS.match((value or "").strip())
    if match is None:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


class CliToken:
    """An ARM token of the Azure CLI's signed-in account: ``az account get-access-token --resource
    https://management.azure.com/ -o json``, cached until a minute before it expires."""

    def __init__(self, *, run: Callable[[Sequence[str], float], subprocess.CompletedProcess[str]] | None = None,
                 which: Callable[[str], str | None] = shutil.which, clock: Callable[[], float] = time.time) -> None:
        self._run = run or _run_az
        self._which = which
        self._clock = clock
        self._value: str | None = None
        self._expires = 0.0

    def invalidate(self) -> None:
        self._value = None

    def token(self, deadline: float) -> str:
        if self._value is not None and self._clock() < self._expires - 60:
            return self._value
        az = self._which("az")
        if az is None:
            raise GraphError("no token: the Azure CLI (az) is not installed or not on PATH; install it and run "
                             "az login, or use --auth msi on an Azure VM with a managed identity", "token")
        command = [az, "account", "get-access-token", "--resource", ARM_RESOURCE, "-o", "json"]
        try:
            done = self._run(command, max(1.0, deadline - time.monotonic()))
        except (OSError, subprocess.SubprocessError) as exc:
            raise GraphError(f"no token from the Azure CLI: {type(exc).__name__}: {exc}", "token") from None
        if done.returncode != 0:
            said = next((line.strip() for line in (done.stderr or "").splitlines() if line.strip()), "no message")
            raise GraphError(f"no token from the Azure CLI (az account get-access-token exited {done.returncode}: "
                             f"{said[:200]}); run az login", "token")
        try:
            body = json.loads(done.stdout)
            value = body["accessToken"]
        except (ValueError, KeyError, TypeError):
            raise GraphError("no token from the Azure CLI: its answer has no accessToken", "token") from None
        if not isinstance(value, str) or not value:
            raise GraphError("no token from the Azure CLI: its accessToken is empty", "token")
        expires = body.get("expires_on")
        try:
            self._expires = float(expires) if expires is not None else self._clock() + 300
        except (TypeError, ValueError):
            self._expires = self._clock() + 300
        self._value = value
        return value


def _run_az(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)


class ResourceGraphClient:
    """Queries Resource Graph with a token from ``tokens``. ``timeout`` bounds each request, ``max_wait`` a
    throttled query's wait; ``clock`` is monotonic."""

    def __init__(self, tokens: TokenSource, *, arm_url: str = DEFAULT_ARM_URL, timeout: float = 15.0,
                 max_wait: float = 30.0, who: str = "the identity", transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self._tokens = tokens
        self._url = arm_url.rstrip("/") + GRAPH_PATH
        self._arm_url = arm_url.rstrip("/")
        self._timeout = timeout
        self._max_wait = max_wait
        self._who = who
        self._clock = clock
        self._sleep = sleep
        self._http = httpx.Client(timeout=timeout, trust_env=False, transport=transport)
        self._quota_ends: float | None = None  # monotonic time a used-up quota is back
        self.requests = 0
        self.quota_remaining: int | None = None

    def close(self) -> None:
        self._http.close()

    def scheduled_events(self, subscriptions: Sequence[str], *, hours: float = 24.0) -> GraphResult:
        """Every pending scheduled event of ``subscriptions`` and those finished in the last ``hours``."""
        if not subscriptions:
            raise GraphError("no subscription to query: give --subscription ID", "bad_query")
        query = scheduled_events_query(hours)
        events: list[GraphEvent] = []
        skipped: list[str] = []
        skip_token: str | None = None
        pages = 0
        while True:
            options: dict[str, Any] = {"resultFormat": "objectArray"}
            if skip_token is not None:
                options["$skipToken"] = skip_token
            body = self._post({"subscriptions": list(subscriptions), "query": query, "options": options})
            pages += 1
            data = body.get("data")
            if not isinstance(data, list):
                raise GraphError("Resource Graph answered without a data array (resultFormat objectArray)",
                                 "bad_answer")
            for row in data:
                try:
                    events.append(parse_row(row))
                except ValueError as exc:
                    skipped.append(str(exc))
            token = body.get("$skipToken")
            if not token:
                break
            if pages >= _MAX_PAGES:
                raise GraphError(f"Resource Graph kept answering pages: stopped after {pages}", "bad_answer")
            skip_token = str(token)
        horizon = time.time() - hours * 3600
        kept = [e for e in events if e.pending or e.updated_at is None or e.updated_at >= horizon]
        return GraphResult(kept, pages, time.time(), skipped)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One page: the answer's body; raises ``GraphError``."""
        renewed = False
        failures = 0
        began = self._clock()
        while True:
            self._wait_for_quota(began)
            token = self._token()
            self.requests += 1
            try:
                response = self._http.post(self._url, params={"api-version": GRAPH_API_VERSION}, json=payload,
                                           headers={"Authorization": f"Bearer {token}"})
            except httpx.HTTPError as exc:
                failures += 1
                if failures > 2:
                    raise GraphError(f"cannot reach Resource Graph at {self._arm_url}: {_brief(exc)}",
                                     "unreachable") from None
                self._sleep(0.5 * failures)
                continue
            self._note_quota(response)
            status = response.status_code
            if status == 200:
                try:
                    body = response.json()
                except ValueError:
                    raise GraphError("Resource Graph answered 200 with a body that is not JSON", "bad_answer") from None
                if not isinstance(body, dict):
                    raise GraphError("Resource Graph answered 200 with a body that is not an object", "bad_answer")
                return body
            if status == 401 and not renewed:
                renewed = True
                self._tokens.invalidate()
                continue
            if status == 401:
                raise GraphError(f"Resource Graph refused the token of {self._who} (401 {error_excerpt(response)})",
                                 "forbidden")
            if status == 403:
                subscriptions = ", ".join(payload["subscriptions"])
                raise GraphError(f"{self._who} may not read the scheduled events (403 {error_excerpt(response)}): "
                                 f"give it the Reader role on subscription(s) {subscriptions}", "forbidden")
            if status == 429:
                wait = self._throttle_wait(response)
                if self._clock() + wait - began > self._max_wait:
                    raise GraphError(f"Resource Graph throttled the query (429: about 15 queries per 5 s per user) "
                                     f"and asks to wait {wait:.0f} s, longer than {self._max_wait:g} s: try again "
                                     "later, or query less often", "throttled")
                self._sleep(wait)
                continue
            if status >= 500 and failures < 2:
                failures += 1
                self._sleep(0.5 * failures)
                continue
            if status >= 500:
                raise GraphError(f"Resource Graph failed ({status} {error_excerpt(response)})", "server_error")
            raise GraphError(f"Resource Graph refused the query ({status} {_detailed(response)})", "bad_query")

    def _token(self) -> str:
        deadline = time.monotonic() + self._timeout
        try:
            return self._tokens.token(deadline)
        except ArmError as exc:
            raise GraphError(f"no token for {self._who}: {exc}; on a VM, assign it a managed identity, or use "
                             "--auth cli where the Azure CLI is logged in", "token") from None

    def _note_quota(self, response: httpx.Response) -> None:
        remaining = response.headers.get("x-ms-user-quota-remaining")
        resets = quota_resets_after(response.headers.get("x-ms-user-quota-resets-after"))
        try:
            self.quota_remaining = int(remaining) if remaining is not None else None
        except ValueError:
            self.quota_remaining = None
        if self.quota_remaining is not None and self.quota_remaining <= 0 and resets is not None:
            self._quota_ends = self._clock() + resets
        else:
            self._quota_ends = None

    def _wait_for_quota(self, began: float) -> None:
        """Before a request: wait for the window's end if the last answer said the quota is used up."""
        if self._quota_ends is None:
            return
        wait = self._quota_ends - self._clock()
        if wait > 0:
            if self._clock() + wait - began > self._max_wait:
                raise GraphError(f"Resource Graph's quota (about 15 queries per 5 s per user) is used up for "
                                 f"{wait:.0f} s more, longer than {self._max_wait:g} s: try again later", "throttled")
            self._sleep(wait)
        self._quota_ends = None

    def _throttle_wait(self, response: httpx.Response) -> float:
        wait = parse_retry_after(response.headers.get("Retry-After"))
        if wait is None:
            wait = quota_resets_after(response.headers.get("x-ms-user-quota-resets-after"))
        return 1.0 if wait is None or not math.isfinite(wait) else wait

    def quota_wait(self) -> float:
        """Seconds until the quota is back, if the last answer said it is used up (else 0)."""
        return 0.0 if self._quota_ends is None else max(0.0, self._quota_ends - self._clock())


def _detailed(response: httpx.Response) -> str:
    """ARM's error with its first detail (Resource Graph puts the query's fault there)."""
    text = error_excerpt(response)
    try:
        details = response.json()["error"]["details"]
        first = details[0]
        return f"{text}; {first.get('code', '?')}: {str(first.get('message', ''))[:300]}"
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return text


def _brief(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host unreachable"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:160]
