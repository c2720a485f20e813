"""The fleet as ``coordinator fleet`` shows it: one immutable pydantic model, rendered as text
(``coordinator.fleet.render``) or dumped as JSON (``--json``, documented in ``docs/fleet.md``).

``schema_version`` changes only when a field is removed or changes meaning; new fields may appear. Every
time is an ISO 8601 string in UTC; ``read_at`` is when Resource Graph answered, the instant the relative
times of the text are counted from."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from coordinator.groupstatus.model import Approval, Blocker, EventState

__all__ = ["SCHEMA_VERSION", "FleetEvent", "FleetGroup", "FleetStatus", "FleetVm", "GroupRecord", "UnlistedRecord"]

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FleetGroup(_Model):
    """One cluster under the ZooKeeper root."""

    cluster: str
    members: list[str] = Field(description="VMs whose agent is live (holds members/{vm})")
    registered: list[str] = Field(description="every VM that has ever run an agent in the group")
    leader: str | None
    paused: str | None = Field(description="why the group is paused, and by whom (None: not paused)")
    error: str | None = Field(description="why the group could not be read (None: it was read)")


class FleetVm(_Model):
    """A VM an event names, and what coordinates it."""

    vm: str = Field(description="as Resource Graph names it in Resources")
    group: str | None = Field(description="the cluster whose agent the VM runs (or last ran); None: none")
    agent: bool = Field(description="whether the VM runs a live agent (a member of that group)")


class GroupRecord(_Model):
    """A group's record of the event, with what ``coordinator status`` works out about it."""

    cluster: str
    state: EventState
    approver: str | None = Field(description="who approves it (None: nobody can)")
    acks: list[str]
    missing_acks: list[str]
    admitted_at: datetime | None
    approval: Approval | None
    done_at: datetime | None
    blockers: list[Blocker] = Field(description="why it is not approved yet (empty unless state is blocked)")


class FleetEvent(_Model):
    """One scheduled event of Resource Graph."""

    event_id: str
    type: str
    status: str = Field(description="EventStatus: Scheduled, Started, Completed or Canceled")
    not_before: datetime | None = Field(description="None: blank (a Started or finished event)")
    not_before_in_seconds: float | None = Field(description="NotBefore minus read_at (negative: past)")
    updated_at: datetime | None = Field(description="the row's last change, when Resource Graph gives it")
    unit: str = Field(description="the resource the event is published for: scale set, availability set or VM")
    subscription: str
    resource_group: str
    description: str
    source: str
    vms: list[FleetVm]
    records: list[GroupRecord] = Field(description="the groups' records of this event (empty: no group has one)")


class UnlistedRecord(_Model):
    """A group's pending record that Resource Graph does not list (its publishing may not be enabled)."""

    cluster: str
    event_id: str
    type: str
    resources: list[str]
    state: EventState
    not_before: datetime | None


class FleetStatus(_Model):
    schema_version: int = SCHEMA_VERSION
    read_at: datetime
    subscriptions: list[str]
    zookeeper: str
    root: str
    finished_hours: float = Field(description="how far back finished events are shown")
    policy: str = Field(description="where the policy used to work out blockers came from")
    groups: list[FleetGroup]
    events: list[FleetEvent] = Field(description="pending events at least one of whose VMs runs an agent")
    uncoordinated: list[FleetEvent] = Field(
        description="pending events none of whose VMs runs an agent: nothing holds them, they start at NotBefore")
    finished: list[FleetEvent] = Field(description="Completed or Canceled within finished_hours, latest first")
    unlisted: list[UnlistedRecord] = Field(description="pending group records Resource Graph does not list")
    skipped_rows: list[str] = Field(description="Resource Graph rows that could not be read, and why")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)
