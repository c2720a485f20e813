"""The entries of ``actions``, run after the health probe when draining: HAProxy's runtime API, a command,
a webhook, open connections, and Azure Load Balancer admin state; ``ActionConfig`` picks one by ``type``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from coordinator.config.base import Section, imds_base_url

__all__ = [
    "ActionConfig",
    "AzureLbActionConfig",
    "CommandActionConfig",
    "ConnectionsActionConfig",
    "HAProxyActionConfig",
    "WebhookActionConfig",
]


class HAProxyActionConfig(Section):
    type: Literal["haproxy"]
    runtime: str = Field(description="Runtime API: a UNIX socket path, or host:port for a TCP socket")
    backend: str = Field(description="HAProxy backend of this VM's server")
    server: str = Field(description="This VM's server in that backend")
    drain_timeout_seconds: float = Field(120.0, gt=0, description="Longest wait for sessions to end")
    maint: bool = Field(False, description="After draining, put the server in maint (health checks stop)")
    fail_on_timeout: bool = Field(False, description="Sessions still open at the deadline fail the drain")
    timeout_seconds: float = Field(5.0, gt=0, description="Per runtime-API command")


class CommandActionConfig(Section):
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


class WebhookActionConfig(Section):
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



class ConnectionsActionConfig(Section):
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


class AzureLbActionConfig(Section):
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
        return imds_base_url(value)


ActionConfig = Annotated[
    HAProxyActionConfig | CommandActionConfig | WebhookActionConfig | ConnectionsActionConfig | AzureLbActionConfig,
    Field(discriminator="type"),
]
