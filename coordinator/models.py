"""The Scheduled Events document, as IMDS serves it.

Modelled on the documented schema (api-version 2017-08-01 to 2020-07-01) and tolerant where real
documents are irregular:

* fields added by later api-versions (``Description``, ``EventSource``, ``DurationInSeconds``) and, in
  some captures, ``ResourceType``, ``Resources`` and ``NotBefore`` may be absent;
* ``NotBefore`` is RFC 1123 in GMT, ``""`` once Started, and in older tools ISO 8601; public examples
  carry weekday names that do not match the date, so the weekday is ignored;
* unknown ``EventType`` and ``EventStatus`` values are kept as they are (``is_known_type`` is False)
  and are never approved automatically.

What is *not* tolerated: a body that is not JSON, a wrong type for a documented field (a string
incarnation, a number as an event id, ...). ``parse_document`` raises ``MalformedDocument`` with the
content, and the agent then changes nothing.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from coordinator.errors import MalformedDocument
from coordinator.support.httpdate import parse_http_date

__all__ = [
    "Document",
    "EventSource",
    "EventStatus",
    "EventType",
    "ScheduledEvent",
    "format_not_before",
    "parse_document",
    "parse_not_before",
]


class EventType(StrEnum):
    FREEZE = "Freeze"
    REBOOT = "Reboot"
    REDEPLOY = "Redeploy"
    PREEMPT = "Preempt"
    TERMINATE = "Terminate"


class EventStatus(StrEnum):
    SCHEDULED = "Scheduled"
    STARTED = "Started"


class EventSource(StrEnum):
    PLATFORM = "Platform"
    USER = "User"


_RFC1123 = re.compile(
    r"\s*(?:[A-Za-z]{3},\s*)?(?P<day>\d{1,2})\s+(?P<month>[A-Za-z]{3})\s+(?P<year>\d{4})\s+"
    r"(?P<time>\d{2}:\d{2}:\d{2})\s+(?:GMT|UTC|Z|\+0000)\s*"
)


def parse_not_before(value: object) -> datetime | None:
    """Parse ``NotBefore``: RFC 1123 (weekday ignored), ISO 8601, or ``""``/None meaning no time.

    Raises ValueError for anything else; the returned datetime is always timezone-aware UTC.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        raise ValueError(f"NotBefore must be a string, got {type(value).__name__}")
    if value.strip() == "":
        return None
    match = _RFC1123.fullmatch(value)
    if match:
        return parse_http_date(value)
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"NotBefore {value[:60]!r} is neither RFC 1123 nor ISO 8601") from None
    if not parsed.tzinfo:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # Past the ends of the calendar once moved to UTC (9999-12-31T23:59:59-01:00): the nearest
        # representable instant keeps the meaning (far future, or long past) and every later
        # ``.timestamp()`` works.
        return datetime.max.replace(tzinfo=UTC) if parsed.year > 1 else datetime.min.replace(tzinfo=UTC)


def format_not_before(value: datetime) -> str:
    """Format a time the way IMDS does: RFC 1123 in GMT, e.g. ``Mon, 11 Apr 2022 22:26:58 GMT``."""
    utc = value.astimezone(UTC)
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    months = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    return (
        f"{days[utc.weekday()]}, {utc.day:02d} {months[utc.month - 1]} {utc.year:04d} "
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d} GMT"
    )


NotBefore = Annotated[datetime | None, BeforeValidator(parse_not_before)]


class ScheduledEvent(BaseModel):
    """One entry of ``Events``. Field names follow Python; aliases follow IMDS."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    event_id: StrictStr = Field(alias="EventId", min_length=1)
    event_type: StrictStr = Field(alias="EventType")
    event_status: StrictStr = Field(alias="EventStatus")
    resource_type: StrictStr | None = Field(default=None, alias="ResourceType")
    resources: tuple[StrictStr, ...] = Field(default=(), alias="Resources")
    not_before: NotBefore = Field(default=None, alias="NotBefore")
    description: StrictStr | None = Field(default=None, alias="Description")
    event_source: StrictStr | None = Field(default=None, alias="EventSource")
    duration_in_seconds: StrictInt | None = Field(default=None, alias="DurationInSeconds")
    # Why NotBefore could not be read (then ``not_before`` is None): one odd field must not hide the
    # event, or the whole document, from the agent. Such an event drains its VMs at once if it is
    # Scheduled and is never approved early.
    not_before_error: str | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _tolerate_not_before(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "NotBefore" not in data:
            return data
        try:
            parse_not_before(data["NotBefore"])
        except (ValueError, TypeError) as exc:
            data = {k: v for k, v in data.items() if k not in ("NotBefore", "not_before_error")}
            data["not_before_error"] = str(exc)[:200]
        return data

    @property
    def is_known_type(self) -> bool:
        return self.event_type in EventType.__members__.values()

    @property
    def is_scheduled(self) -> bool:
        return self.event_status == EventStatus.SCHEDULED

    @property
    def is_started(self) -> bool:
        return self.event_status == EventStatus.STARTED

    def names(self, vm: str) -> bool:
        """True if ``vm`` is among ``Resources`` (Azure names are case-insensitive)."""
        wanted = vm.lower()
        return any(r.lower() == wanted for r in self.resources)

    def to_imds(self, api_version: str | None = None) -> dict[str, Any]:
        """Serialize as IMDS does, omitting fields that ``api_version`` predates (absent, not null)."""
        body: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.event_status,
            "EventType": self.event_type,
            "ResourceType": self.resource_type or "VirtualMachine",
            "Resources": list(self.resources),
            "NotBefore": format_not_before(self.not_before) if self.not_before else "",
        }
        if api_version is None or api_version >= "2019-04-01":
            body["Description"] = self.description or ""
        if api_version is None or api_version >= "2019-08-01":
            body["EventSource"] = self.event_source or EventSource.PLATFORM.value
        if (api_version is None or api_version >= "2020-07-01") and self.duration_in_seconds is not None:
            body["DurationInSeconds"] = self.duration_in_seconds
        return body


class Document(BaseModel):
    """The whole Scheduled Events document."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    document_incarnation: StrictInt = Field(alias="DocumentIncarnation", ge=0)
    events: tuple[ScheduledEvent, ...] = Field(alias="Events")

    def event(self, event_id: str) -> ScheduledEvent | None:
        for event in self.events:
            if event.event_id == event_id:
                return event
        return None

    def to_imds(self, api_version: str | None = None) -> dict[str, Any]:
        return {
            "DocumentIncarnation": self.document_incarnation,
            "Events": [event.to_imds(api_version) for event in self.events],
        }


def parse_document(raw: bytes | str | object) -> Document:
    """Parse a Scheduled Events document from bytes, text or already-decoded JSON.

    Raises ``MalformedDocument`` (with the offending content, truncated) for anything that is not a
    valid document. Never raises anything else, whatever the input.
    """
    content = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if isinstance(content, str):
        try:
            data = json.loads(content)
        except (ValueError, RecursionError) as exc:
            raise MalformedDocument(f"not JSON: {exc}", content=content[:2000]) from None
    else:
        data = content
    try:
        return Document.model_validate(data)
    except (ValidationError, ValueError, TypeError, RecursionError) as exc:
        shown = content if isinstance(content, str) else _safe_dump(content)
        raise MalformedDocument(f"invalid document: {_summarize(exc)}", content=shown[:2000]) from None


def _safe_dump(data: object) -> str:
    try:
        return json.dumps(data, default=repr)
    except (ValueError, TypeError, RecursionError):
        return repr(data)


def _summarize(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors()[:5]:
            loc = ".".join(str(p) for p in error["loc"])
            parts.append(f"{loc}: {error['msg']}")
        return "; ".join(parts)
    return str(exc)
