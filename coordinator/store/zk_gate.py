"""``approve`` of the ZooKeeper store: the last gate before the POST to IMDS.

It re-confirms everything from the server itself, never from what an earlier read saw: the connection is
CONNECTED; after a ``sync``, this session owns ``/leader`` (and holds it for this VM) or
``/members/{vm}``; no operator has paused approvals (``/pause``); the record exists and is not done;
with ``admission``, the event is admitted; every required VM has acknowledged; the session did not change
meanwhile. Only then is ``approval`` created (or found: approval is idempotent, whoever wrote it), in
one transaction with a rewrite of the record at the version the checks read (see
``coordinator.store.zk_records``): should the record have changed since (marked done, reopened), the
approval is not written and the checks are made again.

Node data that does not parse: the leader node counts as held by nobody (REFUSED); a record that does not
parse is REFUSED, and so is a required ack that does not parse, names another VM, or is not an ephemeral
node of the session that holds that VM's member node (it is no ack); an existing approval record that
does not parse raises ``StoreUnknownOutcome``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from kazoo.exceptions import NoNodeError

from coordinator.errors import StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import Approval, ApprovalOutcome, ApprovalResult, ConnectionState, WriteResult
from coordinator.store.payloads import AckNode, ApprovalNode, EventNode, LeaderNode, PayloadError
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_records import create_on_record

__all__ = ["approve"]

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


def _approve(
    ctx: StoreContext, event_id: str, vm: str, needed: set[str], *, as_leader: bool, at: float, admission: bool,
) -> ApprovalResult | None:
    """One round of checks, then the write; None if the record changed since the checks read it."""
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
        owner_path = paths.leader if as_leader else paths.member(vm)
        sync_r = client.sync_async(paths.base)
        owner_r = client.get_async(owner_path)
        record_r = client.get_async(paths.event(event_id))
        admitted_r = client.exists_async(paths.admitted(event_id)) if admission else None
        acks_r = client.get_children_async(paths.acks(event_id))
        # Each required ack is read, not only listed: a node that does not parse is no acknowledgement,
        # and neither is one that the VM's own live session does not hold (see step 3).
        ack_rs = {name: client.get_async(paths.ack(event_id, name)) for name in sorted(needed)}
        member_rs = {name: client.exists_async(paths.member(name)) for name in sorted(needed)}
        pause_r = client.exists_async(paths.pause)
        wait(sync_r, deadline)
        try:
            data, stat = wait(owner_r, deadline)
        except NoNodeError:
            role = "the leader" if as_leader else "a member"
            return _refused(f"{owner_path} does not exist: this agent is not {role}")
        if stat.ephemeralOwner != session:
            return _refused(f"{owner_path} belongs to session 0x{stat.ephemeralOwner:x}, not ours (0x{session:x})")
        if as_leader:
            try:
                holder: str | None = LeaderNode.from_bytes(data, owner_path).vm
            except PayloadError as exc:
                log.warning("undecodable leader node, held by nobody: %s", exc)
                holder = None
            if holder != vm:
                return _refused(f"{owner_path} is held by this session for {holder!r}, not {vm!r}")

        if wait(pause_r, deadline) is not None:
            return _refused("approvals are paused for the group (coordinator resume lifts it)")

        # 3. The record is not done (a returning event is reopened first), it is admitted if it must be,
        # and every required VM has acknowledged.
        try:
            record_data, record_stat = wait(record_r, deadline)
            done_at = EventNode.from_bytes(record_data, paths.event(event_id)).done_at
        except NoNodeError:
            return _refused(f"event {event_id} has no record in the store")
        except PayloadError as exc:
            return _refused(f"event {event_id}: undecodable record: {exc}")
        if done_at is not None:
            return _refused(f"event {event_id} is marked done")
        if admitted_r is not None and wait(admitted_r, deadline) is None:
            return _refused(f"event {event_id} is not admitted")
        try:
            ack_names: list[str] = wait(acks_r, deadline)
        except NoNodeError:
            return _refused(f"event {event_id} has no record in the store")
        missing = sorted(needed - set(ack_names))
        if missing:
            return _refused(f"event {event_id}: no ack yet from {', '.join(missing)}")
        for name, ack_r in ack_rs.items():
            try:
                ack_data, ack_stat = wait(ack_r, deadline)
                AckNode.of_vm(ack_data, paths.ack(event_id, name), name)
            except NoNodeError:
                return _refused(f"event {event_id}: no ack yet from {name}")
            except PayloadError as exc:
                return _refused(f"event {event_id}: the ack of {name} does not count: {exc}")
            # An agent acknowledges with the session its member node belongs to, so the ack vanishes
            # with that session. A node another session wrote (by hand, by a buggy or hostile client)
            # or a member whose session is not the ack's is no acknowledgement of a drain now.
            member = wait(member_rs[name], deadline)
            owner = member.ephemeralOwner if member is not None else 0
            if not owner or ack_stat.ephemeralOwner != owner:
                return _refused(f"event {event_id}: the ack of {name} is not held by {name}'s own live session")

        # 4. Nothing changed locally meanwhile, then write the approval once (or find it).
        client_id = client.client_id
        state = ctx.session.connection_state
        if state is not ConnectionState.CONNECTED or client_id is None or client_id[0] != session:
            return _refused("the ZooKeeper session changed during the checks")
        # Written with the record as checked: it fails if the record was marked done (or reopened, or
        # approved by another) since, and a done mark that listed the record's children before fails.
        approval = Approval(by=vm, at=at, as_leader=as_leader)
        written = create_on_record(ctx, client, paths.event(event_id), record_data, record_stat.version,
                                   paths.approval(event_id), ApprovalNode.of(approval).to_bytes(), deadline)
        if written is None:
            log.info("event %s: the record changed during the checks: checking again", event_id)
            return None
        if written is WriteResult.MISSING:
            return _refused(f"event {event_id} has no record in the store")
        if written is WriteResult.DONE:
            log.info("event %s: approval recorded by %s (as leader: %s)", event_id, vm, as_leader)
            return ApprovalResult(ApprovalOutcome.APPROVED, record=approval)
        data, _ = wait(client.get_async(paths.approval(event_id)), deadline)
    try:
        existing = ApprovalNode.from_bytes(data, paths.approval(event_id)).to_approval()
    except PayloadError as exc:
        raise StoreUnknownOutcome(f"event {event_id}: undecodable approval record: {exc}") from exc
    return ApprovalResult(ApprovalOutcome.APPROVED, reason="approved before", record=existing)


def _refused(reason: str) -> ApprovalResult:
    log.info("approval refused: %s", reason)
    return ApprovalResult(ApprovalOutcome.REFUSED, reason=reason)
