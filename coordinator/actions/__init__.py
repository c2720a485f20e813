"""Drain and recover actions: one protocol, run in the configured order (recovery in reverse)."""

from coordinator.actions.base import Action, ActionContext, DryRunAction, run_drain, run_recover
from coordinator.actions.probe import ProbeAction, ProbeState

__all__ = [
    "Action",
    "ActionContext",
    "DryRunAction",
    "ProbeAction",
    "ProbeState",
    "run_drain",
    "run_recover",
]
