"""Where the ZooKeeper store's nodes live, and the checks that keep names safe to put in a path.

Every path lives under ``{root}/{cluster}`` (see ``coordinator.store.base`` for the layout below it).
``validate_root`` and ``validate_cluster`` raise ``ConfigError`` for anything that is not a plain path
component; VM names and event ids are validated by ``coordinator.names`` before they reach a path, and
the ``is_canonical_*`` predicates filter child names read back from the server (a node created by hand
or by a buggy agent is skipped rather than trusted).
"""

from __future__ import annotations

import re

from coordinator.errors import ConfigError
from coordinator.names import normalize_event_id, normalize_vm_name

__all__ = [
    "LAYOUT_VERSION",
    "NODES",
    "ZooKeeperPaths",
    "history_name",
    "is_canonical_event_id",
    "is_canonical_vm",
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

# Every node of the layout, relative to the group's base, and whether it lives with the session that made it.
# docs/architecture.md's "ZooKeeper layout" table lists these, in this order (``tests/unit/test_docs.py``).
NODES: tuple[tuple[str, str], ...] = (
    ("/members/{vm}", "ephemeral"),
    ("/leader", "ephemeral"),
    ("/events/{EVENT_ID}", "persistent"),
    ("/registry/{vm}", "persistent"),
    ("/absent/{vm}", "persistent"),
    ("/out/{vm}", "persistent"),
    ("/events/{EVENT_ID}/admitted", "persistent"),
    ("/events/{EVENT_ID}/acks/{vm}", "ephemeral"),
    ("/events/{EVENT_ID}/approval", "persistent"),
    ("/pause", "persistent"),
    ("/drains/{vm}", "persistent"),
    ("/drains-admitted/{vm}", "persistent"),
    ("/layout", "persistent"),
    ("/history/{DONE_MS}-{EVENT_ID}", "persistent"),
)


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
