"""What an operator meets running status, pause and resume against the wrong thing or against nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coordinator.cli import main


class _NotAnAgent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answers = {"/html/status": (200, "text/html", b"<html>hello</html>"),
                   "/json/status": (200, "application/json", b'{"ok": true}'),
                   "/list/status": (200, "application/json", b"[1, 2]")}
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
