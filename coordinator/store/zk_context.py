"""What every part of the ZooKeeper store shares: the session, the cluster's paths, the clock, and the
creation of the base layout (the persistent parents every node is created under)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient

from coordinator.store.zk_paths import ZooKeeperPaths
from coordinator.store.zk_session import Deadline, ZooKeeperSession

__all__ = ["StoreContext"]


@dataclass(frozen=True)
class StoreContext:
    """One store's session and paths. ``clock`` gives the wall-clock time written into ``/leader`` and
    ``/registry/{vm}``; ``create_layout`` is False for an observer that must write nothing (dry run)."""

    session: ZooKeeperSession
    paths: ZooKeeperPaths
    clock: Callable[[], float]
    create_layout: bool

    def ensure_layout(self, client: KazooClient, deadline: Deadline) -> None:
        """Create the persistent parents that are missing (nothing for an observer)."""
        if not self.create_layout:
            return
        for result in [client.ensure_path_async(path) for path in self.paths.layout()]:
            self.session.wait(result, deadline)
