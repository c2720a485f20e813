"""An HTTP server that takes a client going away quietly.

``socketserver`` prints a full traceback on stderr for any exception out of a handler, including a
client that hung up mid-request (an agent stopping while it polls, a probe closing its connection). That
is the client's business, not the simulator's: it is logged at debug level; anything else is one warning
line, never a raw traceback.
"""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

__all__ = ["HUNG_UP", "QuietThreadingHTTPServer"]

log = logging.getLogger(__name__)

#: What a client going away looks like to the server.
HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, HUNG_UP):
            log.debug("client %s went away: %r", client_address, exc)
            return
        log.warning("HTTP request from %s failed: %r", client_address, exc)
