"""Drain and recover actions: one protocol, run in the configured order (recovery in reverse)."""

from coordinator.actions.base import Action, ActionContext, run_drain, run_recover
from coordinator.actions.probe import ProbeAction, ProbeState

__all__ = [
    "Action",
    "ActionContext",
    "ProbeAction",
    "ProbeState",
    "run_drain",
    "run_recover",
]
