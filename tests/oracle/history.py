"""The group's ZooKeeper nodes as ZooKeeper's transaction log records them, in place of an observer's polls.

An observer session that polls the nodes sees them late under load, and misses one created and deleted
between two of its polls: in a 200-agent group on two loaded cores it first saw an ack 8 s after its
creation and never saw four that stood across an approval, so S1 found approvals "without an ack". The
transaction log (``tests.oracle.txnlog``) has every creation and deletion with the
server's time in milliseconds, the same clock as a node's ``ctime``.

``from_txn_log(observations, data_dir)`` returns the observations with their node history taken from
the log: for each node of a kind the observer records (``recorded_kinds``), a ``NodeSighting`` whose
``ctime`` is its creation and whose ``gone_seen`` is its deletion (explicit, or implied by the end of its
owner's session), keeping the observer's ``first_seen`` where it saw that node (None where it never did).
Nodes created after the record ended are left out and a deletion after it leaves ``gone_seen`` None (as
an observer still polling then would). A sighting the log does not hold (a log file missing) is kept as
the observer made it. The log has no blind spots, so ``zk_blind`` is emptied (unless the log lacked a
node the observer saw); ``nodes_from`` says ``txn log``. Without a log, or when the log holds none of
the group's nodes (another group's log), the observations are returned unchanged: old records are
judged as before.

Paths map to kinds as the observers map them (``chaos.observers.ZooKeeperRecorder``, whose kinds
``bench/groups.py``'s ``NodeRecorder`` records two of), below the group's chroot: ``/members/{vm}``
member, ``/leader``, ``/pause``, ``/out/{vm}`` out, ``/events/{id}`` record, ``/events/{id}/acks/{vm}``
ack, ``/events/{id}/approval`` and ``/events/{id}/admitted``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.oracle.records import NodeSighting, Observations
from tests.oracle.txnlog import History, NodeChange, TxnLogError, read_history, server_logs

__all__ = ["GROUP_KINDS", "KINDS", "TXN_LOG", "from_txn_log", "merge_nodes", "node_kind", "recorded_kinds"]

KINDS = ("member", "leader", "pause", "out", "record", "ack", "approval", "admitted")  # the chaos recorder's
GROUP_KINDS = ("ack", "member")  # bench/groups.py's NodeRecorder's
TXN_LOG = "txn log"

Kind = tuple[str, str | None, str | None]  # kind, event id, VM


def node_kind(path: str) -> Kind | None:
    """The kind, event id and VM of a node at ``path`` below the group's chroot, as the observers name it;
    None for a node they do not record (``/registry``, ``/absent``, the parents themselves)."""
    parts = path.split("/")[1:] if path.startswith("/") else []
    match parts:
        case ["members", vm]:
            return "member", None, vm
        case ["leader"] | ["pause"]:
            return parts[0], None, None
        case ["out", vm]:
            return "out", None, vm
        case ["events", event_id]:
            return "record", event_id, None
        case ["events", event_id, "acks", vm]:
            return "ack", event_id, vm
        case ["events", event_id, "approval" | "admitted" as kind]:
            return kind, event_id, None
    return None


def recorded_kinds(observations: Observations) -> tuple[str, ...]:
    """The kinds the observer of ``observations`` records: the chaos recorder's (every kind; it records
    each event's record, which the group benchmark's never does) when a sighting is of another kind than
    ack or member, else the group benchmark's."""
    return KINDS if any(n.kind not in GROUP_KINDS for n in observations.nodes) else GROUP_KINDS


def _splits(path: str) -> Iterable[tuple[str, Kind]]:
    """Each (chroot, kind) a full path can be read as: its last one to four components below a chroot."""
    parts = path.split("/")
    for k in range(1, 5):
        if len(parts) - k >= 1:
            kind = node_kind("/" + "/".join(parts[-k:]))
            if kind is not None:
                yield "/".join(parts[:-k]), kind


def _key(kind: Kind, ctime: float) -> tuple[str, str, str, int]:
    return kind[0], (kind[1] or "").upper(), (kind[2] or "").lower(), round(ctime * 1000)


def _root(history: History, nodes: Sequence[NodeSighting], kinds: Sequence[str]) -> str | None:
    """The chroot under which the log holds most of the observer's nodes (same kind, name and ctime in ms);
    None when it holds none of them."""
    seen = {_key((n.kind, n.event_id, n.vm), n.ctime) for n in nodes if n.kind in kinds}
    score: Counter[str] = Counter()
    for change in history.nodes:
        if change.op == "create":
            for root, kind in _splits(change.path):
                if kind[0] in kinds and _key(kind, change.time_ms / 1000.0) in seen:
                    score[root] += 1
    best = score.most_common(2)
    if not best or (len(best) > 1 and best[0][1] == best[1][1]):
        return None
    return best[0][0]


def merge_nodes(nodes: Sequence[NodeSighting], history: History, root: str, kinds: Sequence[str],
                ended_at: float) -> tuple[list[NodeSighting], dict[str, int]]:
    """The node history of ``kinds`` under the chroot ``root`` from the log, with the observer's
    ``first_seen`` of each node it saw, and its sightings of other kinds (and those the log lacks) as they
    are; with counts: nodes from the log, of which the observer saw, never saw, saw go later than the log
    says by more than a second, and sightings the log lacks."""
    root = root.rstrip("/")
    observed: dict[tuple[str, str, str, int], list[NodeSighting]] = {}
    for n in nodes:
        if n.kind in kinds:
            observed.setdefault(_key((n.kind, n.event_id, n.vm), n.ctime), []).append(n)
    lives: list[tuple[Kind, NodeChange, NodeChange | None]] = []
    open_: dict[str, int] = {}  # path -> index in lives of its standing creation
    for change in history.nodes:
        if not change.path.startswith(root + "/"):
            continue
        kind = node_kind(change.path[len(root):])
        if kind is None or kind[0] not in kinds:
            continue
        if change.op == "create":
            open_[change.path] = len(lives)
            lives.append((kind, change, None))
        elif (index := open_.pop(change.path, None)) is not None:
            lives[index] = (lives[index][0], lives[index][1], change)
    out: list[NodeSighting] = [n for n in nodes if n.kind not in kinds]
    counts = Counter({"log": 0, "seen": 0, "unseen": 0, "seen_gone_late": 0, "not_in_log": 0})
    for kind, made, gone in lives:
        ctime = made.time_ms / 1000.0
        if ctime > ended_at:
            continue
        gone_at = gone.time_ms / 1000.0 if gone is not None and gone.time_ms / 1000.0 <= ended_at else None
        match = observed.get(_key(kind, ctime))
        sighting = match.pop(0) if match else None
        counts["log"] += 1
        counts["seen" if sighting is not None and sighting.first_seen is not None else "unseen"] += 1
        if sighting is not None and gone_at is not None and (sighting.gone_seen or ended_at) > gone_at + 1.0:
            counts["seen_gone_late"] += 1
        out.append(NodeSighting(
            kind[0], sighting.event_id if sighting else kind[1], sighting.vm if sighting else kind[2], ctime,
            made.owner, sighting.first_seen if sighting else None, gone_at))
    left = [n for rest in observed.values() for n in rest]
    counts["not_in_log"] = len(left)
    out.extend(left)
    out.sort(key=lambda n: n.ctime)
    return out, dict(counts)


def from_txn_log(observations: Observations, source: Path | History | None, *, chroot: str | None = None,
                 kinds: Sequence[str] | None = None) -> Observations:
    """``observations`` with their node history from the transaction logs of ``source`` (a directory
    ``txnlog.server_logs`` reads, or a ``History`` already read), below ``chroot`` (None: the chroot
    under which the log holds the observer's nodes), for ``kinds`` (None: ``recorded_kinds``). Unchanged
    without a log, or when no chroot is found; with one it cannot read, ``nodes_from`` says why. Pure apart
    from reading the logs."""
    if source is None:
        return observations
    if isinstance(source, History):
        history = source
    else:
        servers = server_logs(source)
        if not servers:
            return observations
        try:
            history = read_history(servers=servers)
        except (OSError, TxnLogError) as exc:  # judged by the observer's sightings, and the record says why
            return dataclasses.replace(observations, nodes_from=f"observer (the transaction log is unreadable: {exc})")
    kinds = tuple(kinds) if kinds is not None else recorded_kinds(observations)
    root = chroot if chroot is not None else _root(history, observations.nodes, kinds)
    if root is None:
        return observations
    nodes, counts = merge_nodes(observations.nodes, history, root, kinds, observations.ended_at)
    if not counts["log"]:
        return observations  # nothing of the group's in this log
    # A log that lacks a node the observer saw is not the whole history: its blind intervals stand.
    blind = [] if not counts["not_in_log"] else observations.zk_blind
    return dataclasses.replace(observations, nodes=nodes, zk_blind=blind, nodes_from=TXN_LOG,
                               nodes_from_counts=counts)
