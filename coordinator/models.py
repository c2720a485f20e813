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

__all__ = [
    "MAX_INCARNATION",
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
        return _from_rfc1123(match)
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


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _from_rfc1123(match: re.Match[str]) -> datetime:
    # Built from the fields themselves: a mail-date parser reads years below 100 as two-digit years
    # (``01 Jan 0001`` would become 2001), and IMDS always writes four digits.
    month = match["month"].capitalize()
    if month not in _MONTHS:
        raise ValueError(f"not an RFC 1123 date: unknown month {match['month']!r}")
    hour, minute, second = (int(part) for part in match["time"].split(":"))
    try:
        return datetime(
            int(match["year"]), _MONTHS.index(month) + 1, int(match["day"]), hour, minute, second, tzinfo=UTC
        )
    except ValueError as exc:
        raise ValueError(f"not an RFC 1123 date: {match.string[:60]!r} ({exc})") from None


def format_not_before(value: datetime) -> str:
    """Format a time the way IMDS does: RFC 1123 in GMT, e.g. ``Mon, 11 Apr 2022 22:26:58 GMT``."""
    utc = value.astimezone(UTC)
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    return (
        f"{days[utc.weekday()]}, {utc.day:02d} {_MONTHS[utc.month - 1]} {utc.year:04d} "
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


#: The largest ``DocumentIncarnation`` accepted (a signed 64-bit integer); a larger one is malformed.
MAX_INCARNATION = 2**63 - 1


class Document(BaseModel):
    """The whole Scheduled Events document."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    # Bounded like the 64-bit counter it is: a number of thousands of digits is not an incarnation (and
    # could not even be exported as a metric).
    document_incarnation: StrictInt = Field(alias="DocumentIncarnation", ge=0, le=MAX_INCARNATION)
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
    if isinstance(raw, bytes):
        # JSON on the wire is UTF-8 (RFC 8259). A body in another encoding, or with invalid bytes, is
        # refused rather than read with replacement characters: a mangled name in ``Resources`` would
        # otherwise read as an event that no longer names this VM.
        try:
            content: object = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedDocument(
                f"not UTF-8: {exc.reason} at byte {exc.start}", content=raw[:2000].decode("utf-8", "replace")
            ) from None
    else:
        content = raw
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
