"""One VM's IMDS port: Scheduled Events (GET and the approval POST), instance metadata and the
managed-identity token endpoint, under IMDS's request rules and the VM's queued faults (see
``azuresim.server`` for the rules and their order)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

from azuresim.catalogue import INSTANCE_API_VERSIONS, SCHEDULED_EVENTS_API_VERSIONS
from azuresim.faults import Fault, mutate_document
from azuresim.routes_common import Handler

__all__ = ["VmHandler"]

_SCHEDULED_EVENTS = "/metadata/scheduledevents"
_COMPUTE = "/metadata/instance/compute"
_INSTANCE = "/metadata/instance"
_TOKEN = "/metadata/identity/oauth2/token"
_HEADER_ERROR = "Bad request. Required metadata header not specified"


class VmHandler(Handler):
    """One VM's IMDS. Every request is logged as a ``request`` entry after it is answered."""

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header of every answer: the real clock, off by the server's ``date_skew`` (a VM whose
        # own clock drifted sees IMDS's Date that far from it).
        if timestamp is None:
            timestamp = time.time() + self.server.owner.date_skew
        return super().date_time_string(timestamp)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def __getattr__(self, name: str) -> Callable[[], None]:
        # Any other method (PUT, DELETE, PATCH, HEAD, OPTIONS, made-up ones) gets the same
        # treatment as GET/POST so that it is checked and answered 405, not 501.
        if name.startswith("do_") and name[3:].isalpha():
            method = name[3:]
            return lambda: self._handle(method)
        raise AttributeError(name)

    def _handle(self, method: str) -> None:
        owner = self.server.owner
        group = owner.group
        vm = self.server.vm
        assert vm is not None
        split = urlsplit(self.path)
        status: int | None = None
        try:
            status = self._dispatch(method, split.path, split.query)
        finally:
            group.record("request", vm=vm, method=method, path=split.path, query=split.query, status=status)

    def _dispatch(self, method: str, path: str, query: str) -> int | None:
        owner = self.server.owner
        group = owner.group
        vm = self.server.vm
        assert vm is not None
        body = self._read_body()
        if body is None:
            return self._send_json(400, {"error": "Bad request. Request body too large"})
        if not owner.limiter(vm).admit():
            return self._send_json(429, {"error": "Too many requests"})
        if "X-Forwarded-For" in self.headers:
            return self._send_json(
                400, {"error": "Bad request. Requests with X-Forwarded-For header are not allowed"}
            )
        if path == _TOKEN and owner.azure is not None:
            metadata = (self.headers.get("Metadata") or "").strip().lower() == "true"
            token_query = dict(parse_qsl(query, keep_blank_values=True))
            return self._send_answer(owner.azure.token(vm, method, token_query, metadata))
        if (self.headers.get("Metadata") or "").strip().lower() != "true":
            return self._send_json(400, {"error": _HEADER_ERROR})
        versions: tuple[str, ...]
        allowed: tuple[str, ...]
        if path == _SCHEDULED_EVENTS:
            versions, allowed = SCHEDULED_EVENTS_API_VERSIONS, ("GET", "POST")
        elif path in (_COMPUTE, _INSTANCE):
            versions, allowed = INSTANCE_API_VERSIONS, ("GET",)
        else:
            return self._send_json(404, {"error": "Not found"})
        if method not in allowed:
            return self._send_json(405, {"error": "Method not allowed"}, extra={"Allow": ", ".join(allowed)})
        params = parse_qsl(query, keep_blank_values=True)
        seen: set[str] = set()
        for key, _ in params:
            if key.lower() in seen:
                return self._send_json(400, {"error": f"Bad request. Duplicate query parameter {key!r}"})
            seen.add(key.lower())
        api_version = next((v for k, v in params if k.lower() == "api-version"), None)
        if api_version is None or api_version not in versions:
            what = "was not specified" if api_version is None else "is invalid"
            return self._send_json(
                400,
                {
                    "error": f"Bad request. api-version {what} in the request. "
                    "For more information refer to aka.ms/azureimds",
                    "newest-versions": list(reversed(versions[-3:])),
                },
            )
        if path == _COMPUTE:
            return self._send_json(200, group.compute(vm))
        if path == _INSTANCE:
            return self._send_json(200, {"compute": group.compute(vm)})

        hold = group.begin_request(vm)
        if hold > 0 and owner.stopping.wait(group.real_seconds(hold)):
            self.close_connection = True
            return None
        fault = group.take_fault(vm, method, path)
        if fault is not None:
            if fault.kind == "status":
                assert fault.status is not None
                return self._send_json(fault.status, {"error": f"Simulated fault {fault.status}"})
            if fault.kind == "malformed":
                return self._send(200, b'{"DocumentIncarnation": 7, "Events": [{"EventId": ')
            if fault.kind == "wrong_type" and method == "GET":
                assert fault.field is not None
                return self._send_json(200, mutate_document(group.document(vm, api_version), fault.field))
            if fault.kind == "body":
                return self._send_served(fault)
            if fault.kind == "drop":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if fault.kind == "delay" and fault.seconds and owner.stopping.wait(fault.seconds):
                self.close_connection = True
                return None
        if method == "GET":
            return self._send_json(200, group.document(vm, api_version))
        return self._approve(vm, body)

    def _send_served(self, fault: Fault) -> int:
        """Answer with a ``body`` fault's exact bytes and headers; a declared length larger than the body
        cuts the answer short (the connection is closed after it)."""
        body = fault.body or b""
        status = fault.status or 200
        declared = len(body) if fault.content_length is None else fault.content_length
        self.send_response(status)
        content_type = "application/json; charset=utf-8" if fault.content_type is None else fault.content_type
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(declared))
        for name, value in fault.headers:
            self.send_header(name, value)
        if declared != len(body):
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body[:declared])
        return status

    def _approve(self, vm: str, body: bytes) -> int:
        group = self.server.owner.group
        ids, problem = _parse_start_requests(body)
        if problem is not None:
            group.reject_approval(vm, problem)
            return self._send_json(400, {"error": f"Bad request. {problem}"})
        results = group.approve(vm, ids)
        status = group.approval_status(results)
        if status == 200:
            return self._send(200)
        unknown = [i for i, r in results.items() if r == "unknown"]
        return self._send_json(status, {"error": f"Unknown EventId: {', '.join(unknown)}"})


def _parse_start_requests(body: bytes) -> tuple[list[str], str | None]:
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return [], "the body is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("StartRequests"), list):
        return [], "the body has no StartRequests list"
    incarnation = data.get("DocumentIncarnation")
    if incarnation is not None and (isinstance(incarnation, bool) or not isinstance(incarnation, int)):
        return [], "DocumentIncarnation must be an integer"
    ids = []
    for item in data["StartRequests"]:
        if not isinstance(item, dict) or not isinstance(item.get("EventId"), str) or not item["EventId"]:
            return [], "every StartRequests entry needs an EventId string"
        ids.append(item["EventId"])
    return ids, None
