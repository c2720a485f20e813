"""What every section shares: the model base that refuses unknown keys and infinities, the HOST:PORT
check, the switch that turns a section's cross-field rule off, and the event types options are keyed by.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationInfo

__all__ = [
    "_EVENT_KEYS",
    "_Section",
    "_host_port",
    "_rules_off",
]


class _Section(BaseModel):
    # No .inf or .nan anywhere: they would pass every bound (or none), then fail a later check under another
    # field's name, and check-config would print Infinity, which is not JSON.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def _rules_off(info: ValidationInfo, section: str) -> bool:
    """Whether the rule between the fields of ``section`` is off for this validation: after it failed,
    to find the errors it hid (see ``_later_errors`` in ``coordinator.config.wording``)."""
    return isinstance(info.context, dict) and section in info.context.get("rules_off", ())


# The keys of policy.approval (User: user-initiated events, whatever their type); drain.wait_seconds_by_type
# takes all but User.
_EVENT_KEYS = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "User")
