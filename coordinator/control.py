"""Group-wide controls an operator runs from any machine that reaches ZooKeeper: ``pause`` and ``resume``.

``pause`` writes ``{root}/{cluster}/pause`` (reason, who, when); while it exists no agent approves an
event early, neither in its decision nor in the approval gate, which checks the node on the server
right before it records an approval. Drains, acknowledgements and recoveries go on, so a paused group
behaves as it would without this product: events start at NotBefore. ``resume`` deletes the node.

Both are idempotent, and print what they found: pausing a paused group keeps the first pause (its
reason and author) and says so.
"""

from __future__ import annotations

import getpass
import logging
import socket
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from coordinator.store.base import Pause
from coordinator.store.payloads import PauseNode, PayloadError
from coordinator.store.zk_paths import ZooKeeperPaths, validate_cluster, validate_root

__all__ = ["ControlError", "GroupAddress", "operator_name", "pause", "resume"]

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
            client.create(paths.pause, node.to_bytes())
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


class _connected:
    """A short-lived kazoo session for one command; errors become ``ControlError``."""

    def __init__(self, group: GroupAddress) -> None:
        self._group = group
        self._client = KazooClient(hosts=group.hosts, timeout=group.timeout)

    def __enter__(self) -> KazooClient:
        try:
            self._client.start(timeout=self._group.timeout)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            self._client.close()
            raise ControlError(f"cannot reach ZooKeeper at {self._group.hosts}: {exc or type(exc).__name__}") from None
        return self._client

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._client.stop()
        self._client.close()
        if isinstance(exc, KazooException):
            raise ControlError(f"ZooKeeper request failed: {exc!r}") from None
