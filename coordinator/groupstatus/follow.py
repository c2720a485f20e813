"""Following one VM's drain by hand to its end (``coordinator drain VM --wait`` and ``undrain VM --wait``):
each change said once, as ``coordinator status`` reads the group, until the VM is drained (its agent took it
out of rotation and its drain actions are done) or back in rotation, or the time is up."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

from coordinator.decide import Policy
from coordinator.groupstatus.analyse import build_status
from coordinator.groupstatus.model import GroupStatus
from coordinator.groupstatus.read import GroupReader, GroupStatusError
from coordinator.store.base import BY_HAND

__all__ = ["Outcome", "drain_state", "follow", "undrain_state"]


class Outcome(Enum):
    WAIT = "wait"  # not there yet
    DONE = "done"  # drained, or back in rotation
    STOP = "stop"  # it cannot get there by waiting (undone meanwhile, no agent)


def drain_state(status: GroupStatus, vm: str) -> tuple[Outcome, str]:
    """Where the drain by hand of ``vm`` stands, in the words ``coordinator status`` uses."""
    drain = next((d for d in status.drained_by_hand if d.vm == vm), None)
    if drain is None:
        return Outcome.STOP, "not drained by hand any more (undone meanwhile)"
    if drain.admitted_at is None:
        return Outcome.WAIT, "waiting for the maintenance budget: " + (drain.waiting or "the leader has not weighed it "
                                                                      "yet")
    if not drain.out:
        return Outcome.WAIT, f"admitted by {drain.admitted_by or 'the leader'}; its agent takes it out of rotation"
    if drain.phase != "drained":
        return Outcome.WAIT, f"out of rotation, draining ({drain.phase or 'its agent does not answer'})"
    return Outcome.DONE, "drained: out of rotation, its drain actions done"


def undrain_state(status: GroupStatus, vm: str) -> tuple[Outcome, str]:
    """Where ``vm`` stands on its way back from a drain by hand."""
    if any(d.vm == vm for d in status.drained_by_hand):
        return Outcome.STOP, "drained by hand again (asked again meanwhile)"
    member = next((m for m in status.members if m.vm == vm), None)
    if member is None:
        return Outcome.STOP, "runs no agent: it serves again once its agent runs"
    phase = member.agent.phase
    mark = next((m for m in status.out_of_rotation if m.vm == vm), None)
    if mark is None and phase == "serving":
        return Outcome.DONE, "back in rotation: serving"
    events = [e for e in mark.events if e != BY_HAND] if mark is not None else []
    if events:
        return Outcome.WAIT, f"held by {', '.join(events)} ({phase or 'its agent does not answer'})"
    if phase == "serving":
        return Outcome.WAIT, "serving again; its out-of-rotation mark is being cleared"
    return Outcome.WAIT, f"coming back ({phase or 'its agent does not answer'})"


def follow(reader: GroupReader, policy: Policy, vm: str, state: Callable[[GroupStatus, str], tuple[Outcome, str]],
           *, timeout: float, say: Callable[[str], None], interval: float = 1.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Read the group every ``interval`` and say each new state of ``vm`` until it is DONE or STOP, or
    ``timeout`` seconds have passed (WAIT). A failed read is said and tried again."""
    deadline = clock() + timeout
    said = ""
    while True:
        try:
            outcome, words = state(build_status(reader.read(), policy, "follow"), vm)
        except GroupStatusError as exc:
            outcome, words = Outcome.WAIT, f"cannot read the group: {exc}"
        if words != said:
            say(f"{vm}: {words}")
            said = words
        if outcome is not Outcome.WAIT or clock() >= deadline:
            return outcome
        sleep(interval)
