"""Membership and leadership on ZooKeeper: ``join`` (``/members/{vm}``, ephemeral, and ``/registry/{vm}``)
and ``campaign`` (``/leader``, ephemeral).

A live member node held by another session is never taken over, unless it provably belongs to this VM's
previous agent process (see ``coordinator.store.members``) or to an earlier session of this very store:
then it is replaced, and a ``/leader`` that session holds is taken back by ``campaign``. Anything else is
another agent running with the same VM name: its node is left alone, ``join`` raises ``DuplicateMember``
(and gives up ``/leader`` if this session held it), and the store remembers it (``Membership.duplicate``)
until a ``join`` succeeds. The refused node is read with a
watch, so the agent is woken as soon as it goes.

Both answer from the watched view (``coordinator.store.zk_watch``) when it is current and already shows
the answer, sending nothing: ``join`` when the view shows this session's own member node, made by this
store, and the VM registered; ``campaign`` when it shows a ``/leader`` node. Whatever they send counts as
a change (the next ``read_view`` reads again).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.errors import DuplicateMember, LayoutMismatch, StoreUnknownOutcome
from coordinator.names import normalize_vm_name
from coordinator.store.base import WriteResult
from coordinator.store.members import duplicate_member, predecessor
from coordinator.store.payloads import LeaderNode, MemberNode, PayloadError, RegistryNode
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_session import Deadline
from coordinator.store.zk_watch import WatchedView

__all__ = ["Membership", "campaign", "join"]

log = logging.getLogger(__name__)


class Membership:
    """What one store knows of its own membership: the sessions in which it joined (a member node left
    by one of them is its own, whatever it says), and the refusal of the last ``join`` while no later
    one succeeded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: set[int] = set()
        # Sessions of this VM's previous agent process, proven dead when ``join`` replaced their member node.
        self._predecessors: set[int] = set()
        self._duplicate: DuplicateMember | None = None

    @property
    def duplicate(self) -> DuplicateMember | None:
        return self._duplicate

    def is_own(self, session: int) -> bool:
        with self._lock:
            return session in self._sessions

    def replaced(self, session: int) -> None:
        with self._lock:
            self._predecessors.add(session)

    def is_own_or_predecessor(self, session: int) -> bool:
        """Whether ``session`` is one of this store's, or of this VM's previous agent process (proven gone when
        ``join`` replaced its member node): nobody acts through it any more."""
        with self._lock:
            return session in self._sessions or session in self._predecessors

    def joined(self, session: int) -> None:
        with self._lock:
            self._sessions.add(session)
            self._duplicate = None

    def refused(self, error: DuplicateMember) -> bool:
        """Note the refusal; True if it is news (not the one already standing), to be logged once."""
        previous, self._duplicate = self._duplicate, error
        return previous is None or str(previous) != str(error)

    def check(self, vm: str) -> None:
        """Raise the standing ``DuplicateMember`` of ``vm``, if any."""
        duplicate = self._duplicate
        if duplicate is not None and duplicate.vm == vm:
            raise duplicate.again()


def join(
    ctx: StoreContext, watched: WatchedView, membership: Membership, vm: str, info: Mapping[str, object]
) -> WriteResult:
    """See ``Store.join``."""
    vm = normalize_vm_name(vm)
    client, session = ctx.session.connected(write=True)
    if watched.join_answer(vm, session):
        return WriteResult.EXISTS
    watched.joined(vm, None)
    deadline = ctx.session.deadline()
    data = MemberNode.of(vm, info).to_bytes()
    with ctx.session.writing(f"join as {vm}"):
        try:
            result = _join_members(ctx, watched, membership, client, session, vm, info, data, deadline)
        except DuplicateMember as exc:
            if membership.refused(exc):
                log.error("%s", exc)
            _step_down(ctx, client, session, vm, deadline, "another agent runs with its name")
            raise
        _register(ctx, client, vm, deadline)
    membership.joined(session)
    watched.joined(vm, session)
    return result


def _join_members(
    ctx: StoreContext, watched: WatchedView, membership: Membership, client: KazooClient, session: int, vm: str,
    info: Mapping[str, object], data: bytes, deadline: Deadline,
) -> WriteResult:
    path = ctx.paths.member(vm)
    wait = ctx.session.wait
    for _ in range(3):
        # Looked at before a create is tried: a create that fails still costs the ensemble a transaction.
        # Watched: a node this agent may not take wakes it up when it goes.
        try:
            raw, stat = wait(client.get_async(path, watch=watched.watch), deadline)
        except NoNodeError:
            try:
                wait(client.create_async(path, data, ephemeral=True), deadline)
                log.info("joined as %s (session 0x%x)", vm, session)
                return WriteResult.DONE
            except NoNodeError:
                ctx.ensure_layout(client, deadline)
                continue
            except NodeExistsError:
                continue  # created in between: look again
        owner = stat.ephemeralOwner
        if owner == session:
            return WriteResult.EXISTS
        try:
            theirs: dict[str, object] | None = MemberNode.from_bytes(raw, path).model_dump()
        except PayloadError as exc:
            log.warning("undecodable member node, taken for another agent's: %s", exc)
            theirs = None
        if membership.is_own(owner):
            reason: str | None = "an earlier session of this agent"
        else:
            reason = predecessor(theirs, info) if theirs is not None else None
        if reason is None:
            raise duplicate_member(vm, owner, theirs, stat.ctime / 1000.0)
        # This VM's previous agent process (restarted before its old session expired): replace its node.
        log.warning("member node of %s belongs to session 0x%x, not ours (0x%x), %s: replacing it",
                    vm, owner, session, reason)
        membership.replaced(owner)
        with contextlib.suppress(NoNodeError, BadVersionError):
            wait(client.delete_async(path, version=stat.version), deadline)
    raise StoreUnknownOutcome(f"member node of {vm} keeps being taken by another session")


def _step_down(ctx: StoreContext, client: KazooClient, session: int, vm: str, deadline: Deadline, why: str) -> None:
    """A duplicate, or an agent that cannot read the group's layout, does not lead: delete ``/leader`` if
    this session holds it. Never raises: the refusal is what the caller must see (``campaign`` and
    ``approve`` refuse a duplicate anyway)."""
    try:
        stat = ctx.session.wait(client.exists_async(ctx.paths.leader), deadline)
        if stat is not None and stat.ephemeralOwner == session:
            with contextlib.suppress(NoNodeError, BadVersionError):
                ctx.session.wait(client.delete_async(ctx.paths.leader, version=stat.version), deadline)
            log.warning("%s gives up leadership: %s", vm, why)
    except Exception as exc:  # a failure of the connection: leadership lapses with the session
        log.warning("%s could not give up leadership: %r", vm, exc)


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


def campaign(ctx: StoreContext, watched: WatchedView, membership: Membership, vm: str,
             mismatch: LayoutMismatch | None = None) -> bool:
    """See ``Store.campaign``: create ``/leader`` if nobody holds it; True if this session holds it.
    Raises the standing ``DuplicateMember`` without sending anything while ``join`` is refused. With the
    group in another layout (``mismatch``) it gives up ``/leader`` if it holds it, and takes nothing: a
    leader that reads nothing of the group would admit nothing for good."""
    vm = normalize_vm_name(vm)
    membership.check(vm)
    client, session = ctx.session.connected(write=False)
    if mismatch is not None:
        _step_down(ctx, client, session, vm, ctx.session.deadline(), "it does not read the group's layout")
        return False
    answer = watched.campaign_answer(session, membership.is_own_or_predecessor)
    if answer is not None:
        return answer
    try:
        return _campaign(ctx, client, session, vm, membership)
    finally:
        ctx.session.changed()  # a write was sent, or may have been


def _campaign(ctx: StoreContext, client: KazooClient, session: int, vm: str, membership: Membership) -> bool:
    deadline = ctx.session.deadline()
    data = LeaderNode(vm=vm, since=ctx.clock()).to_bytes()
    with ctx.session.reading(f"campaign as {vm}"):
        for _ in range(3):
            # Looked at first: a create that fails on a held node still costs the ensemble a transaction.
            stat = ctx.session.wait(client.exists_async(ctx.paths.leader), deadline)
            if stat is not None and stat.ephemeralOwner != session and membership.is_own_or_predecessor(
                    stat.ephemeralOwner):
                # Held by this VM's previous agent process, which is gone (a VM rebooted by maintenance, an
                # agent restarted): taken back now rather than left to lapse with that session while
                # nobody leads the group.
                log.warning("%s takes back leadership from session 0x%x, its previous agent's, which is gone",
                            vm, stat.ephemeralOwner)
                with contextlib.suppress(NoNodeError, BadVersionError):
                    ctx.session.wait(client.delete_async(ctx.paths.leader, version=stat.version), deadline)
                continue
            if stat is not None:
                return stat.ephemeralOwner == session
            try:
                ctx.session.wait(client.create_async(ctx.paths.leader, data, ephemeral=True), deadline)
                log.info("%s is the leader now (session 0x%x)", vm, session)
                return True
            except NodeExistsError:
                continue  # taken in between: look again
    return False
