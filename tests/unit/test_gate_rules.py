"""The approval gate's rules (``coordinator.store.gate.refusal``), as a table of what the gate read and what it
says. The ZooKeeper store judges its reads with it: they are driven through its refusals on a real server in
``tests/integration/test_zookeeper_store.py``, and over the fake ZooKeeper by the model-based suite."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.store.gate import AckFact, GateFacts, refusal

E = "E1"
FINE = GateFacts(event_id=E, vm="vm1", as_leader=False, session=0x10, owner_path="/g/members/vm1", owner=0x10,
                 holder=None, paused=False, record=None, admitted=True, needed=frozenset({"vm1", "vm2"}),
                 acks={"vm1": AckFact(0x10, 0x10), "vm2": AckFact(0x20, 0x20)})
LEADING = replace(FINE, as_leader=True, owner_path="/g/leader", holder="vm1")


@pytest.mark.parametrize(("case", "facts", "reason"), [
    ("everything holds", FINE, None),
    ("as leader", LEADING, None),
    ("no admission asked", replace(FINE, admitted=None), None),
    ("not a member", replace(FINE, owner=None), "/g/members/vm1 does not exist: this agent is not a member"),
    ("not the leader", replace(LEADING, owner=None), "/g/leader does not exist: this agent is not the leader"),
    ("another session owns it", replace(FINE, owner=0x11), "/g/members/vm1 belongs to session 0x11, not ours (0x10)"),
    ("the leader node names another", replace(LEADING, holder="vm9"),
     "/g/leader is held by this session for 'vm9', not 'vm1'"),
    ("an undecodable leader node", replace(LEADING, holder=None),
     "/g/leader is held by this session for None, not 'vm1'"),
    ("paused", replace(FINE, paused=True), "approvals are paused for the group (coordinator resume lifts it)"),
    ("no record", replace(FINE, record="missing"), "event E1 has no record in the store"),
    ("done", replace(FINE, record="done"), "event E1 is marked done"),
    ("an undecodable record", replace(FINE, record="bad json"), "event E1: undecodable record: bad json"),
    ("not admitted", replace(FINE, admitted=False), "event E1 is not admitted"),
    ("an ack missing", replace(FINE, acks={"vm1": AckFact(0x10, 0x10)}), "event E1: no ack yet from vm2"),
    ("an undecodable ack", replace(FINE, acks={**FINE.acks, "vm2": AckFact(0x20, 0x20, "names vm3")}),
     "event E1: the ack of vm2 does not count: names vm3"),
    ("an ack of another session", replace(FINE, acks={**FINE.acks, "vm2": AckFact(0x21, 0x20)}),
     "event E1: the ack of vm2 is not held by vm2's own live session"),
    ("an ack of a VM without a member node", replace(FINE, acks={**FINE.acks, "vm2": AckFact(0x20, None)}),
     "event E1: the ack of vm2 is not held by vm2's own live session"),
    # The first rule that fails is the one said: ownership before the pause, the pause before the record.
    ("paused and not a member", replace(FINE, owner=None, paused=True),
     "/g/members/vm1 does not exist: this agent is not a member"),
    ("done and paused", replace(FINE, record="done", paused=True),
     "approvals are paused for the group (coordinator resume lifts it)"),
])
def test_the_gate_refuses_for_the_first_rule_that_fails(case: str, facts: GateFacts, reason: str | None) -> None:
    assert refusal(facts) == reason, case
