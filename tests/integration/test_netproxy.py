"""The link proxy (``tests.chaos.netproxy``) against real sockets on loopback, and one real
ZooKeeper session through it.

An upstream server on 127.0.0.1 records every connection it accepts and every byte it receives, and can
push bytes to its clients; the tests connect through the proxy and switch the link at run time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient, KazooState

from tests.chaos.netproxy import LinkProxy, LinkState, ZooKeeperLink
from tests.plugins.zookeeper import wait_until


class Upstream:
    """A TCP server on 127.0.0.1: accepts, records what each connection receives, echoes it if asked."""

    def __init__(self, echo: bool = True) -> None:
        self.echo = echo
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.conns: list[socket.socket] = []
        self.received: list[bytearray] = []
        self.closed: list[bool] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self.conns)

    def data(self, index: int = 0) -> bytes:
        with self._lock:
            return bytes(self.received[index]) if index < len(self.received) else b""

    def _accept(self) -> None:
        try:
            self.listener.settimeout(0.1)
        except OSError:
            return  # closed by a test that was over before this thread started
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.conns.append(conn)
                self.received.append(bytearray())
                self.closed.append(False)
                index = len(self.conns) - 1
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    self.closed[index] = True
                return
            with self._lock:
                self.received[index] += data
            if self.echo:
                with contextlib.suppress(OSError):
                    conn.sendall(data)

    def push(self, data: bytes, index: int = 0) -> None:
        with self._lock:
            conn = self.conns[index]
        conn.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(2)
        with self._lock:
            for conn in self.conns:
                conn.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[LinkProxy]:
    with LinkProxy(("127.0.0.1", upstream.port), name="test") as link:
        yield link


def connect(proxy: LinkProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    sock.settimeout(2)
    return sock


def recv_exactly(sock: socket.socket, size: int, timeout: float = 2.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def nothing_arrives(sock: socket.socket, seconds: float = 0.6) -> bool:
    """True if neither bytes nor an end of stream nor a reset arrive within ``seconds``."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    return False


def test_a_whole_link_forwards_both_ways_and_an_end_of_stream(proxy: LinkProxy, upstream: Upstream) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert recv_exactly(sock, 5) == b"hello"
        sock.shutdown(socket.SHUT_WR)
        assert wait_until(lambda: upstream.closed and upstream.closed[0], timeout=3)
    assert upstream.data() == b"hello"
    stats = proxy.stats()
    assert (stats.accepted, stats.connected, stats.parked) == (1, 1, 0)
    assert stats.bytes_up == 5 and stats.bytes_down == 5


def test_a_cut_is_silent_and_holds_bytes_until_it_heals(proxy: LinkProxy, upstream: Upstream) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.cut()
        assert proxy.state == LinkState(cut=True)
        sock.sendall(b"bc")
        upstream.push(b"X")
        # Nothing crosses, either way, and nobody sees a reset or an end of stream.
        assert nothing_arrives(sock)
        assert upstream.data() == b"a"
        proxy.heal()
        # What was sent during the cut arrives, in order, as TCP's retransmissions would deliver it.
        assert recv_exactly(sock, 3) == b"Xbc"
        assert upstream.data() == b"abc"


def test_a_new_connection_during_a_cut_is_accepted_but_reaches_nothing(proxy: LinkProxy,
                                                                        upstream: Upstream) -> None:
    proxy.cut()
    with connect(proxy) as sock:  # accepted: no refusal, no reset
        sock.sendall(b"hi")
        assert nothing_arrives(sock)
        assert upstream.accepted == 0
        assert proxy.stats().parked == 1
        proxy.heal()
        assert recv_exactly(sock, 2) == b"hi"
        assert upstream.accepted == 1 and upstream.data() == b"hi"


def test_a_parked_client_that_gave_up_never_reaches_the_server(proxy: LinkProxy, upstream: Upstream) -> None:
    proxy.cut()
    with connect(proxy) as sock:
        sock.sendall(b"stale request")
    assert wait_until(lambda: proxy.stats().dropped_parked == 1, timeout=3)
    proxy.heal()
    time.sleep(0.3)
    assert upstream.accepted == 0


def test_delay_adds_to_each_direction_and_heals(proxy: LinkProxy) -> None:
    with connect(proxy) as sock:
        proxy.delay(300)
        started = time.monotonic()
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        assert time.monotonic() - started >= 0.58  # 300 ms up, 300 ms down
        proxy.heal()
        started = time.monotonic()
        sock.sendall(b"pong")
        assert recv_exactly(sock, 4) == b"pong"
        assert time.monotonic() - started < 0.25


def test_delay_keeps_the_order_of_bytes(proxy: LinkProxy) -> None:
    with connect(proxy) as sock:
        proxy.delay(200)
        sock.sendall(b"first,")
        proxy.delay(0)  # a later, shorter delay must not overtake the earlier bytes
        sock.sendall(b"second")
        assert recv_exactly(sock, 12) == b"first,second"


def test_loss_up_holds_what_the_client_sends_while_the_server_still_reaches_it(upstream: Upstream) -> None:
    upstream.echo = False
    with LinkProxy(("127.0.0.1", upstream.port)) as proxy, connect(proxy) as sock:
        sock.sendall(b"1")
        assert wait_until(lambda: upstream.data() == b"1", timeout=2)
        proxy.loss_up()
        sock.sendall(b"2")
        upstream.push(b"down")
        assert recv_exactly(sock, 4) == b"down"  # the server still reaches the client
        time.sleep(0.4)
        assert upstream.data() == b"1"  # the client does not reach the server
        proxy.heal()
        assert wait_until(lambda: upstream.data() == b"12", timeout=2)


def test_loss_down_holds_what_the_server_sends_while_the_client_still_reaches_it(upstream: Upstream) -> None:
    upstream.echo = False
    with LinkProxy(("127.0.0.1", upstream.port)) as proxy, connect(proxy) as sock:
        sock.sendall(b"1")
        assert wait_until(lambda: upstream.data() == b"1", timeout=2)
        proxy.loss_down()
        sock.sendall(b"2")
        assert wait_until(lambda: upstream.data() == b"12", timeout=2)  # the client reaches the server
        upstream.push(b"answer")
        assert nothing_arrives(sock)  # the answer does not come back, and the socket stays open
        proxy.heal()
        assert recv_exactly(sock, 6) == b"answer"


def test_no_new_connection_reaches_the_server_while_one_direction_loses_everything(
        proxy: LinkProxy, upstream: Upstream) -> None:
    for loss in (proxy.loss_up, proxy.loss_down):
        proxy.heal()
        loss()
        with connect(proxy) as sock:
            sock.sendall(b"x")
            assert nothing_arrives(sock, 0.3)
        assert upstream.accepted == 0
    assert wait_until(lambda: proxy.stats().dropped_parked == 2, timeout=3)


def test_a_server_that_is_down_ends_the_clients_connection(upstream: Upstream) -> None:
    upstream.close()
    with (LinkProxy(("127.0.0.1", upstream.port)) as proxy, connect(proxy) as sock,
          contextlib.suppress(ConnectionResetError)):
        assert sock.recv(1) == b""


def test_stop_closes_every_connection_and_frees_the_port(upstream: Upstream) -> None:
    proxy = LinkProxy(("127.0.0.1", upstream.port))
    proxy.start()
    port = proxy.port
    sock = connect(proxy)
    sock.sendall(b"x")
    assert recv_exactly(sock, 1) == b"x"
    proxy.cut()
    proxy.stop()
    assert not proxy.running
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""
    sock.close()
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port is free again
    proxy.stop()  # a second stop does nothing


def test_link_state_and_addresses_are_checked() -> None:
    with pytest.raises(ValueError):
        LinkState(delay_ms=-1)
    with pytest.raises(ValueError):
        ZooKeeperLink(["10.0.0.1:2181"])
    with pytest.raises(ValueError):
        ZooKeeperLink(["127.0.0.1"])
    assert LinkState().describe() == "whole"
    assert "loss up" in LinkState(hold_up=True).describe()


def test_a_link_switches_every_server_of_an_ensemble_together() -> None:
    servers = [Upstream(), Upstream()]
    try:
        link = ZooKeeperLink([f"127.0.0.1:{s.port}" for s in servers], name="vm0")
        with link:
            ports = [p.port for p in link.proxies]
            assert link.hosts == ",".join(f"127.0.0.1:{p}" for p in ports)
            link.cut()
            assert all(p.state.cut for p in link.proxies)
            link.delay(100)
            assert all(p.state == LinkState(cut=True, delay_ms=100) for p in link.proxies)
            link.heal()
            for port, server in zip(ports, servers, strict=True):
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    sock.sendall(b"ok")
                    assert recv_exactly(sock, 2) == b"ok"
                assert server.data() == b"ok"
            assert link.stats().connected == 2
    finally:
        for server in servers:
            server.close()


@pytest.mark.zookeeper
def test_a_real_session_expires_behind_a_cut_longer_than_its_timeout(zk_hosts: str, zk_chroot: str) -> None:
    """A kazoo client cut off longer than its session: the server expires the session (its ephemeral
    node goes, seen by a client on a direct link) and the client learns it once the link heals."""
    direct = KazooClient(hosts=zk_hosts, timeout=10)
    direct.start(timeout=10)
    direct.ensure_path(zk_chroot)
    link = ZooKeeperLink.for_hosts(zk_hosts, name="client")
    states: list[str] = []
    with link:
        client = KazooClient(hosts=link.hosts + zk_chroot, timeout=2.0)
        client.add_listener(lambda state: states.append(state))
        client.start(timeout=10)
        try:
            client.create("/mine", b"", ephemeral=True)
            assert direct.exists(zk_chroot + "/mine") is not None
            link.cut()
            assert wait_until(lambda: KazooState.SUSPENDED in states, timeout=5)
            # The server expires the session on its own (2 s asked, tickTime 500 ms): the node goes.
            assert wait_until(lambda: direct.exists(zk_chroot + "/mine") is None, timeout=8)
            assert KazooState.LOST not in states  # the client cannot know yet
            link.heal()
            assert wait_until(lambda: KazooState.LOST in states, timeout=10)
            assert wait_until(lambda: client.connected, timeout=10)
        finally:
            client.stop()
            client.close()
            direct.stop()
            direct.close()


@pytest.mark.zookeeper
def test_a_short_cut_keeps_the_session(zk_hosts: str, zk_chroot: str) -> None:
    setup = KazooClient(hosts=zk_hosts, timeout=10)
    setup.start(timeout=10)
    setup.ensure_path(zk_chroot)
    setup.stop()
    setup.close()
    link = ZooKeeperLink.for_hosts(zk_hosts, name="client")
    states: list[str] = []
    with link:
        client = KazooClient(hosts=link.hosts + zk_chroot, timeout=4.0)
        client.add_listener(lambda state: states.append(state))
        client.start(timeout=10)
        try:
            session = client.client_id
            client.create("/mine", b"", ephemeral=True)
            link.cut()
            time.sleep(1.0)
            link.heal()
            assert wait_until(lambda: client.connected and client.exists("/mine") is not None, timeout=10)
            assert client.client_id == session
            assert KazooState.LOST not in states
        finally:
            client.stop()
            client.close()
