"""What an operator meets running status, pause and resume against the wrong thing or against nothing, and
what one agent's view (``status --url``) shows of its trouble."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from coordinator.cli import main


def _agent_status(**trouble: Any) -> bytes:
    """An agent's /status (``coordinator.telemetry.status_dict`` and the agent's additions), with ``trouble``."""
    status: dict[str, Any] = {
        "vm": "vm1", "phase": "drained", "cycles": 12, "last_cycle": "nothing to do", "approved_by_me": [],
        "drained_for": ["E1"], "stays_out": "", "duplicate": None, "action_error": None, "action_fallback": None,
        "imds": {"fresh": False, "incarnation": 4, "reading_age_seconds": 31.5, "last_error": None},
        "cluster": {"connection": "connected", "leader": "vm0", "i_am_leader": False, "members": ["vm0", "vm1"],
                    "paused": None},
        "events": [],
    }
    imds_error = trouble.pop("imds_error", None)
    status.update(trouble)
    status["imds"]["last_error"] = imds_error
    return json.dumps(status).encode()


class _NotAnAgent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answers = {"/html/status": (200, "text/html", b"<html>hello</html>"),
                   "/json/status": (200, "application/json", b'{"ok": true}'),
                   "/list/status": (200, "application/json", b"[1, 2]"),
                   "/calm/status": (200, "application/json", _agent_status()),
                   "/troubled/status": (200, "application/json", _agent_status(
                       action_error="recover failed: azure-lb: backend address vm1 may still be Down",
                       action_fallback="azure-lb drain fell back to the health probe alone: cannot set backend "
                                       "address vm1 Down through ARM (403 AuthorizationFailed)",
                       stays_out="its acknowledgement may still stand in ZooKeeper",
                       imds_error="IMDS unavailable: connection refused")),
                   "/outage/status": (200, "application/json", _agent_status(
                       cluster=None, cluster_unavailable={"for_seconds": 42.0, "why": "store connection suspended"},
                       events=[{"event_id": "E1", "type": "Reboot", "status": "Scheduled", "resources": ["vm1"],
                                "approver": None, "acks": None, "approved_by": None, "waiting_for": []}]))}
        code, kind, body = answers.get(self.path, (404, "text/plain", b"not found"))
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def not_an_agent() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAnAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/html", "/json", "/list", "/missing"])
def test_status_url_at_something_that_is_not_an_agent_is_one_line(
        not_an_agent: str, path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--url", not_an_agent + path]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"{not_an_agent}{path}/status" in err and "Traceback" not in err


def test_status_url_shows_what_the_operations_guide_says_to_read_when_it_is_set(
        not_an_agent: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--url", not_an_agent + "/troubled"]) == 0
    out = capsys.readouterr().out
    assert "action_error: recover failed: azure-lb: backend address vm1 may still be Down" in out
    assert ("action_fallback: azure-lb drain fell back to the health probe alone: cannot set backend address vm1 "
            "Down through ARM (403 AuthorizationFailed)") in out
    assert "stays_out: its acknowledgement may still stand in ZooKeeper" in out
    assert "imds.last_error: IMDS unavailable: connection refused" in out
    assert "last reading 31.5 s ago" in out

    assert main(["status", "--url", not_an_agent + "/calm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vm vm1: drained") and "zookeeper: connected" in out
    assert not any(name in out for name in ("action_error", "action_fallback", "stays_out", "last_error"))


def test_status_url_during_a_zookeeper_outage_says_why_and_prints_no_placeholder(
        not_an_agent: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--url", not_an_agent + "/outage"]) == 0
    out = capsys.readouterr().out
    assert ("zookeeper: cluster view unavailable for 42.0 s: store connection suspended (nothing is approved until "
            "it is back)") in out
    assert "approver unknown without the cluster view  acks not read here  not approved" in out
    assert "None" not in out and " -" not in out
