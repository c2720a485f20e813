"""Many HTTP health probes asked at once from one thread: non-blocking sockets, one selector, h11.

An approver of a group of 200 VMs asks its 199 peers' probes right before it approves, and the answers
count only for a few seconds from when they were asked. A pool of threads asks them in waves (64
threads: four waves, each as long as its slowest answer), and a thread per peer costs the agent memory
for as long as it leads or approves. Here every request is sent at once and every answer waits on one
selector, so a round takes as long as the slowest single answer, bounded by the timeout, whatever the
group's size. The HTTP is h11's (the sans-IO HTTP/1.1 parser that httpx itself uses, already loaded
with it): this module only moves bytes between it and the sockets.

A probe is ``GET`` with ``Connection: close`` on a new connection, as a load balancer asks: an answer on
a kept-alive connection could come from a server thread that outlived its listener. Only the status line
and the headers are read. Plain ``http://`` only (each agent advertises its probe so).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import h11
import httpx

__all__ = ["AskAll", "ProbeAnswer", "ask_all"]

_USER_AGENT = "coordinator-peer-probe"
_IN_PROGRESS = {0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, getattr(errno, "WSAEWOULDBLOCK", -1)}


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe's outcome: when its request was about to be sent (the caller's clock), and the status and
    headers (lower-case names) of the answer, or why there was none."""

    asked: float
    status: int | None = None
    headers: Mapping[str, str] | None = None
    error: str | None = None


class AskAll(Protocol):
    """The shape of ``ask_all``: a round's URLs by key, the timeout, the clock, and who hears each answer as
    it comes -> every key's answer."""

    def __call__(self, urls: Mapping[str, str], timeout: float, clock: Callable[[], float] = ...,
                 on_answer: Callable[[str, ProbeAnswer], None] | None = None) -> Mapping[str, ProbeAnswer]: ...


class _Probe:
    def __init__(self, url: str, asked: float, deadline: float) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme != "http" or not parsed.host:
            raise ValueError(f"not a plain http:// URL: {url!r}")
        port = parsed.port or 80
        family, kind, proto, _, address = socket.getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)[0]
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
        self.asked, self.deadline = asked, deadline
        self.sock = socket.socket(family, kind, proto)
        try:
            self.sock.setblocking(False)
            code = self.sock.connect_ex(address)
            if code not in _IN_PROGRESS:
                raise OSError(code, os.strerror(code))
        except OSError:
            self.sock.close()
            raise
        self.http = h11.Connection(our_role=h11.CLIENT)
        self.pending = self.http.send(h11.Request(
            method="GET", target=parsed.raw_path or b"/",
            headers=[("Host", f"{host}:{port}" if parsed.port else host), ("User-Agent", _USER_AGENT),
                     ("Connection", "close")],
        )) + (self.http.send(h11.EndOfMessage()) or b"")

    def write(self) -> bool:
        """Send what is left of the request; True once all of it is sent."""
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, os.strerror(code))  # the connection failed (refused, unreachable)
        sent = self.sock.send(self.pending)
        self.pending = self.pending[sent:]
        return not self.pending

    def read(self) -> ProbeAnswer | None:
        """Feed what arrived to h11: the answer once its headers are in, None while more is needed."""
        self.http.receive_data(self.sock.recv(16384))  # b"": the peer closed; h11 raises if that was early
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                return None
            if isinstance(event, h11.Response):
                headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
                return ProbeAnswer(self.asked, event.status_code, headers)
            # an InformationalResponse (1xx): the real answer follows


def ask_all(urls: Mapping[str, str], timeout: float, clock: Callable[[], float] = time.monotonic,
            on_answer: Callable[[str, ProbeAnswer], None] | None = None) -> dict[str, ProbeAnswer]:
    """Ask every URL of ``urls`` (key -> URL) at once and wait for each answer's headers at most
    ``timeout`` seconds from when it was asked; every key gets an answer or the reason it has none.
    ``clock`` stamps each answer with when it was asked (the caller's clock); the timeout is kept by
    ``time.monotonic``. ``on_answer`` (key, answer) is called as each one is known, on this thread: a peer
    that accepts the connection and never answers (a VM whose processes are stopped: the kernel still
    completes the handshake) holds back the return of the round, not the answers of the others."""
    answers: dict[str, ProbeAnswer] = {}

    def answered(key: str, answer: ProbeAnswer) -> None:
        answers[key] = answer
        if on_answer is not None:
            on_answer(key, answer)

    with selectors.DefaultSelector() as selector:
        for key, url in urls.items():
            asked = clock()
            try:
                probe = _Probe(url, asked, time.monotonic() + timeout)
            except (OSError, ValueError, h11.ProtocolError) as exc:
                answered(key, ProbeAnswer(asked, error=type(exc).__name__))
                continue
            selector.register(probe.sock, selectors.EVENT_WRITE, (key, probe))
        try:
            while selector.get_map():
                now = time.monotonic()
                for selected in list(selector.get_map().values()):
                    key, probe = selected.data
                    if now >= probe.deadline:
                        answered(key, ProbeAnswer(probe.asked, error=f"no answer within {timeout:g} s"))
                        selector.unregister(probe.sock)
                        probe.sock.close()
                if not selector.get_map():
                    break
                wait = min(s.data[1].deadline for s in selector.get_map().values()) - now
                for selected, ready in selector.select(max(wait, 0.0)):
                    key, probe = selected.data
                    try:
                        if ready & selectors.EVENT_WRITE:
                            if probe.write():
                                selector.modify(probe.sock, selectors.EVENT_READ, (key, probe))
                            continue
                        answer = probe.read()
                    except BlockingIOError:
                        continue  # woken with nothing to do: wait again
                    except (OSError, h11.ProtocolError) as exc:
                        answer = ProbeAnswer(probe.asked, error=type(exc).__name__)
                    if answer is not None:
                        answered(key, answer)
                        selector.unregister(probe.sock)
                        probe.sock.close()
        finally:
            for selected in list(selector.get_map().values()):
                selected.fileobj.close()  # type: ignore[union-attr]
    return answers

