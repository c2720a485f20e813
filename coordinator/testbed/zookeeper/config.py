"""The configuration of a local ZooKeeper server: its Java class path, the TLS of its secure client port,
its ensemble peers, ``zoo.cfg`` and the launch settings (main class, JVM options, log4j templates).

Debian's ``zookeeper.jar`` manifest pulls in most of its dependencies, but not ``netty-codec.jar``,
``netty-resolver.jar`` or a logging binding (without netty-codec every client connection drops), so
those are put on the class path explicitly. Install with ``apt-get install zookeeper``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.testbed.certs import Pki

__all__ = [
    "DEFAULT_JAR_DIR",
    "FOUR_LETTER_WORDS",
    "JVM_OPTIONS",
    "LOG4J_DELIVERIES",
    "LOG4J_PROPERTIES",
    "MAIN_CLASS",
    "QuorumPeer",
    "ServerTls",
    "find_classpath",
    "render_zoo_cfg",
]

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
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
JVM_OPTIONS = ("-Xmx256m", "-XX:-UsePerfData", "-XX:+UseSerialGC")
FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,cons"
LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_file}
log4j.appender.FILE.Append=true
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""
# With ``trace_deliveries``: the server's own line for every watch event it delivers to a session (a trace
# line of NIOServerCnxn, shown once the trace mask has EVENT_DELIVERY set), alone in a file of its own.
LOG4J_DELIVERIES = """\
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
        f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
    ]
    if peers:
        lines.extend(f"server.{p.server_id}=127.0.0.1:{p.quorum_port}:{p.election_port}" for p in peers)
    lines.extend(extra)
    return "\n".join(lines) + "\n"
