"""Configuration: one YAML file, validated once at start, with environment overrides.

Every option has a default except ``cluster``. An environment variable
``COORDINATOR__SECTION__FIELD=value`` overrides ``section.field`` (the field's type converts the text:
``true``, ``5`` and ``1.5`` where a boolean or a number is expected, while ``on`` stays ``on`` where a
string is; ``null`` is null, ``[...]`` and ``{...}`` are YAML lists and mappings). Errors name the field:
``zookeeper.session_timeout: Input should be greater than or equal to 4``.
"""

from __future__ import annotations

import codecs
import copy
import datetime as dt
import ipaddress
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from kazoo.security import Id
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import to_jsonable_python

from coordinator.actions.connections import probe_wait_seconds
from coordinator.errors import ConfigError, InvalidName
from coordinator.maintenance_windows import WEEKDAYS, Weekday, Window
from coordinator.names import normalize_vm_name
from coordinator.store.zk_security import NodeAcls, digest_identity, node_acls, parse_identity
from coordinator.store.zk_session import ClientOptions, TlsOptions
from coordinator.support.hostos import default_state_file

__all__ = [
    "AppHealthConfig",
    "ApprovalRule",
    "ApproverMode",
    "AzureLbActionConfig",
    "DrainConfig",
    "HttpConfig",
    "ImdsConfig",
    "LoggingConfig",
    "MaintenanceWindowConfig",
    "PeersPolicy",
    "PolicyConfig",
    "ProbeConfig",
    "Settings",
    "ZooKeeperAclConfig",
    "ZooKeeperAuthConfig",
    "ZooKeeperConfig",
    "ZooKeeperTlsConfig",
    "apply_env",
    "host_problems",
    "load_settings",
    "redacted",
]

ENV_PREFIX = "COORDINATOR__"


class _Section(BaseModel):
    # No .inf or .nan anywhere: they would pass every bound (or none), then fail a later check under another
    # field's name, and check-config would print Infinity, which is not JSON.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


class ImdsConfig(_Section):
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
        "and read at once when a peer publishes an event this VM's document does not show yet"
    )
    max_requests_per_second: float = Field(5.0, gt=0, le=5.0, description="IMDS allows 5/s per VM in all")

    @field_validator("url")
    @classmethod
    def _plain_http(cls, value: str) -> str:
        if not value.startswith("http://"):
            raise ValueError("IMDS is plain HTTP on a link-local address; the URL must start with http://")
        return value.rstrip("/")


def _rules_off(info: ValidationInfo, section: str) -> bool:
    """Whether the rule between the fields of ``section`` is off for this validation: after it failed,
    to find the errors it hid (see ``_later_errors``)."""
    return isinstance(info.context, dict) and section in info.context.get("rules_off", ())


def _readable(value: Path | None) -> Path | None:
    if value is not None:
        try:
            with value.open("rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {value}: {exc.strerror or exc}") from None
    return value


class ZooKeeperAuthConfig(_Section):
    """Digest authentication: the agent proves it is ``username`` (ZooKeeper's ``addauth digest``)."""

    username: str = Field(pattern=r"^[^:\s]{1,64}$", description="Digest user name (no colon, no space)")
    password: SecretStr | None = Field(None, description="Its password (prefer password_file)")
    password_file: Path | None = Field(
        None, description="A file holding the password (one line; trailing newline ignored)"
    )
    _secret: str = PrivateAttr("")

    @model_validator(mode="after")
    def _one_password(self, info: ValidationInfo) -> ZooKeeperAuthConfig:
        if _rules_off(info, "zookeeper.auth"):
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


class ZooKeeperAclConfig(_Section):
    """Who may do what in the group's namespace (see coordinator.store.zk_security)."""

    agents: list[str] = Field(
        default_factory=list,
        description="Agent identities (SCHEME:ID) besides zookeeper.auth's own digest, such as the x509 "
        "subject of the agents' client certificate: everything below the base",
    )
    operators: list[str] = Field(
        default_factory=list, description="Identities that may read, pause and resume (SCHEME:ID)"
    )
    readers: list[str] = Field(
        default_factory=list, description="Identities that may read, for coordinator status (SCHEME:ID)"
    )

    _ids = field_validator("agents", "operators", "readers")(classmethod(lambda cls, v: _identities(v)))


class ZooKeeperTlsConfig(_Section):
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
        if _rules_off(info, "zookeeper.tls"):
            return self
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("zookeeper.tls: certfile and keyfile go together")
        return self


class ZooKeeperConfig(_Section):
    hosts: str = Field("127.0.0.1:2181", description="Ensemble as host:port,host:port (no chroot)")
    root: str = Field("/azure-maintenance", description="Chroot base; the cluster name is appended")
    session_timeout: float = Field(
        30.0, ge=4, le=600, description="An agent silent this long loses membership and leadership"
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
            _host_port(part.strip())
        return value

    @model_validator(mode="after")
    def _some_agent(self, info: ValidationInfo) -> ZooKeeperConfig:
        if _rules_off(info, "zookeeper"):
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


class ApproverMode(StrEnum):
    FIRST_RESOURCE = "first-resource"
    LEADER = "leader"


class ApprovalRule(StrEnum):
    AFTER_DRAIN = "after-drain"  # approve once every named VM has drained and acknowledged
    IMMEDIATELY = "immediately"  # approve at once, nobody drains (short, harmless impacts)
    NEVER = "never"  # never approve: the VMs drain and the event starts at NotBefore


_EVENT_KEYS = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "User")
_DEFAULT_WAIT_BY_TYPE: dict[str, float] = {"Preempt": 5.0}  # a Preempt has 30 s of notice


class PeersPolicy(StrEnum):
    BLOCK = "block"  # a VM named in Resources that runs no agent blocks early approval
    IGNORE = "ignore"  # ... is not waited for


def _clock_time(value: str) -> dt.time:
    try:
        hours, minutes = value.split(":")
        return dt.time(int(hours), int(minutes))
    except ValueError:
        raise ValueError(f"{value!r} is not a time of day as HH:MM (00:00 to 23:59)") from None


class MaintenanceWindowConfig(_Section):
    days: list[Weekday] = Field(
        default_factory=lambda: list(WEEKDAYS), description="Weekdays on which the window opens"
    )
    start: str = Field(description="Opening time, HH:MM, in timezone")
    end: str = Field(description="Closing time, HH:MM; not after start: the window runs past midnight")
    timezone: str = Field("UTC", description="IANA time zone name, such as Europe/Amsterdam")

    _times = field_validator("start", "end")(classmethod(lambda cls, v: (_clock_time(v), v)[1]))

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as UTC or Europe/Amsterdam)") from None
        return value

    @field_validator("days")
    @classmethod
    def _some_day(cls, value: list[Weekday]) -> list[Weekday]:
        if not value:
            raise ValueError("a window needs at least one day")
        return value

    def to_window(self) -> Window:
        return Window(frozenset(WEEKDAYS.index(d) for d in self.days), _clock_time(self.start),
                      _clock_time(self.end), ZoneInfo(self.timezone))


class PolicyConfig(_Section):
    approver: ApproverMode = Field(
        ApproverMode.FIRST_RESOURCE,
        description="first-resource: the first live agent named in Resources, else the leader; "
        "leader: always the leader",
    )
    approval: dict[str, ApprovalRule] = Field(
        default_factory=dict,
        description="Rule per event type (Freeze, Reboot, Redeploy, Preempt, Terminate) and for "
        "user-initiated events (key User, which wins over the type); default after-drain",
    )
    freeze_immediately_below_seconds: float | None = Field(
        None,
        ge=0,
        description="Approve a Freeze at once, without draining, when 0 <= DurationInSeconds < this",
    )
    unknown_peers: PeersPolicy = Field(
        PeersPolicy.BLOCK, description="A VM in Resources that has never run an agent: block or ignore"
    )
    absent_peer_grace_seconds: float | None = Field(
        None,
        ge=0,
        description="A VM whose agent has been gone this long counts as drained (its probe endpoint went "
        "with it); null: always wait for it",
    )
    max_events_in_maintenance: int | None = Field(
        1, ge=1, description="Disruption budget: events drained or in maintenance at once (null: no limit)"
    )
    max_vms_in_maintenance: int | None = Field(
        None, ge=1, description="Disruption budget: VMs drained or in maintenance at once (null: no limit)"
    )
    keep_one_serving: bool = Field(True, description="Never admit an event that would leave no live member serving")
    recovery_grace_seconds: float = Field(
        600.0,
        ge=0,
        description="How long a finished event's ack from a VM whose agent is down still "
        "holds the budget (the VM may still be rebooting)",
    )
    terminate_together: bool = Field(True, description="Approve Terminate events sharing one NotBefore together")
    confirm_peers_by_probe: bool = Field(
        True,
        description="Count a peer as serving, for the budget and keep_one_serving, only while its health "
        "probe answers 200 and says serving (the leader and the VMs an event names ask, as the load "
        "balancer does); needs the probe port reachable between the VMs",
    )
    peer_probe_interval_seconds: float = Field(1.0, gt=0, le=30, description="Seconds between two probes of a peer")
    peer_probe_timeout_seconds: float = Field(0.5, gt=0, le=10, description="Timeout of one probe of a peer")
    maintenance_windows: list[MaintenanceWindowConfig] = Field(
        default_factory=list,
        description="Approve early only inside one of these windows (days, start, end, timezone); outside, "
        "events are neither admitted nor approved early and start at NotBefore; empty: always",
    )

    @field_validator("approval")
    @classmethod
    def _approval_keys(cls, value: dict[str, ApprovalRule]) -> dict[str, ApprovalRule]:
        unknown = sorted(set(value) - set(_EVENT_KEYS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; expected some of {', '.join(_EVENT_KEYS)}")
        return value


class DrainConfig(_Section):
    probe_interval_seconds: float = Field(15.0, ge=1, description="The load balancer's probe interval")
    probe_threshold: int = Field(2, ge=1, description="Consecutive failed probes before the LB stops new flows")
    grace_seconds: float = Field(5.0, ge=0, description="Extra time for connections to close")
    wait_seconds: float | None = Field(
        None,
        ge=0,
        description="Time between failing the probe and acknowledging; default probe_interval_seconds x "
        "probe_threshold + grace_seconds (35 s with Azure's defaults)",
    )
    wait_seconds_by_type: dict[str, float] = Field(
        default_factory=lambda: dict(_DEFAULT_WAIT_BY_TYPE),
        description="Per event type override of wait_seconds (Preempt has only 30 s of notice); entries merge "
        "over the default {Preempt: 5}, null removes one",
    )
    latest_start_seconds: float = Field(
        120.0,
        ge=0,
        description="An event not admitted by the budget (or held by lead_time_seconds) still starts "
        "draining this long before its NotBefore",
    )
    lead_time_seconds: float | None = Field(
        None,
        ge=0,
        description="Start draining no earlier than this before NotBefore (for events announced days ahead); "
        "null: as soon as the event is admitted",
    )
    return_wait_seconds: float | None = Field(
        None,
        ge=0,
        description="After recovering, time until the load balancer routes to the VM again; only then does "
        "it count as serving for the budget; default: the drain wait",
    )
    gone_after_seconds: float = Field(
        3.0,
        ge=0,
        description="An event is gone for a VM once missing from (or no longer naming it in) at least two "
        "fresh documents over this long: a flapped read never puts a drained VM back",
    )
    unapprovable: Literal["just-in-time", "at-once"] = Field(
        "just-in-time",
        description="Events that can never be approved early (unknown type, approval never, a peer without "
        "an agent, an invalid name): drain latest_start_seconds before NotBefore, or at once",
    )

    @field_validator("wait_seconds_by_type", mode="before")
    @classmethod
    def _merge_defaults(cls, value: Any) -> Any:
        # {Reboot: 600} keeps Preempt's 5 s (a Preempt has 30 s of notice); {Preempt: null} drops it.
        if not isinstance(value, Mapping):
            return value
        merged = {**_DEFAULT_WAIT_BY_TYPE, **value}
        return {key: wait for key, wait in merged.items() if wait is not None}

    @field_validator("wait_seconds_by_type")
    @classmethod
    def _types(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(_EVENT_KEYS[:-1]))
        if unknown:
            raise ValueError(f"unknown event type(s) {', '.join(unknown)}")
        if any(v < 0 for v in value.values()):
            raise ValueError("waits must be >= 0")
        return value

    @property
    def effective_wait(self) -> float:
        if self.wait_seconds is not None:
            return self.wait_seconds
        return probe_wait_seconds(self.probe_interval_seconds, self.probe_threshold, self.grace_seconds)

    def wait_for(self, event_type: str) -> float:
        """The drain wait of an event of this type."""
        return self.wait_seconds_by_type.get(event_type, self.effective_wait)

    @model_validator(mode="after")
    def _lead(self, info: ValidationInfo) -> DrainConfig:
        if _rules_off(info, "drain"):
            return self
        short = [(t, self.wait_for(t)) for t in _EVENT_KEYS[:-1] if self.latest_start_seconds < self.wait_for(t)]
        if short:
            waits = ", ".join(f"{t} {w:g} s" for t, w in short)
            raise ValueError(
                f"drain.latest_start_seconds ({self.latest_start_seconds:g}) must be at least the drain wait of "
                f"every event type ({waits}), or a late drain cannot finish before NotBefore"
            )
        if self.lead_time_seconds is not None and self.lead_time_seconds < self.latest_start_seconds:
            raise ValueError("drain.lead_time_seconds must be at least drain.latest_start_seconds")
        return self


class HAProxyActionConfig(_Section):
    type: Literal["haproxy"]
    runtime: str = Field(description="Runtime API: a UNIX socket path, or host:port for a TCP socket")
    backend: str = Field(description="HAProxy backend of this VM's server")
    server: str = Field(description="This VM's server in that backend")
    drain_timeout_seconds: float = Field(120.0, gt=0, description="Longest wait for sessions to end")
    maint: bool = Field(False, description="After draining, put the server in maint (health checks stop)")
    fail_on_timeout: bool = Field(False, description="Sessions still open at the deadline fail the drain")
    timeout_seconds: float = Field(5.0, gt=0, description="Per runtime-API command")


class CommandActionConfig(_Section):
    type: Literal["command"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$", description="Name in logs and errors")
    drain: list[str] | None = Field(None, description="argv run when draining (never through a shell)")
    recover: list[str] | None = Field(None, description="argv run when recovering")
    timeout_seconds: float = Field(60.0, gt=0, description="The process group is killed after this")
    # Secrets (tokens): masked in repr, logs, check-config and errors; read only when the command starts.
    env: dict[str, SecretStr] = Field(default_factory=dict, description="Extra environment variables")

    @model_validator(mode="after")
    def _some_argv(self) -> CommandActionConfig:
        if not self.drain and not self.recover:
            raise ValueError("a command action needs a drain or a recover argv (a non-empty list)")
        return self


_BOTH_PHASES: list[Literal["drain", "recover"]] = ["drain", "recover"]


class WebhookActionConfig(_Section):
    type: Literal["webhook"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$", description="Name in logs and errors")
    url: str = Field(pattern=r"^https?://", description="Where to POST")
    phases: list[Literal["drain", "recover"]] = Field(
        default_factory=lambda: _BOTH_PHASES.copy(), description="Phases that call the webhook"
    )
    body: dict[str, Any] | None = Field(None, description="JSON body template: {vm} {phase} {event_ids} {event_types}")
    # Secrets (tokens): masked in repr, logs, check-config and errors; read only when a request is sent.
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="Extra HTTP headers (never logged)")
    timeout_seconds: float = Field(10.0, gt=0, description="Per attempt")
    retries: int = Field(2, ge=0, le=10, description="Retries on connection errors, timeouts, 429 and 5xx")


class ConnectionsActionConfig(_Section):
    type: Literal["connections"]
    ports: list[int] = Field(min_length=1, description="Local ports whose established connections must end")
    deadline_seconds: float = Field(300.0, gt=0, description="Longest wait for connections to close")

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        if any(not 0 < p < 65536 for p in value):
            raise ValueError("ports must be between 1 and 65535")
        return value


_POOL_ID = re.compile(
    r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/Microsoft\.Network/loadBalancers/[^/\s]+/"
    r"backendAddressPools/[^/\s]+",
    re.IGNORECASE,
)
_GUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class AzureLbActionConfig(_Section):
    """Drain through Azure Load Balancer admin state (``coordinator.actions.azure_lb``), beside the probe."""

    type: Literal["azure-lb"]
    name: str = Field("azure-lb", pattern=r"^[A-Za-z0-9_.-]{1,40}$", description="Name in logs and errors")
    backend_pools: list[str] = Field(
        min_length=1, description="Backend address pools by resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
        "providers/Microsoft.Network/loadBalancers/{lb}/backendAddressPools/{pool}"
    )
    backend_address: str = Field(
        min_length=1, max_length=256,
        description="This VM's backend address in those pools: its name, or its IP address",
    )
    client_id: str | None = Field(
        None, description="Client id of a user-assigned managed identity; default: the VM's "
        "system-assigned identity"
    )
    arm_url: str = Field("https://management.azure.com", description="Azure Resource Manager's base URL")
    imds_url: str = Field("http://169.254.169.254", description="IMDS base URL, for the managed identity's token")
    api_version: str = Field("2023-09-01", pattern=r"^\d{4}-\d{2}-\d{2}(-preview)?$",
                             description="Microsoft.Network api-version (admin state needs 2023-09-01 or later)")
    timeout_seconds: float = Field(10.0, gt=0, le=60, description="Per HTTP request to IMDS or ARM")
    deadline_seconds: float = Field(
        60.0, gt=0, le=600, description="All ARM work of one drain or recovery; then the drain falls back to "
        "the probe, and a recovery is retried"
    )
    fallback_wait_seconds: float | None = Field(
        None, ge=0, description="How long a drain that could not use ARM lasts at least, so that the probe's lag "
        "is waited out; default drain.probe_interval_seconds x drain.probe_threshold + drain.grace_seconds"
    )

    @field_validator("backend_pools")
    @classmethod
    def _pool_ids(cls, value: list[str]) -> list[str]:
        for index, pool in enumerate(value):
            if not _POOL_ID.fullmatch(pool):
                raise ValueError(
                    f"item {index} ({pool!r}) is not a backend address pool resource id: expected /subscriptions/"
                    "{sub}/resourceGroups/{rg}/providers/Microsoft.Network/loadBalancers/{lb}/backendAddressPools/"
                    "{pool}"
                )
        if len({p.lower() for p in value}) != len(value):
            raise ValueError("a backend address pool is listed twice")
        return value

    @field_validator("client_id")
    @classmethod
    def _guid(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(_GUID, value):
            raise ValueError(f"must be the user-assigned identity's client id, a GUID, got {value!r}")
        return value

    @field_validator("arm_url")
    @classmethod
    def _arm_https(cls, value: str) -> str:
        value = value.rstrip("/")
        try:
            split = urlsplit(value)
            host = split.hostname or ""
            split.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            raise ValueError(f"not a URL: {value!r}") from None
        if split.query or split.fragment or not host:
            raise ValueError(f"must be a base URL such as https://management.azure.com, got {value!r}")
        if split.scheme == "https":
            return value
        if split.scheme == "http" and host in _LOOPBACK_HOSTS:
            return value  # the simulator: a bearer token never leaves the machine in clear
        raise ValueError("must start with https:// (plain http:// only to a loopback address, for tests): the "
                         "request carries the VM's bearer token")

    @field_validator("imds_url")
    @classmethod
    def _imds_http(cls, value: str) -> str:
        if not value.startswith("http://"):
            raise ValueError("IMDS is plain HTTP on a link-local address; the URL must start with http://")
        return value.rstrip("/")


ActionConfig = Annotated[
    HAProxyActionConfig | CommandActionConfig | WebhookActionConfig | ConnectionsActionConfig | AzureLbActionConfig,
    Field(discriminator="type"),
]


class ProbeConfig(_Section):
    listen: str = Field("0.0.0.0:8090", description="Address the load balancer probes")
    path: str = Field("/health", description="HTTP path of the health probe")
    advertise: str | None = Field(
        None,
        description="HOST:PORT at which the peers reach this probe (policy.confirm_peers_by_probe); "
        "default: probe.listen, a wildcard host replaced by this VM's address toward ZooKeeper",
    )

    _listen = field_validator("listen")(classmethod(lambda cls, v: _host_port(v)))
    _advertise = field_validator("advertise")(classmethod(lambda cls, v: v if v is None else _host_port(v)))


class HttpConfig(_Section):
    listen: str = Field("127.0.0.1:9110", description="/metrics, /status, /livez, /readyz, and app_health.path")

    _listen = field_validator("listen")(classmethod(lambda cls, v: _host_port(v)))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ADMIN_PATHS = ("/metrics", "/status", "/livez", "/readyz")


class AppHealthConfig(_Section):
    listen: str | None = Field(
        None, description="HOST:PORT of a listener of its own for the Application Health extension's endpoint "
        "(the extension asks localhost); null: served on http.listen only"
    )
    path: str = Field(
        "/apphealth", description="HTTP path of the application health endpoint (rich health states: 200 and "
        '{"ApplicationHealthState": "Healthy"} or "Unhealthy"), on http.listen and on app_health.listen'
    )
    stuck_after_seconds: float = Field(
        600.0, ge=60, description="Unhealthy once the agent's loop has completed no cycle for this long "
        "(/livez fails much sooner: that one is for alerts, this one may get the VM repaired)"
    )
    recover_failing_after_seconds: float | None = Field(
        1800.0, gt=0, description="Unhealthy once the VM's recovery, after its events are gone, has kept "
        "failing this long; null: never for that. Never Unhealthy while drained, nor for ZooKeeper or IMDS"
    )

    @field_validator("listen")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host = _host_port(value).rpartition(":")[0].strip("[]")
        if host not in ("localhost", "0.0.0.0", "::", "") and not _is_loopback(host):
            raise ValueError(f"the extension asks http://localhost:PORT: bind a loopback address or a wildcard "
                             f"(127.0.0.1, 0.0.0.0), not {host!r}")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*", value):
            raise ValueError(f"must be a URL path starting with / (no query, fragment or space), got {value!r}")
        if value in ADMIN_PATHS:
            raise ValueError(f"{value} is an admin endpoint of http.listen; choose another path")
        return value


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level (any case)")
    format: Literal["text", "json"] = Field(
        "text", description="text for people, json (one object per line) for shippers"
    )

    @field_validator("level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class Settings(_Section):
    cluster: str = Field(description="Name of the VM group; one ZooKeeper chroot per cluster")
    vm_name: str | None = Field(
        None, description="This VM's name as it appears in Resources; default: learned from IMDS"
    )
    imds: ImdsConfig = ImdsConfig()
    zookeeper: ZooKeeperConfig = ZooKeeperConfig()
    policy: PolicyConfig = PolicyConfig()
    drain: DrainConfig = DrainConfig()
    probe: ProbeConfig = ProbeConfig()
    http: HttpConfig = HttpConfig()
    app_health: AppHealthConfig = AppHealthConfig()
    logging: LoggingConfig = LoggingConfig()
    actions: list[ActionConfig] = Field(
        default_factory=list,
        description="Drain actions after the health probe, in order; recovery runs them in reverse",
    )
    state_file: Path | None = Field(
        default_factory=default_state_file,
        description="Where the drain state survives restarts and reboots (null: not kept); default "
        "/var/lib/coordinator/state.json, on Windows %ProgramData%\\coordinator\\state.json",
    )
    done_retention_seconds: float = Field(
        7 * 24 * 3600.0, ge=0, description="How long the leader keeps records of finished events"
    )

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        try:
            return normalize_vm_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc).replace("VM name", "cluster name")) from None

    @field_validator("vm_name")
    @classmethod
    def _vm_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return normalize_vm_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _timing(self) -> Settings:
        problems = self.cross_field_problems()
        if problems:
            raise ValueError("\n  ".join(problems))  # one line each in the report
        return self

    def cross_field_problems(self) -> list[str]:
        """Every rule between fields that this configuration breaks, each message naming its fields."""
        problems = []
        # A session must outlive a few polls, or one slow cycle costs the leader its session.
        if self.zookeeper.session_timeout < 3 * self.imds.poll_interval:
            problems.append(
                "zookeeper.session_timeout must be at least 3 x imds.poll_interval "
                f"({self.zookeeper.session_timeout:g} < 3 x {self.imds.poll_interval:g})"
            )
        if self.imds.backoff_max_seconds < self.imds.poll_interval:
            problems.append(
                "imds.backoff_max_seconds must be at least imds.poll_interval "
                f"({self.imds.backoff_max_seconds:g} < {self.imds.poll_interval:g})"
            )
        names = [a.name for a in self.actions
                 if isinstance(a, CommandActionConfig | WebhookActionConfig | AzureLbActionConfig)]
        if len(names) != len(set(names)):
            problems.append("actions: two actions share a name: " + ", ".join(sorted(names)))
        if self.zookeeper.operation_timeout >= self.zookeeper.session_timeout:
            problems.append("zookeeper.operation_timeout must be shorter than zookeeper.session_timeout")
        grace = self.policy.absent_peer_grace_seconds
        longest_wait = max([self.drain.effective_wait, *self.drain.wait_seconds_by_type.values()])
        if grace is not None and grace < longest_wait:
            problems.append(
                f"policy.absent_peer_grace_seconds ({grace:g}) must be at least the longest drain wait "
                f"({longest_wait:g}): a VM cut off from ZooKeeper drains itself that long before its peers "
                "stop waiting for it"
            )
        if _same_socket(self.probe.listen, self.http.listen):
            problems.append(
                f"probe.listen and http.listen must be different ports ({self.probe.listen} and "
                f"{self.http.listen}): the health probe and the admin endpoints each need their own listener"
            )
        health = self.app_health
        idle_cycles = 3 * max(5.0, 2 * self.imds.poll_interval)  # the loop's longest quiet gap, three times
        if health.stuck_after_seconds < idle_cycles:
            problems.append(
                f"app_health.stuck_after_seconds ({health.stuck_after_seconds:g}) must be at least three idle "
                f"cycles of the agent's loop ({idle_cycles:g} s: 3 x max(5, 2 x imds.poll_interval)): a quiet "
                "loop is not a stuck one"
            )
        if health.path == self.probe.path:
            problems.append(
                f"app_health.path and probe.path must differ (both {health.path}): the admin listener serves "
                "both, and the load balancer's drain probe must keep its own answer"
            )
        if health.listen is not None:
            for option, other in (("probe.listen", self.probe.listen), ("http.listen", self.http.listen)):
                if _same_socket(health.listen, other):
                    problems.append(
                        f"app_health.listen and {option} must be different ports ({health.listen} and {other}): "
                        "the application health endpoint's own listener cannot share theirs (leave "
                        "app_health.listen null to serve it on http.listen)"
                    )
        return problems


def _same_socket(a: str, b: str) -> bool:
    """Whether two HOST:PORT listeners would collide: one port, and one host or a wildcard on either side."""
    host_a, _, port_a = a.rpartition(":")
    host_b, _, port_b = b.rpartition(":")
    wildcard = ("", "0.0.0.0", "::", "[::]", "*")
    return int(port_a) == int(port_b) != 0 and (host_a == host_b or host_a in wildcard or host_b in wildcard)


def _env_path(key: str) -> tuple[str, ...]:
    return tuple(p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p)


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """The options the environment sets, as paths into the configuration, each with its variable's name."""
    return {path: key for key in sorted(environ) if key.startswith(ENV_PREFIX) and (path := _env_path(key))}


def env_value(key: str, raw: str) -> Any:
    """The value of one override. No YAML 1.1 guessing: a plain word stays a string (``on``, ``no`` and
    ``0700`` included) and the field's type converts it where it expects a number or a boolean; ``null``
    or ``~`` is null; a value that starts as a YAML flow list, mapping or quoted string is read as such."""
    text = raw.strip()
    if text in ("null", "Null", "NULL", "~"):
        return None
    if text[:1] in ("[", "{", '"', "'"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError(f"{key}: {problem} in its value {raw[:80]!r}") from None
    return raw


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    merged = dict(data)
    for path, key in env_overrides(environ).items():
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = env_value(key, environ[key])
    return merged


def _in_file(data: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not in_list and not (isinstance(data, dict) and part in data):
            return False
        data = data[part]
    return True


def _variable_of(loc: tuple[str | int, ...], overrides: Mapping[tuple[str, ...], str], file_data: Any) -> str | None:
    """The environment variable an error at ``loc`` comes from, if any: one that sets ``loc`` or an option
    inside it, or one that creates ``loc`` (a misspelt section) where the file has nothing."""
    for path, key in overrides.items():
        if loc[: len(path)] == path:
            return key
    for path, key in overrides.items():
        if loc and path[: len(loc)] == loc and not _in_file(file_data, loc):
            return key
    return None


def _later_errors(data: dict[str, Any], exc: ValidationError, overrides: Mapping[tuple[str, ...], str],
                  file_data: Any) -> list[str]:
    """The errors pydantic reports only once the first ones are fixed: a rule between fields runs only when
    every field it reads is valid. The invalid values are taken out (their fields fall back to defaults, a
    bad list item is dropped), the rules of sections that failed already are turned off, and the rest is
    validated again, until nothing more comes up."""
    lines: list[str] = []
    rules_off: set[str] = set()
    for _ in range(4):
        data = copy.deepcopy(data)
        if not _take_out(data, [tuple(error["loc"]) for error in exc.errors()], rules_off):
            break
        try:
            Settings.model_validate(data, context={"rules_off": rules_off})
            break
        except ValidationError as again:
            exc = again
            lines += _error_lines(again, overrides, file_data)
    return lines


def _take_out(data: dict[str, Any], locs: list[tuple[str | int, ...]], rules_off: set[str]) -> bool:
    """Remove what each error points at: the value (a missing cluster gets a stand-in), or the list item
    it lies in. An error about a whole section that is a mapping comes from a rule between its fields: that
    rule is turned off (added to ``rules_off``). Returns whether anything changed."""
    targets: set[tuple[str | int, ...]] = set()
    changed = False
    for loc in locs:
        if loc == ("cluster",) and "cluster" not in data:
            data["cluster"] = "stand-in"
            changed = True
            continue
        node: Any = data
        path: list[str | int] = []
        for part in loc:
            if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                path.append(part)
                break  # the whole item goes
            if not isinstance(node, dict) or part not in node:
                path = []
                break
            path.append(part)
            node = node[part]
        else:
            section = ".".join(str(p) for p in loc)
            if isinstance(node, dict) and loc and section not in rules_off:
                rules_off.add(section)  # a section that is a mapping: its own rule failed
                changed = True
                path = []
            elif isinstance(node, dict):
                path = []
        if path:
            targets.add(tuple(path))
    # Deepest and last first, so that taking out one list item does not move another still to go.
    for target in sorted(targets, key=lambda t: [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in t],
                         reverse=True):
        *parents, last = target
        node = data
        try:
            for part in parents:
                node = node[part]
            del node[last]
            changed = True
        except (KeyError, IndexError, TypeError):
            pass
    return changed


def _error_lines(exc: ValidationError, overrides: Mapping[tuple[str, ...], str], file_data: Any) -> list[str]:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        where = ".".join(str(p) for p in loc)
        message = error["msg"].removeprefix("Value error, ")
        # Cross-field checks name their fields themselves, from the top.
        line = message if not where or message.startswith(where + ".") else f"{where}: {message}"
        variable = _variable_of(loc, overrides, file_data)
        lines.append(f"{variable} (environment): {line}" if variable else line)
    return lines


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        if any(key_node.tag == "tag:yaml.org,2002:merge" for key_node, _ in node.value):
            return super().construct_mapping(node, deep=deep)  # `<<: *base` then overrides: meant
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, list | dict):
                continue  # unhashable: the constructor below refuses it
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(f"line {line}: the key {key!r} is given twice (first on line {seen[key]}); "
                                    "YAML would keep only the last")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16 LE: its BOM starts with UTF-16 LE's
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),  # Windows PowerShell 5.1 writes this with `>` and Out-File
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_config(raw: bytes, path: Path) -> str:
    """The text of a configuration file: UTF-8, or UTF-8, UTF-16 or UTF-32 with a byte order mark. Any
    other bytes raise ``ConfigError`` naming the file and the offset of the first undecodable byte."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not {exc.encoding.upper()} text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            "cannot be decoded; save the file as UTF-8"
        ) from None


def load_settings(path: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read, merge environment overrides and validate. Raises ``ConfigError`` naming the field."""
    data: Any = {}
    if path is not None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        text = decode_config(raw, path)
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # a SafeLoader
        except _DuplicateKey as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    environ = os.environ if environ is None else environ
    file_data = data
    data = apply_env(data, environ)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = _error_lines(exc, env_overrides(environ), file_data)
        lines += [line for line in _later_errors(data, exc, env_overrides(environ), file_data) if line not in lines]
        if all(line.startswith(ENV_PREFIX) for line in lines):
            where = "invalid configuration from the environment" + (f" (over {path})" if path else "")
        else:
            where = (f"{path}: " if path else "") + "invalid configuration"
        raise ConfigError(where + ":\n  " + "\n  ".join(lines)) from None


def host_problems(settings: Settings, *, at_start: bool) -> tuple[list[str], list[str]]:
    """What this machine would refuse the agent that the file alone cannot tell, as (errors, warnings): the
    state file must be writable, with its directory (it is replaced atomically), or every cycle would fail
    to save it. A directory still missing is created by the agent (or by systemd's StateDirectory before
    it starts): ``check-config`` (``at_start`` False), perhaps run by another user, only warns when this
    user could not create it; the agent itself (``at_start`` True) refuses to start."""
    path = settings.state_file
    if path is None:
        return [], []
    as_user = f" (checked as user {_user_name()})"
    if path.is_dir():
        return [f"state_file: {path} is a directory; name a file in it"], []
    if path.exists() and not os.access(path, os.W_OK):
        return [f"state_file: cannot write {path}: permission denied{as_user}"], []
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return [f"state_file: cannot create {path}: {ancestor} is not a directory"], []
    if os.access(ancestor, os.W_OK | os.X_OK):
        return [], []
    if ancestor == path.parent:
        return [f"state_file: cannot write files in {ancestor}: permission denied{as_user}"], []
    message = f"state_file: cannot create {path.parent} in {ancestor}: permission denied{as_user}"
    if at_start:
        return [message], []
    return [], [message + "; fine if the agent runs as another user or systemd creates it (StateDirectory)"]


def _user_name() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


REDACTED = "<redacted>"


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective configuration for logging and ``check-config``: every secret (webhook header values,
    command environment values: they carry tokens) is shown as ``<redacted>``, its name kept. Secrets are
    found by their type, so a secret field added later is masked too."""
    return dict(to_jsonable_python(_mask_secrets(settings.model_dump())))


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return REDACTED
    if isinstance(value, dict):
        return {key: _mask_secrets(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_secrets(item) for item in value]
    return value
