"""``LocalEnsemble``: a ZooKeeper ensemble of servers on the loopback interface, each a ``LocalZooKeeper``
with ports of its own; one of them can be crashed, paused and brought back while the others serve.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Self

from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper.admin import four_letter_word
from coordinator.testbed.zookeeper.config import DEFAULT_JAR_DIR, QuorumPeer, find_classpath
from coordinator.testbed.zookeeper.server import LocalZooKeeper

__all__ = ["LocalEnsemble"]


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
