"""The ``drain`` section: how long a VM drains before it acknowledges, per event type, and when a drain
starts relative to the event's NotBefore.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from coordinator.actions.connections import probe_wait_seconds
from coordinator.config.base import EVENT_KEYS, Section, reads_stand_in, rules_off, stand_ins_of

__all__ = ["DrainConfig"]


_DEFAULT_WAIT_BY_TYPE: dict[str, float] = {"Preempt": 5.0}  # a Preempt has 30 s of notice


class DrainConfig(Section):
    probe_interval_seconds: float = Field(15.0, ge=1, description="The load balancer's probe interval")
    probe_threshold: int = Field(2, ge=1, description="Consecutive failed probes before the LB stops new flows")
    grace_seconds: float = Field(5.0, ge=0, description="Extra time for connections to close")
    wait_seconds: float | None = Field(
        None,
        ge=0,
        description="Time between failing the probe and acknowledging; default probe_interval_seconds x "
        "probe_threshold + grace_seconds (35 s with Azure's defaults)",
    )
    wait_seconds_by_type: dict[str, float] = Field(
        default_factory=lambda: dict(_DEFAULT_WAIT_BY_TYPE),
        description="Per event type override of wait_seconds (Preempt has only 30 s of notice); entries merge "
        "over the default {Preempt: 5}, null removes one",
    )
    latest_start_seconds: float = Field(
        120.0,
        ge=0,
        description="An event not admitted by the budget (or held by lead_time_seconds) still starts "
        "draining this long before its NotBefore",
    )
    lead_time_seconds: float | None = Field(
        None,
        ge=0,
        description="Start draining no earlier than this before NotBefore (for events announced days ahead); "
        "null: as soon as the event is admitted",
    )
    return_wait_seconds: float | None = Field(
        None,
        ge=0,
        description="After recovering, time until the load balancer routes to the VM again; only then does "
        "it count as serving for the budget; default: the drain wait",
    )
    gone_after_seconds: float = Field(
        3.0,
        ge=0,
        description="An event is gone for a VM once missing from (or no longer naming it in) at least two "
        "fresh documents over this long: a flapped read never puts a drained VM back",
    )
    unapprovable: Literal["just-in-time", "at-once"] = Field(
        "just-in-time",
        description="Events that can never be approved early (unknown type, approval never, a peer without "
        "an agent, an invalid name): drain latest_start_seconds before NotBefore, or at once",
    )

    @field_validator("wait_seconds", mode="before")
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        # A map here is a wait per type put under the wrong option: say which one takes it, rather than
        # pydantic's "should be a valid number".
        if isinstance(value, Mapping):
            shown = ", ".join(f"{key}: {wait}" for key, wait in value.items())
            raise ValueError("takes one number, the wait of every event type; a wait per type goes in "
                             f"drain.wait_seconds_by_type (wait_seconds_by_type: {{{shown}}})")
        return value

    @field_validator("wait_seconds_by_type", mode="before")
    @classmethod
    def _merge_defaults(cls, value: Any) -> Any:
        # {Reboot: 600} keeps Preempt's 5 s (a Preempt has 30 s of notice); {Preempt: null} drops it.
        if not isinstance(value, Mapping):
            return value
        merged = {**_DEFAULT_WAIT_BY_TYPE, **value}
        return {key: wait for key, wait in merged.items() if wait is not None}

    @field_validator("wait_seconds_by_type")
    @classmethod
    def _types(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(EVENT_KEYS[:-1]))
        if unknown:
            raise ValueError(f"unknown event type(s) {', '.join(unknown)}")
        if any(v < 0 for v in value.values()):
            raise ValueError("waits must be >= 0")
        return value

    @property
    def effective_wait(self) -> float:
        if self.wait_seconds is not None:
            return self.wait_seconds
        return probe_wait_seconds(self.probe_interval_seconds, self.probe_threshold, self.grace_seconds)

    def wait_for(self, event_type: str) -> float:
        """The drain wait of an event of this type."""
        return self.wait_seconds_by_type.get(event_type, self.effective_wait)

    def waits(self) -> dict[str, float]:
        """The drain wait of every event type (``wait_for`` of each), as the agent uses them."""
        return {event_type: self.wait_for(event_type) for event_type in EVENT_KEYS[:-1]}

    def effective_wait_inputs(self) -> tuple[str, ...]:
        """The options ``effective_wait`` is computed from (dotted paths): wait_seconds, or when it is
        null the probe's timing."""
        if self.wait_seconds is not None:
            return ("drain.wait_seconds",)
        return ("drain.wait_seconds", "drain.probe_interval_seconds", "drain.probe_threshold", "drain.grace_seconds")

    def wait_inputs(self, event_type: str) -> tuple[str, ...]:
        """The options the drain wait of this type is computed from (dotted paths): its entry in
        wait_seconds_by_type, and without one those of ``effective_wait``."""
        entry = f"drain.wait_seconds_by_type.{event_type}"
        if event_type in self.wait_seconds_by_type:
            return (entry,)
        return entry, *self.effective_wait_inputs()

    @model_validator(mode="after")
    def _lead(self, info: ValidationInfo) -> DrainConfig:
        if rules_off(info, "drain"):
            return self
        stand_ins = stand_ins_of(info)
        short = [(t, self.wait_for(t)) for t in EVENT_KEYS[:-1] if self.latest_start_seconds < self.wait_for(t)
                 and not reads_stand_in(stand_ins, "drain.latest_start_seconds", *self.wait_inputs(t))]
        if short:
            waits = ", ".join(f"{t} {w:g} s" for t, w in short)
            raise ValueError(
                f"drain.latest_start_seconds ({self.latest_start_seconds:g}) must be at least the drain wait of "
                f"every event type ({waits}), or a late drain cannot finish before NotBefore"
            )
        if self.lead_time_seconds is not None and self.lead_time_seconds < self.latest_start_seconds \
                and not reads_stand_in(stand_ins, "drain.lead_time_seconds", "drain.latest_start_seconds"):
            raise ValueError("drain.lead_time_seconds must be at least drain.latest_start_seconds")
        return self
