"""Who may do what in a group's ZooKeeper namespace: identities, and the ACL of each kind of node.

Three roles, each a list of ZooKeeper identities (``scheme:id``):

* **agents** may do everything below ``{root}/{cluster}``: join, acknowledge, record approvals, purge.
  An agent configured with a digest credential is always one of them.
* **operators** may read everything, pause and resume the group (create and delete the ``pause``
  child of the base node), and drain a VM by hand and undo it (create and delete a child of ``drains``).
  They cannot write anything an agent trusts (acknowledgements, approvals, absence marks live deeper, in
  nodes whose ACL gives operators ``read`` only).
* **readers** may read everything (``coordinator status``, dashboards).

Nobody else may read or write the namespace. The components of ``root`` above the base, when an agent
has to create them, allow anyone to read them and create children (another group's base), and only
agents to change or delete them.

``NodeAcls`` holds the four ACLs; ``None`` in their place means the namespace is open (the ZooKeeper
default ``world:anyone`` with every permission), which the agent warns about at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from coordinator.store.zk_paths import node_at, operators_create_in

__all__ = [
    "NodeAcls",
    "digest_identity",
    "identity_words",
    "is_masked",
    "node_acls",
    "parse_identity",
    "pause_acl",
    "same_acl",
]

#: The schemes an identity may use. ``digest``: ``user:base64(sha1(user:password))``; ``x509``: the
#: client certificate's subject (``CN=agent,O=example``); ``ip``: an address or CIDR; ``sasl``: a
#: Kerberos principal; ``world``: ``anyone``.
SCHEMES = ("digest", "x509", "ip", "sasl", "world")

_DIGEST_ID = re.compile(r"[^:\s]{1,64}:[A-Za-z0-9+/]{27}=")


def parse_identity(text: str) -> Id:
    """``scheme:id`` as a kazoo ``Id``. Raises ``ValueError`` with what was expected."""
    scheme, sep, ident = text.partition(":")
    if not sep or scheme not in SCHEMES or not ident:
        raise ValueError(f"{text[:80]!r} is not an identity: expected SCHEME:ID with SCHEME one of "
                         f"{', '.join(SCHEMES)} (for example digest:operator:<base64 SHA-1>)")
    if scheme == "digest" and not _DIGEST_ID.fullmatch(ident):
        raise ValueError(f"{text[:80]!r}: a digest identity is digest:USER:HASH, HASH the base64 SHA-1 of "
                         "USER:PASSWORD (coordinator zk-digest USER prints it)")
    if scheme == "world" and ident != "anyone":
        raise ValueError(f"{text[:80]!r}: the world scheme has one identity, world:anyone")
    return Id(scheme, ident)


def digest_identity(username: str, password: str) -> Id:
    """The digest identity ZooKeeper gives a client that authenticated as ``username:password``."""
    return Id("digest", make_digest_acl_credential(username, password))


_ALL = Permissions.ALL
_READ = Permissions.READ
_PAUSE = Permissions.READ | Permissions.CREATE | Permissions.DELETE


@dataclass(frozen=True)
class NodeAcls:
    """The ACL of each kind of node in one group's namespace."""

    default: tuple[ACL, ...]  # every node below the base: agents all, operators and readers read
    base: tuple[ACL, ...]  # the base: agents all, operators read/create/delete (the pause child), readers read
    pause: tuple[ACL, ...]  # the pause node: agents and operators all, readers read
    ancestors: tuple[ACL, ...]  # root's components: agents all, anyone read and create

    def for_path(self, path: str, base: str) -> tuple[ACL, ...]:
        """The ACL a node at ``path`` should carry, from the layout's table (``zk_paths.NODES``): a node that
        operators write (the pause, a drain by hand) gets ``pause``; the base and a node whose children
        operators create and delete (``/drains``) get ``base``; every other node below the base
        ``default``; the root's components ``ancestors``."""
        if not (path == base or path.startswith(base + "/")):
            return self.ancestors
        relative = path[len(base):]
        if operators_create_in(relative):
            return self.base
        node = node_at(relative)
        if node is not None and node.writers == "operators":
            return self.pause
        return self.default


def identity_words(auth_data: Sequence[tuple[str, str]], tls: object | None) -> str:
    """How a client presented itself, for an error message: ``as USER`` (digest), ``with its client
    certificate``, or ``without credentials``. Never the password."""
    if auth_data:
        return "as " + ", ".join(sorted({credential.split(":", 1)[0] for _, credential in auth_data}))
    if tls is not None and getattr(tls, "certfile", None):
        return "with its client certificate only"
    return "without credentials"


def is_masked(ident: Id) -> bool:
    """Whether the server hid this digest identity's hash (ZooKeeper shows ``user:x`` to a client that
    may read a node's ACL but not administer it)."""
    return ident.scheme == "digest" and ident.id.endswith(":x")


def same_acl(current: Iterable[ACL], wanted: Iterable[ACL]) -> bool:
    """Whether the ACL read from the server is ``wanted``, a masked digest identity matching by user."""
    def key(entry: ACL, masked: bool) -> tuple[int, str, str]:
        ident = entry.id.id.split(":", 1)[0] if masked and entry.id.scheme == "digest" else entry.id.id
        return entry.perms, entry.id.scheme, ident

    current = list(current)
    masked = any(is_masked(entry.id) for entry in current)
    return {key(e, masked) for e in current} == {key(e, masked) for e in wanted}


def pause_acl(base: Iterable[ACL], known: Sequence[Id] = ()) -> list[ACL]:
    """The ACL of a new pause node, from the base node's as the server shows it, so that whoever pauses
    need not be configured with every role: those who may change the base (agents: admin) or create
    and delete below it (operators) get every permission on the pause, readers read. A digest identity
    the server masks is taken from ``known`` (the caller's own and configured identities) by user name;
    if one cannot be, anyone may read the pause (its reason and author) so that no agent is shut out
    of it. An open base gives an open pause."""
    by_user = {ident.id.split(":", 1)[0]: ident for ident in known if ident.scheme == "digest"}
    acl: list[ACL] = []
    unresolved = False
    for entry in base:
        ident: Id | None = entry.id
        if is_masked(entry.id):
            ident = by_user.get(entry.id.id.split(":", 1)[0])
            unresolved = unresolved or ident is None
        if ident is None:
            continue
        if entry.perms & (Permissions.ADMIN | Permissions.CREATE | Permissions.DELETE):
            acl.append(ACL(Permissions.ALL, ident))
        elif entry.perms & Permissions.READ:
            acl.append(ACL(Permissions.READ, ident))
    if unresolved:
        acl.append(ACL(Permissions.READ, Id("world", "anyone")))
    return acl


def _acl(perms: int, identities: Iterable[Id]) -> list[ACL]:
    return [ACL(perms, ident) for ident in identities]


def _unique(identities: Iterable[Id]) -> list[Id]:
    seen: dict[tuple[str, str], Id] = {}
    for ident in identities:
        seen.setdefault((ident.scheme, ident.id), ident)
    return list(seen.values())


def node_acls(agents: Sequence[Id], operators: Sequence[Id] = (), readers: Sequence[Id] = ()) -> NodeAcls:
    """The ACLs for these roles. An identity in several roles gets the widest of their permissions on
    each node. Raises ``ValueError`` when ``agents`` is empty: nobody could write the group's records."""
    if not agents:
        raise ValueError("an ACL needs at least one agent identity, or the agents could not write their records")
    agents = _unique(agents)
    operators = [i for i in _unique(operators) if i not in agents]
    readers = [i for i in _unique(readers) if i not in agents and i not in operators]
    return NodeAcls(
        default=tuple(_acl(_ALL, agents) + _acl(_READ, operators) + _acl(_READ, readers)),
        base=tuple(_acl(_ALL, agents) + _acl(_PAUSE, operators) + _acl(_READ, readers)),
        pause=tuple(_acl(_ALL, agents) + _acl(_ALL, operators) + _acl(_READ, readers)),
        ancestors=(*_acl(_ALL, agents), ACL(_READ | Permissions.CREATE, Id("world", "anyone"))),
    )
