"""What one IMDS attempt came to: its outcome (``OUTCOMES``, from the HTTP status), whether it is retried,
the ``Retry-After`` it asks for, and the record of an operation's cool-down after a 4xx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import httpx

__all__ = ["OUTCOMES", "RETRYABLE", "Cooldown", "outcome_for_status", "retry_after_of"]

#: Every value ``on_request`` can receive as its outcome (pre-declare metric label values with it).
OUTCOMES: Final[tuple[str, ...]] = (
    "ok",
    "bad_request",
    "not_found",
    "gone",
    "rate_limited",
    "server_error",
    "timeout",
    "connection_error",
    "malformed",
    "other",
)

RETRYABLE: Final = frozenset({"gone", "rate_limited", "server_error", "timeout", "connection_error"})


@dataclass
class Cooldown:
    """One operation's cool-down after a 4xx: calls are refused until ``until``; ``delay`` is its length
    (the next 4xx doubles it); ``status`` and ``body`` are the answer that armed it."""

    until: float
    delay: float
    status: int
    body: str


def outcome_for_status(status: int) -> str:
    if status == 200:
        return "ok"
    if status == 400:
        return "bad_request"
    if status == 404:
        return "not_found"
    if status == 410:
        return "gone"
    if status == 429:
        return "rate_limited"
    if 500 <= status < 600:
        return "server_error"
    return "other"


def retry_after_of(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds, or None if absent or in HTTP-date form (no wall clock here)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds
