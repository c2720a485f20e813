"""``LocalZooKeeper``: one ZooKeeper server process on the loopback interface, owned by this process, from
its launch to its stop (and its pauses, crashes and restarts in between); and the stop at interpreter exit
of every server still running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper.admin import ConnectionStats, connection_stats, four_letter_word
from coordinator.testbed.zookeeper.config import (
    DEFAULT_JAR_DIR,
    FOUR_LETTER_WORDS,
    JVM_OPTIONS,
    LOG4J_DELIVERIES,
    LOG4J_PROPERTIES,
    MAIN_CLASS,
    QuorumPeer,
    ServerTls,
    find_classpath,
    render_zoo_cfg,
)

__all__ = ["LocalZooKeeper"]

# The launcher's log lines keep the package's logger name, whichever of its modules writes them.
log = logging.getLogger("coordinator.testbed.zookeeper")

# With ``trace_deliveries`` (``LOG4J_DELIVERIES``): the trace mask that turns the server's delivery lines
# on, and what such a line looks like.
_EVENT_DELIVERY_TRACE_MASK = 1 << 6  # org.apache.zookeeper.server.ZooTrace
# "Deliver event WatchedEvent state:SyncConnected type:NodeChildrenChanged path:/x to 0x1000... through ..."
_DELIVERY_LINE = re.compile(r"^Deliver event WatchedEvent state:\S+ type:(?P<type>\S+) path:(?P<path>\S*) "
                            r"to 0x(?P<sid>[0-9a-fA-F]+) ")


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
                       *([f"4lw.commands.whitelist={FOUR_LETTER_WORDS},stmk"] if self.trace_deliveries else [])],
            )
        )
        log4j = self.data_dir / "log4j.properties"
        log4j.write_text(LOG4J_PROPERTIES.format(log_file=self.log_file)
                         + (LOG4J_DELIVERIES.format(deliveries_file=self.deliveries_file)
                            if self.trace_deliveries else ""))
        command = [
            self.java,
            *JVM_OPTIONS,
            f"-Dlog4j.configuration=file:{log4j}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            MAIN_CLASS,
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
