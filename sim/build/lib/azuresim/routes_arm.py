"""The simulated Azure Resource Manager's port: every request handed to ``AzureModel.arm``, but the Resource
Graph query (``/providers/Microsoft.ResourceGraph/resources``), handed to ``ResourceGraph.query``."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit

from azuresim.azure import ArmAnswer
from azuresim.graph import GRAPH_PATH
from azuresim.routes_common import Handler

__all__ = ["ArmHandler"]

# Every part of the simulator's HTTP front logs under the server's name.
log = logging.getLogger("azuresim.server")


class ArmHandler(Handler):
    """Azure Resource Manager, as far as ``azuresim.azure.AzureModel`` models it."""

    def version_string(self) -> str:
        return "ARM-simulator"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        azure = self.server.owner.azure
        assert azure is not None
        split = urlsplit(self.path)
        body = self._read_body()
        if body is None:
            self._send_json(413, {"error": {"code": "RequestEntityTooLarge", "message": "The body is too large."}})
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        graph = self.server.owner.graph
        try:
            if graph is not None and split.path.rstrip("/").lower() == GRAPH_PATH.lower():
                answer = graph.query(method, dict(parse_qsl(split.query, keep_blank_values=True)), headers, body)
            else:
                answer = azure.arm(method, split.path, dict(parse_qsl(split.query, keep_blank_values=True)), headers,
                                   body, self.server.owner.arm_url)
        except Exception:
            log.exception("bug in the ARM simulator for %s %s", method, self.path)
            answer = ArmAnswer(500, {"error": {"code": "InternalServerError", "message": "simulator bug"}})
        if answer.acknowledge:
            answer = self._acknowledged(answer)
        log.debug("arm %s %s -> %s", method, split.path, "dropped" if answer.drop else answer.status)
        self._send_answer(answer)

    def _acknowledged(self, answer: ArmAnswer) -> ArmAnswer:
        """The Maintenance API's acknowledgement carried out in the group, outside the model's lock (the group
        asks the model for policies under its own): the same approval as one through IMDS, logged as
        approved by ``maintenance-api``. An id no current event has: 404 for the one-event form, and for the
        list form 400 naming each (the simulator's error codes: the specification gives none)."""
        results = self.server.owner.group.approve_from_outside(answer.acknowledge)
        unknown = [event_id for event_id in answer.acknowledge if results.get(event_id) == "unknown"]
        if not unknown:
            return answer
        if answer.single:
            return ArmAnswer(404, {"error": {"code": "ScheduledEventNotFound",
                                             "message": f"The scheduled event '{unknown[0]}' was not found."}})
        return ArmAnswer(400, {"error": {"code": "ScheduledEventsNotFound", "message": "Some scheduled events were "
                                         "not found.", "details": [{"code": "ScheduledEventNotFound", "target": e,
                                                                    "message": f"The scheduled event '{e}' was not "
                                                                    "found."} for e in unknown]}})
