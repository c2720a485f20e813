"""Group-wide controls an operator runs from any machine that reaches ZooKeeper: ``pause`` and ``resume``,
``drain`` and ``undrain``.

``pause`` writes ``{root}/{cluster}/pause`` (reason, who, when; its ACL follows the base node's, see
``coordinator.store.zk_security.pause_acl``); while it exists no agent approves an
event early, neither in its decision nor in the approval gate, which checks the node on the server
right before it records an approval. Drains, acknowledgements and recoveries go on, so a paused group
behaves as it would without this product: events start at NotBefore. ``resume`` deletes the node.

``drain VM`` writes ``{root}/{cluster}/drains/{vm}`` (reason, who, when; the pause's ACL): the leader
admits it into the group's disruption budget when taking the VM out keeps the budget (at once in a group
without one), and the VM's agent then drains it as for an event and keeps it out of rotation, across
restarts, until ``undrain VM`` deletes the node. Only a VM that has run an agent in the group may be
drained (a typo names no VM).

Each is idempotent, and prints what it found: pausing a paused group keeps the first pause (its reason and
author) and says so; draining a VM already drained by hand keeps the first drain.
"""

from __future__ import annotations

import getpass
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import Id

from coordinator.errors import InvalidName
from coordinator.names import normalize_vm_name
from coordinator.store.base import HandDrain, Pause
from coordinator.store.payloads import DrainAdmittedNode, DrainNode, PauseNode, PayloadError
from coordinator.store.zk_paths import ZooKeeperPaths, validate_cluster, validate_root
from coordinator.store.zk_security import identity_words, pause_acl
from coordinator.store.zk_session import ClientFactory, ClientOptions, TlsOptions, default_client_factory

if TYPE_CHECKING:
    from coordinator.config import Settings

__all__ = ["ControlError", "GroupAddress", "drain", "operator_name", "pause", "resume", "undrain"]

log = logging.getLogger(__name__)


class ControlError(Exception):
    """A control command could not be carried out; the message says why, in one line."""


@dataclass(frozen=True)
class GroupAddress:
    """Where a group lives: the ensemble, the root and the cluster name (as in the agents' configuration)."""

    hosts: str
    root: str
    cluster: str
    timeout: float = 10.0
    auth_data: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    tls: TlsOptions | None = None
    known: tuple[Id, ...] = ()  # identities of the configuration, to resolve masked ones (``pause_acl``)
    # Builds the command's kazoo client, as ``ZooKeeperStore``'s does (tests inject their own).
    client_factory: ClientFactory = field(default=default_client_factory, repr=False, compare=False)

    @classmethod
    def of(cls, settings: Settings) -> GroupAddress:
        """The group of a configuration (an agent's, or an operator's), with its credentials and TLS."""
        zk = settings.zookeeper.client_options()
        known = [entry.id for entry in zk.acls.default] if zk.acls is not None else []
        if settings.zookeeper.auth is not None:
            known.append(settings.zookeeper.auth.identity)
        return cls(zk.hosts, settings.zookeeper.root, settings.cluster, auth_data=zk.auth_data, tls=zk.tls,
                   known=tuple(known))

    @property
    def paths(self) -> ZooKeeperPaths:
        return ZooKeeperPaths(f"{validate_root(self.root)}/{validate_cluster(self.cluster)}")


def operator_name() -> str:
    """Who runs the command, for the record: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def pause(group: GroupAddress, reason: str, by: str | None = None, at: float | None = None) -> tuple[Pause, bool]:
    """Pause early approvals of ``group``. Returns the pause in force and whether this call created it
    (False: the group was already paused, and that pause is kept)."""
    if not reason.strip():
        raise ControlError("a pause needs a reason (--reason TEXT): the on-call engineer reads it in status")
    paths = group.paths
    node = PauseNode(reason=reason.strip(), by=by or operator_name(), at=time.time() if at is None else at)
    with _connected(group) as client:
        if not client.exists(paths.base):
            raise ControlError(f"no group {group.cluster!r} under {group.root} on {group.hosts}: "
                               "check the cluster name, or start an agent first")
        try:
            base_acl, _ = client.get_acls(paths.base)
            client.create(paths.pause, node.to_bytes(), acl=pause_acl(base_acl, group.known))
            return Pause(reason=node.reason, by=node.by, at=node.at), True
        except NodeExistsError:
            pass
        data, stat = client.get(paths.pause)
        try:
            found = PauseNode.from_bytes(data, paths.pause)
        except PayloadError:
            return Pause(reason="undecodable pause node", by="?", at=stat.ctime / 1000.0), False
        return Pause(reason=found.reason, by=found.by, at=found.at), False


def resume(group: GroupAddress) -> bool:
    """Lift the pause of ``group``. Returns False when it was not paused."""
    with _connected(group) as client:
        try:
            client.delete(group.paths.pause)
            return True
        except NoNodeError:
            return False


def drain(group: GroupAddress, vm: str, reason: str, by: str | None = None,
          at: float | None = None) -> tuple[HandDrain, bool]:
    """Ask for ``vm`` to be taken out of rotation by hand, through the group's budget. Returns the drain in
    force and whether this call asked for it (False: it was drained by hand already, and that is kept)."""
    if not reason.strip():
        raise ControlError("a drain needs a reason (--reason TEXT): the on-call engineer reads it in status")
    try:
        name = normalize_vm_name(vm)
    except InvalidName as exc:
        raise ControlError(str(exc)) from None
    paths = group.paths
    node = DrainNode(vm=name, reason=reason.strip(), by=by or operator_name(), at=time.time() if at is None else at)
    with _connected(group) as client:
        if not client.exists(paths.base):
            raise ControlError(f"no group {group.cluster!r} under {group.root} on {group.hosts}: "
                               "check the cluster name, or start an agent first")
        if not client.exists(paths.registered(name)):
            known = sorted(client.get_children(paths.registry)) if client.exists(paths.registry) else []
            raise ControlError(f"{name} has never run an agent in group {group.cluster}"
                               + (f" (its VMs: {', '.join(known)})" if known else "")
                               + ": only a VM whose agent runs can drain")
        if not client.exists(paths.drains):
            raise ControlError(f"group {group.cluster} has no {paths.drains}: its agents are of a version without "
                               "drains by hand; upgrade them first (docs/deployment.md)")
        try:
            base_acl, _ = client.get_acls(paths.base)
            client.create(paths.drain(name), node.to_bytes(), acl=pause_acl(base_acl, group.known))
            return HandDrain(reason=node.reason, by=node.by, at=node.at), True
        except NodeExistsError:
            pass
        data, stat = client.get(paths.drain(name))
        try:
            found = DrainNode.from_bytes(data, paths.drain(name))
            drain = HandDrain(reason=found.reason, by=found.by, at=found.at, asked=stat.czxid)
        except PayloadError:
            drain = HandDrain(reason="undecodable drain node", by="?", at=stat.ctime / 1000.0, asked=stat.czxid)
        try:
            admission = DrainAdmittedNode.from_bytes(client.get(paths.drain_admitted(name))[0],
                                                     paths.drain_admitted(name))
        except (NoNodeError, PayloadError):
            return drain, False
        if admission.drain != drain.asked:
            return drain, False
        return HandDrain(drain.reason, drain.by, drain.at, admission.by, admission.at, drain.asked), False


def undrain(group: GroupAddress, vm: str) -> bool:
    """Undo the drain by hand of ``vm``: its agent puts it back in rotation, unless an event holds it.
    Returns False when it was not drained by hand."""
    try:
        name = normalize_vm_name(vm)
    except InvalidName as exc:
        raise ControlError(str(exc)) from None
    with _connected(group) as client:
        try:
            client.delete(group.paths.drain(name))
            return True
        except NoNodeError:
            return False


class _connected:
    """A short-lived kazoo session for one command; errors become ``ControlError``."""

    def __init__(self, group: GroupAddress) -> None:
        self._group = group
        options = ClientOptions(hosts=group.hosts, session_timeout=group.timeout, auth_data=group.auth_data,
                                tls=group.tls)
        self._client = group.client_factory(options)

    def __enter__(self) -> KazooClient:
        try:
            self._client.start(timeout=self._group.timeout)
        except KazooTimeoutError:
            self._client.close()
            raise ControlError(f"cannot reach ZooKeeper at {self._group.hosts} within {self._group.timeout:g} s "
                               "(--timeout)") from None
        except (KazooException, OSError) as exc:
            self._client.close()
            raise ControlError(f"cannot reach ZooKeeper at {self._group.hosts}: {exc or type(exc).__name__}") from None
        return self._client

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._client.stop()
        self._client.close()
        if isinstance(exc, NoAuthError):
            who = identity_words(self._group.auth_data, self._group.tls)
            raise ControlError(f"ZooKeeper refused it: not authorised {who}; pausing, resuming, draining and "
                               "undraining need an agent or operator identity (zookeeper.auth, "
                               "zookeeper.acl.operators)") from None
        if isinstance(exc, KazooException):
            raise ControlError(f"ZooKeeper request failed: {exc!r}") from None
