"""A controllable TCP proxy on loopback, to put real network faults on one client's link to a server.

``LinkProxy`` listens on 127.0.0.1 and forwards every connection it accepts to one upstream address.
Its ``LinkState`` can be changed at any time, from any thread:

- ``cut``: a silent partition. Established connections stay open and nothing crosses them in either
  direction; new connections are accepted (the client sees no reset and no refusal) but reach nothing.
- ``delay_ms``: every chunk of bytes is forwarded that many milliseconds after the proxy read it, in
  each direction (so a request and its answer take twice that longer).
- ``hold_up`` / ``hold_down``: one-way loss. Nothing crosses from the client to the server (up) or from
  the server to the client (down); the other direction keeps flowing, and every socket stays open.

Bytes that may not cross are **held, not discarded**: that is what TCP does in a real partition (the
sender retransmits them until they are acknowledged), and discarding bytes inside a stream would corrupt
its framing, which no network fault does. Once the link heals, whatever a sender wrote (and its FIN, if
it closed meanwhile) arrives, as retransmissions would. A real network also establishes no new
connection while either direction loses every packet (the SYN or the SYN-ACK is lost): a connection
accepted while the link is cut or one-way is **parked**, with no upstream connection, until the link
heals; then it is connected upstream if its client still holds it open, else dropped unseen. A parked
client that gave up therefore never reaches the server, as a lost SYN never does.

``ZooKeeperLink`` is one client's link to a whole ensemble: one ``LinkProxy`` per server, one listening
port each, all switched together; ``hosts`` is the connect string to give that client.

Everything runs on one asyncio event loop, on a thread of its own, per ``LinkProxy``; ``stop`` closes
every socket and ends the thread. Only loopback addresses are listened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

__all__ = ["LinkProxy", "LinkState", "LinkStats", "ZooKeeperLink"]

_CHUNK = 65536
_UP, _DOWN = "up", "down"


@dataclass(frozen=True)
class LinkState:
    """What the link does now. The default is a whole link: everything forwarded at once."""

    cut: bool = False
    delay_ms: int = 0
    hold_up: bool = False
    hold_down: bool = False

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")

    def flows(self, direction: str) -> bool:
        """Whether bytes may cross in ``direction`` (``up``: client to server)."""
        if self.cut:
            return False
        return not (self.hold_up if direction == _UP else self.hold_down)

    @property
    def connects(self) -> bool:
        """Whether a new connection may reach the server: only while both directions flow."""
        return self.flows(_UP) and self.flows(_DOWN)

    def describe(self) -> str:
        parts = []
        if self.cut:
            parts.append("cut")
        if self.hold_up:
            parts.append("loss up (client to server)")
        if self.hold_down:
            parts.append("loss down (server to client)")
        if self.delay_ms:
            parts.append(f"delay {self.delay_ms} ms each way")
        return ", ".join(parts) or "whole"


@dataclass(frozen=True)
class LinkStats:
    """Counters since the proxy started: connections accepted, connected upstream, parked (accepted while
    the link could not connect), dropped unseen (parked clients that gave up), open now; bytes forwarded
    each way."""

    accepted: int = 0
    connected: int = 0
    parked: int = 0
    dropped_parked: int = 0
    open: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class _Modes:
    """The faults a link can be switched to, on top of ``state`` and ``set_state``."""

    @property
    def state(self) -> LinkState:
        raise NotImplementedError

    def set_state(self, state: LinkState) -> None:
        raise NotImplementedError

    def cut(self) -> None:
        self.set_state(replace(self.state, cut=True))

    def delay(self, ms: int) -> None:
        self.set_state(replace(self.state, delay_ms=int(ms)))

    def loss_up(self) -> None:
        self.set_state(replace(self.state, hold_up=True))

    def loss_down(self) -> None:
        self.set_state(replace(self.state, hold_down=True))

    def heal(self) -> None:
        self.set_state(LinkState())


class LinkProxy(_Modes):
    """One listening port on 127.0.0.1 forwarding to ``upstream``; see the module docstring."""

    def __init__(self, upstream: tuple[str, int], *, listen_port: int = 0, name: str = "",
                 connect_timeout: float = 2.0) -> None:
        self.upstream = upstream
        self.name = name or f"proxy->{upstream[0]}:{upstream[1]}"
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._state = LinkState()
        self._stats = LinkStats()
        self._stats_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._port: int | None = None

    # -- life cycle -------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy has not been started")
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 5.0) -> None:
        """Bind the listening port and start forwarding. Raises ``OSError`` if the port cannot be bound."""
        if self.running:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        async def open_server() -> None:
            self._changed = asyncio.Event()
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port,
                                                      reuse_address=True)
            self._port = int(self._server.sockets[0].getsockname()[1])

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(open_server())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close_all())
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"netproxy-{self.name}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{self.name}: did not start within {timeout:g} s")
        if failure:
            self._thread.join(timeout)
            self._thread = None
            raise failure[0]

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listening socket and every connection, and end the proxy's thread. Never raises."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        self._thread = None
        self._loop = None

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- control ------------------------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        return self._state

    def stats(self) -> LinkStats:
        with self._stats_lock:
            return self._stats

    def set_state(self, state: LinkState) -> None:
        """Switch the link to ``state`` now; effective for the bytes and connections that follow."""
        self._state = state
        loop = self._loop
        if loop is not None and self.running:
            with contextlib.suppress(RuntimeError, TimeoutError):  # waiters also poll the state
                asyncio.run_coroutine_threadsafe(self._notify(), loop).result(2.0)

    async def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        if changed is not None:
            changed.set()

    async def _wait_state(self, ok: Callable[[LinkState], bool]) -> None:
        """Wait until ``ok(state)`` holds; a change of state wakes the waiters (a slow poll is the backstop)."""
        while not ok(self._state):
            changed = self._changed
            assert changed is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.5)

    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            self._stats = replace(self._stats, **{k: getattr(self._stats, k) + v for k, v in increments.items()})

    # -- forwarding ---------------------------------------------------------------------------------------

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(client_writer)
        self._count(accepted=1, open=1)
        try:
            pending = b""
            if not self._state.connects:
                self._count(parked=1)
                parked = await self._park(client_reader)
                if parked is None:
                    self._count(dropped_parked=1)
                    return
                pending = parked
            try:
                server_reader, server_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), self._connect_timeout)
            except (OSError, TimeoutError):
                return  # the server is down: the client's connection ends, as a refused one would
            self._writers.add(server_writer)
            self._count(connected=1)
            try:
                if pending:
                    server_writer.write(pending)
                    self._count(bytes_up=len(pending))
                await asyncio.gather(self._pump(client_reader, server_writer, _UP),
                                     self._pump(server_reader, client_writer, _DOWN))
            finally:
                self._writers.discard(server_writer)
                server_writer.transport.abort()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(client_writer)
            client_writer.transport.abort()
            self._count(open=-1)
            if task is not None:
                self._tasks.discard(task)

    async def _park(self, reader: asyncio.StreamReader) -> bytes | None:
        """Hold a connection accepted while the link cannot connect, until it can. Returns what the client
        sent meanwhile, or None if it gave up (its end of stream came) before the link healed."""
        pending = bytearray()
        read: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(_CHUNK))
        try:
            while True:
                if read.done():
                    try:
                        chunk = read.result()
                    except (ConnectionError, OSError):
                        return None
                    if not chunk:
                        return None
                    pending += chunk
                    read = asyncio.ensure_future(reader.read(_CHUNK))
                if self._state.connects:
                    return bytes(pending)
                changed = self._changed
                assert changed is not None
                waiting: asyncio.Future[Any] = asyncio.ensure_future(changed.wait())
                await asyncio.wait([read, waiting], timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
        finally:
            if not read.done():
                read.cancel()  # StreamReader.read gives up nothing it has not returned

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Forward one direction: read while the direction flows, queue each chunk with the time it is due
        (read time plus the delay then), write it once due and while the direction flows. A chunk read
        just before the direction stopped flowing waits in the queue: it is held too."""
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()  # None: the sender reset
        loop = asyncio.get_running_loop()

        def flows(state: LinkState) -> bool:
            return state.flows(direction)

        async def read_side() -> None:
            last_due = 0.0
            while True:
                await self._wait_state(flows)
                data: bytes | None
                try:
                    data = await reader.read(_CHUNK)
                except (ConnectionError, OSError):
                    data = None
                due = max(last_due, loop.time() + self._state.delay_ms / 1000.0)
                last_due = due
                await queue.put((due, data))
                if not data:
                    return

        async def write_side() -> None:
            while True:
                due, data = await queue.get()
                while True:
                    await self._wait_state(flows)
                    wait = due - loop.time()
                    if wait <= 0:
                        break
                    await asyncio.sleep(min(wait, 0.5))
                if data is None:
                    writer.transport.abort()  # a reset crosses as a reset
                    return
                if not data:
                    if writer.can_write_eof() and not writer.is_closing():
                        with contextlib.suppress(OSError):
                            writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                self._count(**{f"bytes_{direction}": len(data)})

        reading = asyncio.ensure_future(read_side())
        try:
            await write_side()
        except (ConnectionError, OSError):
            writer.transport.abort()  # the other end reset: so does this side, as a real path would carry it
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading


class ZooKeeperLink(_Modes):
    """One client's link to a ZooKeeper ensemble: a ``LinkProxy`` per server, switched together.

    ``upstreams`` are the servers' ``host:port``; ``hosts`` is the client's connect string through the
    proxies, in the same order."""

    def __init__(self, upstreams: Sequence[str], *, name: str = "") -> None:
        self.name = name
        self.proxies = [
            LinkProxy(_parse(address), name=f"{name}->{address}" if name else "") for address in upstreams
        ]

    @classmethod
    def for_hosts(cls, hosts: str, *, name: str = "") -> ZooKeeperLink:
        """A link for a connect string ``h1:p1,h2:p2,...`` (no chroot)."""
        return cls([h.strip() for h in hosts.split(",") if h.strip()], name=name)

    @property
    def hosts(self) -> str:
        return ",".join(proxy.address for proxy in self.proxies)

    @property
    def state(self) -> LinkState:
        return self.proxies[0].state

    def start(self) -> None:
        try:
            for proxy in self.proxies:
                proxy.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()

    def set_state(self, state: LinkState) -> None:
        for proxy in self.proxies:
            proxy.set_state(state)

    def stats(self) -> LinkStats:
        total = LinkStats()
        for proxy in self.proxies:
            s = proxy.stats()
            total = LinkStats(*(a + b for a, b in zip(
                (total.accepted, total.connected, total.parked, total.dropped_parked, total.open, total.bytes_up,
                 total.bytes_down),
                (s.accepted, s.connected, s.parked, s.dropped_parked, s.open, s.bytes_up, s.bytes_down), strict=True)))
        return total

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _parse(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    if host not in ("127.0.0.1", "localhost") and not host.startswith("127."):
        raise ValueError(f"a link proxy forwards to loopback only, not {host!r}")
    return host, int(port)
