"""The sections of the services the agent talks to: IMDS (``imds``) and ZooKeeper (``zookeeper``, with
its digest authentication, ACL identities and TLS), and the store options built from them.
"""

from __future__ import annotations

from pathlib import Path

from kazoo.security import Id
from pydantic import Field, PrivateAttr, SecretStr, ValidationInfo, field_validator, model_validator

from coordinator.config.base import Section, host_port, imds_base_url, rules_off
from coordinator.delivery import DeliveryMode
from coordinator.store.zk_security import NodeAcls, digest_identity, node_acls, parse_identity
from coordinator.store.zk_session import ClientOptions, TlsOptions

__all__ = [
    "ImdsConfig",
    "ZooKeeperAclConfig",
    "ZooKeeperAuthConfig",
    "ZooKeeperConfig",
    "ZooKeeperTlsConfig",
]


class ImdsConfig(Section):
    url: str = Field("http://169.254.169.254", description="IMDS base URL (the simulator's per-VM URL in tests)")
    api_version: str = Field(
        "2020-07-01", description="Scheduled Events api-version (2020-07-01 adds DurationInSeconds)"
    )
    poll_interval: float = Field(1.0, gt=0, le=30, description="Seconds between polls; Microsoft advises 1 s")
    request_timeout: float = Field(10.0, gt=0, description="Timeout of each IMDS request after the first success")
    first_request_timeout: float = Field(120.0, gt=0, description="The first call may take up to 2 minutes")
    max_attempts: int = Field(
        3, ge=1, le=10, description="Attempts per approval POST on timeouts, 410, 429 and 5xx (a poll is one "
        "attempt: the next poll is its retry)"
    )
    backoff_max_seconds: float = Field(
        8.0, gt=0, le=60, description="Longest gap between polls while IMDS keeps failing (jittered, doubling)"
    )
    stagger: bool = Field(
        True, description="Spread the group's polls over the interval by each agent's rank among the members, "
        "and, while following the whole group, read at once when a peer publishes an event this VM's document "
        "does not show yet"
    )
    max_requests_per_second: float = Field(5.0, gt=0, le=5.0, description="IMDS allows 5/s per VM in all")
    delivery: DeliveryMode = Field(
        DeliveryMode.AUTO, description="Which events IMDS shows this VM: unit (every event of its availability set "
        "or scale-set placement group), named (only those naming it: GPU sizes of a one-fault-domain scale set) "
        "or auto (unit once this VM's own documents show an event not naming it; until then named)"
    )
    unit: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="This VM's delivery unit: its availability set, or its scale set's placement group "
        "(default: a scale-set instance's placementGroupId, which IMDS gives with its name when vm_name is not set; "
        "else unknown)"
    )

    @field_validator("url")
    @classmethod
    def _plain_http(cls, value: str) -> str:
        if not value.startswith("http://"):
            raise ValueError("IMDS is plain HTTP on a link-local address; the URL must start with http://")
        return imds_base_url(value)


def _readable(value: Path | None) -> Path | None:
    if value is not None:
        try:
            with value.open("rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {value}: {exc.strerror or exc}") from None
    return value


class ZooKeeperAuthConfig(Section):
    """Digest authentication: the agent proves it is ``username`` (ZooKeeper's ``addauth digest``)."""

    username: str = Field(pattern=r"^[^:\s]{1,64}$", description="Digest user name (no colon, no space)")
    password: SecretStr | None = Field(None, description="Its password (prefer password_file)")
    password_file: Path | None = Field(
        None, description="A file holding the password (one line; trailing newline ignored)"
    )
    _secret: str = PrivateAttr("")

    @model_validator(mode="after")
    def _one_password(self, info: ValidationInfo) -> ZooKeeperAuthConfig:
        if rules_off(info, "zookeeper.auth"):
            return self
        if (self.password is None) == (self.password_file is None):
            raise ValueError("zookeeper.auth needs exactly one of password and password_file")
        if self.password_file is not None:
            try:
                secret = self.password_file.read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"zookeeper.auth.password_file: cannot read {self.password_file}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        else:
            assert self.password is not None
            secret = self.password.get_secret_value()
        if not secret:
            raise ValueError("zookeeper.auth: the password is empty")
        self._secret = secret
        return self

    @property
    def credential(self) -> str:
        """``username:password``, as kazoo's ``auth_data`` wants it. Never log it."""
        return f"{self.username}:{self._secret}"

    @property
    def identity(self) -> Id:
        return digest_identity(self.username, self._secret)


def _identities(value: list[str]) -> list[str]:
    for text in value:
        parse_identity(text)
    return value


class ZooKeeperAclConfig(Section):
    """Who may do what in the group's namespace (see coordinator.store.zk_security)."""

    agents: list[str] = Field(
        default_factory=list,
        description="Agent identities (SCHEME:ID) besides zookeeper.auth's own digest, such as the x509 "
        "subject of the agents' client certificate: everything below the base",
    )
    operators: list[str] = Field(
        default_factory=list,
        description="Identities that may read the group, pause and resume it, and drain VMs by hand (SCHEME:ID)",
    )
    readers: list[str] = Field(
        default_factory=list, description="Identities that may read, for coordinator status (SCHEME:ID)"
    )

    _ids = field_validator("agents", "operators", "readers")(classmethod(lambda cls, v: _identities(v)))


class ZooKeeperTlsConfig(Section):
    """TLS to the ensemble's secure client port; the server's certificate is always verified."""

    ca: Path | None = Field(None, description="CA bundle (PEM) that signed the servers' certificates; "
                            "default: the system's trust store")
    certfile: Path | None = Field(None, description="Client certificate (PEM), when the servers ask for one")
    keyfile: Path | None = Field(None, description="Its private key (PEM)")
    keyfile_password: SecretStr | None = Field(None, description="Passphrase of an encrypted keyfile")
    check_hostname: bool = Field(True, description="The server's certificate must name the host connected to")

    _files = field_validator("ca", "certfile", "keyfile")(classmethod(lambda cls, v: _readable(v)))

    @model_validator(mode="after")
    def _pair(self, info: ValidationInfo) -> ZooKeeperTlsConfig:
        if rules_off(info, "zookeeper.tls"):
            return self
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("zookeeper.tls: certfile and keyfile go together")
        return self


class ZooKeeperConfig(Section):
    hosts: str = Field("127.0.0.1:2181", description="Ensemble as host:port,host:port (no chroot)")
    root: str = Field("/azure-maintenance", description="Chroot base; the cluster name is appended")
    # 20 s: the longest session with which a Preempt (30 s of notice, 5 s drain wait) can still be approved
    # before NotBefore after an agent is lost: the session lapses a tick late (2 s), so 20 + 2 + 5 < 30
    # (coordinator doctor's session-timeout rule). Shorter finds a dead agent sooner but expires on a
    # shorter pause or network cut (kazoo gives up on a silent server after two thirds of it); longer
    # rides out longer pauses but lets a lost agent hold a Preempt's approval past its NotBefore. The
    # reasoning is in docs/configuration.md ("The session timeout").
    session_timeout: float = Field(
        20.0, ge=4, le=600, description="An agent silent this long loses membership and leadership; 20 s lets "
        "every event type, a Preempt included, be approved early after an agent is lost (see The session "
        "timeout above)"
    )
    operation_timeout: float = Field(5.0, gt=0, le=60, description="Bound on every ZooKeeper call")
    tick_seconds: float = Field(
        2.0, gt=0, le=60, description="The servers' tickTime (ZooKeeper's default: 2 s). A server grants at least 2 "
        "ticks and expires a session up to a tick late: a cut-off agent serves again only once its session "
        "has certainly lapsed"
    )
    auth: ZooKeeperAuthConfig | None = Field(
        None, description="Digest credentials of the agents (username and password or password_file); with "
        "them, the group's nodes are closed to everyone but the identities of zookeeper.acl"
    )
    acl: ZooKeeperAclConfig = Field(
        default_factory=ZooKeeperAclConfig, description="Extra agent, operator and reader identities"
    )
    tls: ZooKeeperTlsConfig | None = Field(
        None, description="Connect over TLS (hosts then name the servers' secure client ports)"
    )

    @field_validator("root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or (value != "/" and value.endswith("/")) or "//" in value:
            raise ValueError("must be an absolute ZooKeeper path such as /azure-maintenance")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: str) -> str:
        for part in value.split(","):
            host_port(part.strip())
        return value

    @model_validator(mode="after")
    def _some_agent(self, info: ValidationInfo) -> ZooKeeperConfig:
        if rules_off(info, "zookeeper"):
            return self
        if (self.acl.operators or self.acl.readers) and self.auth is None and not self.acl.agents:
            raise ValueError("zookeeper.acl: operators and readers need an agent identity too (zookeeper.auth "
                             "or zookeeper.acl.agents), or the agents could not write their records")
        return self

    @property
    def acls(self) -> NodeAcls | None:
        """The namespace's ACLs, or None when it is open (no auth, no acl.agents)."""
        agents = [parse_identity(text) for text in self.acl.agents]
        if self.auth is not None:
            agents.insert(0, self.auth.identity)
        if not agents:
            return None
        return node_acls(agents, [parse_identity(t) for t in self.acl.operators],
                         [parse_identity(t) for t in self.acl.readers])

    def client_options(self, session_timeout: float | None = None) -> ClientOptions:
        """What the store's kazoo client is built from: hosts, session timeout, auth, ACLs and TLS."""
        tls = None
        if self.tls is not None:
            password = self.tls.keyfile_password
            tls = TlsOptions(
                ca=str(self.tls.ca) if self.tls.ca else None,
                certfile=str(self.tls.certfile) if self.tls.certfile else None,
                keyfile=str(self.tls.keyfile) if self.tls.keyfile else None,
                keyfile_password=password.get_secret_value() if password is not None else None,
                check_hostname=self.tls.check_hostname,
            )
        return ClientOptions(
            hosts=self.hosts,
            session_timeout=self.session_timeout if session_timeout is None else session_timeout,
            auth_data=(("digest", self.auth.credential),) if self.auth is not None else (),
            tls=tls,
            acls=self.acls,
        )
