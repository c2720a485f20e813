"""Faults served on a VM's Scheduled Events endpoint instead of, or before, the normal answer.

Kinds: ``status`` (answer ``status``, 400-599), ``malformed`` (200 with a body that is not JSON),
``delay`` (wait ``seconds``, real time, then answer normally), ``drop`` (close the connection without
an answer), ``wrong_type`` (200 with the document's ``field`` of the wrong JSON type), ``body`` (these
exact bytes, ``repeat`` times, with ``status`` (default 200), ``content_type`` ("" for none), extra
``headers`` and a declared ``content_length``: one larger than the body cuts the answer short, the
connection being closed after it). ``refuse`` is not queued: it happens at once, the VM's port refusing
connections for ``seconds`` of real time.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from azuresim.log import Log
from azuresim.schema import FaultRequest

__all__ = ["Fault", "Faults", "RefuseHandler", "mutate_document"]

#: ``(vm, real_seconds)``: closes the VM's listening socket for that long. Called under the group's
#: lock: it must not block.
RefuseHandler = Callable[[str, float], None]


@dataclass(frozen=True)
class Fault:
    """A fault queued for one VM's Scheduled Events endpoint.

    ``remaining`` is None for a fault served until cleared.
    """

    kind: str
    vm: str
    remaining: int | None = 1
    status: int | None = None
    seconds: float | None = None
    methods: tuple[str, ...] = ("GET",)
    field: str | None = None
    body: bytes | None = None  # ``body`` faults: what is served (``repeat`` applied)
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    content_length: int | None = None

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {
            "kind": self.kind,
            "vm": self.vm,
            "remaining": self.remaining,
            "status": self.status,
            "seconds": self.seconds,
            "methods": list(self.methods),
            "field": self.field,
        }
        if self.body is not None:
            view.update(
                body_bytes=len(self.body), content_type=self.content_type, headers=dict(self.headers),
                content_length=self.content_length,
            )
        return view


class Faults:
    """The fault queue of each VM, served in the order queued. Not locked: callers hold the group's lock."""

    def __init__(self, vms: Iterable[str], log: Log) -> None:
        self._log = log
        self._queues: dict[str, list[Fault]] = {vm: [] for vm in vms}
        self.on_refuse: RefuseHandler | None = None

    def add(self, request: FaultRequest, targets: Sequence[str]) -> list[dict[str, Any]]:
        """Give each VM of ``targets`` its own copy of the fault; returns the views.

        A ``refuse`` fault is carried out at once through ``on_refuse`` and logged, never queued.
        """
        views = []
        served = request.served_body() * (request.repeat or 1) if request.kind == "body" else None
        for name in targets:
            fault = Fault(
                kind=request.kind,
                vm=name,
                remaining=request.count,
                status=request.status,
                seconds=request.seconds,
                methods=tuple(request.methods),
                field=request.field,
                body=served,
                content_type=request.content_type,
                headers=tuple((request.headers or {}).items()),
                content_length=request.content_length,
            )
            if fault.kind == "refuse":
                assert fault.seconds is not None
                self._log.record(
                    "fault", vm=name, method=None, path=None, fault="refuse", status=None,
                    seconds=fault.seconds, remaining=0,
                )
                if self.on_refuse is not None:
                    self.on_refuse(name, fault.seconds)
                views.append(replace(fault, remaining=0).view())
                continue
            self._queues[name].append(fault)
            views.append(fault.view())
        return views

    def views(self) -> list[dict[str, Any]]:
        return [f.view() for queue in self._queues.values() for f in queue]

    def clear(self, vms: Iterable[str]) -> int:
        """Drop the queued faults of ``vms``; returns how many were dropped."""
        dropped = 0
        for vm in vms:
            dropped += len(self._queues[vm])
            self._queues[vm].clear()
        return dropped

    def take(self, vm: str, method: str, path: str) -> Fault | None:
        """The first queued fault of ``vm`` for ``method``, if any; consumes one use and logs it."""
        queue = self._queues[vm]
        for index, fault in enumerate(queue):
            if method.upper() not in fault.methods:
                continue
            remaining = None if fault.remaining is None else fault.remaining - 1
            if remaining == 0:
                del queue[index]
            else:
                queue[index] = replace(fault, remaining=remaining)
            extra = {"field": fault.field} if fault.field is not None else {}
            self._log.record(
                "fault",
                vm=vm,
                method=method.upper(),
                path=path,
                fault=fault.kind,
                status=fault.status,
                seconds=fault.seconds,
                remaining=remaining,
                **extra,
            )
            return fault
        return None


def mutate_document(document: dict[str, Any], field: str) -> dict[str, Any]:
    """A copy of ``document`` with ``field`` of the wrong JSON type (for ``wrong_type`` faults).

    Event fields are changed in every event; a document without events is returned unchanged for
    them (the fault then serves a valid document).
    """
    served = copy.deepcopy(document)
    if field == "DocumentIncarnation":
        served["DocumentIncarnation"] = str(served.get("DocumentIncarnation"))
    elif field == "Events":
        served["Events"] = json.dumps(served.get("Events"))
    else:
        for number, event in enumerate(served.get("Events") or [], start=1):
            if not isinstance(event, dict):
                continue
            if field == "EventId":
                event["EventId"] = number
            elif field == "Resources":
                event["Resources"] = ",".join(str(r) for r in event.get("Resources") or [])
            elif field == "NotBefore":
                event["NotBefore"] = 1700000000
            elif field == "DurationInSeconds":
                event["DurationInSeconds"] = str(event.get("DurationInSeconds", -1))
    return served
