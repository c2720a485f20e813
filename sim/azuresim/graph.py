"""The simulated Azure Resource Graph: the scheduled events of the simulated VMs as Azure publishes them to
the ``maintenanceresources`` table, served on ARM's port (``POST /providers/Microsoft.ResourceGraph/resources``).

Rows (see ``docs/simulator.md``, "Resource Graph"): one per event naming a VM of the group, updated at each
state change, ``EventStatus`` ``Scheduled`` -> ``Started`` -> ``Completed``, or ``Canceled`` when the event is
removed before it started (``DELETE /events/{id}``); a finished row is kept ``keep_finished`` seconds. The
rows follow the group's ``transition`` log (read on every query and by the server's ARM ticker), with the
event's fields taken from the group's current events while it has one. Each row names the event's unit
(``properties.TargetResourceId``, also the prefix of its ``id``): the scale set of a scale-set VM, the
availability set of a VM given a unit, else the VM itself.

Queries: not KQL. The product's own query is recognized by its table and type (``maintenanceresources``,
``microsoft.maintenance/scheduledevents``); ``ago(Nh)`` in it bounds how long finished rows are shown;
anything else is answered 400 ``BadRequest`` (``InvalidQuery``). Paging by ``$skipToken`` (``page_size`` rows
a page, ``$top`` a smaller one), ``objectArray`` only. Authentication and roles are ARM's
(``AzureModel.graph_caller``: a ``reader`` role reads; 401 without a valid token, 403 without a read role);
the throttle is Resource Graph's: ``quota`` queries per ``window`` seconds per caller, every answer carrying
``x-ms-user-quota-remaining`` and ``x-ms-user-quota-resets-after`` (``hh:mm:ss``), 429 with ``Retry-After``
beyond it. Faults with target ``graph`` (``AzureModel.add_fault``) answer a status or drop the connection.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import Field, StrictInt

from azuresim.azure import ArmAnswer, AzureModel
from azuresim.azure.answers import arm_error
from azuresim.catalogue import VmInfo, default_description
from azuresim.errors import InvalidRequest
from azuresim.httpdate import format_http_date
from azuresim.schema import Request

__all__ = ["GRAPH_API_VERSIONS", "GRAPH_PATH", "GraphSettingsRequest", "ResourceGraph"]

GRAPH_PATH = "/providers/Microsoft.ResourceGraph/resources"
#: api-versions of Microsoft.ResourceGraph's query the simulator accepts.
GRAPH_API_VERSIONS = ("2021-03-01", "2022-10-01", "2024-04-01")
ROW_TYPE = "microsoft.maintenance/scheduledevents"
TABLE = "maintenanceresources"
#: The tenant every row names (the simulator has one).
TENANT_ID = "00000000-0000-0000-0000-0000000000aa"
_AGO_HOURS = re.compile(r"ago\(\s*(\d+(?:\.\d+)?)\s*h\s*\)", re.IGNORECASE)
_PENDING = ("Scheduled", "Started")


class GraphSettingsRequest(Request):
    """``POST /arm/graph``: the Resource Graph's settings (``ResourceGraph.configure``); those not given stay."""

    page_size: StrictInt | None = Field(default=None, ge=1, le=1000)
    quota: StrictInt | None = Field(default=None, ge=1, le=1000)
    window_seconds: float | None = Field(default=None, gt=0, le=3600)
    keep_finished_seconds: float | None = Field(default=None, ge=0)


class _Group(Protocol):
    """What the Resource Graph reads of the simulated group (``SimulatedGroup``)."""

    @property
    def vms(self) -> tuple[VmInfo, ...]: ...

    def events(self) -> dict[str, Any]: ...

    def log(self, since: int = 0, kind: str | None = None) -> list[dict[str, Any]]: ...

    def served_not_before(self, not_before: int) -> int: ...


@dataclass
class _Row:
    event_id: str
    event_type: str
    resources: list[str]
    status: str
    updated: float  # wall-clock time of the last change
    resource_type: str = "VirtualMachine"
    description: str = ""
    source: str = "Platform"
    duration: int | None = -1
    not_before: str = ""


@dataclass
class _Quota:
    began: float
    used: int = 0


class ResourceGraph:
    """The rows and the query endpoint; thread-safe. ``clock`` is the wall clock (the log's ``t``)."""

    def __init__(self, group: _Group, azure: AzureModel, *, page_size: int = 1000, quota: int = 15,
                 window_seconds: float = 5.0, keep_finished_seconds: float = 7 * 86400.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._group = group
        self._azure = azure
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, _Row] = {}
        self._seq = 0
        self._quotas: dict[str, _Quota] = {}
        self.page_size = page_size
        self.quota = quota
        self.window_seconds = window_seconds
        self.keep_finished_seconds = keep_finished_seconds
        self._infos = {info.name.lower(): info for info in group.vms}

    def configure(self, *, page_size: int | None = None, quota: int | None = None, window_seconds: float | None = None,
                  keep_finished_seconds: float | None = None) -> dict[str, Any]:
        """Change the settings (those not given stay); returns them all, with the rows kept."""
        with self._lock:
            if page_size is not None:
                self.page_size = page_size
            if quota is not None:
                self.quota = quota
                self._quotas.clear()
            if window_seconds is not None:
                self.window_seconds = window_seconds
                self._quotas.clear()
            if keep_finished_seconds is not None:
                self.keep_finished_seconds = keep_finished_seconds
            return {"page_size": self.page_size, "quota": self.quota, "window_seconds": self.window_seconds,
                    "keep_finished_seconds": self.keep_finished_seconds, "rows": len(self._rows)}

    # -- rows -------------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the rows up to the group: its transitions since the last sync, then its current events."""
        current = self._group.events()["events"]
        with self._lock:
            for entry in self._group.log(self._seq, "transition"):
                self._seq = max(self._seq, int(entry["seq"]))
                self._apply(entry)
            for view in current:
                row = self._rows.get(view["event_id"])
                if row is None:
                    continue
                row.event_type = view["event_type"]
                row.resources = list(view["resources"])
                row.resource_type = view["resource_type"]
                row.description = view["description"]
                row.source = view["source"]
                duration = view["duration_in_seconds"]
                row.duration = -1 if duration is None else duration  # -1: not known, as IMDS says it
                if row.status == "Scheduled":
                    row.not_before = view["not_before_text"]
            horizon = self._clock() - self.keep_finished_seconds
            for key in [k for k, r in self._rows.items() if r.status not in _PENDING and r.updated < horizon]:
                del self._rows[key]

    def _apply(self, entry: dict[str, Any]) -> None:
        event_id, before, after = entry["event_id"], entry["from"], entry["to"]
        at = float(entry["t"])
        row = self._rows.get(event_id)
        if row is None:
            if after is None:
                return  # created and gone before any sync saw it: its creation is in the same batch, handled first
            row = self._rows[event_id] = _Row(event_id, entry["event_type"], list(entry["resources"]), after, at)
            # What a current event's view refines at the next sync, should the event be gone by then.
            row.source = entry.get("source") or row.source
            row.description = default_description(row.event_type, row.source)
            not_before = entry.get("not_before")
            if after == "Scheduled" and not_before is not None:
                row.not_before = format_http_date(self._group.served_not_before(int(not_before)))
            return
        if after is None:
            row.status = "Canceled" if before == "Scheduled" and entry["reason"] == "cancelled" else "Completed"
        else:
            row.status = after
            if after == "Started":
                row.not_before = ""  # blank once Started, as the documented field says
        row.updated = at

    def rows(self) -> list[dict[str, Any]]:
        """Every row kept, as the query serves it (sorted by id)."""
        self.sync()
        with self._lock:
            return sorted((r for r in (self._row_view(row) for row in self._rows.values()) if r is not None),
                          key=lambda r: r["id"])

    def _row_view(self, row: _Row) -> dict[str, Any] | None:
        named = [self._infos[name.lower()] for name in row.resources if name.lower() in self._infos]
        if not named:
            return None  # names no VM the simulator serves: no resource of its subscriptions
        info = named[0]
        target = _target(info)
        properties = {
            "EventId": row.event_id, "EventType": row.event_type, "ResourceType": row.resource_type,
            "Resources": list(row.resources), "EventStatus": row.status, "NotBefore": row.not_before,
            "Description": row.description, "EventSource": row.source, "DurationInSeconds": row.duration,
            "TargetResourceId": target,
            "LastUpdateTime": datetime.fromtimestamp(row.updated, tz=UTC).isoformat().replace("+00:00", "Z"),
        }
        return {"id": f"{target}/providers/Microsoft.Maintenance/scheduledevents/{row.event_id}", "name": row.event_id,
                "type": ROW_TYPE, "tenantId": TENANT_ID, "kind": "", "location": info.location,
                "resourceGroup": info.resource_group.lower(), "subscriptionId": info.subscription_id, "managedBy": "",
                "sku": None, "plan": None, "properties": properties, "tags": {}, "identity": None,
                "zones": sorted({i.zone for i in named if i.zone}) or None, "extendedLocation": None}

    # -- the query --------------------------------------------------------------------------------------

    def query(self, method: str, params: dict[str, str], headers: dict[str, str], body: bytes) -> ArmAnswer:
        """Resource Graph's answer to one request on its path; ``headers`` with lower-case names."""
        answer = self._query(method, params, headers, body)
        self._azure.count_graph_answer("dropped" if answer.drop else answer.status)
        return answer

    def _query(self, method: str, params: dict[str, str], headers: dict[str, str], body: bytes) -> ArmAnswer:
        if method != "POST":
            return arm_error(405, "MethodNotAllowed",
                              f"The requested resource does not support http method '{method}'.")
        version = params.get("api-version")
        if version is None:
            return arm_error(400, "MissingApiVersionParameter",
                              "The api-version query parameter (?api-version=) is required for all requests.")
        if version not in GRAPH_API_VERSIONS:
            return arm_error(400, "InvalidApiVersionParameter", f"The api-version '{version}' is invalid. The "
                              f"supported versions are '{', '.join(GRAPH_API_VERSIONS)}'.")
        identity, refused = self._azure.graph_caller(headers)
        if refused is not None and (refused.drop or refused.status == 401 or identity is None):
            return refused
        assert identity is not None
        quota = self._take_quota(identity.object_id)
        if isinstance(quota, ArmAnswer):
            return quota
        if refused is not None:
            return _with_headers(refused, quota)
        try:
            request = _parse(body)
        except InvalidRequest as exc:
            return _with_headers(_bad_request("InvalidQuery" if "query" in str(exc) else "BadRequest", str(exc)), quota)
        text, subscriptions, options = request
        if TABLE not in text.lower() or ROW_TYPE not in text.lower():
            refusal = _bad_request("InvalidQuery", "The simulated Resource Graph answers only the query of scheduled "
                                   f"events ({TABLE} | where type == '{ROW_TYPE}' ...).")
            return _with_headers(refusal, quota)
        hours = _AGO_HOURS.search(text)
        since = self._clock() - float(hours.group(1)) * 3600 if hours else -math.inf
        wanted = {s.lower() for s in subscriptions} if subscriptions is not None else None
        rows = [r for r in self.rows() if (wanted is None or r["subscriptionId"].lower() in wanted)
                and (r["properties"]["EventStatus"] in _PENDING or _updated(r) >= since)]
        fingerprint = hashlib.sha256(json.dumps([text, sorted(wanted or [])]).encode()).hexdigest()[:16]
        try:
            skip = _skip_of(options.get("$skipToken"), fingerprint) if options.get("$skipToken") else 0
        except InvalidRequest as exc:
            return _with_headers(_bad_request("InvalidSkipToken", str(exc)), quota)
        size = min(self.page_size, int(options.get("$top") or self.page_size))
        page = rows[skip:skip + size]
        answer: dict[str, Any] = {"totalRecords": len(rows), "count": len(page), "data": page, "facets": [],
                                  "resultTruncated": "false"}
        if skip + size < len(rows):
            answer["$skipToken"] = _skip_token(skip + size, fingerprint)
        return ArmAnswer(200, answer, _quota_headers(*quota))

    def _take_quota(self, principal: str) -> tuple[int, float] | ArmAnswer:
        """One query of ``principal``'s quota: (queries left, seconds to the window's end), or the 429."""
        with self._lock:
            now = self._clock()
            quota = self._quotas.get(principal)
            if quota is None or now >= quota.began + self.window_seconds:
                quota = self._quotas[principal] = _Quota(now)
            resets = max(0.0, quota.began + self.window_seconds - now)
            if quota.used >= self.quota:
                headers = _quota_headers(0, resets)
                headers["Retry-After"] = str(max(1, math.ceil(resets)))
                return arm_error(429, "RateLimiting", f"Client application has been throttled and should not "
                                  f"attempt to repeat the request until an amount of time has elapsed: "
                                  f"{self.quota} queries per {self.window_seconds:g} seconds.", headers)
            quota.used += 1
            return self.quota - quota.used, resets


def _target(info: VmInfo) -> str:
    """The resource an event of ``info`` is published for: its scale set, its availability set, or the VM."""
    base = f"/subscriptions/{info.subscription_id}/resourceGroups/{info.resource_group}/providers/Microsoft.Compute"
    if info.scale_set_name:
        return f"{base}/virtualMachineScaleSets/{info.scale_set_name}"
    if info.unit:
        return f"{base}/availabilitySets/{info.unit}"
    return f"{base}/virtualMachines/{info.name}"


def _updated(row: dict[str, Any]) -> float:
    return datetime.fromisoformat(row["properties"]["LastUpdateTime"].replace("Z", "+00:00")).timestamp()


def _parse(body: bytes) -> tuple[str, Sequence[str] | None, dict[str, Any]]:
    """The query, subscriptions and options of a QueryRequest; raises ``InvalidRequest``."""
    try:
        data = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidRequest("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object (QueryRequest).")
    text = data.get("query")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("The query is missing: the request body needs a non-empty 'query'.")
    subscriptions = data.get("subscriptions")
    if subscriptions is not None and (not isinstance(subscriptions, list)
                                      or not all(isinstance(s, str) for s in subscriptions)):
        raise InvalidRequest("'subscriptions' must be an array of strings.")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("'options' must be an object (QueryRequestOptions).")
    if options.get("resultFormat", "objectArray") != "objectArray":
        raise InvalidRequest("The simulated Resource Graph serves resultFormat objectArray only.")
    top = options.get("$top")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 1000):
        raise InvalidRequest("'$top' must be an integer from 1 to 1000.")
    return text, subscriptions, options


def _skip_token(skip: int, fingerprint: str) -> str:
    return base64.b64encode(json.dumps({"skip": skip, "q": fingerprint}).encode()).decode()


def _skip_of(token: object, fingerprint: str) -> int:
    """Where a ``$skipToken`` resumes; raises ``InvalidRequest`` for one not given for this query."""
    try:
        data = json.loads(base64.b64decode(str(token), validate=True))
        skip = data["skip"]
        same = data["q"] == fingerprint
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise InvalidRequest("The $skipToken is not valid.") from None
    if not same or not isinstance(skip, int) or skip < 0:
        raise InvalidRequest("The $skipToken was not issued for this query and these subscriptions.")
    return skip


def _bad_request(code: str, message: str) -> ArmAnswer:
    return ArmAnswer(400, {"error": {"code": "BadRequest", "message": "Please provide below info when asking for "
                                     "support: the query is invalid.",
                                     "details": [{"code": code, "message": message}]}})


def _quota_headers(remaining: int, resets: float) -> dict[str, str]:
    seconds = max(0, math.ceil(resets))
    return {"x-ms-user-quota-remaining": str(remaining),
            "x-ms-user-quota-resets-after": f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"}


def _with_headers(answer: ArmAnswer, quota: tuple[int, float]) -> ArmAnswer:
    return ArmAnswer(answer.status, answer.body, {**answer.headers, **_quota_headers(*quota)}, answer.drop,
                     answer.delay)
