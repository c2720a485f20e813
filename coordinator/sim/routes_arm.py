"""The simulated Azure Resource Manager's port: every request handed to ``AzureModel.arm``, but the Resource
Graph query (``/providers/Microsoft.ResourceGraph/resources``), handed to ``ResourceGraph.query``."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit

from coordinator.sim.azure import ArmAnswer
from coordinator.sim.graph import GRAPH_PATH
from coordinator.sim.routes_common import _Handler

__all__ = ["_ArmHandler"]

# Every part of the simulator's HTTP front logs under the server's name.
log = logging.getLogger("coordinator.sim.server")


class _ArmHandler(_Handler):
    """Azure Resource Manager, as far as ``coordinator.sim.azure.AzureModel`` models it."""

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
        log.debug("arm %s %s -> %s", method, split.path, "dropped" if answer.drop else answer.status)
        self._send_answer(answer)
