"""The verdict of the ``delivery`` check: this VM's delivery unit and how IMDS delivers in it
(``coordinator.delivery``), as the configuration gives them against what IMDS says (the compute metadata's
``placementGroupId``, a Scheduled Events document), and as the group's members publish them. Pure
functions, no I/O.

What can be told from here: that ``imds.unit`` names another unit than IMDS's ``placementGroupId``, that a
VM configured ``named`` is shown an event naming other VMs and not it (which only unit-wide delivery
does), that ``unit`` is configured where the agent cannot know its unit (so it helps nothing), that the
running agent publishes another unit or mode than this configuration gives, and that the members publish
different modes, or a unit for some and none for others. What cannot: that a VM configured ``unit`` is
shown every event of its unit (one document never disproves it), so nothing is said of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.delivery import Delivery, DeliveryMode
from coordinator.doctor.outcome import Status, Verdict

__all__ = ["agent_unit", "delivery_verdict"]

_SHOWN_EVENTS = 3


def agent_unit(*, configured: str | None, vm_name_set: bool, placement_group: str | None) -> str | None:
    """The unit an agent started with this configuration on this VM takes (``runtime.delivery_from``):
    ``imds.unit``, else, when ``vm_name`` is not set (IMDS then gives the placement with the name), a
    non-empty ``placementGroupId``; else None. ``placement_group`` None: the compute metadata was not read."""
    if configured is not None:
        return configured
    if not vm_name_set and placement_group:
        return placement_group
    return None


def _unit_source(*, configured: str | None, vm_name_set: bool, placement_group: str | None) -> str:
    """Where the unit comes from, or why it is not known, in a few words."""
    if configured is not None:
        return "imds.unit"
    if vm_name_set:
        if placement_group:
            return f"vm_name is set, so the agent does not read IMDS's placementGroupId {placement_group}"
        return "no imds.unit, and vm_name is set"
    if placement_group:
        return "IMDS's placementGroupId"
    if placement_group is None:
        return "no imds.unit, and the compute metadata was not read: the agent learns placementGroupId at start"
    return "no imds.unit, and IMDS gives no placementGroupId outside a scale set"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _published(info: Mapping[str, object]) -> tuple[str | None, str | None]:
    """A member's published unit and delivery mode (None: not published, as by agents before them)."""
    return _text(info.get("unit")), _text(info.get("delivery"))


def _members_said(published: Mapping[str, tuple[str | None, str | None]]) -> str:
    """The members grouped by what they publish: ``pg0 (auto): web_0, web_1; no unit (named): vm2``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for vm, (unit, mode) in sorted(published.items()):
        groups.setdefault((unit or "no unit", mode or "no delivery"), []).append(vm)
    return "; ".join(f"{unit} ({mode}): {', '.join(vms)}" for (unit, mode), vms in sorted(groups.items()))


def delivery_verdict(
    *,
    configured_unit: str | None,
    mode: DeliveryMode,
    vm_name_set: bool,
    placement_group: str | None,
    unnamed_events: Sequence[str] | None,
    members: Mapping[str, Mapping[str, object]] | None,
    me: str | None = None,
    members_error: str | None = None,
) -> Verdict:
    """This VM's delivery unit and mode as an agent started with this configuration takes them, against IMDS
    and the members.

    ``configured_unit`` and ``mode``: ``imds.unit`` and ``imds.delivery``; ``vm_name_set``: whether
    ``vm_name`` is set (the agent then does not read the placement); ``placement_group``: the compute
    metadata's ``placementGroupId`` ("" outside a scale set, None when not read); ``unnamed_events``: the
    EventIds of the document's events that name other VMs and not this one (None when the document was not
    read, or this VM's name is not known); ``members``: the live members' info (None when not read, then
    ``members_error`` may say why), ``me`` this VM's member name among them."""
    unit = agent_unit(configured=configured_unit, vm_name_set=vm_name_set, placement_group=placement_group)
    unit_known_here = configured_unit is not None or vm_name_set or placement_group is not None
    seen_unnamed = bool(unnamed_events)
    delivery = Delivery(unit=unit, mode=mode)
    published = {vm: _published(info) for vm, info in (members or {}).items()}
    details: dict[str, Any] = {
        "unit": unit, "delivery": mode.value, "imds_unit": configured_unit, "placement_group": placement_group,
        "vm_name_set": vm_name_set, "unnamed_events": list(unnamed_events) if unnamed_events is not None else None,
        "members": {vm: {"unit": u, "delivery": d} for vm, (u, d) in sorted(published.items())}
        if members is not None else None,
    }
    problems: list[str] = []
    fixes: list[str] = []

    if configured_unit is not None and placement_group and configured_unit != placement_group:
        problems.append(f"imds.unit is {configured_unit!r} while IMDS gives this VM placementGroupId "
                        f"{placement_group!r}: this VM's records carry {configured_unit!r}, and agents of its "
                        "placement group that learn the unit from IMDS do not take them for their unit's")
        fixes.append(f"set imds.unit to {placement_group!r}"
                     + ("" if vm_name_set else ", or remove it to use IMDS's placementGroupId"))
    if mode is DeliveryMode.NAMED and unnamed_events:
        shown = ", ".join(unnamed_events[:_SHOWN_EVENTS]) \
            + (f" and {len(unnamed_events) - _SHOWN_EVENTS} more" if len(unnamed_events) > _SHOWN_EVENTS else "")
        problems.append(f"imds.delivery is named, but this document lists {len(unnamed_events)} event(s) naming "
                        f"other VMs and not this one ({shown}): IMDS shows this VM every event of its unit")
        fixes.append("set imds.delivery to unit (or auto): IMDS delivers unit-wide to this VM"
                     + ("" if unit is not None else f", and imds.unit to {placement_group!r}" if placement_group
                        else ", and imds.unit to its availability set"))
    if mode is DeliveryMode.UNIT and unit is None and unit_known_here:
        problems.append("imds.delivery is unit, but the agent does not know its unit: a VM speaks only for events "
                        "of a unit it knows, so unit-wide delivery helps nothing")
        fixes.append(f"set imds.unit to {placement_group!r}" if placement_group
                     else "set imds.unit to this VM's availability set (or its scale set's placement group)")

    if me is not None and me in published and "delivery" in (members or {}).get(me, {}):
        running_unit, running_mode = published[me]
        differs = []
        if running_mode != mode.value:
            differs.append(f"delivery {running_mode or 'none'} against {mode.value}")
        if unit_known_here and running_unit != unit:
            differs.append(f"unit {running_unit or 'none'} against {unit or 'none'}")
        if differs:
            problems.append(f"this VM's running agent publishes another delivery than this configuration gives "
                            f"({', '.join(differs)})")
            fixes.append("run coordinator doctor with the running agent's configuration file, or restart the agent "
                         "after changing imds.unit or imds.delivery")

    if members:
        modes: dict[str, list[str]] = {}
        for vm, (_, member_mode) in sorted(published.items()):
            modes.setdefault(member_mode or "none", []).append(vm)
        if len(modes) > 1:
            problems.append("the members publish different delivery modes: "
                            + ", ".join(f"{m} ({', '.join(vms)})" for m, vms in sorted(modes.items())))
            fixes.append("set imds.delivery alike on the agents of a unit (IMDS delivers one way in it)"
                         + ("; upgrade the agents that publish none" if "none" in modes else ""))
        with_unit = sorted(vm for vm, (member_unit, _) in published.items() if member_unit is not None)
        without = sorted(vm for vm, (member_unit, _) in published.items() if member_unit is None)
        if with_unit and without:
            problems.append(f"{len(with_unit)} member(s) publish a unit and {len(without)} none ({', '.join(without)}):"
                            " the records these publish carry no unit, so only the VMs an event names speak for it")
            fixes.append("set imds.unit on the agents that publish none (their availability set), or leave vm_name "
                         "unset on scale-set instances so that they learn their placementGroupId")

    how = delivery.how(seen_unnamed)
    said = (f"unit {unit or 'unknown'} ("
            + _unit_source(configured=configured_unit, vm_name_set=vm_name_set, placement_group=placement_group)
            + f"), imds.delivery {mode.value}: {how}")
    if unnamed_events is None:
        said += "; no document judged (see the imds check)"
    elif unnamed_events and mode is not DeliveryMode.NAMED:
        said += f" (this document lists {len(unnamed_events)} event(s) naming other VMs and not this one)"
    if members:
        said += f"; members by unit (delivery): {_members_said(published)}"
    elif members is None:
        said += f"; members not read{': ' + members_error if members_error else ''}"
    else:
        said += "; no live member"
    if problems:
        return Verdict(Status.WARN, f"{said}; " + "; ".join(problems), "; ".join(fixes), details)
    return Verdict(Status.PASS, said, details=details)
