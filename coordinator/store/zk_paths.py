"""Where the ZooKeeper store's nodes live, and the checks that keep names safe to put in a path.

Every path lives under ``{root}/{cluster}`` (see ``coordinator.store.base`` for the layout below it).
``validate_root`` and ``validate_cluster`` raise ``ConfigError`` for anything that is not a plain path
component; VM names and event ids are validated by ``coordinator.names`` before they reach a path, and
the ``is_canonical_*`` predicates filter child names read back from the server (a node created by hand
or by a buggy agent is skipped rather than trusted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coordinator.errors import ConfigError
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store.base import Part

__all__ = [
    "LAYOUT_VERSION",
    "NODES",
    "Node",
    "ZooKeeperPaths",
    "history_name",
    "is_canonical_event_id",
    "is_canonical_vm",
    "node_at",
    "operators_create_in",
    "parse_history_name",
    "validate_cluster",
    "validate_root",
]

# The version of the layout below (paths, node kinds, what each payload holds) that this agent reads and
# writes. Another version's agents may read a group differently: an agent that finds ``/layout`` naming
# another version reads nothing of the group (``coordinator.store.zk_view``) and so stays on the safe side,
# and docs/deployment.md says how a new version is rolled through a running group.
LAYOUT_VERSION = 1

_PATH_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

@dataclass(frozen=True)
class Node:
    """One kind of node of the layout, relative to the group's base (``{vm}``, ``{EVENT_ID}``, ``{DONE_MS}``
    stand for a name).

    ``lifetime``: ``ephemeral`` (lives with the session that made it) or ``persistent``. ``writers``: who may
    create, change and delete it, which is its ACL once ACLs are configured (``zk_security.NodeAcls``):
    ``agents`` (operators and readers read it), or ``operators`` (operators' commands write it too, and the
    node it lives in lets them create and delete children). ``read_from``: the least part of the view
    (``coordinator.store.base.Part``) that reads every node of this kind, each read carrying a watch; None
    when no agent reads it. ``own_from``: for a node named by a VM, the least part in which a VM reads its own
    one, where that is a smaller part than ``read_from``."""

    path: str
    lifetime: str
    writers: str = "agents"
    read_from: Part | None = Part.OWN
    own_from: Part | None = None

    def reads(self, part: Part, own: bool = False) -> bool:
        """Whether a view of ``part`` reads a node of this kind (``own``: one named by the reading VM)."""
        least = self.own_from if own and self.own_from is not None else self.read_from
        return least is not None and part.holds(least)


# Every node of the layout. docs/architecture.md's "ZooKeeper layout" table lists these, in this order, with
# the same lifetime, writers and readers (``tests/unit/test_docs.py``); ``tests/unit/test_layout_reads.py``
# checks each part of the view against ``read_from`` and ``own_from``, request by request.
NODES: tuple[Node, ...] = (
    Node("/members/{vm}", "ephemeral"),
    Node("/leader", "ephemeral"),
    Node("/events/{EVENT_ID}", "persistent", read_from=Part.NAMED),
    Node("/registry/{vm}", "persistent"),
    Node("/absent/{vm}", "persistent", read_from=Part.LEAD),
    Node("/out/{vm}", "persistent", read_from=Part.LEAD, own_from=Part.OWN),
    Node("/events/{EVENT_ID}/admitted", "persistent", read_from=Part.NAMED),
    Node("/events/{EVENT_ID}/acks/{vm}", "ephemeral", read_from=Part.WHOLE, own_from=Part.NAMED),
    Node("/events/{EVENT_ID}/approval", "persistent", read_from=Part.NAMED),
    Node("/pause", "persistent", writers="operators"),
    Node("/drains/{vm}", "persistent", writers="operators", read_from=Part.LEAD, own_from=Part.OWN),
    Node("/drains-admitted/{vm}", "persistent", read_from=Part.LEAD, own_from=Part.OWN),
    Node("/layout", "persistent"),
    Node("/history/{DONE_MS}-{EVENT_ID}", "persistent", read_from=None),
)


def _pattern(node: Node) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[A-Z_a-z]+\\\}", "[^/]+", re.escape(node.path)))


_PATTERNS = tuple((_pattern(node), node) for node in NODES)


def node_at(relative: str) -> Node | None:
    """The kind of node at ``relative`` (a path below the group's base, with its leading slash); None for
    the base's lists and for a path the layout has no node at."""
    for pattern, node in _PATTERNS:
        if pattern.fullmatch(relative):
            return node
    return None


def operators_create_in(relative: str) -> bool:
    """Whether operators create and delete children of the node at ``relative`` (``""``: the base): the
    node that the layout's operator-written nodes live in."""
    return any(node.writers == "operators" and node.path.rsplit("/", 1)[0] == relative for node in NODES)


class ZooKeeperPaths:
    """The absolute paths of one cluster's nodes under ``base`` (``{root}/{cluster}``).

    The methods only join strings: callers pass names already normalised by ``coordinator.names``.
    """

    def __init__(self, base: str) -> None:
        self.base = base
        self.members = f"{base}/members"
        self.registry = f"{base}/registry"
        self.absent = f"{base}/absent"
        self.leader = f"{base}/leader"
        self.events = f"{base}/events"
        self.out = f"{base}/out"
        self.pause = f"{base}/pause"  # present while an operator has paused early approvals
        self.drains = f"{base}/drains"  # an operator's drains by hand, one child per VM
        self.drains_admitted = f"{base}/drains-admitted"  # the leader's admissions of them
        self.layout_version = f"{base}/layout"  # {"version": N}: the layout the group's nodes are written in
        self.history = f"{base}/history"  # finished records moved out of /events, which no agent watches

    def member(self, vm: str) -> str:
        return f"{self.members}/{vm}"

    def registered(self, vm: str) -> str:
        return f"{self.registry}/{vm}"

    def absent_vm(self, vm: str) -> str:
        return f"{self.absent}/{vm}"

    def out_vm(self, vm: str) -> str:
        return f"{self.out}/{vm}"

    def drain(self, vm: str) -> str:
        return f"{self.drains}/{vm}"

    def drain_admitted(self, vm: str) -> str:
        return f"{self.drains_admitted}/{vm}"

    def event(self, event_id: str) -> str:
        return f"{self.events}/{event_id}"

    def acks(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/acks"

    def ack(self, event_id: str, vm: str) -> str:
        return f"{self.events}/{event_id}/acks/{vm}"

    def approval(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/approval"

    def admitted(self, event_id: str) -> str:
        return f"{self.events}/{event_id}/admitted"

    def history_entry(self, name: str) -> str:
        return f"{self.history}/{name}"

    def layout(self) -> tuple[str, ...]:
        """The persistent parents that must exist before any node is created under them."""
        return (self.members, self.registry, self.absent, self.events, self.out, self.drains, self.drains_admitted,
                self.history)


def history_name(done_at: float, event_id: str) -> str:
    """The name of a finished record in ``/history``: when it was done (milliseconds of the Unix epoch, 13
    digits: names sort by it) and the event id, so that listing ``/history`` tells which are past the
    retention without reading them, and an event id seen again is kept once per time it was done."""
    return f"{max(0, round(done_at * 1000)):013d}-{event_id}"


def parse_history_name(name: str) -> tuple[float, str] | None:
    """(done_at, event id) of a ``/history`` child name; None for a name this layout does not make."""
    stamp, sep, event_id = name.partition("-")
    if not sep or len(stamp) != 13 or not stamp.isdigit() or not is_canonical_event_id(event_id):
        return None
    return int(stamp) / 1000, event_id


def validate_root(root: str) -> str:
    """``root`` in canonical form (one leading slash, no trailing one). Raises ``ConfigError`` unless it
    is an absolute path of components made of letters, digits, '.', '_' or '-'."""
    parts = root.strip("/").split("/")
    if not root.startswith("/") or not all(_PATH_COMPONENT.fullmatch(p) for p in parts):
        raise ConfigError(
            f"zookeeper root {root[:100]!r} must be an absolute path of components made of letters, "
            "digits, '.', '_' or '-' (for example /azure-maintenance)"
        )
    return "/" + "/".join(parts)


def validate_cluster(cluster: str) -> str:
    """``cluster`` unchanged. Raises ``ConfigError`` unless it is one path component (1-128 letters,
    digits, '.', '_' or '-', starting with a letter or digit)."""
    if not _PATH_COMPONENT.fullmatch(cluster):
        raise ConfigError(
            f"cluster name {cluster[:100]!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return cluster


def is_canonical_vm(name: str) -> bool:
    """True if ``name`` is a valid VM name already in its stored (lower-case) form."""
    try:
        return normalize_vm_name(name) == name
    except ValueError:
        return False


def is_canonical_event_id(event_id: str) -> bool:
    """True if ``event_id`` is a valid event id already in its stored (upper-case) form."""
    try:
        return normalize_event_id(event_id) == event_id
    except ValueError:
        return False
