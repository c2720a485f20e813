"""The writes of the ZooKeeper store other than membership and approval: event records (publish, acks,
admission, done and reopened, purge), absences and out-of-rotation marks.

Each function is one store method (see ``coordinator.store.base`` for the contract): it sends nothing
unless CONNECTED, is bounded by one deadline, and turns a kazoo failure into ``StoreUnknownOutcome``.

``admitted`` and ``approval`` (see ``coordinator.store.zk_gate``) are created only together with a
versioned rewrite of their record that copies them into its data (``create_on_record``; readers then need
the record's data only), and ``mark_done`` and ``reopen`` rewrite the record with the version they read:
of an admission (or approval) and a done mark sent at the same time, whichever lands second fails, is
re-read and decided again. So an admission never lands on a record marked done since
it was read, and none created after ``mark_done`` read the record survives it (ZooKeeper's multi can check
a node's data version only, not its ``cversion``, the count of its children's changes: hence the rewrite
of the record's data rather than a bare check).

Node data that does not parse: the record read by ``admit``, ``mark_done`` or ``reopen`` raises
``StoreUnknownOutcome``; ``purge_done`` leaves such a record, with a warning; ``mark_out`` rewrites an
``/out/{vm}`` it cannot read, with ``since`` set to now.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Literal

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from coordinator.errors import StoreUnknownOutcome
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import EventRecord, WriteResult
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    ApprovalNode,
    ClosedNode,
    EventNode,
    OutNode,
    PayloadError,
    VouchNode,
)
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_session import Deadline

__all__ = [
    "Known",
    "acknowledge",
    "admit",
    "clear_absent",
    "clear_out",
    "create_on_record",
    "mark_absent",
    "mark_out",
    "publish_event",
    "purge_done",
    "set_done",
    "subtree",
    "withdraw_ack",
]

log = logging.getLogger(__name__)


def publish_event(ctx: StoreContext, record: EventRecord) -> WriteResult:
    """Create ``/events/{EVENT_ID}`` and its ``acks`` node atomically. The record's ``acks``, ``approval``
    and ``admitted_at`` are not written (they have their own methods)."""
    event_id = normalize_event_id(record.event_id)
    published_by = normalize_vm_name(record.published_by)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    data = EventNode.of(
        EventRecord(
            event_id=event_id,
            event_type=record.event_type,
            resources=record.resources,
            not_before=record.not_before,
            published_by=published_by,
            published_at=record.published_at,
            done_at=record.done_at,
            unit=record.unit,
        )
    ).to_bytes()
    with ctx.session.writing(f"publish event {event_id}"):
        for _ in range(2):
            transaction = client.transaction()
            transaction.create(ctx.paths.event(event_id), data)
            transaction.create(ctx.paths.acks(event_id), b"")
            results = ctx.session.wait(transaction.commit_async(), deadline)
            first = results[0] if results else None
            if isinstance(first, NodeExistsError):
                return WriteResult.EXISTS
            if isinstance(first, NoNodeError):
                ctx.ensure_layout(client, deadline)
                continue
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            log.info("event %s: published by %s", event_id, published_by)
            return WriteResult.DONE
    return WriteResult.MISSING


def acknowledge(ctx: StoreContext, event_id: str, vm: str, at: float) -> WriteResult:
    event_id = normalize_event_id(event_id)
    vm = normalize_vm_name(vm)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    data = AckNode(vm=vm, at=at).to_bytes()
    with ctx.session.writing(f"event {event_id}: acknowledge for {vm}"):
        try:
            # Ephemeral: the ack stands only as long as the session of the agent that drained.
            ctx.session.wait(client.create_async(ctx.paths.ack(event_id, vm), data, ephemeral=True), deadline)
        except NodeExistsError:
            return WriteResult.EXISTS
        except NoNodeError:
            return WriteResult.MISSING
    return WriteResult.DONE


def withdraw_ack(ctx: StoreContext, event_id: str, vm: str) -> WriteResult:
    event_id = normalize_event_id(event_id)
    vm = normalize_vm_name(vm)
    return _delete(ctx, ctx.paths.ack(event_id, vm), f"event {event_id}: withdraw the ack of {vm}")


Known = tuple[bytes, ZnodeStat]
"""A record's data and stat as an earlier watched read of this session got them: a versioned rewrite
starts from it instead of reading the record again, and reads it only if the rewrite finds it changed."""


def admit(ctx: StoreContext, event_id: str, vm: str, at: float, *, known: Known | None = None) -> WriteResult:
    """Create ``admitted`` under the event, once, on the record as read (first as ``known``, if given):
    MISSING if the record is gone or marked done (now, or by the time the admission would land). The store
    does not check that ``vm`` leads."""
    event_id = normalize_event_id(event_id)
    vm = normalize_vm_name(vm)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    path = ctx.paths.event(event_id)
    with ctx.session.writing(f"event {event_id}: admit (by {vm})"):
        for _ in range(3):
            try:
                record, stat = known if known is not None else ctx.session.wait(client.get_async(path), deadline)
            except NoNodeError:
                return WriteResult.MISSING
            known = None  # a rewrite that fails reads the record from the server
            try:
                node = EventNode.from_bytes(record, path)
            except PayloadError as exc:
                raise StoreUnknownOutcome(f"event {event_id}: undecodable record: {exc}") from exc
            if node.done_at is not None:
                return WriteResult.MISSING
            result = create_on_record(ctx, client, path, node, stat, "admitted", AdmittedNode(by=vm, at=at), deadline)
            if result is WriteResult.DONE:
                log.info("event %s: admitted by %s", event_id, vm)
            if result is not None:
                return result
    raise StoreUnknownOutcome(f"event {event_id}: record keeps changing")


def create_on_record(
    ctx: StoreContext, client: KazooClient, path: str, node: EventNode, stat: ZnodeStat,
    child: Literal["admitted", "approval"], payload: AdmittedNode | ApprovalNode, deadline: Deadline,
) -> WriteResult | None:
    """Create ``child`` of the record at ``path`` in one transaction with a rewrite of the record, as read
    (``node``, whose stat was ``stat``), that copies ``payload`` into it (``EventNode.mirrors``): the record's data
    version moves, so that a ``set_done`` that read it before fails, and this fails if the record was
    rewritten (marked done, reopened, another child created this way) since it was read. DONE; EXISTS if
    ``child`` exists; MISSING if the record is gone; None if it changed since it was read (read it again
    and decide again)."""
    copied = _copy_of_children(ctx, client, path, node, stat, deadline)
    transaction = client.transaction()
    transaction.set_data(path, node.rewritten(stat, 1, **{**copied, child: payload}), version=stat.version)
    transaction.create(f"{path}/{child}", payload.to_bytes())
    results = ctx.session.wait(transaction.commit_async(), deadline)
    rewrite, created = [*results, None, None][:2]
    if isinstance(rewrite, BadVersionError):
        return None
    if isinstance(rewrite, NoNodeError):
        return WriteResult.MISSING
    if isinstance(created, NodeExistsError):
        return WriteResult.EXISTS
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure
    return WriteResult.DONE


def _copy_of_children(
    ctx: StoreContext, client: KazooClient, path: str, node: EventNode, stat: ZnodeStat, deadline: Deadline,
) -> dict[str, AdmittedNode | ApprovalNode | None]:
    """What a rewrite of the record at ``path`` (``node``, whose stat is ``stat``) copies of its ``admitted`` and
    ``approval``: the node's own copy where it holds (``EventNode.mirrors``), else (written by a version
    that does not keep one, or a child made by hand) the children themselves, read now. The rewrite is
    versioned: a rewrite of the record since fails it. A child that does not parse is copied as the view shows it
    (``coordinator.store.zk_view``): admitted at its creation time, approved by ``"?"`` at 0."""
    if node.mirrors(stat):
        return {"admitted": node.admitted, "approval": node.approval}
    wait = ctx.session.wait
    try:
        children = wait(client.get_children_async(path), deadline)
    except NoNodeError:
        return {"admitted": None, "approval": None}
    copied: dict[str, AdmittedNode | ApprovalNode | None] = {"admitted": None, "approval": None}
    for name in ("admitted", "approval"):
        if name not in children:
            continue
        try:
            data, child_stat = wait(client.get_async(f"{path}/{name}"), deadline)
        except NoNodeError:
            continue  # gone since: the versioned rewrite fails, and the caller reads again
        if name == "admitted":
            copied[name] = AdmittedNode.or_created(data, f"{path}/{name}", child_stat)
        else:
            try:
                copied[name] = ApprovalNode.from_bytes(data, f"{path}/{name}")
            except PayloadError:
                copied[name] = ApprovalNode.unknown()
    return copied


def mark_absent(ctx: StoreContext, vm: str, at: float) -> WriteResult:
    vm = normalize_vm_name(vm)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    data = AbsentNode(since=at).to_bytes()
    with ctx.session.writing(f"mark {vm} absent"):
        for _ in range(2):
            try:
                ctx.session.wait(client.create_async(ctx.paths.absent_vm(vm), data), deadline)
                return WriteResult.DONE
            except NodeExistsError:
                return WriteResult.EXISTS
            except NoNodeError:
                ctx.ensure_layout(client, deadline)
    raise StoreUnknownOutcome(f"{ctx.paths.absent} keeps disappearing")


def clear_absent(ctx: StoreContext, vm: str) -> WriteResult:
    vm = normalize_vm_name(vm)
    return _delete(ctx, ctx.paths.absent_vm(vm), f"clear the absence of {vm}")


def set_done(ctx: StoreContext, event_id: str, done_at: float | None, *,
             drop: tuple[Literal["admitted", "approval"], ...], started_at: float | None = None,
             known: Known | None = None) -> WriteResult:
    """Rewrite the record's ``done_at`` (EXISTS if it already is set, or clear, as asked) and delete the
    children named in ``drop`` (and their copies in the record's data), in one transaction, versioned so
    that a concurrent writer is never overwritten: re-read and decide again. A child created since the
    record was read moved its version (``create_on_record``): the transaction fails and it is read again.
    Every other field of the record is kept (including fields unknown to this version), but the history's:
    marking done sets ``started_at`` and ``closed`` (what ``admitted`` and ``approval`` held, from the copy
    the rewrite reads anyway: no request more), reopening clears them. Raises ``StoreUnknownOutcome`` if the
    record does not parse. The first attempt starts from ``known``, if given."""
    event_id = normalize_event_id(event_id)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    path = ctx.paths.event(event_id)
    wait = ctx.session.wait
    with ctx.session.writing(f"event {event_id}: {'reopen' if done_at is None else 'mark done'}"):
        for _ in range(3):
            read = _record(ctx, client, event_id, deadline, known)
            known = None  # a rewrite that fails reads the record from the server
            if read is None:
                return WriteResult.MISSING
            node, stat = read
            if (node.done_at is None) == (done_at is None):
                return WriteResult.EXISTS
            copied = _copy_of_children(ctx, client, path, node, stat, deadline)
            deleted = [child for child in drop if copied.get(child) is not None]
            kept = {name: (None if name in drop else child) for name, child in copied.items()}
            closed = None
            if done_at is not None:
                admitted, approval = copied["admitted"], copied["approval"]
                closed = ClosedNode(done_at=done_at, admitted=admitted if isinstance(admitted, AdmittedNode) else None,
                                    approval=approval if isinstance(approval, ApprovalNode) else None)
            history = {"started_at": started_at if done_at is not None else None, "closed": closed}
            transaction = client.transaction()
            # An operator's word for VMs without an agent holds for the event as it was: neither a done mark
            # nor a reopening keeps it.
            transaction.set_data(path, node.rewritten(stat, len(deleted), **kept, **history, done_at=done_at,
                                                      vouched=None), version=stat.version)
            for child in deleted:
                transaction.delete(f"{path}/{child}")
            results = wait(transaction.commit_async(), deadline)
            if not any(isinstance(result, Exception) for result in results):
                return WriteResult.DONE
    raise StoreUnknownOutcome(f"event {event_id}: record keeps changing")


def vouch(ctx: StoreContext, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
    """Write an operator's word for ``vms`` into the open record (``Store.vouch``), with the version read and
    the copy of its children as they are (as ``set_done`` does)."""
    event_id = normalize_event_id(event_id)
    named = tuple(sorted(normalize_vm_name(vm) for vm in vms))
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    wait = ctx.session.wait
    path = ctx.paths.event(event_id)
    with ctx.session.writing(f"event {event_id}: vouch for {', '.join(named)} (by {by})"):
        for _ in range(3):
            read = _record(ctx, client, event_id, deadline)
            if read is None or read[0].done_at is not None:
                return WriteResult.MISSING
            node, stat = read
            if node.vouched is not None:
                return WriteResult.EXISTS
            copied = _copy_of_children(ctx, client, path, node, stat, deadline)
            word = VouchNode(by=by, at=at, reason=reason, vms=named)
            try:
                wait(client.set_async(path, node.rewritten(stat, 0, **copied, vouched=word), version=stat.version),
                     deadline)
            except NoNodeError:
                return WriteResult.MISSING
            except BadVersionError:
                continue  # rewritten meanwhile (acked, admitted): read it again
            log.warning("event %s: %s vouches for %s: %s", event_id, by, ", ".join(named), reason)
            return WriteResult.DONE
    raise StoreUnknownOutcome(f"event {event_id}: record keeps changing")


def _record(ctx: StoreContext, client: KazooClient, event_id: str, deadline: Deadline,
            known: Known | None = None) -> tuple[EventNode, ZnodeStat] | None:
    """The record of ``event_id`` and its stat as the server holds them (None: no record), or as ``known``.
    Raises ``StoreUnknownOutcome`` when its data does not parse: a rewrite of it cannot keep what it holds."""
    path = ctx.paths.event(event_id)
    try:
        data, stat = known if known is not None else ctx.session.wait(client.get_async(path), deadline)
    except NoNodeError:
        return None
    try:
        return EventNode.from_bytes(data, path), stat
    except PayloadError as exc:
        raise StoreUnknownOutcome(f"event {event_id}: undecodable record: {exc}") from exc


def mark_out(ctx: StoreContext, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
    vm = normalize_vm_name(vm)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    path = ctx.paths.out_vm(vm)
    wait = ctx.session.wait
    with ctx.session.writing(f"mark {vm} out of rotation"):
        create = True  # a VM usually has no mark when it writes one: created first, read only if it exists
        for _ in range(4):
            if create:
                try:
                    fresh = OutNode(vm=vm, since=at, events=events).to_bytes()
                    wait(client.create_async(path, fresh), deadline)
                    return WriteResult.DONE
                except NodeExistsError:
                    pass
                except NoNodeError:
                    ctx.ensure_layout(client, deadline)
                    continue
            try:
                data, stat = wait(client.get_async(path), deadline)
            except NoNodeError:
                create = True
                continue
            create = False
            try:
                existing = OutNode.from_bytes(data, path)
                if existing.events == tuple(events):
                    return WriteResult.EXISTS
                since = existing.since
            except PayloadError:
                since = at
            updated = OutNode(vm=vm, since=since, events=events).to_bytes()
            try:
                wait(client.set_async(path, updated, version=stat.version), deadline)
                return WriteResult.DONE
            except (BadVersionError, NoNodeError):
                continue
    raise StoreUnknownOutcome(f"{path} keeps changing")


def clear_out(ctx: StoreContext, vm: str) -> WriteResult:
    vm = normalize_vm_name(vm)
    return _delete(ctx, ctx.paths.out_vm(vm), f"clear {vm} out of rotation")


def purge_done(ctx: StoreContext, older_than: float) -> int:
    """Delete, each in one transaction with its whole subtree, the records done before ``older_than``.
    A record that gains a child meanwhile is left for the next call; one that does not parse is left
    too, with a warning."""
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    wait = ctx.session.wait
    deleted = 0
    with ctx.session.writing("purge done events"):
        try:
            event_ids = wait(client.get_children_async(ctx.paths.events), deadline)
        except NoNodeError:
            return 0
        reads = {e: client.get_async(ctx.paths.event(e)) for e in event_ids}
        for event_id, result in reads.items():
            try:
                data, _ = wait(result, deadline)
                done_at = EventNode.from_bytes(data, ctx.paths.event(event_id)).done_at
            except NoNodeError:
                continue
            except PayloadError as exc:
                log.warning("event %s: undecodable record, not purged: %s", event_id, exc)
                continue
            if done_at is None or done_at >= older_than:
                continue
            nodes = subtree(ctx, client, ctx.paths.event(event_id), deadline)
            transaction = client.transaction()
            for path in reversed(nodes):  # children before parents
                transaction.delete(path)
            results = wait(transaction.commit_async(), deadline)
            if all(result is True for result in results):
                deleted += 1
                log.info("event %s: record purged (done at %.0f)", event_id, done_at)
    return deleted


def _delete(ctx: StoreContext, path: str, what: str) -> WriteResult:
    """Delete ``path``: DONE, or MISSING if it was not there."""
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    with ctx.session.writing(what):
        try:
            ctx.session.wait(client.delete_async(path), deadline)
        except NoNodeError:
            return WriteResult.MISSING
    return WriteResult.DONE


def subtree(ctx: StoreContext, client: KazooClient, path: str, deadline: Deadline) -> list[str]:
    """``path`` and every node below it, parents before children."""
    nodes = [path]
    index = 0
    while index < len(nodes):
        try:
            children = ctx.session.wait(client.get_children_async(nodes[index]), deadline)
        except NoNodeError:
            children = []
        nodes.extend(f"{nodes[index]}/{child}" for child in children)
        index += 1
    return nodes
