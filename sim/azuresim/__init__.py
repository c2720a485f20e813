"""A simulator of the Azure Instance Metadata Service's Scheduled Events, for tests and demos.

``SimulatedGroup`` is the pure model (events, lifecycle, log, faults) driven by an injected clock;
``SimulatorServer`` serves it over HTTP with one port per VM and a JSON control port; ``SimControl``
is a client of that control port. ``azure-sim`` (also ``python -m azuresim``, or the agent's
``coordinator imds-sim``) runs it.
"""

from typing import TYPE_CHECKING, Any

from azuresim.catalogue import MINIMUM_NOTICE, SCHEDULED_EVENTS_API_VERSIONS, VmInfo
from azuresim.errors import InvalidRequest, SimulatorError, UnknownEvent, UnknownVm
from azuresim.faults import Fault
from azuresim.group import SimulatedGroup
from azuresim.ratelimit import RateLimiter
from azuresim.server import DEFAULT_RATE_LIMIT, SimulatorServer, format_url

if TYPE_CHECKING:
    from azuresim.client import SimControl, SimControlError

__all__ = [
    "DEFAULT_RATE_LIMIT",
    "MINIMUM_NOTICE",
    "SCHEDULED_EVENTS_API_VERSIONS",
    "Fault",
    "InvalidRequest",
    "RateLimiter",
    "SimControl",
    "SimControlError",
    "SimulatedGroup",
    "SimulatorError",
    "SimulatorServer",
    "UnknownEvent",
    "UnknownVm",
    "VmInfo",
    "format_url",
]


def __getattr__(name: str) -> Any:
    # The client needs httpx, which the simulator process itself never uses: import it on demand.
    if name in ("SimControl", "SimControlError"):
        from azuresim import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
