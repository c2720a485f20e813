"""Dates in the RFC 1123 form that HTTP and IMDS use (``Mon, 19 Sep 2016 18:29:47 GMT``)."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

__all__ = ["format_http_date"]


def format_http_date(moment: datetime | float) -> str:
    """``moment`` as RFC 1123 in GMT, e.g. ``Mon, 19 Sep 2016 18:29:47 GMT``.

    A number is epoch seconds; a naive datetime is taken as UTC. Fractions of a second are dropped.
    """
    if isinstance(moment, datetime):
        utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    else:
        utc = datetime.fromtimestamp(moment, UTC)
    return email.utils.format_datetime(utc, usegmt=True)
