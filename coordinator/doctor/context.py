"""What every ``coordinator doctor`` check shares: the ``Context`` it reads and fills in (the settings, the
deadline, what earlier checks observed), what a check is (``Check``), the IMDS answer the clock check
reads (``ImdsSeen``, noted by ``RecordingTransport``), and the command line's ARM options and what the
azure check read (``ArmOptions``, ``AzureSeen``).

The checks of ``coordinator.doctor.checks`` and ``coordinator.doctor.azure`` both build on it; it imports
neither.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from coordinator.config import Settings
from coordinator.doctor.outcome import Verdict
from coordinator.imds_retry import retry_after_of

if TYPE_CHECKING:
    from coordinator.groupstatus.read import GroupReader
    from coordinator.models import Document

__all__ = ["ArmOptions", "AzureSeen", "Check", "Context", "ImdsSeen", "RecordingTransport"]


@dataclass(frozen=True)
class ArmOptions:
    """The command line's ARM options."""

    enabled: bool = False  # --arm (or any other ARM option)
    arm_url: str | None = None
    resource_id: str | None = None
    load_balancers: tuple[str, ...] = ()
    client_id: str | None = None


@dataclass
class AzureSeen:
    """What the azure check read: resources by id (lower case), and what could not be read."""

    load_balancers: dict[str, dict[str, Any]] = field(default_factory=dict)
    scale_set: dict[str, Any] | None = None
    vm: dict[str, Any] | None = None
    availability_set: dict[str, Any] | None = None  # the VM's, when it is in one
    scale_set_id: str | None = None
    vm_id: str | None = None
    availability_set_id: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class ImdsSeen:
    """What the IMDS check saw, for the clock check."""

    answered: bool
    date: str | None = None  # the Date header of the Scheduled Events answer
    sent: float = 0.0  # wall clock before the request
    received: float = 0.0  # wall clock once its headers arrived


@dataclass
class Context:
    """What every check reads: the agent's settings, the run's deadline (``time.monotonic``), the
    environment, and what earlier checks observed."""

    settings: Settings
    config_path: Path
    deadline: float
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    vm: str | None = None  # this VM's name: vm_name, else IMDS's
    imds: ImdsSeen | None = None
    zookeeper: GroupReader | None = None  # the open session, read-only
    zookeeper_error: str | None = None
    cluster_exists: bool = False
    granted: float | None = None
    members: dict[str, dict[str, object]] | None = None
    # Read with the members: each VM an open event record names that runs no agent -> those events, and
    # every VM the group has seen (registered).
    unattended: dict[str, list[str]] = field(default_factory=dict)
    registered: frozenset[str] = frozenset()
    arm: ArmOptions = field(default_factory=ArmOptions)
    compute_resource_id: str | None = None  # IMDS compute.resourceId
    document: Document | None = None  # the Scheduled Events document the imds check read
    placement_group: str | None = None  # IMDS compute.placementGroupId ("" outside a scale set; None: not read)
    azure: AzureSeen | None = None  # what the azure check read

    def remaining(self, cap: float | None = None) -> float:
        """Seconds left before the deadline (at least 0.1), at most ``cap``."""
        left = max(0.1, self.deadline - time.monotonic())
        return left if cap is None else min(cap, left)

    def close(self) -> None:
        if self.zookeeper is not None:
            self.zookeeper.close()
            self.zookeeper = None


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[Context], Verdict]


class RecordingTransport(httpx.BaseTransport):
    """The transport under the agent's IMDS client here: notes the wall clock around each request, the
    answer's ``Date`` header, and the ``Retry-After`` of the last answer (seconds; None when it had none,
    in the form the agent reads). No proxy, as the client's own transport (``trust_env=False``).
    ``inner`` replaces the network (tests)."""

    def __init__(self, url: str, inner: httpx.BaseTransport | None = None) -> None:
        # IMDS speaks plain HTTP; an https URL (a front of one's own) is verified as the agent verifies it.
        self._inner = inner or httpx.HTTPTransport(trust_env=False, verify=httpx.URL(url).scheme != "http")
        self.last: ImdsSeen | None = None
        self.retry_after: float | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.time()
        response = self._inner.handle_request(request)
        self.retry_after = retry_after_of(response)
        if request.url.path.endswith("/scheduledevents"):
            self.last = ImdsSeen(True, response.headers.get("Date"), sent, time.time())
        return response

    def close(self) -> None:
        self._inner.close()
