"""The groups of a ZooKeeper root, read for ``coordinator fleet``: every child of the root is a cluster,
read with the status command's own read-only reader (``coordinator.groupstatus.read.GroupReader``: a kazoo
client that refuses every write, a store that never creates its layout) and worked out by
``build_status``, as ``coordinator status`` would show it. The agents' admin ``/status`` is not asked:
ZooKeeper says who is a live member.

One session lists the clusters and one per cluster reads it; ``Groups`` keeps them open between reads
(``--watch``): the store's reads answer from its cache while nothing changed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from coordinator.decide import Policy
from coordinator.fleet.join import ClusterRead
from coordinator.groupstatus.analyse import build_status
from coordinator.groupstatus.read import GroupReader, GroupStatusError
from coordinator.store.zk_session import ClientOptions

__all__ = ["LISTER", "Groups"]

#: The cluster name the lister's reader is built for; it only lists the root's children.
LISTER = "coordinator-fleet"


class Groups:
    """The clusters under ``root``; ``open``, ``read`` as often as needed, ``close``."""

    def __init__(self, options: ClientOptions, root: str, policy: Policy, policy_source: str, *,
                 timeout: float = 5.0, reader: Callable[..., GroupReader] = GroupReader) -> None:
        self._options = options
        self.root = root
        self._policy = policy
        self._source = policy_source
        self._timeout = timeout
        self._make = reader
        self._lister: GroupReader | None = None
        self._readers: dict[str, GroupReader] = {}

    def _reader(self, cluster: str) -> GroupReader:
        return self._make(self._options.hosts, self.root, cluster, timeout=self._timeout, ask_agents_too=False,
                          auth_data=self._options.auth_data, tls=self._options.tls)

    def open(self) -> None:
        """Connect. Raises ``GroupStatusError`` (ZooKeeper unreachable)."""
        lister = self._reader(LISTER)
        lister.open(require_cluster=False)
        self._lister = lister

    def read(self) -> list[ClusterRead]:
        """Every cluster of the root, each read or with why it could not be. Raises ``GroupStatusError``
        when the root cannot be listed."""
        if self._lister is None:
            raise GroupStatusError("not connected")
        clusters = self._lister.children(self.root)
        for gone in set(self._readers) - set(clusters):
            _close(self._readers.pop(gone))
        found: list[ClusterRead] = []
        for cluster in clusters:
            try:
                reader = self._readers.get(cluster)
                if reader is None:
                    reader = self._reader(cluster)
                    reader.open()
                    self._readers[cluster] = reader
                found.append(ClusterRead(cluster, build_status(reader.read(), self._policy, self._source)))
            except GroupStatusError as exc:
                found.append(ClusterRead(cluster, error=str(exc)))
        return found

    def close(self) -> None:
        for reader in [*self._readers.values(), *([self._lister] if self._lister else [])]:
            _close(reader)
        self._readers.clear()
        self._lister = None


def _close(reader: GroupReader, timeout: float = 5.0) -> None:
    """Close, waiting at most ``timeout`` (kazoo's close may wait a whole session timeout for a server that
    does not answer; its threads are daemons)."""
    closing = threading.Thread(target=reader.close, name="fleet-close", daemon=True)
    closing.start()
    closing.join(timeout)
