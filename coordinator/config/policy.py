"""The ``policy`` section: who approves (``ApproverMode``), the rule per event type (``ApprovalRule``),
peers without an agent (``PeersPolicy``), the disruption budget and the maintenance windows.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from coordinator.config.base import EVENT_KEYS, Section
from coordinator.maintenance_windows import WEEKDAYS, Weekday, Window

__all__ = ["ApprovalRule", "ApproverMode", "MaintenanceWindowConfig", "PeersPolicy", "PolicyConfig"]


class ApproverMode(StrEnum):
    FIRST_RESOURCE = "first-resource"
    LEADER = "leader"


class ApprovalRule(StrEnum):
    AFTER_DRAIN = "after-drain"  # approve once every named VM has drained and acknowledged
    IMMEDIATELY = "immediately"  # approve at once, nobody drains (short, harmless impacts)
    NEVER = "never"  # never approve: the VMs drain and the event starts at NotBefore


class PeersPolicy(StrEnum):
    BLOCK = "block"  # a VM named in Resources that runs no agent blocks early approval
    IGNORE = "ignore"  # ... is not waited for


def _clock_time(value: str) -> dt.time:
    try:
        hours, minutes = value.split(":")
        return dt.time(int(hours), int(minutes))
    except ValueError:
        raise ValueError(f"{value!r} is not a time of day as HH:MM (00:00 to 23:59)") from None


class MaintenanceWindowConfig(Section):
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


class PolicyConfig(Section):
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
        unknown = sorted(set(value) - set(EVENT_KEYS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; expected some of {', '.join(EVENT_KEYS)}")
        return value
