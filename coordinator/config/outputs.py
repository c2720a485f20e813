"""What the agent serves and writes: the load balancer's health probe (``probe``), the admin listener
(``http``), the Application Health extension's endpoint (``app_health``) and the log (``logging``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from coordinator.config.base import Section, host_port

__all__ = [
    "ADMIN_PATHS",
    "AppHealthConfig",
    "HttpConfig",
    "LoggingConfig",
    "ProbeConfig",
]


class ProbeConfig(Section):
    listen: str = Field("0.0.0.0:8090", description="Address the load balancer probes")
    path: str = Field("/health", description="HTTP path of the health probe")
    advertise: str | None = Field(
        None,
        description="HOST:PORT at which the peers reach this probe (policy.confirm_peers_by_probe); "
        "default: probe.listen, a wildcard host replaced by this VM's address toward ZooKeeper",
    )

    _listen = field_validator("listen")(classmethod(lambda cls, v: host_port(v)))
    _advertise = field_validator("advertise")(classmethod(lambda cls, v: v if v is None else host_port(v)))


class HttpConfig(Section):
    listen: str = Field("127.0.0.1:9110", description="/metrics, /status, /livez, /readyz, and app_health.path")

    _listen = field_validator("listen")(classmethod(lambda cls, v: host_port(v)))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ADMIN_PATHS = ("/metrics", "/status", "/livez", "/readyz")


class AppHealthConfig(Section):
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
        "failing this long; null: never for that. Never Unhealthy while drained, nor for ZooKeeper, IMDS or ARM"
    )

    @field_validator("listen")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host = host_port(value).rpartition(":")[0].strip("[]")
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


class LoggingConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level (any case)")
    format: Literal["text", "json"] = Field(
        "text", description="text for people, json (one object per line) for shippers"
    )

    @field_validator("level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value
