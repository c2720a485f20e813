"""What every part of the ZooKeeper store shares: the session, the cluster's paths, the clock, and the
creation of the base layout (the persistent parents every node is created under)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.security import ACL, Permissions

from coordinator.store.payloads import LayoutNode
from coordinator.store.zk_paths import LAYOUT_VERSION, ZooKeeperPaths
from coordinator.store.zk_security import same_acl
from coordinator.store.zk_session import Deadline, ZooKeeperSession

__all__ = ["StoreContext", "describe_acl"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreContext:
    """One store's session and paths. ``clock`` gives the wall-clock time written into ``/leader`` and
    ``/registry/{vm}``; ``create_layout`` is False for an observer that must write nothing (dry run)."""

    session: ZooKeeperSession
    paths: ZooKeeperPaths
    clock: Callable[[], float]
    create_layout: bool

    def ensure_layout(self, client: KazooClient, deadline: Deadline) -> None:
        """Create the persistent parents that are missing (nothing for an observer). With ACLs, the
        components of the root and the base are created one by one with their own ACL; the layout
        below the base gets the client's default ACL."""
        if not self.create_layout:
            return
        acls = self.session.options.acls
        if acls is not None:
            parts = self.paths.base.strip("/").split("/")
            for depth in range(1, len(parts) + 1):
                path = "/" + "/".join(parts[:depth])
                acl = list(acls.for_path(path, self.paths.base))
                with contextlib.suppress(NodeExistsError):
                    self.session.wait(client.create_async(path, b"", acl=acl), deadline)
            # Operators create and delete its children (``coordinator drain``): the base's ACL, not the default.
            acl = list(acls.for_path(self.paths.drains, self.paths.base))
            with contextlib.suppress(NodeExistsError):
                self.session.wait(client.create_async(self.paths.drains, b"", acl=acl), deadline)
        for result in [client.ensure_path_async(path) for path in self.paths.layout()]:
            self.session.wait(result, deadline)
        with contextlib.suppress(NodeExistsError):  # written once, by the first agent of the group
            self.session.wait(client.create_async(self.paths.layout_version,
                                                  LayoutNode(version=LAYOUT_VERSION).to_bytes()), deadline)

    def ensure_acls(self, client: KazooClient, deadline: Deadline) -> int:
        """With ACLs configured, make the namespace carry them: when the base's ACL differs from the
        configured one (a group that ran open, or whose roles changed), set the ACL of every node below
        it. Returns the number of nodes changed. Raises kazoo's ``NoAuthError`` when this agent's
        identity may not change them."""
        acls = self.session.options.acls
        if acls is None or not self.create_layout:
            return 0
        wait = self.session.wait
        current, _ = wait(client.get_acls_async(self.paths.base), deadline)
        if same_acl(current, acls.base):
            return 0
        changed, pending = 0, [self.paths.base]
        while pending:
            path = pending.pop()
            want = list(acls.for_path(path, self.paths.base))
            try:
                wait(client.set_acls_async(path, want), deadline)
                changed += 1
                pending.extend(f"{path}/{child}" for child in wait(client.get_children_async(path), deadline))
            except NoNodeError:
                continue  # gone meanwhile (an ephemeral node, a purged record)
        log.warning("the ACL of %s differed from the configured one (was: %s); set it on %d nodes",
                    self.paths.base, describe_acl(current), changed)
        return changed


def describe_acl(acl: Iterable[ACL]) -> str:
    """``world:anyone=crdwa, digest:ops=r``: identities with their permissions, digest hashes left out."""
    letters = "rwcda"
    bits = (Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE, Permissions.ADMIN)
    parts = []
    for entry in acl:
        ident = entry.id.id.split(":", 1)[0] if entry.id.scheme == "digest" else entry.id.id
        perms = "".join(letter for letter, bit in zip(letters, bits, strict=True) if entry.perms & bit)
        parts.append(f"{entry.id.scheme}:{ident}={perms}")
    return ", ".join(parts) or "empty"
