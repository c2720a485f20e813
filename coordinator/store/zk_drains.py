"""Drains by hand in the ZooKeeper store: how the view reads them, and the leader's admissions.

An operator writes ``/drains/{vm}`` (``coordinator drain``, through ``coordinator.control``; the node's ACL
is the pause's, which the agents may not be able to write: an operator's client sees the agents' digest
identities masked). The leader's admission is a node of its own, ``/drains-admitted/{vm}``, written by the
agents only (operators read it): an operator cannot admit a drain past the budget. It names the drain it
admits by that node's creation zxid, so that an admission outlives its drain harmlessly: a drain undone and
asked again is a new node, which the old admission does not admit. The leader deletes such an admission
(``forget_drain_admission``); until then the view lists it in ``stale_admissions``.

Nodes that do not parse never make the read fail: a drain still drains (asked at the node's creation, its
reason "undecodable drain node"), an admission admits nothing; each with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from coordinator.errors import StoreUnknownOutcome
from coordinator.names import normalize_vm_name
from coordinator.store.base import HandDrain, WriteResult
from coordinator.store.payloads import DrainAdmittedNode, DrainNode, PayloadError
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_paths import ZooKeeperPaths, is_canonical_vm

__all__ = ["DrainReads", "admit_drain", "forget_drain_admission"]

log = logging.getLogger(__name__)

_T_co = TypeVar("_T_co", covariant=True)


class _Pending(Protocol[_T_co]):
    """An answer of the view's ``Fetch``: kept, or on its way."""

    def get(self) -> _T_co: ...


class Fetch(Protocol):
    """What ``DrainReads`` asks of ``coordinator.store.zk_view.Fetch``."""

    def children(self, path: str) -> _Pending[list[str]]: ...

    def exists(self, path: str) -> _Pending[ZnodeStat | None]: ...

    def present(self, path: str) -> _Pending[object]: ...

    def data(self, path: str) -> _Pending[tuple[bytes, ZnodeStat]]: ...


class _Lists(Protocol):
    """What ``DrainReads`` asks of the view's top-level lists (``coordinator.store.zk_view._Lists``)."""

    def canonical(self, path: str, result: Any, check: Callable[[str], bool]) -> list[str]: ...


class DrainReads:
    """The drains and admissions of one view read, sent in the view's rounds: the lists (whole view) or
    ``exists`` of the reading VM's own two nodes (a part of it), then their data."""

    def __init__(self, fetch: Fetch, paths: ZooKeeperPaths, only: str | None) -> None:
        self._fetch = fetch
        self._paths = paths
        self._only = only
        if only is None:
            self._lists: tuple[_Pending[list[str]], _Pending[list[str]]] | None = (
                fetch.children(paths.drains), fetch.children(paths.drains_admitted))
            self._own: tuple[_Pending[object], _Pending[object]] | None = None
        else:
            self._lists = None
            self._own = (fetch.present(paths.drain(only)), fetch.present(paths.drain_admitted(only)))
        self._data: dict[str, _Pending[tuple[bytes, ZnodeStat]]] = {}
        self._admitted: dict[str, _Pending[tuple[bytes, ZnodeStat]]] = {}

    def send_data(self, lists: _Lists) -> None:
        """Ask for the data of every node the first round found."""
        paths = self._paths
        if self._lists is not None:
            drains = lists.canonical(paths.drains, self._lists[0], is_canonical_vm)
            admitted = lists.canonical(paths.drains_admitted, self._lists[1], is_canonical_vm)
        else:
            assert self._own is not None and self._only is not None
            drains = [self._only] if self._own[0].get() is not None else []
            admitted = [self._only] if self._own[1].get() is not None else []
        self._data = {vm: self._fetch.data(paths.drain(vm)) for vm in drains}
        self._admitted = {vm: self._fetch.data(paths.drain_admitted(vm)) for vm in admitted}

    def finish(self) -> tuple[dict[str, HandDrain], frozenset[str]]:
        """The drains by hand, each with its admission if one admits it, and the VMs whose admission admits
        no drain of theirs (whole view only)."""
        drains: dict[str, HandDrain] = {}
        for vm, result in self._data.items():
            drain = _drain(result, self._paths.drain(vm))
            if drain is not None:
                drains[vm] = drain
        stale: set[str] = set()
        for vm, result in self._admitted.items():
            admission = _admission(result, self._paths.drain_admitted(vm))
            drain = drains.get(vm)
            if admission is not None and drain is not None and admission.drain == drain.asked:
                drains[vm] = HandDrain(drain.reason, drain.by, drain.at, admitted_by=admission.by,
                                       admitted_at=admission.at, asked=drain.asked)
            elif self._only is None:
                stale.add(vm)
        return drains, frozenset(stale)


def _drain(result: _Pending[tuple[bytes, ZnodeStat]], path: str) -> HandDrain | None:
    try:
        data, stat = result.get()
    except NoNodeError:
        return None
    try:
        node = DrainNode.from_bytes(data, path)
    except PayloadError as exc:
        log.warning("undecodable drain node, the VM is drained by hand all the same: %s", exc)
        return HandDrain(reason="undecodable drain node", by="?", at=stat.ctime / 1000.0, asked=stat.czxid)
    return HandDrain(reason=node.reason, by=node.by, at=node.at, asked=stat.czxid)


def _admission(result: _Pending[tuple[bytes, ZnodeStat]], path: str) -> DrainAdmittedNode | None:
    try:
        data, _ = result.get()
    except NoNodeError:
        return None
    try:
        return DrainAdmittedNode.from_bytes(data, path)
    except PayloadError as exc:
        log.warning("undecodable admission of a drain by hand, it admits nothing: %s", exc)
        return None


def admit_drain(ctx: StoreContext, vm: str, asked: int, by: str, at: float) -> WriteResult:
    """Create the admission of the drain ``asked`` of ``vm`` (``Store.admit_drain``), replacing one of an
    earlier drain in the same transaction."""
    vm = normalize_vm_name(vm)
    by = normalize_vm_name(by)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    wait = ctx.session.wait
    path = ctx.paths.drain_admitted(vm)
    payload = DrainAdmittedNode(by=by, at=at, drain=asked).to_bytes()
    with ctx.session.writing(f"admit the drain by hand of {vm} (by {by})"):
        for _ in range(3):
            drain = wait(client.exists_async(ctx.paths.drain(vm)), deadline)
            if drain is None or drain.czxid != asked:
                return WriteResult.MISSING
            try:
                data, stat = wait(client.get_async(path), deadline)
            except NoNodeError:
                try:
                    wait(client.create_async(path, payload), deadline)
                except NodeExistsError:
                    continue
                log.info("drain by hand of %s: admitted by %s", vm, by)
                return WriteResult.DONE
            if _admits(data, path, asked):
                return WriteResult.EXISTS
            transaction = client.transaction()
            transaction.delete(path, version=stat.version)
            transaction.create(path, payload)
            results = wait(transaction.commit_async(), deadline)
            if not any(isinstance(r, Exception) for r in results):
                log.info("drain by hand of %s: admitted by %s (an admission of an earlier drain replaced)", vm, by)
                return WriteResult.DONE
    raise StoreUnknownOutcome(f"drain by hand of {vm}: its admission keeps changing")


def forget_drain_admission(ctx: StoreContext, vm: str) -> WriteResult:
    """Delete the admission of ``vm`` if it admits no drain there is now (``Store.forget_drain_admission``)."""
    vm = normalize_vm_name(vm)
    client, _ = ctx.session.connected(write=True)
    deadline = ctx.session.deadline()
    wait = ctx.session.wait
    path = ctx.paths.drain_admitted(vm)
    with ctx.session.writing(f"forget the admission of an undone drain by hand of {vm}"):
        try:
            data, stat = wait(client.get_async(path), deadline)
        except NoNodeError:
            return WriteResult.MISSING
        drain = wait(client.exists_async(ctx.paths.drain(vm)), deadline)
        if drain is not None and _admits(data, path, drain.czxid):
            return WriteResult.EXISTS
        try:
            wait(client.delete_async(path, version=stat.version), deadline)
        except (NoNodeError, BadVersionError):
            return WriteResult.MISSING  # gone, or rewritten by a new admission meanwhile: the next view says
        return WriteResult.DONE


def _admits(data: bytes, path: str, asked: int) -> bool:
    try:
        return DrainAdmittedNode.from_bytes(data, path).drain == asked
    except PayloadError:
        return False
