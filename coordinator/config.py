"""Configuration: one YAML file, validated once at start, with environment overrides.

Every option has a default except ``cluster``. An environment variable
``COORDINATOR__SECTION__FIELD=value`` overrides ``section.field`` (values are parsed as YAML scalars,
so ``true``, ``5`` and ``1.5`` have their natural types). Errors name the field:
``zookeeper.session_timeout: Input should be greater than or equal to 4``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coordinator.errors import ConfigError, InvalidName
from coordinator.names import normalize_vm_name

__all__ = [
    "ApproverMode",
    "DrainConfig",
    "HttpConfig",
    "ImdsConfig",
    "LoggingConfig",
    "PolicyConfig",
    "ProbeConfig",
    "Settings",
    "ZooKeeperConfig",
    "load_settings",
    "redacted",
]

ENV_PREFIX = "COORDINATOR__"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


class ImdsConfig(_Section):
    url: str = Field("http://169.254.169.254", description="IMDS base URL (the simulator's per-VM URL in tests)")
    api_version: str = "2020-07-01"
    poll_interval: float = Field(1.0, gt=0, le=30, description="Seconds between polls; Microsoft advises 1 s")
    request_timeout: float = Field(10.0, gt=0)
    first_request_timeout: float = Field(120.0, gt=0, description="The first call may take up to 2 minutes")
    max_attempts: int = Field(3, ge=1, le=10)
    max_requests_per_second: float = Field(5.0, gt=0, le=5.0, description="IMDS allows 5/s per VM in all")

    @field_validator("url")
    @classmethod
    def _plain_http(cls, value: str) -> str:
        if not value.startswith("http://"):
            raise ValueError("IMDS is plain HTTP on a link-local address; the URL must start with http://")
        return value.rstrip("/")


class ZooKeeperConfig(_Section):
    hosts: str = "127.0.0.1:2181"
    root: str = Field("/azure-maintenance", description="Chroot base; the cluster name is appended")
    session_timeout: float = Field(30.0, ge=4, le=600)
    operation_timeout: float = Field(5.0, gt=0, le=60)

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


class ApproverMode(StrEnum):
    FIRST_RESOURCE = "first-resource"
    LEADER = "leader"


class PolicyConfig(_Section):
    approver: ApproverMode = Field(
        ApproverMode.FIRST_RESOURCE,
        description="first-resource: the first live agent named in Resources, else the leader; "
        "leader: always the leader",
    )


class DrainConfig(_Section):
    wait_seconds: float = Field(
        35.0,
        ge=0,
        description="Time between failing the health probe and acknowledging: probe interval x "
        "threshold (Azure defaults 15 s x 2) plus a grace for connections to close",
    )


class ProbeConfig(_Section):
    listen: str = Field("0.0.0.0:8090", description="Address the load balancer probes")
    path: str = "/health"

    _listen = field_validator("listen")(classmethod(lambda cls, v: _host_port(v)))


class HttpConfig(_Section):
    listen: str = Field("127.0.0.1:9110", description="/metrics, /status, /livez")

    _listen = field_validator("listen")(classmethod(lambda cls, v: _host_port(v)))


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


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
    logging: LoggingConfig = LoggingConfig()
    done_retention_seconds: float = Field(7 * 24 * 3600.0, ge=0)

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
        # A session must outlive a few polls, or one slow cycle costs the leader its session.
        if self.zookeeper.session_timeout < 3 * self.imds.poll_interval:
            raise ValueError(
                "zookeeper.session_timeout must be at least 3 x imds.poll_interval "
                f"({self.zookeeper.session_timeout} < 3 x {self.imds.poll_interval})"
            )
        if self.zookeeper.operation_timeout >= self.zookeeper.session_timeout:
            raise ValueError("zookeeper.operation_timeout must be shorter than zookeeper.session_timeout")
        return self


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    merged = dict(data)
    for key, raw in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = yaml.safe_load(raw) if raw != "" else ""
    return merged


def load_settings(path: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read, merge environment overrides and validate. Raises ``ConfigError`` naming the field."""
    data: Any = {}
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    data = _apply_env(data, os.environ if environ is None else environ)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{loc}: {message}")
        where = f"{path}: " if path else ""
        raise ConfigError(where + "invalid configuration:\n  " + "\n  ".join(lines)) from None


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective configuration for logging. No option holds a secret yet; ZooKeeper credentials,
    when added, are masked here."""
    return settings.model_dump(mode="json")
