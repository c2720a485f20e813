"""Faults of the Azure model, queued for the token endpoint or ARM and each used up by the next ``count``
requests it applies to:

* ``status``: a status answer (429 with ``Retry-After``, 500...), on the token endpoint, ARM or the Resource
  Graph query (target ``graph``: ``POST /providers/Microsoft.ResourceGraph/resources`` on ARM's port);
* ``unreachable``: the connection is closed without an answer, before the request does anything;
* ``concurrent_write``: another writer changes a pool just before the next PUT (whose ``If-Match`` fails);
* ``lost_answer``: the next PUT is applied, then no answer reaches the client (or only after ``seconds``);
* ``status_after_apply``: the next PUT is applied, then answered 500, 502, 503 or 504;
* ``slow_operation``: the operation of the next PUT takes ``seconds``;
* ``operation_end``: the operation of the next PUT ends ``Failed`` or ``Canceled``;
* ``stalled_write``: the next PUT reaches its pool only ``seconds`` later, and is handled then as if it had
  just arrived (its ``If-Match`` judged against the pool as it is then); its client gets no answer.

``lost_answer``, ``status_after_apply``, ``slow_operation`` and ``operation_end`` are used up only by a PUT
that is applied (one refused with 412, 409 or 429 leaves them); ``stalled_write`` by the next PUT that
passed authentication and throttling, before anything else is judged."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from azuresim.azure.answers import SERVER_ERRORS, ArmAnswer, arm_error
from azuresim.azure.records import ArmFault, AzureState
from azuresim.errors import InvalidRequest

__all__ = ["FAULT_KINDS", "OPERATION_ENDS", "FaultsMixin"]

FAULT_KINDS = ("status", "unreachable", "concurrent_write", "lost_answer", "status_after_apply", "slow_operation",
               "operation_end", "stalled_write")
#: How an ``operation_end`` fault ends an operation (Azure's terminal states besides Succeeded).
OPERATION_ENDS = ("Failed", "Canceled")
_TOKEN_KINDS = ("status", "unreachable")
_PUT_KINDS = ("concurrent_write", "lost_answer", "status_after_apply", "slow_operation", "operation_end",
              "stalled_write")
_WITH_SECONDS = ("slow_operation", "stalled_write")
_MAX_DELAY = 3600.0


class FaultsMixin(AzureState):
    """Queue, take and answer faults; part of ``AzureModel``."""

    def add_fault(self, target: str, kind: str = "status", *, status: int | None = None,
                  retry_after: int | None = None, count: int | None = 1, methods: Sequence[str] = ("GET", "PUT"),
                  seconds: float | None = None, delay_seconds: float | None = None,
                  end: str | None = None) -> dict[str, Any]:
        """Queue a fault (see the module's docstring) for the next ``count`` requests (None: every one) of
        ``methods`` (a PUT-only kind takes PUTs whatever ``methods`` says)."""
        _check_fault(target, kind, status, retry_after, count, seconds, delay_seconds, end)
        # Another writer, a lost answer, a slow or failed operation matter only to a write: they wait for a PUT.
        verbs = ("PUT",) if kind in _PUT_KINDS else ("POST",) if target == "graph" else \
            tuple(m.upper() for m in methods)
        fault = ArmFault(target, kind, status, retry_after, count, verbs,
                       seconds if kind in _WITH_SECONDS else delay_seconds, end)
        with self._lock:
            self._faults.append(fault)
        return self._fault_view(fault)

    def faults(self) -> list[dict[str, Any]]:
        """The faults queued, in the order they will be used."""
        with self._lock:
            return [self._fault_view(f) for f in self._faults]

    def clear_faults(self) -> int:
        with self._lock:
            cleared = len(self._faults)
            self._faults.clear()
            return cleared

    def _take_fault(self, target: str, method: str, kinds: Sequence[str]) -> ArmFault | None:
        """The first queued fault of ``kinds`` for ``target`` and ``method``, one of its ``count`` used up."""
        for fault in self._faults:
            if fault.target == target and fault.kind in kinds and method in fault.methods:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _fault_answer(fault: ArmFault, *, token: bool) -> ArmAnswer:
        assert fault.status is not None
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        if token:
            return ArmAnswer(fault.status, {"error": "simulated_fault",
                                            "error_description": f"Simulated fault {fault.status}"}, headers)
        code = "TooManyRequests" if fault.status == 429 else SERVER_ERRORS.get(fault.status, "InternalServerError") \
            if fault.status >= 500 else "SimulatedFault"
        return arm_error(fault.status, code, f"Simulated fault {fault.status}", headers)

    @staticmethod
    def _fault_view(fault: ArmFault) -> dict[str, Any]:
        view: dict[str, Any] = {"target": fault.target, "kind": fault.kind, "status": fault.status,
                                "retry_after": fault.retry_after, "count": fault.remaining,
                                "methods": list(fault.methods)}
        if fault.kind in _WITH_SECONDS:
            view["seconds"] = fault.seconds
        elif fault.kind == "lost_answer":
            view["delay_seconds"] = fault.seconds
        elif fault.kind == "operation_end":
            view["end"] = fault.end
        return view


def _check_fault(target: str, kind: str, status: int | None, retry_after: int | None, count: int | None,
                 seconds: float | None, delay_seconds: float | None, end: str | None) -> None:
    """Raise ``InvalidRequest`` naming the field at fault if these do not make a fault."""
    if target not in ("token", "arm", "graph"):
        raise InvalidRequest("target must be token, arm or graph")
    if kind not in FAULT_KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(FAULT_KINDS)}")
    if target in ("token", "graph") and kind not in _TOKEN_KINDS:
        raise InvalidRequest(f"kind {kind} applies to arm; the {target} target takes {' or '.join(_TOKEN_KINDS)}")
    if kind == "status" and (status is None or not 400 <= status <= 599):
        raise InvalidRequest("status: a status fault needs a status between 400 and 599")
    if kind == "status_after_apply" and status not in SERVER_ERRORS:
        raise InvalidRequest(f"status: a status_after_apply fault needs a status among "
                             f"{', '.join(map(str, SERVER_ERRORS))}")
    with_status = ("status", "status_after_apply")
    if kind not in with_status and (status is not None or retry_after is not None):
        raise InvalidRequest(f"status and retry_after are only for status and status_after_apply faults, not {kind}")
    if count is not None and count < 1:
        raise InvalidRequest("count must be >= 1 or null")
    if retry_after is not None and retry_after < 0:
        raise InvalidRequest("retry_after must be >= 0")
    if kind == "slow_operation":
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            raise InvalidRequest("seconds: a slow_operation fault needs seconds, a finite number >= 0")
    elif kind == "stalled_write":
        if seconds is None or not 0 < seconds <= _MAX_DELAY:
            raise InvalidRequest(f"seconds: a stalled_write fault needs seconds, from 0 (excluded) to {_MAX_DELAY:g}")
    elif seconds is not None:
        raise InvalidRequest(f"seconds is only for slow_operation and stalled_write faults, not {kind}")
    if delay_seconds is not None and (kind != "lost_answer" or not 0 < delay_seconds <= _MAX_DELAY):
        raise InvalidRequest(f"delay_seconds is only for lost_answer faults, from 0 (excluded) to {_MAX_DELAY:g}")
    if kind == "operation_end" and end not in OPERATION_ENDS:
        raise InvalidRequest(f"end: an operation_end fault needs end, one of {', '.join(OPERATION_ENDS)}")
    if kind != "operation_end" and end is not None:
        raise InvalidRequest(f"end is only for operation_end faults, not {kind}")
