"""Faults of the Azure model: status answers queued on the token endpoint or on ARM, and
``concurrent_write`` (another writer changes a pool just before the next PUT)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.sim.azure.answers import ArmAnswer, _arm_error
from coordinator.sim.azure.records import _AzureState, _Fault
from coordinator.sim.errors import InvalidRequest

__all__ = ["_FaultsMixin"]


class _FaultsMixin(_AzureState):
    """Queue, take and answer faults; part of ``AzureModel``."""

    def add_fault(self, target: str, kind: str = "status", *, status: int | None = None,
                  retry_after: int | None = None, count: int | None = 1,
                  methods: Sequence[str] = ("GET", "PUT")) -> dict[str, Any]:
        if target not in ("token", "arm"):
            raise InvalidRequest("target must be token or arm")
        if kind not in ("status", "concurrent_write"):
            raise InvalidRequest("kind must be status or concurrent_write")
        if kind == "status" and (status is None or not 400 <= status <= 599):
            raise InvalidRequest("a status fault needs a status between 400 and 599")
        if kind == "concurrent_write" and target != "arm":
            raise InvalidRequest("concurrent_write applies to arm")
        if count is not None and count < 1:
            raise InvalidRequest("count must be >= 1 or null")
        if retry_after is not None and retry_after < 0:
            raise InvalidRequest("retry_after must be >= 0")
        # Another writer matters only to a write: a concurrent_write waits for the next PUT.
        verbs = ("PUT",) if kind == "concurrent_write" else tuple(m.upper() for m in methods)
        fault = _Fault(target, kind, status, retry_after, count, verbs)
        with self._lock:
            self._faults.append(fault)
        return self._fault_view(fault)

    def clear_faults(self) -> int:
        with self._lock:
            cleared = len(self._faults)
            self._faults.clear()
            return cleared

    def _take_fault(self, target: str, method: str) -> _Fault | None:
        for fault in self._faults:
            if fault.target == target and method in fault.methods:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _fault_answer(fault: _Fault, *, token: bool) -> ArmAnswer:
        assert fault.status is not None
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        if token:
            return ArmAnswer(fault.status, {"error": "simulated_fault",
                                            "error_description": f"Simulated fault {fault.status}"}, headers)
        code = "TooManyRequests" if fault.status == 429 else "InternalServerError" if fault.status >= 500 \
            else "SimulatedFault"
        return _arm_error(fault.status, code, f"Simulated fault {fault.status}", headers)

    @staticmethod
    def _fault_view(fault: _Fault) -> dict[str, Any]:
        return {"target": fault.target, "kind": fault.kind, "status": fault.status, "retry_after": fault.retry_after,
                "count": fault.remaining, "methods": list(fault.methods)}
