"""What a valid configuration may still get wrong, as warnings for ``check-config`` and ``coordinator
doctor``: drain waits that an event's notice or the load balancer's probe lag defeat, a unit-wide delivery
whose unit cannot be known, and environment variables that look like overrides but are not read; and the
delivery as configured, for ``check-config``'s summary (``delivery_said``).

Nothing here refuses a configuration: each warning is a trade the operator may mean (a Preempt that is
never approved early, a drain that relies on another signal than the probe), said once with its remedy.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from coordinator.config.actions import AzureLbActionConfig
from coordinator.config.base import MINIMUM_NOTICE_SECONDS
from coordinator.config.env import ignored_variables
from coordinator.config.policy import ApprovalRule
from coordinator.config.settings import Settings
from coordinator.delivery import DeliveryMode

__all__ = [
    "FIXED_NOTICE_TYPES",
    "config_warnings",
    "delivery_said",
    "delivery_warnings",
    "drain_warnings",
    "environment_warnings",
    "option_paths",
]

#: The event types whose notice Azure fixes (Terminate's is the scale set's notBeforeTimeout, 5 to 15 minutes,
#: which the file cannot tell: a Terminate wait is weighed against it by doctor's azure-terminate check).
FIXED_NOTICE_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt")


def config_warnings(settings: Settings, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every warning about ``settings`` loaded in ``environ`` (default: this process's environment): the
    ignored environment variables first (``environment_warnings``), then the drain waits (``drain_warnings``),
    then the delivery (``delivery_warnings``)."""
    return environment_warnings(environ) + drain_warnings(settings) + delivery_warnings(settings)


def delivery_said(settings: Settings) -> str:
    """The delivery as configured (``imds.unit``, ``imds.delivery``), in a few words: the unit, or where the
    agent learns it (a scale-set instance's ``placementGroupId``, which IMDS gives with its name only when
    ``vm_name`` is not set), and which events IMDS shows the VM (``coordinator.delivery``)."""
    imds = settings.imds
    if imds.unit is not None:
        unit = f"unit {imds.unit}"
    elif settings.vm_name is None:
        unit = "unit from IMDS (placementGroupId; unknown outside a scale set)"
    else:
        unit = "unit unknown (vm_name is set and imds.unit is not)"
    how = {
        DeliveryMode.UNIT: "every event of the unit",
        DeliveryMode.NAMED: "only events naming this VM",
        DeliveryMode.AUTO: "auto (every event of the unit once this VM's documents list an event naming other "
                           "VMs and not it; until then only events naming it)",
    }[imds.delivery]
    return f"{unit}, {how}"


def delivery_warnings(settings: Settings) -> list[str]:
    """``imds.delivery: unit`` where the agent cannot know its unit: ``imds.unit`` is not set and ``vm_name``
    is, so IMDS's ``placementGroupId`` is not read. A VM speaks for an event that does not name it only when
    the event is of a unit it knows (``Delivery.covers``): the setting then changes nothing."""
    if settings.imds.delivery is DeliveryMode.UNIT and settings.imds.unit is None and settings.vm_name is not None:
        return ["imds.delivery is unit, but imds.unit is not set and vm_name is, so the agent does not read its "
                "unit from IMDS (a scale-set instance's placementGroupId): a VM speaks only for events of a unit it "
                "knows, so unit-wide delivery helps nothing; set imds.unit to this VM's availability set or "
                "scale-set placement group, or remove vm_name on a scale-set instance"]
    return []


def environment_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables of ``environ`` (default: this process's environment) that look like overrides of this
    configuration's options but are not read (``ignored_variables``). Known without a valid file: an
    override meant to supply a required value may be just what is missing."""
    return ignored_variables(os.environ if environ is None else environ, option_paths(Settings))


def drain_warnings(settings: Settings) -> list[str]:
    """The drain waits of the event types approved after a drain, against two limits.

    * The type's notice: a wait not shorter than it acknowledges at NotBefore at the earliest, so the event
      is never approved early (a Preempt has 30 s; its default wait is 5 s).
    * The load balancer's probe lag, ``drain.probe_interval_seconds x drain.probe_threshold``: a drain that
      relies on the probe and acknowledges sooner does so while the load balancer still sends new flows.
      With an ``azure-lb`` action the drain relies on the admin state, and only its fallback wait (used when
      ARM fails) must cover the lag. A Preempt is not weighed: with 30 s of notice, a wait that covers the
      lag (30 s with Azure's default probe) leaves no early approval, and its short wait (5 s by default,
      whatever the probe) is the documented choice (docs/deployment-azure.md), not a slip to warn about."""
    drain = settings.drain
    after_drain = [t for t in (*FIXED_NOTICE_TYPES, "Terminate")
                   if settings.policy.approval.get(t, ApprovalRule.AFTER_DRAIN) is ApprovalRule.AFTER_DRAIN]
    warnings = []
    for event_type in after_drain:
        notice = MINIMUM_NOTICE_SECONDS[event_type]
        if event_type in FIXED_NOTICE_TYPES and drain.wait_for(event_type) >= notice:
            warnings.append(
                f"{_wait_said(settings, event_type)} is not shorter than a {event_type}'s {notice:g} s "
                f"of notice: a {event_type} is then never approved early and starts at NotBefore; give "
                f"drain.wait_seconds_by_type.{event_type} a shorter wait"
                + (" (its default is 5 s)" if event_type == "Preempt" else "")
            )
    lag = drain.probe_interval_seconds * drain.probe_threshold
    lag_said = f"the load balancer's probe lag (drain.probe_interval_seconds x drain.probe_threshold = {lag:g} s)"
    admin_state = [(i, a) for i, a in enumerate(settings.actions) if isinstance(a, AzureLbActionConfig)]
    if admin_state:
        for index, action in admin_state:
            fallback = action.fallback_wait_seconds
            if fallback is not None and fallback < lag:
                warnings.append(
                    f"actions.{index}.fallback_wait_seconds ({fallback:g} s) is shorter than {lag_said}: a drain "
                    "that could not use ARM acknowledges while the load balancer still sends new flows; raise it "
                    f"to at least {lag:g} s, or leave it null"
                )
        return warnings
    short: dict[str, list[str]] = {}
    for event_type in after_drain:
        if event_type != "Preempt" and drain.wait_for(event_type) < lag:
            short.setdefault(_wait_said(settings, event_type), []).append(event_type)
    for said, types in short.items():
        warnings.append(
            f"{said} is shorter than {lag_said}: {_listed(types)} "
            f"{'is' if len(types) == 1 else 'are'} acknowledged while the load balancer still sends new flows; "
            f"raise it to at least {lag:g} s, or set drain.probe_interval_seconds and drain.probe_threshold to the "
            "load balancer's probe"
        )
    return warnings


def _wait_said(settings: Settings, event_type: str) -> str:
    """This type's drain wait and the option that gives it, as the warnings name them."""
    drain = settings.drain
    wait = drain.wait_for(event_type)
    if event_type in drain.wait_seconds_by_type:
        return f"drain.wait_seconds_by_type.{event_type} ({wait:g} s)"
    if drain.wait_seconds is not None:
        return f"drain.wait_seconds ({wait:g} s)"
    return (f"the drain wait ({wait:g} s: drain.probe_interval_seconds x drain.probe_threshold + "
            "drain.grace_seconds)")


def _listed(types: list[str]) -> str:
    return types[0] if len(types) == 1 else ", ".join(types[:-1]) + " and " + types[-1]


def option_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every path an environment override may set in ``model``: each option, and each section (a
    section may be set whole, as a YAML mapping)."""
    return list(_paths(model, prefix))


def _paths(model: type[BaseModel], prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        yield path
        section = _section_of(field.annotation)
        if section is not None:
            yield from _paths(section, path)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a section, or of an optional one (``SomeConfig | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    arms = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(arms) == 1 and isinstance(arms[0], type) and issubclass(arms[0], BaseModel):
        return arms[0]
    return None
