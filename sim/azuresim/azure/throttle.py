"""ARM's request throttling, as Microsoft's "Request limits and throttling" documents its token-bucket
algorithm: per subscription, one bucket of reads (GET, HEAD) and one of writes (every other method), each
holding ``capacity`` tokens and refilled at ``refill`` tokens a second. A request takes one token; one that
finds its bucket empty is answered 429 ``SubscriptionRequestsThrottled`` with ``Retry-After`` (the seconds
until a token is back) and does nothing. While throttling is on, every ARM answer says what is left in
``x-ms-ratelimit-remaining-subscription-reads`` (or ``-writes``; ``-tenant-`` for a request naming no
subscription). Off by default."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from azuresim.azure.answers import ArmAnswer, arm_error
from azuresim.azure.records import AzureState, Bucket, Limits
from azuresim.errors import InvalidRequest

__all__ = ["ThrottleMixin"]

_SUBSCRIPTION = re.compile(r"^/subscriptions/(?P<sub>[^/]+)", re.IGNORECASE)
_READS = ("GET", "HEAD")


class ThrottleMixin(AzureState):
    """Token buckets per subscription; part of ``AzureModel``."""

    def set_throttling(self, enabled: bool = True, *, read_capacity: int = 250, read_refill: float = 25.0,
                       write_capacity: int = 200, write_refill: float = 10.0) -> dict[str, Any]:
        """Turn throttling on with these buckets (every bucket full again), or off (``enabled=False``).
        The defaults are the documented ones: reads 250 refilled 25 a second, writes 200 refilled 10."""
        for name, value in (("read_capacity", read_capacity), ("write_capacity", write_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"{name} must be an integer >= 1")
        for name, rate in (("read_refill", read_refill), ("write_refill", write_refill)):
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
                raise InvalidRequest(f"{name} must be a finite number of tokens a second > 0")
        with self._lock:
            self._limits = Limits(read_capacity, float(read_refill), write_capacity, float(write_refill)) \
                if enabled else None
            self._buckets.clear()
            return self._throttling_view()

    def throttling(self) -> dict[str, Any]:
        """Whether throttling is on, its limits, and the tokens left in each bucket used so far."""
        with self._lock:
            return self._throttling_view()

    def _throttle(self, method: str, path: str, actor: str) -> ArmAnswer | None:
        """Take a token from the request's bucket (the lock is held); the 429 answer if there is none."""
        limits = self._limits
        if limits is None:
            return None
        bucket = self._bucket(limits, method, path)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        reading = method in _READS
        rate = limits.read_refill if reading else limits.write_refill
        wait = max(1, math.ceil((1 - bucket.tokens) / rate))
        scope, key = self._scope(path)
        code = "SubscriptionRequestsThrottled" if scope == "subscription" else "TenantRequestsThrottled"
        return arm_error(429, code,
                          f"Number of '{'read' if reading else 'write'}' requests for {scope} '{key}' actor "
                          f"'{actor}' exceeded. Please try again after '{wait}' seconds after additional tokens "
                          "are available. Refer to https://aka.ms/arm-throttling", {"Retry-After": str(wait)})

    def _with_ratelimit(self, answer: ArmAnswer, method: str, path: str) -> ArmAnswer:
        """``answer`` with the tokens left in its bucket (``x-ms-ratelimit-remaining-...``), if throttling is on."""
        limits = self._limits
        if limits is None or answer.drop:
            return answer
        bucket = self._bucket(limits, method, path)
        scope, _ = self._scope(path)
        name = f"x-ms-ratelimit-remaining-{scope}-{'reads' if method in _READS else 'writes'}"
        return dataclasses.replace(answer, headers={**answer.headers, name: str(math.floor(bucket.tokens))})

    def _bucket(self, limits: Limits, method: str, path: str) -> Bucket:
        """The request's bucket, refilled up to now."""
        reading = method in _READS
        capacity, rate = (limits.read_capacity, limits.read_refill) if reading else \
            (limits.write_capacity, limits.write_refill)
        now = self._clock()
        key = (self._scope(path)[1], "reads" if reading else "writes")
        bucket = self._buckets.setdefault(key, Bucket(float(capacity), now))
        bucket.tokens = min(float(capacity), bucket.tokens + max(0.0, now - bucket.at) * rate)
        bucket.at = now
        return bucket

    @staticmethod
    def _scope(path: str) -> tuple[str, str]:
        """``("subscription", its id)``, or ``("tenant", "")`` for a request that names no subscription."""
        match = _SUBSCRIPTION.match(path)
        return ("subscription", match["sub"].lower()) if match else ("tenant", "")

    def _throttling_view(self) -> dict[str, Any]:
        limits = self._limits
        if limits is None:
            return {"enabled": False}
        left: dict[str, dict[str, int]] = {}
        for (key, kind), bucket in self._buckets.items():
            capacity, rate = (limits.read_capacity, limits.read_refill) if kind == "reads" else \
                (limits.write_capacity, limits.write_refill)
            tokens = min(float(capacity), bucket.tokens + max(0.0, self._clock() - bucket.at) * rate)
            left.setdefault(key or "tenant", {})[kind] = math.floor(tokens)
        return {"enabled": True, **dataclasses.asdict(limits), "remaining": left}
