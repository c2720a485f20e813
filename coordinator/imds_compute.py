"""The compute metadata of IMDS (``/metadata/instance/compute``): the parts the agent needs to name its VM and
place it (scale set, fault and update domain, zone), parsed tolerantly from what IMDS or a mock serves.
"""

from __future__ import annotations

import json
from typing import Annotated, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from coordinator.errors import MalformedDocument

__all__ = [
    "BODY_LIMIT",
    "InstanceCompute",
    "parse_instance_compute",
]

# How much of a body an error carries as its ``content`` (here and in the IMDS client's errors).
BODY_LIMIT: Final = 2000


def _text(value: object) -> str:
    # IMDS serves these fields as strings ("0", "") but hand-made mocks write numbers or null.
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return str(value)


_Text = Annotated[str, BeforeValidator(_text)]


class InstanceCompute(BaseModel):
    """The parts of ``/metadata/instance/compute`` the agent needs. Absent or null fields are ``""``."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    # validation/serialization aliases (not ``alias``) keep the Python names in the typed constructor.
    name: _Text = ""
    vm_scale_set_name: _Text = Field(
        default="", validation_alias="vmScaleSetName", serialization_alias="vmScaleSetName"
    )
    platform_fault_domain: _Text = Field(
        default="", validation_alias="platformFaultDomain", serialization_alias="platformFaultDomain"
    )
    platform_update_domain: _Text = Field(
        default="", validation_alias="platformUpdateDomain", serialization_alias="platformUpdateDomain"
    )
    zone: _Text = ""
    # A scale-set instance's placement group: its delivery unit (``coordinator.delivery``); "" elsewhere.
    placement_group_id: _Text = Field(
        default="", validation_alias="placementGroupId", serialization_alias="placementGroupId"
    )
    resource_id: _Text = Field(default="", validation_alias="resourceId", serialization_alias="resourceId")

    @property
    def is_scale_set_instance(self) -> bool:
        return self.vm_scale_set_name != ""

    @property
    def scheduled_events_name(self) -> str:
        """This VM's name as Scheduled Events lists it in ``Resources``.

        For a scale-set instance IMDS ``name`` is already ``{scaleSetName}_{instanceId}`` (e.g.
        ``aks-nodepool1-21922338-vmss_47``, not the guest host name); for availability-set and standalone
        VMs it is the VM name. Either way it is ``name`` as served; ``""`` if IMDS did not say.
        Compare it case-insensitively (``ScheduledEvent.names``).
        """
        return self.name


def parse_instance_compute(raw: bytes | str | object) -> InstanceCompute:
    """Parse a compute metadata document from bytes, text or decoded JSON.

    Raises ``MalformedDocument`` (with the content, truncated) if it is not a JSON object or a known
    field has a wrong type. Never raises anything else.
    """
    content = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if isinstance(content, str):
        try:
            data = json.loads(content)
        except (ValueError, RecursionError) as exc:
            raise MalformedDocument(
                f"compute metadata is not JSON: {exc}", content=content[:BODY_LIMIT]
            ) from None
    else:
        data = content
    if not isinstance(data, dict):
        raise MalformedDocument(
            f"compute metadata is not a JSON object but {type(data).__name__}",
            content=repr(data)[:BODY_LIMIT],
        )
    try:
        return InstanceCompute.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()[:5]
        )
        raise MalformedDocument(
            f"invalid compute metadata: {problems}", content=repr(data)[:BODY_LIMIT]
        ) from None
