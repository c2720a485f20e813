"""What every section shares: the model base that refuses unknown keys and infinities, the HOST:PORT
check, the switch that turns a section's cross-field rule off, the test that keeps a rule from judging a
stand-in value, the event types options are keyed by, and their documented minimum notices.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pydantic import BaseModel, ConfigDict, ValidationInfo

__all__ = [
    "EVENT_KEYS",
    "MINIMUM_NOTICE_SECONDS",
    "Section",
    "host_port",
    "imds_base_url",
    "reads_stand_in",
    "rules_off",
    "stand_ins_of",
]


class Section(BaseModel):
    # No .inf or .nan anywhere: they would pass every bound (or none), then fail a later check under another
    # field's name, and check-config would print Infinity, which is not JSON.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def imds_base_url(value: str) -> str:
    """The IMDS base URL ``value`` without a trailing slash. Refused with a path under ``/metadata``
    (Microsoft's examples give the whole ``.../metadata/scheduledevents``): the agent adds the paths itself,
    and would ask ``.../metadata/scheduledevents/metadata/scheduledevents``, a 404."""
    base = value.rstrip("/")
    path = base.split("://", 1)[-1].partition("/")[2]
    if path == "metadata" or path.startswith("metadata/") or "/metadata/" in f"/{path}/":
        raise ValueError(f"give the base URL only, as http://169.254.169.254 (not {value!r}): the agent adds "
                         "/metadata/scheduledevents and /metadata/instance itself")
    return base


def rules_off(info: ValidationInfo, section: str) -> bool:
    """Whether the rule between the fields of ``section`` is off for this validation: after it failed,
    to find the errors it hid (see ``later_errors`` in ``coordinator.config.wording``)."""
    return isinstance(info.context, dict) and section in info.context.get("rules_off", ())


def stand_ins_of(info: ValidationInfo) -> frozenset[str]:
    """The options (dotted paths, such as ``probe.listen``) whose values are stand-ins in this validation:
    to find the errors the first ones hid, an invalid value is taken out and its default stands in for it
    (see ``later_errors`` in ``coordinator.config.wording``). Empty in an ordinary validation."""
    if not isinstance(info.context, dict):
        return frozenset()
    return frozenset(info.context.get("stand_ins", ()))


def reads_stand_in(stand_ins: Collection[str], *options: str) -> bool:
    """Whether a rule reading ``options`` would judge a stand-in (one of ``stand_ins``): computed from a
    default the file never gave, it would report a problem that is not there, so it is skipped. A path
    covers the paths below and above it: a whole section taken out stands in for each of its options, and
    one map entry taken out changes the map."""
    return any(taken == option or taken.startswith(option + ".") or option.startswith(taken + ".")
               for taken in stand_ins for option in options)


# The keys of policy.approval (User: user-initiated events, whatever their type); drain.wait_seconds_by_type
# takes all but User.
EVENT_KEYS = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "User")

#: The documented minimum notice of each event type, in seconds. Terminate's is what a scale set configures
#: (notBeforeTimeout, 5 to 15 minutes): the shortest is assumed where the scale set is not read.
MINIMUM_NOTICE_SECONDS: Mapping[str, float] = {"Freeze": 900.0, "Reboot": 900.0, "Redeploy": 600.0, "Preempt": 30.0,
                                               "Terminate": 300.0}
