"""Dates in the RFC 1123 form that HTTP and IMDS use (``Mon, 19 Sep 2016 18:29:47 GMT``), through ``email.utils``."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

__all__ = ["format_http_date", "parse_http_date"]


def format_http_date(moment: datetime | float) -> str:
    """``moment`` as RFC 1123 in GMT, e.g. ``Mon, 19 Sep 2016 18:29:47 GMT``.

    A number is epoch seconds; a naive datetime is taken as UTC. Fractions of a second are dropped.
    """
    if isinstance(moment, datetime):
        utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    else:
        utc = datetime.fromtimestamp(moment, UTC)
    return email.utils.format_datetime(utc, usegmt=True)


def parse_http_date(text: str) -> datetime:
    """Parse an RFC 1123 date (or the other RFC 2822 forms ``email.utils`` reads) into an aware UTC datetime.

    The weekday is not checked against the date: public examples of IMDS documents carry weekdays that
    do not match. A date without a zone, or with ``-0000``, is taken as UTC. Raises ``ValueError``.
    """
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"not an RFC 1123 date: {text[:60]!r}") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
