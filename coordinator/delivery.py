"""This VM's delivery unit, and how IMDS delivers Scheduled Events in it.

Azure delivers an event to every VM of its *delivery unit* (an availability set, or one placement group of a
scale set; a scale set of more than 100 instances has several), except on some sizes (GPU scale sets in one
fault domain) where a VM sees only the events naming it. One coordinated group may span several units. What
an agent may conclude from its own documents depends on both: that an event is gone, or that a record it
never saw is of an event it will never be shown. These are facts, from the instance metadata (a scale-set
instance's ``placementGroupId``) or the configuration (``imds.unit``, ``imds.delivery``); nothing here infers
them from who published a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from coordinator.store.base import EventRecord

__all__ = ["Delivery", "DeliveryMode"]


class DeliveryMode(StrEnum):
    """How IMDS delivers Scheduled Events to this VM, as configured (``imds.delivery``)."""

    AUTO = "auto"  # every event of the unit once this VM's own documents have shown one not naming it
    UNIT = "unit"  # every event of the VM's delivery unit (availability set, scale-set placement group)
    NAMED = "named"  # only the events naming the VM (GPU sizes of a one-fault-domain scale set)


@dataclass(frozen=True)
class Delivery:
    """This VM's delivery unit and how IMDS delivers in it: facts from the instance metadata (a scale-set
    instance's ``placementGroupId``) or the configuration, never inferred from who published a record.

    ``unit`` None: not known. An agent counts on its own documents to list an event it is not named by
    only when it knows both that IMDS shows it every event of its unit and which unit the event is of
    (``covers``); otherwise only the VMs an event names speak for it (``decide.records``)."""

    unit: str | None = None
    mode: DeliveryMode = DeliveryMode.AUTO

    def every_event(self, seen_unnamed: bool) -> bool:
        """Whether IMDS shows this VM every event of its unit: configured so, or (``auto``) this process's own
        documents have shown an event that does not name it, which only unit-wide delivery does."""
        return self.mode is DeliveryMode.UNIT or (self.mode is DeliveryMode.AUTO and seen_unnamed)

    def covers(self, record: EventRecord, seen_unnamed: bool) -> bool:
        """Whether this VM's documents list the event of ``record`` while it is present, though it does not
        name this VM: IMDS shows this VM every event of its unit, and the record's publisher, which saw the
        event in its own documents, is of this VM's unit."""
        return (self.unit is not None and record.unit == self.unit and self.every_event(seen_unnamed))

    def how(self, seen_unnamed: bool = False) -> str:
        """Which events this VM's documents are taken to show, in the words of logs and ``coordinator doctor``."""
        if self.every_event(seen_unnamed):
            return "every event of the unit"
        if self.mode is DeliveryMode.NAMED:
            return "only events naming this VM"
        return "delivery not known yet (auto: only events naming this VM count)"

    def describe(self, seen_unnamed: bool = False) -> str:
        """The unit and ``how``, in the words of logs and ``coordinator status``."""
        unit = f"unit {self.unit}" if self.unit is not None else "unit unknown"
        return f"{unit}, {self.how(seen_unnamed)}"

    def member_info(self) -> dict[str, object]:
        """What the agent publishes of it in its member node."""
        return {"unit": self.unit, "delivery": self.mode.value}

    @classmethod
    def published(cls, info: Mapping[str, object]) -> Delivery | None:
        """What a member node says (``member_info``); None where it says nothing readable (an agent of an
        earlier version, a garbled node)."""
        unit, mode = info.get("unit"), info.get("delivery")
        if not isinstance(mode, str) or not (unit is None or isinstance(unit, str)):
            return None
        try:
            return cls(unit=unit or None, mode=DeliveryMode(mode))
        except ValueError:
            return None
