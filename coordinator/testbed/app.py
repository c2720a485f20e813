"""A stand-in for the service running on each VM: answers every request with its VM's name.

``python -m coordinator.testbed.app --name vm0 --port 18200``. It is its own process so that the
simulator can really pause it (SIGSTOP) during a Freeze, as Azure pauses the whole VM.
"""

from __future__ import annotations

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler
from typing import Any

from coordinator.support.quiethttp import QuietThreadingHTTPServer

__all__ = ["main"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A trivial HTTP service named after its VM.")
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    body = args.name.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("X-Served-By", args.name)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: Any) -> None:
            return

    server = QuietThreadingHTTPServer((args.host, args.port), Handler)  # a client hanging up is no traceback
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
