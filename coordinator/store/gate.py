"""The rules of the approval gate (``Store.approve``), once: what the gate read is given as ``GateFacts``, and
``refusal`` says whether the approval may be written, or why not. The ZooKeeper store reads the facts from
the ensemble itself after a ``sync`` (``coordinator.store.zk_gate``), then writes the approval; the rules
and the words of a refusal live here, apart from how the facts are read.

In order: this agent owns the node it approves as (``/leader``, held for this VM, or ``/members/{vm}``);
approvals are not paused; the record exists, parses and is not marked done; with ``admission``, the event
is admitted; every required VM has an ack that parses, names it, and is held by the session that holds
that VM's member node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["AckFact", "GateFacts", "refusal", "vouched_refusal"]


@dataclass(frozen=True)
class AckFact:
    """A required VM's ack as the gate read it: the session holding it, the session holding the VM's member
    node (None: the VM has none), and why its data is no ack (None: it parses and names the VM)."""

    session: int
    member_session: int | None
    unreadable: str | None = None
    at: float | None = None  # when the VM acknowledged, as its ack says (recorded with the approval)


@dataclass(frozen=True)
class GateFacts:
    """What the gate read for one approval. ``owner``: the session owning ``owner_path`` (None: no such node);
    ``holder``: whom the leader node names (with ``as_leader``); ``record``: None if the record is fine, else
    ``"missing"``, ``"done"`` or why it does not parse; ``admitted``: None when no admission is required;
    ``acks``: the ack of each required VM that has one."""

    event_id: str
    vm: str
    as_leader: bool
    session: int
    owner_path: str
    owner: int | None
    holder: str | None
    paused: bool
    record: str | None
    admitted: bool | None
    needed: frozenset[str]
    acks: Mapping[str, AckFact] = field(default_factory=dict)


def refusal(facts: GateFacts) -> str | None:
    """Why the approval may not be written (None: it may). See the module docstring for the order."""
    f = facts
    if f.owner is None:
        return f"{f.owner_path} does not exist: this agent is not {'the leader' if f.as_leader else 'a member'}"
    if f.owner != f.session:
        return f"{f.owner_path} belongs to session 0x{f.owner:x}, not ours (0x{f.session:x})"
    if f.as_leader and f.holder != f.vm:
        return f"{f.owner_path} is held by this session for {f.holder!r}, not {f.vm!r}"
    return _record_and_acks(f)


def vouched_refusal(facts: GateFacts, vouched: Mapping[str, int | None], named: frozenset[str] | None) -> str | None:
    """Why an operator's approval vouching for ``vouched`` (VM -> the session holding its member node, None:
    it has none) may not be written (``coordinator approve``): it is for VMs that run no agent, all named by
    the event (``named``: the record's Resources, None when the record could not be read), and every other VM
    it names must have acknowledged as for any approval. No ownership: the operator approves as no member."""
    if not vouched:
        return "no VM to vouch for: every VM it names runs an agent, and the group approves it itself"
    if named is not None:
        strangers = sorted(set(vouched) - named)
        if strangers:
            return f"event {facts.event_id} does not name {', '.join(strangers)}"
    running = sorted(vm for vm, session in vouched.items() if session is not None)
    if running:
        return f"{', '.join(running)} runs an agent now: its agent acknowledges for itself"
    return _record_and_acks(facts)


def _record_and_acks(f: GateFacts) -> str | None:
    """The rules every approval follows: not paused, the record there and open, admitted if asked, every
    required ack held by its VM's own live session."""
    if f.paused:
        return "approvals are paused for the group (coordinator resume lifts it)"
    if f.record == "missing":
        return f"event {f.event_id} has no record in the store"
    if f.record == "done":
        return f"event {f.event_id} is marked done"
    if f.record is not None:
        return f"event {f.event_id}: undecodable record: {f.record}"
    if f.admitted is False:
        return f"event {f.event_id} is not admitted"
    missing = sorted(f.needed - set(f.acks))
    if missing:
        return f"event {f.event_id}: no ack yet from {', '.join(missing)}"
    for name in sorted(f.needed):
        ack = f.acks[name]
        if ack.unreadable is not None:
            return f"event {f.event_id}: the ack of {name} does not count: {ack.unreadable}"
        # An agent acknowledges with the session its member node belongs to, so the ack vanishes with that
        # session. A node another session wrote (by hand, by a buggy or hostile client) or a member whose
        # session is not the ack's is no acknowledgement of a drain now.
        if not ack.member_session or ack.session != ack.member_session:
            return f"event {f.event_id}: the ack of {name} is not held by {name}'s own live session"
    return None
