"""The layout of a simulated group from the simulator's command line: each VM's scale set, fault and update
domain, zone and delivery unit (``--units``, ``--unit-size``; ``docs/simulator.md``, "Delivery units")."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence

from azuresim.catalogue import VmInfo

__all__ = ["parse_units", "vm_infos"]

#: A unit named on the command line: what the agent's ``imds.unit`` accepts, without the ``/`` that
#: separates units in ``--units``.
_UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: One unit of ``--units``: its name (None: ``pg`` and its index) and its VMs.
_UnitSpec = tuple[str | None, list[str]]


def parse_units(text: str, vm_name: Callable[[str], str]) -> list[_UnitSpec]:
    """``--units``: ``[NAME=]VM,VM/[NAME=]VM,...``, each VM name checked by ``vm_name``. Raises
    ``argparse.ArgumentTypeError`` naming what is wrong."""
    units: list[_UnitSpec] = []
    for index, part in enumerate(text.split("/")):
        name: str | None = None
        head, sep, members = part.partition("=")
        if sep:
            name = head.strip()
            if not _UNIT_NAME.fullmatch(name):
                raise argparse.ArgumentTypeError(
                    f"invalid unit name {name!r}: 1-128 letters, digits, '.', '_', ':', '-', starting with a "
                    "letter or digit"
                )
        else:
            members = part
        vms = [vm.strip() for vm in members.split(",") if vm.strip()]
        if not vms:
            raise argparse.ArgumentTypeError(
                f"unit {index} lists no VM: expected [NAME=]VM,VM/[NAME=]VM,..., got {text!r}"
            )
        units.append((name, [vm_name(vm) for vm in vms]))
    return units


def vm_infos(args: argparse.Namespace, names: Sequence[str]) -> list[VmInfo]:
    """The VMs ``names`` (in the group's order) as ``args`` describe them: scale set, fault and update
    domains, zones, and delivery units (``--units`` or ``--unit-size``).

    Raises ValueError, naming the option, when ``--units`` names a VM that is not in the group, or one twice,
    or two units by one name.
    """
    zones = [z.strip() for z in args.zones.split(",") if z.strip()]
    units = _unit_of_vms(args, names)
    return [
        VmInfo(
            name=name,
            scale_set_name=args.scale_set,
            unit=units.get(name.lower(), ""),
            fault_domain=index % args.fault_domains,
            update_domain=index % args.update_domains,
            zone=zones[index % len(zones)] if zones else "",
        )
        for index, name in enumerate(names)
    ]


def _unit_of_vms(args: argparse.Namespace, names: Sequence[str]) -> dict[str, str]:
    """The unit of each VM given one, by lower-cased name."""
    if args.unit_size is not None:
        return {name.lower(): f"pg{index // args.unit_size}" for index, name in enumerate(names)}
    if args.units is None:
        return {}
    known = {name.lower() for name in names}
    units: dict[str, str] = {}
    taken: set[str] = set()
    for index, (given, vms) in enumerate(args.units):
        unit = given if given is not None else f"pg{index}"
        if unit.lower() in taken:
            raise ValueError(f"--units: two units are named {unit!r}")
        taken.add(unit.lower())
        for vm in vms:
            if vm.lower() not in known:
                raise ValueError(f"--units: {vm!r} is not a VM of the group ({', '.join(names)})")
            if vm.lower() in units:
                raise ValueError(f"--units: VM {vm!r} is in two units ({units[vm.lower()]!r} and {unit!r})")
            units[vm.lower()] = unit
    return units
