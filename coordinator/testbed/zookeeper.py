"""Start and stop a real ZooKeeper server on the loopback interface, from Debian's packaged jars.

Used by the test suite and by ``coordinator demo``: a local, throw-away ZooKeeper (one standalone server
or a three-node ensemble) that this process owns. Standard library only.

Every server is a ``java`` child process started with ``QuorumPeerMain``; its PID is recorded and only
that PID is ever signalled (SIGTERM, then SIGKILL; SIGSTOP/SIGCONT for ``pause``/``resume``). Servers
listen on 127.0.0.1 only, the admin HTTP server is disabled, and the four-letter words ``ruok``,
``srvr``, ``stat`` and ``mntr`` are enabled because readiness is detected with them, and ``cons`` to
count each client's requests as the server sees them (``connection_stats``).

Debian's ``zookeeper.jar`` manifest pulls in most of its dependencies, but not ``netty-codec.jar``,
``netty-resolver.jar`` or a logging binding (without netty-codec every client connection drops), so
those are put on the class path explicitly. Install with ``apt-get install zookeeper``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from coordinator.testbed.certs import Pki
from coordinator.testbed.processes import free_port

__all__ = [
    "DEFAULT_JAR_DIR",
    "ConnectionStats",
    "LocalEnsemble",
    "LocalZooKeeper",
    "QuorumPeer",
    "ServerTls",
    "connection_stats",
    "find_classpath",
    "four_letter_word",
    "parse_cons",
    "render_zoo_cfg",
]

log = logging.getLogger(__name__)

DEFAULT_JAR_DIR = Path("/usr/share/java")

# zookeeper.jar's manifest names the rest of its dependencies; these are the ones it does not name
# (see the module docstring), plus the two its manifest names that the server cannot start without.
_REQUIRED_JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "slf4j-api.jar",
    "slf4j-log4j12.jar",
    "log4j-1.2.jar",
)
_CLASSPATH_JARS = (
    "zookeeper.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "slf4j-log4j12.jar",
    "log4j-1.2.jar",
)
_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
_JVM_OPTIONS = ("-Xmx256m", "-XX:-UsePerfData", "-XX:+UseSerialGC")
_FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,cons"
_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_file}
log4j.appender.FILE.Append=true
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""
# With ``trace_deliveries``: the server's own line for every watch event it delivers to a session (a trace
# line of NIOServerCnxn, shown once the trace mask has EVENT_DELIVERY set), alone in a file of its own.
_LOG4J_DELIVERIES = """\
log4j.logger.org.apache.zookeeper.server.NIOServerCnxn=TRACE, DELIVERIES
log4j.additivity.org.apache.zookeeper.server.NIOServerCnxn=false
log4j.appender.DELIVERIES=org.apache.log4j.FileAppender
log4j.appender.DELIVERIES.File={deliveries_file}
log4j.appender.DELIVERIES.Append=true
log4j.appender.DELIVERIES.filter.1=org.apache.log4j.varia.StringMatchFilter
log4j.appender.DELIVERIES.filter.1.StringToMatch=Deliver event
log4j.appender.DELIVERIES.filter.1.AcceptOnMatch=true
log4j.appender.DELIVERIES.filter.2=org.apache.log4j.varia.DenyAllFilter
log4j.appender.DELIVERIES.layout=org.apache.log4j.PatternLayout
log4j.appender.DELIVERIES.layout.ConversionPattern=%m%n
"""
_EVENT_DELIVERY_TRACE_MASK = 1 << 6  # org.apache.zookeeper.server.ZooTrace
# "Deliver event WatchedEvent state:SyncConnected type:NodeChildrenChanged path:/x to 0x1000... through ..."
_DELIVERY_LINE = re.compile(r"^Deliver event WatchedEvent state:\S+ type:(?P<type>\S+) path:(?P<path>\S*) "
                            r"to 0x(?P<sid>[0-9a-fA-F]+) ")


# The secure client port needs Netty's server connection factory, and with it these jars.
_TLS_JARS = (
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-buffer.jar",
    "netty-common.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
)


def find_classpath(jar_dir: Path = DEFAULT_JAR_DIR, *, tls: bool = False) -> str:
    """Return the Java class path for Debian's ZooKeeper server (with Netty's jars for ``tls``).

    Raises ``RuntimeError`` naming the first missing jar when the ``zookeeper`` package (or one of its
    dependencies, ``libnetty-java`` for TLS) is not installed.
    """
    extra = _TLS_JARS if tls else ()
    for jar in (*_REQUIRED_JARS, *extra):
        if not (jar_dir / jar).is_file():
            raise RuntimeError(
                f"ZooKeeper jar {jar} not found in {jar_dir}: install ZooKeeper with "
                "'apt-get install zookeeper libnetty-java' (Debian/Ubuntu)"
            )
    return os.pathsep.join(str(jar_dir / jar) for jar in (*_CLASSPATH_JARS, *extra))


@dataclass(frozen=True)
class ServerTls:
    """A secure client port: the server presents ``pki.server_pem``, trusts ``pki.ca`` for client
    certificates (``client_auth``: need, want or none), and maps a client certificate to the identity
    ``x509:{subject}``. ``plaintext``: keep the plain client port too (False: a TLS-only server)."""

    pki: Pki
    client_auth: str = "need"
    plaintext: bool = False

    def zoo_cfg_lines(self, secure_port: int) -> list[str]:
        return [
            f"secureClientPort={secure_port}",
            "secureClientPortAddress=127.0.0.1",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={self.pki.server_pem}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.pki.ca}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={self.client_auth}",
            "authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider",
        ]

    def client_context(self, client: str = "agent") -> ssl.SSLContext:
        """A client-side context that trusts the CA and presents ``client``'s certificate."""
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.pki.cert(client)), str(self.pki.key(client)))
        return context


@dataclass(frozen=True)
class QuorumPeer:
    """One server of an ensemble as the others see it: its id and its loopback ports."""

    server_id: int
    client_port: int
    quorum_port: int
    election_port: int


def render_zoo_cfg(
    *,
    data_dir: Path,
    client_port: int | None,
    tick_time_ms: int,
    max_session_timeout_ms: int,
    peers: Sequence[QuorumPeer] = (),
    extra: Sequence[str] = (),
) -> str:
    """Render a ``zoo.cfg``: loopback only, no admin server, the four-letter words used for readiness.

    With ``peers`` (an ensemble), one ``server.N`` line per peer is added; the caller writes ``myid``.
    ``client_port`` None: no plain client port (a TLS-only server, whose ``extra`` lines configure it).
    """
    if tick_time_ms <= 0:
        raise ValueError(f"tick_time_ms must be positive, got {tick_time_ms}")
    if max_session_timeout_ms < 2 * tick_time_ms:
        raise ValueError(
            f"max_session_timeout_ms ({max_session_timeout_ms}) must be at least 2 x tick_time_ms "
            f"({2 * tick_time_ms}), ZooKeeper's minimum session timeout"
        )
    lines = [
        f"tickTime={tick_time_ms}",
        "initLimit=10",
        "syncLimit=5",
        f"dataDir={data_dir}",
        *([f"clientPort={client_port}", "clientPortAddress=127.0.0.1"] if client_port is not None else []),
        "maxClientCnxns=0",
        f"minSessionTimeout={2 * tick_time_ms}",
        f"maxSessionTimeout={max_session_timeout_ms}",
        "admin.enableServer=false",
        f"4lw.commands.whitelist={_FOUR_LETTER_WORDS}",
    ]
    if peers:
        lines.extend(f"server.{p.server_id}=127.0.0.1:{p.quorum_port}:{p.election_port}" for p in peers)
    lines.extend(extra)
    return "\n".join(lines) + "\n"


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


# Servers still running when the interpreter exits (a test run interrupted between start and stop)
# are stopped, so that no JVM outlives its owner.
_RUNNING: weakref.WeakSet[LocalZooKeeper] = weakref.WeakSet()
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    with _RUNNING_LOCK:
        servers = list(_RUNNING)
    for server in servers:
        server.stop()


class LocalZooKeeper:
    """One ZooKeeper server process on 127.0.0.1, owned by this process.

    ``data_dir`` receives ``zoo.cfg``, ``log4j.properties``, ``zookeeper.log`` (server log, stdout and
    stderr) and the snapshots (``data/``). ``client_port=0`` picks a free port at ``start``.
    ``max_session_timeout_ms`` caps what a client may negotiate (ZooKeeper silently lowers longer
    requests), so size it for the longest pause a client must survive.

    ``server_id`` and ``peers`` make the server a member of an ensemble; see ``LocalEnsemble``.
    ``trace_deliveries``: the server writes a line for every watch event it delivers to a client session
    (``deliveries_file``, counted by ``deliveries``), its own count of the changes each client was told of.
    """

    def __init__(
        self,
        data_dir: Path,
        client_port: int = 0,
        *,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 60_000,
        java: str = "java",
        jar_dir: Path = DEFAULT_JAR_DIR,
        server_id: int | None = None,
        peers: Sequence[QuorumPeer] = (),
        tls: ServerTls | None = None,
        trace_deliveries: bool = False,
    ) -> None:
        if (server_id is None) != (not peers):
            raise ValueError("server_id and peers go together (ensemble member) or not at all")
        if tls is not None and peers:
            raise ValueError("a TLS server is standalone here")
        self.tls = tls
        self._secure_port: int | None = None
        self.data_dir = Path(data_dir).absolute()
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.java = java
        self.jar_dir = jar_dir
        self.server_id = server_id
        self.peers = tuple(peers)
        self._requested_port = client_port
        self._port: int | None = client_port or None
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.trace_deliveries = trace_deliveries

    # -- properties ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the client port is chosen at start(); the server has not been started")
        return self._port

    @property
    def hosts(self) -> str:
        """The connection string for clients: ``127.0.0.1:PORT`` (the secure port for a TLS server)."""
        if self.tls is not None:
            return self.secure_hosts
        return f"127.0.0.1:{self.port}"

    @property
    def secure_port(self) -> int:
        if self._secure_port is None:
            raise RuntimeError("no secure client port: the server has no TLS or has not been started")
        return self._secure_port

    @property
    def secure_hosts(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def plain_hosts(self) -> str:
        """The plain client port's connection string (a TLS server keeps one only with ``plaintext``)."""
        if self.tls is not None and not self.tls.plaintext:
            raise RuntimeError("a TLS-only server has no plain client port")
        return f"127.0.0.1:{self.port}"

    def _four_letter_word(self, word: str, timeout: float) -> str:
        if self.tls is not None and not self.tls.plaintext:
            context = self.tls.client_context()
            return four_letter_word("127.0.0.1", self.secure_port, word, timeout, context)
        return four_letter_word("127.0.0.1", self.port, word, timeout)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def deliveries_file(self) -> Path:
        """With ``trace_deliveries``: one line per watch event the server delivered to a session."""
        return self.data_dir / "deliveries.log"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "zoo.cfg"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Launch the server and wait until it answers ``imok`` and reports a ``Mode:``.

        Raises ``RuntimeError`` (missing jars or java, the process exited, or not ready within
        ``timeout``; the message carries the end of the server log). A port picked automatically and
        taken in the meantime by someone else is replaced by another one, up to three times.
        """
        if self.running:
            return
        attempts = 3 if self._requested_port == 0 and self.server_id is None else 1
        for attempt in range(1, attempts + 1):
            self.launch()
            try:
                self.wait_ready(timeout)
                return
            except RuntimeError:
                exited = self._process is not None and self._process.poll() is not None
                self.stop()
                if attempt == attempts or not exited or "Address already in use" not in self._log_tail():
                    raise
                self._port = None

    def launch(self) -> None:
        """Start the process without waiting for readiness (an ensemble launches all its members first)."""
        if self.running:
            return
        classpath = find_classpath(self.jar_dir, tls=self.tls is not None)
        if self._port is None:
            self._port = free_port()
        if self.tls is not None and self._secure_port is None:
            self._secure_port = free_port()
        data = self.data_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.server_id is not None:
            (data / "myid").write_text(f"{self.server_id}\n")
        self.config_file.write_text(
            render_zoo_cfg(
                data_dir=data,
                client_port=None if self.tls is not None and not self.tls.plaintext else self._port,
                tick_time_ms=self.tick_time_ms,
                max_session_timeout_ms=self.max_session_timeout_ms,
                peers=self.peers,
                extra=[*(self.tls.zoo_cfg_lines(self.secure_port) if self.tls is not None else ()),
                       *([f"4lw.commands.whitelist={_FOUR_LETTER_WORDS},stmk"] if self.trace_deliveries else [])],
            )
        )
        log4j = self.data_dir / "log4j.properties"
        log4j.write_text(_LOG4J_PROPERTIES.format(log_file=self.log_file)
                         + (_LOG4J_DELIVERIES.format(deliveries_file=self.deliveries_file)
                            if self.trace_deliveries else ""))
        command = [
            self.java,
            *_JVM_OPTIONS,
            f"-Dlog4j.configuration=file:{log4j}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            _MAIN_CLASS,
            str(self.config_file),
        ]
        with self.log_file.open("ab") as output:
            try:
                # A session of its own: a Ctrl-C meant for the parent's terminal does not reach the JVM,
                # which is stopped explicitly by stop() (or at interpreter exit).
                self._process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise RuntimeError(
                    f"cannot run {self.java!r}: a Java runtime is needed for ZooKeeper "
                    "('apt-get install zookeeper' pulls one in)"
                ) from exc
        self._paused = False
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        log.info("started ZooKeeper pid %d on %s (log %s)", self._process.pid, self.hosts, self.log_file)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until ``ruok`` answers ``imok`` and ``srvr`` shows a ``Mode:`` line (quorum reached)."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            process = self._process
            if process is None:
                raise RuntimeError("ZooKeeper was not launched")
            if process.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper (pid {process.pid}) exited with status {process.returncode}; "
                    f"end of {self.log_file}:\n{self._log_tail()}"
                )
            try:
                if self._four_letter_word("ruok", timeout=1.0) == "imok":
                    last = self._four_letter_word("srvr", timeout=1.0)
                    if "Mode:" in last:
                        if self.trace_deliveries:
                            self._set_trace_mask(_EVENT_DELIVERY_TRACE_MASK)
                        return
            except OSError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"ZooKeeper on {self.hosts} not ready after {timeout:.1f}s "
                    f"(last answer: {last.strip()!r}); "
                    f"end of {self.log_file}:\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def _set_trace_mask(self, mask: int) -> None:
        """``stmk``: the server's trace mask (which kinds of trace lines it writes), as an 8-byte long."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
            sock.sendall(b"stmk" + struct.pack(">q", mask))
            answer = sock.recv(64)
        if answer.strip() != str(mask).encode():
            raise OSError(f"ZooKeeper did not take the trace mask {mask}: {answer!r}")

    def deliveries(self, since: int = 0) -> tuple[dict[int, int], int]:
        """With ``trace_deliveries``: the watch events the server delivered, per session id, from byte
        ``since`` of the deliveries file; and the offset to pass next time (the file's end then)."""
        counts: dict[int, int] = {}
        try:
            with self.deliveries_file.open("rb") as file:
                file.seek(since)
                data = file.read()
        except FileNotFoundError:
            return counts, since
        end = since + data.rfind(b"\n") + 1  # a line still being written waits for the next call
        for raw in data[: end - since].decode("utf-8", errors="replace").splitlines():
            match = _DELIVERY_LINE.match(raw)
            if match is not None:
                sid = int(match["sid"], 16)
                counts[sid] = counts.get(sid, 0) + 1
        return counts, end

    def connection_stats(self, timeout: float = 2.0) -> dict[int, ConnectionStats]:
        """The client connections of this server, by session id (see ``ConnectionStats``). Raises
        ``OSError`` when the server does not answer."""
        return connection_stats("127.0.0.1", self.port, timeout)

    def zxid(self, timeout: float = 2.0) -> int:
        """The last transaction id this server has seen (``srvr``): it grows by one with every write
        transaction, including a create or delete that fails, and not with reads or pings."""
        text = self._four_letter_word("srvr", timeout)
        match = re.search(r"Zxid: (0x[0-9a-fA-F]+)", text)
        if match is None:
            raise OSError(f"no Zxid in the server's srvr answer: {text[:200]!r}")
        return int(match.group(1), 16)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout``. Only this server's PID is signalled.
        Never raises; a second call does nothing."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            # A stopped process keeps SIGTERM pending: continue it first.
            if self._paused:
                self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout)
        self._paused = False
        self._process = None
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        log.info("stopped ZooKeeper pid %d (exit status %s)", process.pid, process.returncode)

    def kill(self) -> None:
        """SIGKILL the server (a crash, for node-loss tests). Its data directory is kept."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10.0)
        self._paused = False
        self._process = None
        with _RUNNING_LOCK:
            _RUNNING.discard(self)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop (if running) and start again on the same port with the same data."""
        self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered (an Azure Freeze)."""
        if not self.running:
            raise RuntimeError("ZooKeeper is not running")
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if not self.running:
            raise RuntimeError("ZooKeeper is not running")
        self._signal(signal.SIGCONT)
        self._paused = False

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is not None and self._process.poll() is None:
            # Popen.send_signal addresses the child's PID only, and never a reaped (reusable) PID.
            self._process.send_signal(signum)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        port = self._port if self._port is not None else "?"
        return f"LocalZooKeeper(127.0.0.1:{port}, pid={self.pid}, data_dir={str(self.data_dir)!r})"


class LocalEnsemble:
    """A ZooKeeper ensemble of ``size`` servers on 127.0.0.1 (distinct client, quorum and election
    ports), each in ``data_dir/node{i}``. Servers are indexed from 0; their ZooKeeper ids are 1..size.

    ``kill(i)`` crashes one server (SIGKILL) and ``restart(i)`` brings it back with its data; with three
    servers, the ensemble keeps serving while one is down.
    """

    def __init__(
        self,
        data_dir: Path,
        size: int = 3,
        *,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 60_000,
        java: str = "java",
        jar_dir: Path = DEFAULT_JAR_DIR,
    ) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, got size={size}")
        self.data_dir = Path(data_dir).absolute()
        self._options = {
            "tick_time_ms": tick_time_ms,
            "max_session_timeout_ms": max_session_timeout_ms,
        }
        self.java = java
        self.jar_dir = jar_dir
        self.size = size
        self._servers: list[LocalZooKeeper] = []

    @property
    def servers(self) -> tuple[LocalZooKeeper, ...]:
        return tuple(self._servers)

    @property
    def tick_time_ms(self) -> int:
        """The servers' tickTime (sessions last at least twice that, and expire on its boundaries)."""
        return self._options["tick_time_ms"]

    @property
    def max_session_timeout_ms(self) -> int:
        return self._options["max_session_timeout_ms"]

    @property
    def hosts(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...`` for clients."""
        if not self._servers:
            raise RuntimeError("the ensemble has not been started")
        return ",".join(server.hosts for server in self._servers)

    def server(self, index: int) -> LocalZooKeeper:
        return self._servers[index]

    def start(self, timeout: float = 30.0) -> None:
        """Launch every server, then wait until each of them serves (a quorum exists)."""
        if not self._servers:
            find_classpath(self.jar_dir)  # fail before choosing ports and writing files
            peers = [QuorumPeer(index + 1, free_port(), free_port(), free_port()) for index in range(self.size)]
            self._servers = [
                LocalZooKeeper(
                    self.data_dir / f"node{peer.server_id - 1}",
                    peer.client_port,
                    tick_time_ms=self._options["tick_time_ms"],
                    max_session_timeout_ms=self._options["max_session_timeout_ms"],
                    java=self.java,
                    jar_dir=self.jar_dir,
                    server_id=peer.server_id,
                    peers=peers,
                )
                for peer in peers
            ]
        try:
            for server in self._servers:
                server.launch()
            deadline = time.monotonic() + timeout
            for server in self._servers:
                server.wait_ready(max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server. Never raises."""
        for server in self._servers:
            server.stop()

    def kill(self, index: int) -> None:
        """SIGKILL server ``index``."""
        self._servers[index].kill()

    def restart(self, index: int, timeout: float = 30.0) -> None:
        """Start server ``index`` again (after ``kill`` or ``stop``) and wait until it serves."""
        server = self._servers[index]
        server.stop()
        server.start(timeout)

    def pause(self, index: int) -> None:
        self._servers[index].pause()

    def resume(self, index: int) -> None:
        self._servers[index].resume()

    def leader_index(self) -> int | None:
        """Index of the server that reports ``Mode: leader`` now, or None."""
        for index, server in enumerate(self._servers):
            if not server.running or server.paused:
                continue
            try:
                if "Mode: leader" in four_letter_word("127.0.0.1", server.port, "srvr", timeout=1.0):
                    return index
            except OSError:
                continue
        return None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
