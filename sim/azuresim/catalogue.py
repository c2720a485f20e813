"""What Azure documents, or real documents show, that the simulator reproduces.

api-versions, event types and their notice, statuses, descriptions seen in captures, what each type
does to a VM, the fault kinds the simulator can serve, the delivery modes of a group, and the instance
metadata of a VM. Pure data and small functions over it; nothing here changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "DEFAULT_DESCRIPTIONS",
    "DEFAULT_IMPACT",
    "DEFAULT_IMPACT_SECONDS",
    "DELIVERIES",
    "EVENT_STATUSES",
    "EVENT_TYPE_SINCE",
    "FAULT_KINDS",
    "IMPACT_KINDS",
    "INSTANCE_API_VERSIONS",
    "MAX_FAULT_BODY",
    "MAX_FAULT_SECONDS",
    "MINIMUM_NOTICE",
    "NOT_BEFORE_CLOCKS",
    "SCHEDULED",
    "SCHEDULED_EVENTS_API_VERSIONS",
    "STARTED",
    "TERMINATE_NOTICE_RANGE",
    "WRONG_TYPE_FIELDS",
    "Delivery",
    "EventStatus",
    "FaultKind",
    "ImpactKind",
    "NotBeforeClock",
    "VmInfo",
    "WrongTypeField",
    "compute_metadata",
    "default_description",
    "notice",
    "placement_group_id",
]

#: api-versions of the Scheduled Events endpoint, oldest first.
SCHEDULED_EVENTS_API_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)

#: api-versions accepted by the instance metadata endpoint (``/metadata/instance``), oldest first.
INSTANCE_API_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-08-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
)

#: Event types that an api-version predates are left out of the document served with it
#: (Preempt appeared with 2017-11-01, Terminate with 2019-01-01).
EVENT_TYPE_SINCE: Mapping[str, str] = {"Preempt": "2017-11-01", "Terminate": "2019-01-01"}

EventStatus = Literal["Scheduled", "Started"]
EVENT_STATUSES: tuple[str, ...] = get_args(EventStatus)
SCHEDULED: EventStatus = "Scheduled"
STARTED: EventStatus = "Started"

#: Documented minimum notice per event type, in seconds (Terminate: the 5-minute lower bound; the
#: group's ``terminate_notice`` replaces it, as the scale set's configuration does).
MINIMUM_NOTICE: Mapping[str, float] = {
    "Freeze": 900.0,
    "Reboot": 900.0,
    "Redeploy": 600.0,
    "Preempt": 30.0,
    "Terminate": 300.0,
}
_UNKNOWN_TYPE_NOTICE = 900.0
#: What a scale set may configure as the notice of its Terminate events, in seconds.
TERMINATE_NOTICE_RANGE: tuple[float, float] = (300.0, 900.0)

#: Descriptions seen in real documents, used when an event is given none.
DEFAULT_DESCRIPTIONS: Mapping[str, str] = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to a different host.",
    "Preempt": "",
    "Terminate": "",
}
_PLATFORM_DESCRIPTION = "Host server is undergoing maintenance."

#: What an event does to the VMs it names when it starts: ``freeze`` pauses their registered PIDs,
#: ``kill`` kills them (the VM reboots, moves, is evicted or deleted), ``none`` leaves them alone.
ImpactKind = Literal["freeze", "kill", "none"]
IMPACT_KINDS: tuple[str, ...] = get_args(ImpactKind)
DEFAULT_IMPACT: Mapping[str, ImpactKind] = {
    "Freeze": "freeze",
    "Reboot": "kill",
    "Redeploy": "kill",
    "Preempt": "kill",
    "Terminate": "kill",
}
#: Length of a freeze impact when the event says nothing usable (DurationInSeconds -1): the
#: documented typical impact.
DEFAULT_IMPACT_SECONDS = 7.0

FaultKind = Literal["status", "malformed", "delay", "drop", "wrong_type", "refuse", "body"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
#: Longest ``delay`` or ``refuse`` fault, in real seconds.
MAX_FAULT_SECONDS = 300.0
#: Largest body a ``body`` fault serves (its bytes times ``repeat``).
MAX_FAULT_BODY = 16 * 1024 * 1024
#: Fields a ``wrong_type`` fault serves with the wrong JSON type.
WrongTypeField = Literal["DocumentIncarnation", "Events", "EventId", "Resources", "NotBefore", "DurationInSeconds"]
WRONG_TYPE_FIELDS: tuple[str, ...] = get_args(WrongTypeField)

#: Who sees an event: ``unit``, every VM of the delivery unit the event belongs to (an availability set or
#: a scale-set placement group: Azure delivers each event to every VM of it); ``named``, only the VMs the
#: event names (GPU VMs of a scale set with one fault domain).
Delivery = Literal["unit", "named"]
DELIVERIES: tuple[str, ...] = get_args(Delivery)

#: How NotBefore is rendered under a time scale: in the simulated clock, or in real (wall-clock) time.
NotBeforeClock = Literal["simulated", "real"]
NOT_BEFORE_CLOCKS: tuple[str, ...] = get_args(NotBeforeClock)


def notice(event_type: str, terminate_notice: float) -> float:
    """Seconds from creation to NotBefore when none is given: the documented minimum of the type.

    Terminate uses the group's ``terminate_notice``; an unknown type gets 900 seconds.
    """
    if event_type == "Terminate":
        return terminate_notice
    return MINIMUM_NOTICE.get(event_type, _UNKNOWN_TYPE_NOTICE)


def default_description(event_type: str, source: str) -> str:
    """The ``Description`` real documents carry for this type and source."""
    if source == "Platform" and event_type in ("Reboot", "Redeploy"):
        return _PLATFORM_DESCRIPTION
    return DEFAULT_DESCRIPTIONS.get(event_type, "")


@dataclass(frozen=True)
class VmInfo:
    """A VM of the group, as its instance metadata describes it.

    ``name`` is used as given in ``Resources`` and in the compute metadata; lookups are
    case-insensitive, as Azure names are. ``scale_set_name`` is ``""`` for availability-set VMs.
    ``unit`` is the VM's delivery unit, the VMs that see one another's events: the placement-group id of
    a scale-set instance, the availability-set name otherwise; ``""`` is the default unit, shared by every
    VM given none. Units are compared case-insensitively, as Azure names and GUIDs are.
    """

    name: str
    scale_set_name: str = ""
    unit: str = ""
    fault_domain: int = 0
    update_domain: int = 0
    zone: str = ""
    vm_size: str = "Standard_D2s_v3"
    location: str = "westeurope"
    resource_group: str = "maintenance-sim"
    subscription_id: str = "00000000-0000-0000-0000-000000000000"


def placement_group_id(info: VmInfo) -> str:
    """The ``placementGroupId`` IMDS serves ``info``: ``""`` for a VM not in a scale set (as IMDS serves it);
    for a scale-set instance its ``unit``, else a GUID derived from the scale-set name (uuid5), so that
    every instance of a scale set given no unit is in one placement group."""
    if not info.scale_set_name:
        return ""
    if info.unit:
        return info.unit
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "imds-sim:placement-group:" + info.scale_set_name.lower()))


def compute_metadata(info: VmInfo) -> dict[str, Any]:
    """The ``/metadata/instance/compute`` answer for ``info`` (numbers as strings, as IMDS has them).

    Only fields IMDS documents; ``placementGroupId`` as ``placement_group_id`` gives it.
    """
    provider = "Microsoft.Compute"
    if info.scale_set_name:
        instance = info.name.rsplit("_", 1)[-1]
        resource_id = (
            f"/subscriptions/{info.subscription_id}/resourceGroups/{info.resource_group}/providers/"
            f"{provider}/virtualMachineScaleSets/{info.scale_set_name}/virtualMachines/{instance}"
        )
    else:
        resource_id = (
            f"/subscriptions/{info.subscription_id}/resourceGroups/{info.resource_group}/providers/"
            f"{provider}/virtualMachines/{info.name}"
        )
    return {
        "azEnvironment": "AzurePublicCloud",
        "location": info.location,
        "name": info.name,
        "osType": "Linux",
        "placementGroupId": placement_group_id(info),
        "platformFaultDomain": str(info.fault_domain),
        "platformUpdateDomain": str(info.update_domain),
        "provider": provider,
        "resourceGroupName": info.resource_group,
        "resourceId": resource_id,
        "subscriptionId": info.subscription_id,
        "tags": "",
        "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, "imds-sim:" + resource_id.lower())),
        "vmScaleSetName": info.scale_set_name,
        "vmSize": info.vm_size,
        "zone": info.zone,
    }
