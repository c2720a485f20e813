"""What a fleet of 10,000 VMs would ask of one ZooKeeper ensemble in its busiest hour: a pure model of measured
inputs only.

Inputs, per group size and VMs per event: what one event cost the whole group in ZooKeeper requests, counted
by the server (``bench/event_cost.py``: every request of every agent's session from the event's appearance
until the group is quiet again, writes included, pings excluded), and what the group costs while idle
(``fleet_inputs`` reads both from ``results["cost"]``). A size or an event size the benchmark has not
measured has no row: nothing is assumed. The ceiling is the ensemble's measured throughput for the agents'
mix (``results["ceiling"]["result"]["ceiling"]``, see ``bench/zk_ceiling.py``).

The busiest hour: every VM of the fleet is in maintenance once, in events naming ``event_vms`` VMs each,
so a group of N VMs has N / k events in the hour, each costing what one event cost a group of that size.
Sessions ping after a third of the session timeout without traffic (``SESSION_TIMEOUT``, the product's
default ``zookeeper.session_timeout``, read from its configuration): listed apart, they are not in the
measured mix and their cost to an ensemble is not measured here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.config.services import ZooKeeperConfig

__all__ = ["SESSION_TIMEOUT", "EventCost", "FleetRow", "fleet_inputs", "fleet_model"]

FLEET_VMS = 10_000
# The product's default zookeeper.session_timeout, which the model's fleet runs with: taken from the
# configuration so that the model follows it. kazoo pings after a third of it without traffic.
SESSION_TIMEOUT = float(ZooKeeperConfig.model_fields["session_timeout"].default)


@dataclass(frozen=True)
class EventCost:
    """What one event of ``event_vms`` VMs cost a group of ``size`` agents (the largest of ``events``
    measured), and what the group cost while idle, in requests per second."""

    size: int
    event_vms: int
    requests_per_event: float
    idle_requests_per_s: float
    events: int


@dataclass(frozen=True)
class FleetRow:
    cost: EventCost
    groups: int
    events_per_s_group: float
    requests_per_s_group: float  # the events' requests, and the idle cost
    requests_per_s_fleet: float
    pings_per_s_fleet: float
    fraction_of_ceiling: float | None  # requests_per_s_fleet / ceiling; None without a ceiling


def fleet_model(ceiling: float | None, costs: Sequence[EventCost], *, vms: int = FLEET_VMS,
                session_timeout: float = SESSION_TIMEOUT) -> list[FleetRow]:
    """One row per measured cost (see the module docstring). ``ceiling``: the ensemble's requests/s for the
    agents' mix, or None when not measured."""
    rows = []
    for cost in costs:
        groups = vms // cost.size
        events_per_s = cost.size / cost.event_vms / 3600  # every VM of the group in maintenance once
        per_group = events_per_s * cost.requests_per_event + cost.idle_requests_per_s
        fleet = per_group * groups
        rows.append(FleetRow(cost, groups, events_per_s, per_group, fleet, groups * cost.size / (session_timeout / 3),
                             fleet / ceiling if ceiling else None))
    return rows


def fleet_inputs(results: Mapping[str, Any]) -> list[EventCost]:
    """The measured costs of ``results["cost"]["sizes"]`` (``bench/event_cost.py``), ordered by VMs per event
    then group size: for each, the largest of the events measured, and the idle window's requests per
    second. Empty when nothing was measured."""
    sizes = ((results.get("cost") or {}).get("sizes")) or []
    found = []
    for entry in sizes:
        idle = entry.get("idle") or {}
        seconds = float(idle.get("seconds") or 0)
        idle_rate = float(idle.get("requests", 0)) / seconds if seconds > 0 else 0.0
        for k, runs in (entry.get("events") or {}).items():
            if runs:
                found.append(EventCost(int(entry["size"]), int(k), float(max(run["requests"] for run in runs)),
                                       idle_rate, len(runs)))
    return sorted(found, key=lambda c: (c.event_vms, c.size))
