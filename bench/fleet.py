"""What a fleet of 10,000 VMs would ask of one ZooKeeper ensemble in its busiest hour: a pure model.

Inputs, per group size: how many ZooKeeper requests one agent sends per change it is told of
(``requests_per_agent_per_change``), and how many changes an event makes (``changes_per_event``, for
events naming ``event_vms`` VMs). They are read from ``results["groups"]["result"]["sizes"][str(size)]``
when a benchmark has measured them (``fleet_inputs``), and otherwise assumed (``ASSUMED``), each row
saying which. The ceiling is the ensemble's measured throughput for the agents' mix
(``results["ceiling"]["result"]["ceiling"]``, see ``bench/zk_ceiling.py``).

The busiest hour: every VM of the fleet is in maintenance once, in events naming ``event_vms`` VMs
each. An event of k VMs makes ``changes_per_event + PER_VM_CHANGES * (k - measured event_vms)``
changes: the protocol records four moments per VM that the others must see (out of rotation, drained,
ack withdrawn, back in rotation). Every agent of the group is told of every change and sends
``requests_per_agent_per_change`` for it; each change is one write. Sessions ping after a third of
the session timeout without traffic (``SESSION_TIMEOUT``, the product's default
``zookeeper.session_timeout``, read from its configuration): listed apart, they are not in the measured mix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.config.services import ZooKeeperConfig

__all__ = ["ASSUMED", "SESSION_TIMEOUT", "FleetRow", "GroupInputs", "fleet_inputs", "fleet_model"]

FLEET_VMS = 10_000
SIZES = (10, 100, 200)
PER_VM_CHANGES = 4.0  # out of rotation, drained, ack withdrawn, back in rotation
# The product's default zookeeper.session_timeout, which the model's fleet runs with: taken from the
# configuration so that the model follows it. kazoo pings after a third of it without traffic.
SESSION_TIMEOUT = float(ZooKeeperConfig.model_fields["session_timeout"].default)


@dataclass(frozen=True)
class GroupInputs:
    """What one agent costs per change, and what an event changes, in a group of ``size`` VMs."""

    size: int
    requests_per_agent_per_change: float
    changes_per_event: float  # for an event naming ``event_vms`` VMs
    event_vms: int = 2
    measured: bool = False


# The rewrite of the agent's view aims at about two requests per agent per change; twelve changes per
# event of two VMs is what the group benchmark counts (writes per event: four per event, four per VM).
ASSUMED_REQUESTS_PER_AGENT_PER_CHANGE = 2.0
ASSUMED_CHANGES_PER_EVENT = 12.0
ASSUMED = tuple(GroupInputs(size, ASSUMED_REQUESTS_PER_AGENT_PER_CHANGE, ASSUMED_CHANGES_PER_EVENT)
                for size in SIZES)


@dataclass(frozen=True)
class FleetRow:
    inputs: GroupInputs
    event_vms: int  # VMs named by each event of the busiest hour
    groups: int
    changes_per_event: float
    events_per_s_group: float
    requests_per_s_group: float  # the agents' requests for changes, and the writes
    requests_per_s_fleet: float
    pings_per_s_fleet: float
    fraction_of_ceiling: float | None  # requests_per_s_fleet / ceiling; None without a ceiling


def fleet_model(ceiling: float | None, inputs: Sequence[GroupInputs], *, vms: int = FLEET_VMS,
                event_vms: Sequence[int] = (2, 10), session_timeout: float = SESSION_TIMEOUT) -> list[FleetRow]:
    """One row per group size of ``inputs`` and per event size of ``event_vms`` (see the module
    docstring). ``ceiling``: the ensemble's requests/s for the agents' mix, or None when not measured."""
    rows = []
    for k in event_vms:
        for group in inputs:
            groups = vms // group.size
            changes = max(0.0, group.changes_per_event + PER_VM_CHANGES * (k - group.event_vms))
            events_per_s = group.size / k / 3600  # every VM of the group in maintenance once in the hour
            per_event = changes * (group.size * group.requests_per_agent_per_change + 1)  # reads + the write
            per_group = events_per_s * per_event
            fleet = per_group * groups
            rows.append(FleetRow(group, k, groups, changes, events_per_s, per_group, fleet,
                                 groups * group.size / (session_timeout / 3),
                                 fleet / ceiling if ceiling else None))
    return rows


def fleet_inputs(results: Mapping[str, Any], sizes: Sequence[int] = SIZES) -> list[GroupInputs]:
    """The model's inputs per group size: measured where ``results["groups"]["result"]["sizes"]`` has the
    size (keys ``requests_per_agent_per_change`` and ``changes_per_event``, optionally ``event_vms``),
    assumed (``ASSUMED``) otherwise."""
    measured = ((results.get("groups") or {}).get("result") or {}).get("sizes") or {}
    out = []
    for size in sizes:
        entry = measured.get(str(size)) or {}
        try:
            out.append(GroupInputs(size, float(entry["requests_per_agent_per_change"]),
                                   float(entry["changes_per_event"]), int(entry.get("event_vms", 2)),
                                   measured=True))
        except (KeyError, TypeError, ValueError):
            out.append(GroupInputs(size, ASSUMED_REQUESTS_PER_AGENT_PER_CHANGE, ASSUMED_CHANGES_PER_EVENT))
    return out
