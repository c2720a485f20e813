"""The group status as ``coordinator status`` shows it: one immutable pydantic model, rendered as a table
(``coordinator.groupstatus.render``) or dumped as JSON (``--json``).

The JSON form is a stable interface for scripts (documented in ``docs/status.md``): ``schema_version``
changes only when a field is removed or changes meaning; new fields may appear at any time. Every time is
absolute, an ISO 8601 string in UTC (``2026-11-24T00:15:58.123000Z``); ``read_at`` is when the group
was read, so that scripts compute ages against the same instant as the table does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "Absent",
    "Ack",
    "AgentReport",
    "Approval",
    "Attention",
    "Blocker",
    "EventState",
    "EventStatus",
    "GroupHistory",
    "GroupStatus",
    "HistoryAdmission",
    "HistoryApproval",
    "HistoryEntry",
    "Leader",
    "Member",
    "OutOfRotation",
    "Paused",
    "Placement",
    "Vouched",
    "utc",
]

SCHEMA_VERSION = 1

EventState = Literal["blocked", "approvable", "approved", "started", "done"]


def utc(timestamp: float) -> datetime:
    """A unix time as an aware UTC datetime (how every time of the model is kept). A time beyond the
    calendar (milliseconds written as seconds, NaN) becomes its end or its start: never an error."""
    try:
        return datetime.fromtimestamp(timestamp, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return (datetime.max if timestamp > 0 else datetime.min).replace(tzinfo=UTC)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Paused(_Model):
    """The group-wide pause (the ``pause`` node under the cluster's root), as whoever paused wrote it."""

    reason: str
    by: str
    at: datetime | None = Field(description="when the group was paused (None: the node did not say)")


class Leader(_Model):
    vm: str
    since: datetime | None = None


class Placement(_Model):
    """Where the VM runs, as its agent learned it from IMDS (absent when ``vm_name`` is configured)."""

    fault_domain: str | None = None
    update_domain: str | None = None
    zone: str | None = None
    scale_set: str | None = None
    unit: str | None = Field(default=None, description="its delivery unit (imds.unit, or its placementGroupId)")
    delivery: str | None = Field(default=None, description="imds.delivery as its agent runs with it")


class AgentReport(_Model):
    """What the member's agent says on its admin ``/status`` (asked with a short timeout)."""

    reachable: bool
    url: str | None = Field(description="the /status URL asked (None: the member info names no admin address)")
    error: str | None = Field(default=None, description="why it could not be read (None when reachable)")
    phase: str | None = None
    cycles: int | None = None
    last_cycle: str | None = Field(default=None, description="the description of its last completed cycle")
    connection: str | None = Field(default=None, description="its own ZooKeeper connection state")
    action_error: str | None = Field(default=None, description="its last drain or recover job failed: why")
    action_fallback: str | None = Field(
        default=None, description="its last drain holds by a fallback (azure-lb through the probe alone): why")
    stays_out: str | None = None


class Member(_Model):
    """A live member: its agent holds ``members/{vm}``."""

    vm: str
    leader: bool
    version: str | None = None
    started_at: datetime | None = None
    placement: Placement = Placement()
    probe: str | None = Field(default=None, description="the health probe URL its peers use")
    admin: str | None = Field(default=None, description="its admin address, as its member info gives it")
    agent: AgentReport


class OutOfRotation(_Model):
    """``out/{vm}``: the VM is out of its load balancer's rotation, by its own account."""

    vm: str
    since: datetime
    events: list[str]
    member: bool = Field(description="whether the VM has a live agent")


class DrainedByHand(_Model):
    """``drains/{vm}``: an operator takes the VM out of rotation by hand (``coordinator drain``)."""

    vm: str
    reason: str
    by: str
    at: datetime
    admitted_by: str | None = Field(default=None, description="the leader that admitted it into the budget")
    admitted_at: datetime | None = None
    out: bool = Field(description="the VM's /out mark names the drain by hand: its agent has taken it out")
    phase: str | None = Field(default=None, description="the VM's drain state, as its agent reports it")
    waiting: str | None = Field(default=None, description="not admitted yet: the leader's reason")


class Absent(_Model):
    """``absent/{vm}``: a registered VM the leader has seen without an agent since ``since``."""

    vm: str
    since: datetime


class Ack(_Model):
    vm: str
    at: datetime


class Approval(_Model):
    by: str
    at: datetime
    as_leader: bool


class Vouched(_Model):
    """An operator's word for the VMs an event names that run no agent (``coordinator approve``)."""

    by: str
    at: datetime
    reason: str
    vms: list[str]


class Blocker(_Model):
    """One reason an event is not approved yet (``coordinator.blockers``): its kind, the VM it is about if
    any, its words, and whether it clears by itself."""

    kind: str = Field(description="what holds it, one of coordinator.blockers.Hold (the metrics' reason label)")
    vm: str | None = None
    reason: str = Field(description="in words")
    lasting: bool = Field(default=False, description="it does not clear by itself (the budget on its own, a "
                                                     "peer's probe that does not answer)")


class EventStatus(_Model):
    """One event record, with what the status command worked out about it."""

    event_id: str
    type: str
    status: str | None = Field(
        description="Scheduled or Started, as the agents' last documents show it or, when no agent reported it, "
        "assumed from NotBefore (status_reported_by is then None); None for a done event, or one gone from IMDS"
    )
    status_reported_by: str | None = Field(
        description="the VM whose agent reported the status; for an event gone from IMDS, the VM whose last "
        "document no longer lists it"
    )
    resources: list[str]
    published_by: str
    published_at: datetime
    not_before: datetime | None
    not_before_in_seconds: float | None = Field(description="NotBefore minus read_at (negative: past)")
    acks: list[Ack]
    missing_acks: list[str] = Field(description="VMs of Resources without an ack")
    admitted_at: datetime | None
    approval: Approval | None
    vouched: Vouched | None = Field(default=None, description="an operator's word for its VMs without an agent")
    done_at: datetime | None
    approver: str | None = Field(description="who approves it now (policy approver mode); None if nobody can")
    approver_as_leader: bool | None
    state: EventState = Field(description="done once marked done, or gone from IMDS (done_at None until marked)")
    blockers: list[Blocker] = Field(description="why it is not approved yet (empty unless state is blocked)")
    approver_reports: list[str] | None = Field(
        description="what the approver's own agent reports it waits for (None: its /status did not list it)"
    )


class Attention(_Model):
    """Something that looks stuck or wrong, for the operator."""

    message: str
    vm: str | None = None
    event_id: str | None = None


class GroupStatus(_Model):
    schema_version: int = SCHEMA_VERSION
    cluster: str
    base_path: str = Field(description="the cluster's ZooKeeper path: {root}/{cluster}")
    zookeeper: str = Field(description="the ensemble read")
    read_at: datetime
    read_only_server: bool = Field(description="the server answering is in read-only mode (out of quorum)")
    policy: str = Field(description="where the policy used to work out blockers came from")
    paused: Paused | None
    leader: Leader | None
    members: list[Member]
    registered: list[str] = Field(description="every VM that has ever run an agent in the group")
    out_of_rotation: list[OutOfRotation]
    drained_by_hand: list[DrainedByHand] = Field(default_factory=list)
    absent: list[Absent]
    events: list[EventStatus] = Field(description="event records not marked done, soonest NotBefore first")
    done: list[EventStatus] = Field(description="records marked done and not purged yet, latest first")
    attention: list[Attention]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


# -- the history (``coordinator status --history``) ----------------------------------------------------


class HistoryAdmission(_Model):
    """When the leader admitted the event into the maintenance budget, and which leader."""

    at: datetime
    by: str | None = Field(description="the leader that admitted it (None: its admission node did not say)")


class HistoryApproval(_Model):
    """The approval, as the approver wrote it before its POST."""

    by: str = Field(description='who approved it ("?": its approval node did not parse)')
    at: datetime | None = Field(description="when (None: not known, its approval node did not parse)")
    as_leader: bool = Field(description="approved as the leader; else as the first live VM named in Resources")
    acks: list[str] | None = Field(
        description="the VMs whose acknowledgements released it, as the approval gate found them (empty: none "
        "was required; None: not recorded, approved by an agent of an earlier version)")
    vouched: list[str] | None = Field(default=None, description="the VMs an operator vouched for (no agent)")
    reason: str | None = Field(default=None, description="the operator's reason, with vouched")
    vouched_by: str | None = Field(default=None, description="the operator, with vouched")
    acked_at: dict[str, datetime] | None = Field(
        default=None, description="when each of those VMs acknowledged, as its ack said (None: not recorded)")


class HistoryEntry(_Model):
    """One finished event (its record marked done, not purged yet), with its timeline."""

    event_id: str
    type: str
    resources: list[str]
    not_before: datetime | None
    published_by: str = Field(description="the VM that announced it to the group (created its record)")
    published_at: datetime
    recorded: bool = Field(
        description="whether the agent that marked it done kept its admission and approval in the record "
        "(False: marked done by an agent of an earlier version; admitted and approval are then not known)")
    admitted: HistoryAdmission | None = Field(description="None: not admitted (or not recorded)")
    approval: HistoryApproval | None = Field(
        description="None: not approved early (it started at NotBefore, or was gone before), or not recorded")
    started_at: datetime | None = Field(
        description="when the agent that marked it done first saw it Started in its IMDS document (None: not "
        "recorded: that agent never saw it Started, was restarted since, or is of an earlier version)")
    done_at: datetime = Field(description="when its record was marked done: it had left the IMDS documents")


class GroupHistory(_Model):
    """Every finished event the group's store still keeps, newest first: kept as long as the records are,
    until the leader purges them ``done_retention_seconds`` after they were done."""

    schema_version: int = SCHEMA_VERSION
    cluster: str
    base_path: str
    zookeeper: str
    read_at: datetime
    read_only_server: bool
    policy: str = Field(description="where the policy (its budget, its retention) was taken from")
    budgeted: bool = Field(description="whether the policy admits events into a budget: admitted means something")
    kept_for_seconds: float = Field(description="done_retention_seconds: how long a finished record is kept")
    events: list[HistoryEntry] = Field(description="records marked done and not purged yet, latest done first")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)
