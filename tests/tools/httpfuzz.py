"""Fuzzing of the agent's HTTP surface: generated raw requests against both listeners on loopback.

Each input (random bytes, odd methods, paths with ``%00``, ``..``, unicode or thousands of characters,
no HTTP version, HTTP/0.9, the HTTP/2 preface, broken or oversized headers, bodies) is written on a
connection of its own, which is then half-closed so that an incomplete request ends at once rather than
at the server's deadline. After each one the fuzzer checks that both listeners still answer their health
requests and that the server logged no failure: an exception out of a handler is logged by
``coordinator.httpserver`` (the only WARNING it logs on loopback), so any record at WARNING or above is
a crash. ``tests/integration/test_http_hardening.py`` runs a few hundred inputs; ``scripts/fuzz_http.py``
runs as many as asked and prints the counts.
"""

from __future__ import annotations

import http.client
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeState
from coordinator.httpserver import HttpSurface

__all__ = ["FuzzReport", "raw_requests", "run"]

PROBE_PATH = "/health"
_READ_TIMEOUT = 3.0  # seconds to wait for an answer; the server's own deadline is 5 s

_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "PRI", "get",
            "G ET", "", "\x00", "GET\tGET"]
_PATHS = ["/livez", "/readyz", "/metrics", "/status", PROBE_PATH, "/", "*", "/%00", "/\x00", "/..", "/../../etc/passwd",
          "//livez", "/livez?x=%00&y=..", "/%2e%2e/%2e%2e", "/é☃\U0001f4a5", "http://127.0.0.1/livez", "/" + "a" * 5000,
          "/" + "%" * 3000, ""]
_VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/1.1.1", "HTTP/x", "HTTP/01.01", "http/1.1",
             "HTTP/" + "9" * 20, ""]
_HEADERS = [
    "Host: 127.0.0.1", "Connection: keep-alive", "Connection: close", "Content-Length: 0", "Content-Length: 5",
    "Content-Length: -1", "Content-Length: 1e9", "Content-Length: 99999999999999999999", "Transfer-Encoding: chunked",
    "Content-Length: \xb2", "Content-Length: \u0661",  # digits to str.isdigit(), not to int()
    "Expect: 100-continue", "X: " + "y" * 9000, "no colon at all", ": empty name", " folded continuation",
    "Host: é☃", "X-\x00: nul",
]
_SPECIALS = [
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # the HTTP/2 connection preface
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # the start of a TLS ClientHello
    b"GET /livez\r\n",  # HTTP/0.9
    b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",  # pipelined
    b"\r\n\r\n", b"\n", b"\x00" * 64, b"\xff" * 5000,
    b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n",
]


def _text() -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8"), max_size=40)


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(_METHODS) | _text())
    path = draw(st.sampled_from(_PATHS) | _text())
    version = draw(st.sampled_from(_VERSIONS) | _text())
    line = " ".join(part for part in (method, path, version) if part)
    headers = draw(st.lists(st.sampled_from(_HEADERS) | _text(), max_size=6))
    end = draw(st.sampled_from(["\r\n", "\n", "", "\r"]))
    body = draw(st.sampled_from(["", "hello", "0\r\n\r\n"]))
    text = "".join(part + end for part in (line, *headers)) + end + body
    return text.encode(draw(st.sampled_from(["utf-8", "latin-1", "utf-16"])), "replace")


def raw_requests() -> st.SearchStrategy[tuple[str, bytes]]:
    """(listener, bytes): "probe" or "admin", and what is written to it."""
    payload = st.one_of(_request(), st.binary(max_size=300), st.sampled_from(_SPECIALS))
    return st.tuples(st.sampled_from(["probe", "admin"]), payload)


@dataclass
class FuzzReport:
    inputs: int = 0
    crashes: int = 0  # inputs after which the server logged a failure or a listener thread died
    unanswered: int = 0  # inputs after which a health request went unanswered or answered wrongly
    failing: list[bytes] = field(default_factory=list)  # the first few inputs that did either

    def line(self) -> str:
        return (f"inputs tried: {self.inputs}, server crashes: {self.crashes}, "
                f"unanswered health checks: {self.unanswered}")


class _Failures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _surface() -> Iterator[tuple[HttpSurface, _Failures]]:
    failures = _Failures()
    logger = logging.getLogger("coordinator.httpserver")
    logger.addHandler(failures)
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path=PROBE_PATH, admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=True), registry=CollectorRegistry(), status=lambda: {"ok": 1})
    surface.start()
    try:
        yield surface, failures
    finally:
        surface.stop()
        logger.removeHandler(failures)


def _send(address: tuple[str, int], payload: bytes) -> None:
    """Write ``payload``, half-close, and read until the server closes or the timeout passes."""
    with socket.create_connection(address, timeout=_READ_TIMEOUT) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # refused or reset mid-way: what matters is what the server does next


def _answers(address: tuple[str, int], path: str) -> bool:
    connection = http.client.HTTPConnection(*address, timeout=_READ_TIMEOUT)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def run(inputs: int, *, random_seed: int | None = None) -> FuzzReport:
    """Send ``inputs`` generated requests (reproducible with ``random_seed``) and count what broke."""
    report = FuzzReport()
    with _surface() as (surface, failures):
        probe = surface.probe_address
        assert probe is not None  # the surface under test listens for the probe
        address = {"probe": probe, "admin": surface.admin_address}

        @settings(max_examples=inputs, phases=[Phase.generate], database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(raw_requests())
        def one(case: tuple[str, bytes]) -> None:
            which, payload = case
            report.inputs += 1
            logged = len(failures.records)
            _send(address[which], payload)
            healthy = _answers(surface.admin_address, "/livez") and _answers(probe, PROBE_PATH)
            crashed = len(failures.records) > logged or not surface.running
            report.crashes += crashed
            report.unanswered += not healthy
            if (crashed or not healthy) and len(report.failing) < 5:
                report.failing.append(payload)

        (seed(random_seed)(one) if random_seed is not None else one)()
    return report
