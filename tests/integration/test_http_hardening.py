"""The agent's HTTP surface against hostile clients, on real loopback sockets: only GET and HEAD, no
bodies, bounded request heads, a deadline per request, a bound on connections per listener and per
client (a slowloris does not starve the load balancer's probe), and generated garbage (hypothesis)
never crashes a listener."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coordinator.actions.probe import ProbeState
from coordinator.httpserver import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    ConnectionLimits,
    HttpSurface,
    admin_exposure_warning,
)
from coordinator.metrics import Metrics
from coordinator.testbed.waiting import wait_until
from tests.tools import httpfuzz

FUZZ_EXAMPLES = int(os.environ.get("HTTP_FUZZ_EXAMPLES", "300"))  # about 10 s; scripts/fuzz_http.py for more
FUZZ_SEED = os.environ.get("HTTP_FUZZ_SEED")


def surface_with(limits: ConnectionLimits | None = None,
                 status: Callable[[], dict[str, Any]] = dict) -> HttpSurface:
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(serving=True), registry=CollectorRegistry(), status=status,
                          limits=limits or ConnectionLimits())
    surface.start()
    return surface


@pytest.fixture
def surface() -> Iterator[HttpSurface]:
    surface = surface_with()
    try:
        yield surface
    finally:
        surface.stop()


def exchange(address: tuple[str, int], raw: bytes, *, timeout: float = 5.0) -> bytes:
    """Write ``raw`` (without half-closing: the server must answer on what it has) and read to EOF."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def probe_answers(surface: HttpSurface, *, source: str = "127.0.0.1", timeout: float = 2.0) -> int:
    connection = http.client.HTTPConnection(*surface.probe_address, timeout=timeout, source_address=(source, 0))
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    finally:
        connection.close()


def stalled(address: tuple[str, int], source: str) -> socket.socket:
    """A connection from ``source`` (any 127/8 address reaches 127.0.0.1) that sends half a request."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(address)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    return sock


REFUSED = [
    (b"POST /health HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
    (b"PUT /status HTTP/1.1\r\n\r\n", 405),
    (b"DELETE /status HTTP/1.1\r\n\r\n", 405),
    (b"OPTIONS * HTTP/1.1\r\n\r\n", 405),
    (b"TRACE /health HTTP/1.1\r\n\r\n", 405),
    (b"GET /health HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 413),  # the body never comes, nor is awaited
    (b"GET /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413),
    (b"GET /health HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 7\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400),  # a digit to str.isdigit()
    (b"GET /" + b"a" * MAX_REQUEST_LINE + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /" + b"a" * MAX_REQUEST_LINE, 414),  # refused before its end arrives
    (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n", 431),
    (b"GET /health HTTP/1.1\r\nX: " + b"y" * MAX_HEADER_BYTES + b"\r\n\r\n", 431),
    (b"GET /health HTTP/1.1\r\nX: " + b"y" * MAX_HEADER_BYTES, 431),  # refused before its end arrives
    (b"GET /health\r\n", 400),  # HTTP/0.9
    (b"GET\r\n\r\n", 400),
    (b"\xff\xfe\x00\x80garbage \xc3\x28 x\r\n\r\n", 400),
    (b"GET /health HTTP/1.1.1\r\n\r\n", 400),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
]


@pytest.mark.parametrize(("raw", "status"), REFUSED, ids=[f"{s}-{r[:24]!r}" for r, s in REFUSED])
def test_anything_but_a_small_bodiless_get_or_head_is_refused_and_closed(
    surface: HttpSurface, raw: bytes, status: int, caplog: pytest.LogCaptureFixture,
) -> None:
    for address in (surface.probe_address, surface.admin_address):
        answer = exchange(address, raw)  # reads to EOF: the server closed the connection
        assert status_of(answer) == status, answer[:200]
        head = answer.split(b"\r\n\r\n", 1)[0]
        assert b"\r\nConnection: close" in head
        assert b"Python" not in head
        if status == 405:
            assert b"\r\nAllow: GET, HEAD\r\n" in head
        assert probe_answers(surface) == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_head_answers_like_get_without_the_body(surface: HttpSurface) -> None:
    get = exchange(surface.admin_address, b"GET /livez HTTP/1.1\r\nConnection: close\r\n\r\n")
    head = exchange(surface.admin_address, b"HEAD /livez HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert get.startswith(b"HTTP/1.1 200") and get.endswith(b"\r\n\r\nok: no agent to ask\n")
    assert head == get.removesuffix(b"ok: no agent to ask\n").replace(  # same head, but for the date
        get.split(b"Date: ", 1)[1].split(b"\r\n", 1)[0], head.split(b"Date: ", 1)[1].split(b"\r\n", 1)[0])


def test_odd_paths_are_not_found_and_a_query_is_ignored(surface: HttpSurface) -> None:
    for path in (b"/%00", b"/../../etc/passwd", b"/health/..", b"/\xc3\xa9\xe2\x98\x83", b"*"):
        answer = exchange(surface.probe_address, b"GET " + path + b" HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert status_of(answer) == 404, path
    answer = exchange(surface.probe_address, b"GET /health?x=%00 HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 200


def test_pipelined_keep_alive_requests_are_answered_in_order(surface: HttpSurface) -> None:
    answer = exchange(surface.admin_address, b"GET /livez HTTP/1.1\r\n\r\nGET /readyz HTTP/1.1\r\n"
                      b"Connection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 ") == 2
    assert answer.index(b"200 OK") < answer.index(b"503 Service Unavailable")


def test_a_handler_that_fails_answers_500_and_the_listener_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def status() -> dict[str, Any]:
        raise RuntimeError("a bug")

    surface = surface_with(status=status)
    try:
        answer = exchange(surface.admin_address, b"GET /status HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert status_of(answer) == 500 and b"a bug" not in answer
        assert probe_answers(surface) == 200
    finally:
        surface.stop()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "HTTP handler failed for '/status'"]


def test_a_stalled_request_and_an_idle_keep_alive_are_closed_at_the_deadline() -> None:
    surface = surface_with(ConnectionLimits(timeout=0.5))
    try:
        started = time.monotonic()
        assert exchange(surface.admin_address, b"GET /livez HTTP/1.1\r\nHost: x\r\n") == b""  # closed, no answer
        assert 0.4 < time.monotonic() - started < 3
        # Trickling a byte at a time does not stretch the deadline: it is for the whole head.
        with socket.create_connection(surface.probe_address, timeout=5) as sock:
            started = time.monotonic()
            with pytest.raises(OSError):
                for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"y" * 100:
                    sock.send(bytes([byte]))
                    time.sleep(0.05)
            assert sock.recv(100) == b""
            assert time.monotonic() - started < 3
        # An idle keep-alive connection, after a first answer.
        with socket.create_connection(surface.probe_address, timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            started = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert status_of(answer) == 200 and 0.4 < time.monotonic() - started < 3
        assert surface.requests_timed_out == 3
    finally:
        surface.stop()


def test_a_slowloris_from_one_client_does_not_starve_the_probe(caplog: pytest.LogCaptureFixture) -> None:
    surface = surface_with(ConnectionLimits(connections=64, connections_per_client=16, timeout=30))
    attack: list[socket.socket] = []
    try:
        for _ in range(100):
            attack.append(stalled(surface.probe_address, "127.0.0.2"))
        assert wait_until(lambda: surface.connections_refused == 100 - 16, 10)
        # The load balancer (another address) is answered at once, over and over.
        for _ in range(20):
            started = time.monotonic()
            assert probe_answers(surface) == 200
            assert time.monotonic() - started < 1
        # The refused ones were told so, and closed.
        assert attack[-1].recv(200).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        # ...and the operator sees it in the metrics, as the agent wires them.
        metrics = Metrics(CollectorRegistry())
        metrics.http_closed.source = lambda: {"refused": surface.connections_refused}
        scraped = generate_latest(metrics.registry).decode()
        assert 'coordinator_http_connections_closed_total{reason="refused"} 84.0' in scraped
        assert 'coordinator_http_connections_closed_total{reason="timed_out"} 0.0' in scraped
    finally:
        for sock in attack:
            sock.close()
        surface.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_beyond_the_listener_bound_connections_are_turned_away_until_stalled_ones_expire() -> None:
    surface = surface_with(ConnectionLimits(connections=8, connections_per_client=4, timeout=1.0))
    attack: list[socket.socket] = []
    try:
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            attack += [stalled(surface.probe_address, source) for _ in range(4)]
        assert wait_until(lambda: surface.connections_refused == 4, 10)  # the third source's four
        with socket.create_connection(surface.probe_address, timeout=5) as sock:  # sends nothing: no reset
            assert sock.recv(200).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        # The stalled ones miss their deadline and are closed: the probe is answered again.
        assert wait_until(lambda: surface.requests_timed_out == 8, 10)
        assert probe_answers(surface) == 200
    finally:
        for sock in attack:
            sock.close()
        surface.stop()


def test_the_admin_listener_warns_when_it_is_reachable_beyond_loopback(caplog: pytest.LogCaptureFixture) -> None:
    for host in ("0.0.0.0", "::", "10.1.0.4", "fd00::4", "admin.example"):
        warning = admin_exposure_warning(host)
        assert warning is not None and "/status and /metrics are readable from the network" in warning
    for host in ("127.0.0.1", "127.0.0.53", "::1"):
        assert admin_exposure_warning(host) is None
    with caplog.at_level(logging.WARNING, logger="coordinator.httpserver"):
        surface_with().stop()  # on loopback: no warning
    assert not caplog.records


def test_generated_raw_requests_never_crash_either_listener(record_property: Callable[[str, object], None]) -> None:
    report = httpfuzz.run(FUZZ_EXAMPLES, random_seed=int(FUZZ_SEED) if FUZZ_SEED else None)
    record_property("http_fuzz", report.line())
    print(report.line())
    assert report.inputs == FUZZ_EXAMPLES
    assert (report.crashes, report.unanswered) == (0, 0), report.failing
