"""The four-letter-word client of a ZooKeeper server (``ruok``, ``srvr``, ``cons``...) and the parsing of
``cons``: each client connection's requests as the server counts them.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from dataclasses import dataclass

__all__ = [
    "ConnectionStats",
    "connection_stats",
    "four_letter_word",
    "parse_cons",
]


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0,
                     context: ssl.SSLContext | None = None) -> str:
    """Send a four-letter word (``ruok``, ``srvr``, ...) and return the answer, over TLS with
    ``context``. Raises ``OSError``."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
        if context is not None:
            sock = stack.enter_context(context.wrap_socket(sock, server_hostname=host))
        sock.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ConnectionStats:
    """One client connection as ``cons`` shows it. ``lcxid`` is the xid of the last request the server
    answered on it: clients number their requests 1, 2, 3... on each connection, and pings (xid -2) and
    other special packets do not count, so its growth over an interval is how many requests (reads and
    writes) the client sent, by the server's own count. ``recved`` and ``sent`` count packets, pings
    included; ``lop`` is the last operation (``PING``, ``GETD``, ``EXIS``, ``GETC``, ``CREA``...)."""

    session_id: int
    recved: int
    sent: int
    lcxid: int
    lop: str


# "/127.0.0.1:41234[1](queued=0,recved=12,sent=12,sid=0x1000...,lop=GETD,est=...,to=4000,lcxid=0x5,...)"
_CONS_LINE = re.compile(r"^\s*/\S+\[\d+\]\((?P<fields>[^)]*)\)\s*$")


def parse_cons(text: str) -> dict[int, ConnectionStats]:
    """The connections of a ``cons`` answer that have a session, by session id. Lines of connections
    without one yet (the connection asking, a client still handshaking) are left out."""
    stats: dict[int, ConnectionStats] = {}
    for line in text.splitlines():
        match = _CONS_LINE.match(line)
        if match is None:
            continue
        fields = dict(item.split("=", 1) for item in match["fields"].split(",") if "=" in item)
        if not {"sid", "recved", "sent", "lcxid", "lop"} <= fields.keys():
            continue
        session_id = int(fields["sid"], 16)
        stats[session_id] = ConnectionStats(
            session_id=session_id,
            recved=int(fields["recved"]),
            sent=int(fields["sent"]),
            lcxid=int(fields["lcxid"], 16),
            lop=fields["lop"],
        )
    return stats


def connection_stats(host: str, port: int, timeout: float = 2.0) -> dict[int, ConnectionStats]:
    """Ask a server for ``cons`` and parse its answer (``parse_cons``). Raises ``OSError``."""
    return parse_cons(four_letter_word(host, port, "cons", timeout=timeout))
