"""Membership and leadership on ZooKeeper: ``join`` (``/members/{vm}``, ephemeral, and ``/registry/{vm}``)
and ``campaign`` (``/leader``, ephemeral).

A member node left by an older session of the same VM (the agent restarted before that session expired)
is replaced, deleting exactly the version seen so that a newer node is never removed.

Both answer from the watched view (``coordinator.store.zk_watch``) when it is current and already shows
the answer, sending nothing: ``join`` when the view shows this session's own member node, made by this
store, and the VM registered; ``campaign`` when it shows a ``/leader`` node. Whatever they send counts as
a change (the next ``read_view`` reads again).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.errors import StoreUnknownOutcome
from coordinator.names import normalize_vm_name
from coordinator.store.base import WriteResult
from coordinator.store.payloads import LeaderNode, MemberNode, RegistryNode
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_session import Deadline
from coordinator.store.zk_watch import WatchedView

__all__ = ["campaign", "join"]

log = logging.getLogger(__name__)


def join(ctx: StoreContext, watched: WatchedView, vm: str, info: Mapping[str, object]) -> WriteResult:
    """See ``Store.join``."""
    vm = normalize_vm_name(vm)
    client, session = ctx.session.connected(write=True)
    if watched.join_answer(vm, session):
        return WriteResult.EXISTS
    watched.joined(vm, None)
    deadline = ctx.session.deadline()
    data = MemberNode.of(vm, info).to_bytes()
    with ctx.session.writing(f"join as {vm}"):
        result = _join_members(ctx, client, session, vm, data, deadline)
        _register(ctx, client, vm, deadline)
    watched.joined(vm, session)
    return result


def _join_members(
    ctx: StoreContext, client: KazooClient, session: int, vm: str, data: bytes, deadline: Deadline
) -> WriteResult:
    path = ctx.paths.member(vm)
    wait = ctx.session.wait
    for _ in range(3):
        # Looked at before a create is tried: a create that fails still costs the ensemble a transaction.
        stat = wait(client.exists_async(path), deadline)
        if stat is None:
            try:
                wait(client.create_async(path, data, ephemeral=True), deadline)
                log.info("joined as %s (session 0x%x)", vm, session)
                return WriteResult.DONE
            except NoNodeError:
                ctx.ensure_layout(client, deadline)
                continue
            except NodeExistsError:
                continue  # created in between: look again
        if stat.ephemeralOwner == session:
            return WriteResult.EXISTS
        # Left by an older session of this VM (agent restart before the old session expired):
        # replace it, deleting exactly the version seen so that a newer node is never removed.
        log.warning(
            "member node of %s belongs to session 0x%x, not ours (0x%x): replacing it",
            vm,
            stat.ephemeralOwner,
            session,
        )
        with contextlib.suppress(NoNodeError, BadVersionError):
            wait(client.delete_async(path, version=stat.version), deadline)
    raise StoreUnknownOutcome(f"member node of {vm} keeps being taken by another session")


def _register(ctx: StoreContext, client: KazooClient, vm: str, deadline: Deadline) -> None:
    """Make sure ``/registry/{vm}`` exists; a read when it does (the usual case), a write once."""
    path = ctx.paths.registered(vm)
    if ctx.session.wait(client.exists_async(path), deadline) is not None:
        return
    data = RegistryNode(vm=vm, first_seen=ctx.clock()).to_bytes()
    for _ in range(2):
        try:
            ctx.session.wait(client.create_async(path, data), deadline)
            log.info("registered %s", vm)
            return
        except NodeExistsError:
            return
        except NoNodeError:
            ctx.ensure_layout(client, deadline)
    raise StoreUnknownOutcome(f"{ctx.paths.registry} keeps disappearing")


def campaign(ctx: StoreContext, watched: WatchedView, vm: str) -> bool:
    """See ``Store.campaign``: create ``/leader`` if nobody holds it; True if this session holds it."""
    vm = normalize_vm_name(vm)
    client, session = ctx.session.connected(write=False)
    answer = watched.campaign_answer(session)
    if answer is not None:
        return answer
    try:
        return _campaign(ctx, client, session, vm)
    finally:
        ctx.session.changed()  # a write was sent, or may have been


def _campaign(ctx: StoreContext, client: KazooClient, session: int, vm: str) -> bool:
    deadline = ctx.session.deadline()
    data = LeaderNode(vm=vm, since=ctx.clock()).to_bytes()
    with ctx.session.reading(f"campaign as {vm}"):
        for _ in range(2):
            # Looked at first: a create that fails on a held node still costs the ensemble a transaction.
            stat = ctx.session.wait(client.exists_async(ctx.paths.leader), deadline)
            if stat is not None:
                return stat.ephemeralOwner == session
            try:
                ctx.session.wait(client.create_async(ctx.paths.leader, data, ephemeral=True), deadline)
                log.info("%s is the leader now (session 0x%x)", vm, session)
                return True
            except NodeExistsError:
                continue  # taken in between: look again
    return False
