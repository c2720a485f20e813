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

The modules: ``config`` (class path, TLS, peers, ``zoo.cfg``), ``admin`` (four-letter words, ``cons``),
``server`` (``LocalZooKeeper``, one server process) and ``ensemble`` (``LocalEnsemble``); import their
names from here. The reader of the servers' transaction logs, which the chaos oracle uses, is a test
tool: ``tests.oracle.txnlog``.
"""

from __future__ import annotations

from coordinator.testbed.zookeeper.admin import ConnectionStats, connection_stats, four_letter_word, parse_cons
from coordinator.testbed.zookeeper.config import DEFAULT_JAR_DIR, QuorumPeer, ServerTls, find_classpath, render_zoo_cfg
from coordinator.testbed.zookeeper.ensemble import LocalEnsemble
from coordinator.testbed.zookeeper.server import LocalZooKeeper

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
