"""Errors the simulator raises for control input it cannot act on.

On the control port ``InvalidRequest`` answers 400, ``UnknownEvent`` and ``UnknownVm`` answer 404.
"""

from __future__ import annotations

__all__ = ["InvalidRequest", "SimulatorError", "UnknownEvent", "UnknownVm"]


class SimulatorError(Exception):
    """Base of the errors the simulator raises for bad control input."""


class InvalidRequest(SimulatorError, ValueError):
    """A control request is malformed; the message names the field."""


class UnknownEvent(SimulatorError, KeyError):
    """No current event has this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown event"


class UnknownVm(SimulatorError, KeyError):
    """The VM is not part of the simulated group."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown VM"
