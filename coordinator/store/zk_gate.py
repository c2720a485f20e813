"""``approve`` of the ZooKeeper store: the last gate before the POST to IMDS.

It re-confirms everything from the server itself, never from what an earlier read saw: the connection is
CONNECTED; after a ``sync``, the facts the gate's rules judge (``coordinator.store.gate``: this session owns
``/leader``, held for this VM, or ``/members/{vm}``; no operator has paused approvals; the record exists
and is not done; with ``admission``, the event is admitted; every required VM has acknowledged); the
session did not change meanwhile. Only then is ``approval`` created (or found: approval is idempotent,
whoever wrote it), naming the VMs whose acks the checks found (``ApprovalNode.acks``), in one transaction
with a rewrite of the record at the version the checks read (see ``coordinator.store.zk_records``):
should the record have changed since (marked done, reopened), the approval is not written and the checks
are made again.

Node data that does not parse: the leader node counts as held by nobody (REFUSED); a record that does not
parse is REFUSED, and so is a required ack that does not parse, names another VM, or is not an ephemeral
node of the session that holds that VM's member node (it is no ack); an existing approval record that
does not parse raises ``StoreUnknownOutcome``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import ZnodeStat

from coordinator.errors import StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import Approval, ApprovalOutcome, ApprovalResult, ConnectionState, WriteResult
from coordinator.store.gate import AckFact, GateFacts, refusal, vouched_refusal
from coordinator.store.payloads import AckNode, ApprovalNode, EventNode, LeaderNode, PayloadError
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_records import create_on_record
from coordinator.store.zk_session import Deadline

__all__ = ["approve", "approve_vouched"]

log = logging.getLogger(__name__)


ATTEMPTS = 2  # checks made again when the record changed between them and the approval's write


def approve(
    ctx: StoreContext, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
    admission: bool,
) -> ApprovalResult:
    """See ``Store.approve`` and the module docstring. Raises ``StoreUnknownOutcome`` when it cannot tell."""
    event_id = normalize_event_id(event_id)
    vm = normalize_vm_name(vm)
    needed = {normalize_vm_name(name) for name in required}
    for _ in range(ATTEMPTS):
        result = _approve(ctx, event_id, vm, needed, as_leader=as_leader, at=at, admission=admission)
        if result is not None:
            return result
    return _refused(f"event {event_id}: the record kept changing during the checks")


def approve_vouched(ctx: StoreContext, event_id: str, by: str, required: Collection[str], vouched: Collection[str],
                    *, reason: str, at: float) -> ApprovalResult:
    """An operator's approval (``Store.approve_vouched``): the gate's checks, from the ensemble after a sync,
    with the VMs of ``vouched`` (none of which may have a member node) in place of their acks, and no
    ownership (the operator approves as no member)."""
    event_id = normalize_event_id(event_id)
    needed = {normalize_vm_name(name) for name in required}
    vouching = frozenset(normalize_vm_name(name) for name in vouched)
    for _ in range(ATTEMPTS):
        result = _approve(ctx, event_id, by, needed, as_leader=False, at=at, admission=False, vouched=vouching,
                          reason=reason)
        if result is not None:
            return result
    return _refused(f"event {event_id}: the record kept changing during the checks")


def _approve(
    ctx: StoreContext, event_id: str, vm: str, needed: set[str], *, as_leader: bool, at: float, admission: bool,
    vouched: frozenset[str] | None = None, reason: str | None = None,
) -> ApprovalResult | None:
    """One round of checks, then the write; None if the record changed since the checks read it. With
    ``vouched``, an operator's approval (``vm`` is the operator): ``vouched_refusal`` judges it."""
    paths, wait = ctx.paths, ctx.session.wait

    # 1. The connection is CONNECTED (SUSPENDED may mean that our session, and leadership, are gone).
    try:
        client, session = ctx.session.connected(write=True)
    except StoreUnknownOutcome as exc:
        return ApprovalResult(ApprovalOutcome.REFUSED, reason=str(exc))
    deadline = ctx.session.deadline()
    with ctx.session.writing(f"event {event_id}: approve as {vm}"):
        # 2. Synced reads: the server we talk to has caught up with the ensemble's leader, so a node
        # deleted elsewhere (an expired leader) is not still seen here. All are sent at once: a server
        # answers one session's requests in order, so the reads are served after the sync is done.
        owner_path = paths.base if vouched is not None else paths.leader if as_leader else paths.member(vm)
        sync_r = client.sync_async(paths.base)
        reads = _Reads(
            owner=client.get_async(owner_path),
            record=client.get_async(paths.event(event_id)),
            # Each required ack is read by name (no list: a missing one answers NoNode), not only listed: a
            # node that does not parse is no acknowledgement, and neither is one that the VM's own live
            # session does not hold (``gate.refusal``). This VM's own member node is the owner read already.
            ack=(ack_rs := {name: client.get_async(paths.ack(event_id, name)) for name in sorted(needed)}),
            member={name: client.exists_async(paths.member(name)) for name in ack_rs
                    if paths.member(name) != owner_path},
            pause=client.exists_async(paths.pause),
            vouched={name: client.exists_async(paths.member(name)) for name in sorted(vouched or ())},
        )
        wait(sync_r, deadline)
        # 3. What they answered, judged by the gate's rules (``coordinator.store.gate``).
        asked = GateFacts(event_id, vm, as_leader, session, owner_path, None, None, False, None, None,
                          frozenset(needed))
        facts = reads.facts(ctx, client, asked, deadline, admission)
        record_node, record_stat = reads.record_read
        if vouched is None:
            refused = refusal(facts)
        else:
            members = {name: (stat.ephemeralOwner or None) if (stat := wait(result, deadline)) is not None else None
                       for name, result in reads.vouched.items()}
            named = frozenset(record_node.resources) if record_node is not None else None
            unaccounted = sorted(named - vouched - needed) if named is not None else []
            refused = vouched_refusal(facts, members, named) or (
                f"event {event_id} names {', '.join(unaccounted)}, neither acknowledged nor vouched for"
                if unaccounted else None)
        if refused is not None:
            return _refused(refused)
        assert record_node is not None and record_stat is not None  # or ``refusal`` would have refused

        # 4. Nothing changed locally meanwhile, then write the approval once (or find it).
        client_id = client.client_id
        state = ctx.session.connection_state
        if state is not ConnectionState.CONNECTED or client_id is None or client_id[0] != session:
            return _refused("the ZooKeeper session changed during the checks")
        # Written with the record as checked: it fails if the record was marked done (or reopened, or
        # approved by another) since, and a done mark that listed the record's children before fails.
        # The acks the checks found (every required one: ``refusal`` passed), recorded with the approval.
        # An operator's word the group approves on (``coordinator approve``) is kept with the approval.
        word = record_node.vouched
        approval = Approval(by=vm, at=at, as_leader=as_leader, acks=tuple(sorted(facts.acks)),
                            acked_at={name: fact.at for name, fact in facts.acks.items() if fact.at is not None},
                            vouched=tuple(sorted(vouched)) if vouched is not None else
                            word.vms if word is not None else None,
                            reason=reason if vouched is not None else word.reason if word is not None else None,
                            vouched_by=vm if vouched is not None else word.by if word is not None else None)
        written = create_on_record(ctx, client, paths.event(event_id), record_node, record_stat, "approval",
                                   ApprovalNode.of(approval), deadline)
        if written is None:
            log.info("event %s: the record changed during the checks: checking again", event_id)
            return None
        if written is WriteResult.MISSING:
            return _refused(f"event {event_id} has no record in the store")
        if written is WriteResult.DONE and vouched is not None:
            log.warning("event %s: approval recorded by %s, vouching for %s (%s)", event_id, vm,
                        ", ".join(sorted(vouched)), reason)
            return ApprovalResult(ApprovalOutcome.APPROVED, record=approval)
        if written is WriteResult.DONE:
            log.info("event %s: approval recorded by %s (as leader: %s)", event_id, vm, as_leader)
            return ApprovalResult(ApprovalOutcome.APPROVED, record=approval)
        data, _ = wait(client.get_async(paths.approval(event_id)), deadline)
    try:
        existing = ApprovalNode.from_bytes(data, paths.approval(event_id)).to_approval()
    except PayloadError as exc:
        raise StoreUnknownOutcome(f"event {event_id}: undecodable approval record: {exc}") from exc
    return ApprovalResult(ApprovalOutcome.APPROVED, reason="approved before", record=existing)


@dataclass
class _Reads:
    """The gate's synced reads, sent at once, and what they answered (``facts``)."""

    owner: IAsyncResult[tuple[bytes, ZnodeStat]]
    record: IAsyncResult[tuple[bytes, ZnodeStat]]
    ack: Mapping[str, IAsyncResult[tuple[bytes, ZnodeStat]]]
    member: Mapping[str, IAsyncResult[ZnodeStat | None]]
    pause: IAsyncResult[ZnodeStat | None]
    vouched: Mapping[str, IAsyncResult[ZnodeStat | None]]  # the member nodes of the VMs an operator vouches for
    record_read: tuple[EventNode | None, ZnodeStat | None] = (None, None)  # the record and its stat, as read

    def facts(self, ctx: StoreContext, client: KazooClient, asked: GateFacts, deadline: Deadline,
              admission: bool) -> GateFacts:
        """``asked`` (what is approved, by whom, as what) with what the reads answered. With ``admission``,
        whether the event is admitted: from the record's copy of its ``admitted`` child while the copy holds
        (``EventNode.mirrors``: the record's data version and ``cversion`` are the ones the write that made
        it left, so no child was created or deleted since), else from the child itself, read after the
        record."""
        paths, wait = ctx.paths, ctx.session.wait
        owner: int | None = None
        owner_session: int | None = None
        holder: str | None = None
        try:
            data, stat = wait(self.owner, deadline)
            owner = stat.ephemeralOwner
            owner_session = owner or None
            if asked.as_leader:
                try:
                    holder = LeaderNode.from_bytes(data, asked.owner_path).vm
                except PayloadError as exc:
                    log.warning("undecodable leader node, held by nobody: %s", exc)
        except NoNodeError:
            pass
        record: str | None = None
        admitted: bool | None = None
        try:
            record_data, record_stat = wait(self.record, deadline)
            node = EventNode.from_bytes(record_data, paths.event(asked.event_id))
            self.record_read = (node, record_stat)
            if node.done_at is not None:
                record = "done"
            if admission and node.mirrors(record_stat):
                admitted = node.admitted is not None
        except NoNodeError:
            record = "missing"
        except PayloadError as exc:
            record = str(exc)
        if admission and admitted is None:
            admitted = wait(client.exists_async(paths.admitted(asked.event_id)), deadline) is not None
        acks: dict[str, AckFact] = {}
        for name in sorted(asked.needed):
            try:
                ack_data, ack_stat = wait(self.ack[name], deadline)
            except NoNodeError:
                continue  # withdrawn meanwhile: no ack
            unreadable: str | None = None
            acked_at: float | None = None
            try:
                acked_at = AckNode.of_vm(ack_data, paths.ack(asked.event_id, name), name).at
            except PayloadError as exc:
                unreadable = str(exc)
            if name in self.member:
                member = wait(self.member[name], deadline)
                member_session = member.ephemeralOwner if member is not None else None
            else:
                member_session = owner_session  # this VM's own member node: the owner read
            acks[name] = AckFact(ack_stat.ephemeralOwner, member_session, unreadable, acked_at)
        return replace(asked, owner=owner, holder=holder, paused=wait(self.pause, deadline) is not None,
                       record=record, admitted=admitted, acks=acks)


def _refused(reason: str) -> ApprovalResult:
    log.info("approval refused: %s", reason)
    return ApprovalResult(ApprovalOutcome.REFUSED, reason=reason)
