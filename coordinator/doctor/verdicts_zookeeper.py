"""The verdicts of the ZooKeeper checks: the connection to the ensemble, the ACLs of the group's nodes, and
the session timeout against each event type's notice and drain wait. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.doctor.outcome import Status, Verdict

__all__ = ["acl_verdict", "session_verdict", "zookeeper_verdict"]


def zookeeper_verdict(
    *, hosts: str, error: str | None, cluster_exists: bool, base_path: str, who: str, tls: bool,
    read_only: bool = False, granted: float | None = None, asked: float = 0.0,
) -> Verdict:
    """The agent's connection to the ensemble (``who``: how it presented itself), and whether the group's
    base node exists yet."""
    details = {"hosts": hosts, "base_path": base_path, "tls": tls, "granted_session_timeout": granted,
               "asked_session_timeout": asked, "read_only_server": read_only}
    if error is not None:
        return Verdict(Status.FAIL, f"cannot reach ZooKeeper at {hosts} {who}: {error}",
                       "check zookeeper.hosts, the network path to the client port"
                       + (" (TLS: the secure port, zookeeper.tls.ca)" if tls else "")
                       + " and zookeeper.auth", {**details, "error": error})
    found = f"connected to {hosts} {who}, {'over TLS' if tls else 'without TLS'}"
    if read_only:
        return Verdict(Status.FAIL, f"{found}, but the server is read-only (cut off from its quorum)",
                       "restore the ensemble's quorum: agents cannot join or acknowledge meanwhile", details)
    if not cluster_exists:
        return Verdict(Status.WARN, f"{found}; {base_path} does not exist: no agent of this group has started",
                       "start the agents, then run coordinator doctor again", details)
    return Verdict(Status.PASS, f"{found}; {base_path} exists", details=details)


_WORLD_WRITES = {"write": 2, "create": 4, "delete": 8, "admin": 16}


def _world_rights(acl: Sequence[tuple[str, str, int]]) -> list[str]:
    """What ``world:anyone`` (or ``auth`` with no identity) may do besides read, from (scheme, id, perms)."""
    perms = 0
    for scheme, ident, bits in acl:
        if (scheme, ident) == ("world", "anyone"):
            perms |= bits
    return [name for name, bit in _WORLD_WRITES.items() if perms & bit]


_SHOWN_PATHS = 3


def _summarised(nodes: Mapping[str, Sequence[str]]) -> str:
    """The nodes (path -> rights) in a few words for one line: each with its rights when they are few;
    else grouped by rights, the first paths of each group named (shortest first: the base before what lies
    below it) and the rest counted. A group's nodes can number in the hundreds; ``--json`` has every one in
    the verdict's details."""
    if len(nodes) <= _SHOWN_PATHS:
        return "; ".join(f"{path} ({', '.join(rights)})" for path, rights in sorted(nodes.items()))
    groups: dict[tuple[str, ...], list[str]] = {}
    for path, rights in nodes.items():
        groups.setdefault(tuple(rights), []).append(path)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    parts = []
    for rights, paths in ordered[:2]:
        paths.sort(key=lambda path: (path.count("/"), path))
        shown = ", ".join(paths[:_SHOWN_PATHS])
        more = f" and {len(paths) - _SHOWN_PATHS} more" if len(paths) > _SHOWN_PATHS else ""
        parts.append(f"{', '.join(rights)} on {shown}{more}")
    others = sum(len(paths) for _, paths in ordered[2:])
    if others:
        parts.append(f"other rights on {others} more")
    return "; ".join(parts) + " (--json lists them all)"


def acl_verdict(
    acls: Mapping[str, Sequence[tuple[str, str, int]] | None], *, base_path: str, configured_open: bool
) -> Verdict:
    """The ACLs read from the group's nodes (path -> (scheme, id, permissions); None: no such node).

    The group's base node and the nodes below it must not let ``world:anyone`` write, create, delete or
    change the ACL: anyone who reaches the ensemble could then forge an acknowledgement or an approval.
    The components of ``zookeeper.root`` above the base let anyone read and create children (another
    group's base) by design; anything more there is a WARN."""
    details: dict[str, Any] = {
        path: [f"{scheme}:{ident}:{perms}" for scheme, ident, perms in acl] if acl is not None else None
        for path, acl in acls.items()
    }
    fix_open = "set zookeeper.auth on every agent (and zookeeper.acl for operators and readers): the agents " \
               "then close the nodes at their next start (docs/security.md)"
    if not acls and configured_open:
        return Verdict(Status.FAIL, "zookeeper.auth is not set: the agents create the group's nodes open to anyone "
                       "who reaches the ensemble (not read: no ZooKeeper session)", fix_open, details)
    if acls.get(base_path) is None:
        if configured_open:
            return Verdict(Status.FAIL, f"{base_path} does not exist yet and zookeeper.auth is not set: the agents "
                           "will create it open to anyone", fix_open, details)
        return Verdict(Status.WARN, f"{base_path} does not exist yet: its ACL cannot be checked",
                       "start the agents, then run coordinator doctor again", details)
    open_nodes = {}
    for path, acl in acls.items():
        if acl is None or not (path == base_path or path.startswith(base_path + "/")):
            continue
        rights = _world_rights(acl)
        if rights:
            open_nodes[path] = rights
    if open_nodes:
        details["open_nodes"] = {path: rights for path, rights in sorted(open_nodes.items())}
        return Verdict(Status.FAIL, f"world:anyone may change {len(open_nodes)} of the group's nodes: "
                       f"{_summarised(open_nodes)}", fix_open, details)
    loose = {}
    for path, acl in acls.items():
        if acl is None or path == base_path or path.startswith(base_path + "/"):
            continue
        rights = [r for r in _world_rights(acl) if r != "create"]
        if rights:
            loose[path] = rights
    checked = sum(1 for path, acl in acls.items() if acl is not None)
    if loose:
        details["loose_nodes"] = {path: rights for path, rights in sorted(loose.items())}
        return Verdict(Status.WARN, f"the group's nodes are closed, but world:anyone may change the root above "
                       f"them: {_summarised(loose)}", "restrict those nodes' ACL to read and create for "
                       "world:anyone (setAcl in zkCli.sh)", details)
    return Verdict(Status.PASS, f"{checked} node(s) read: none writable by world:anyone", details=details)


# --- timing ---------------------------------------------------------------------------------------------


def session_verdict(
    *,
    session_timeout: float,
    granted: float | None,
    tick: float,
    waits: Mapping[str, float],
    notices: Mapping[str, float],
    absent_grace: float | None,
) -> Verdict:
    """The session timeout against each event type's notice and drain wait.

    The rule: an agent that is lost (its process hung, its VM cut off) keeps its member node, and with it
    its place as leader or approver, until its session lapses on the server: the longest of the asked
    and granted timeouts (at least two ticks), plus a tick. Only then does another agent take over; and
    the event's VMs still need their drain wait (a lost VM named by the event counts as drained only after
    ``policy.absent_peer_grace_seconds``). So an event can still be approved early after such a loss only if
    lapse + max(drain wait, absent grace) < its notice. ``waits`` and ``notices`` hold the event types that
    are approved after a drain. A type that cannot make it is a FAIL when its notice is minutes long (the
    whole point of early approval is lost there), a WARN for a Preempt's 30 s."""
    lapse = max(session_timeout, granted or 0.0, 2 * tick) + tick
    short: dict[str, tuple[float, float]] = {}
    for event_type, notice in notices.items():
        if event_type not in waits:
            continue
        hold = max(waits[event_type], absent_grace or 0.0)
        if lapse + hold >= notice:
            short[event_type] = (notice, hold)
    details = {"session_timeout": session_timeout, "granted": granted, "tick": tick, "lapse": lapse,
               "short": sorted(short)}
    granted_note = "" if granted is None or math.isclose(granted, session_timeout) else \
        f" (the server granted {granted:g} s, asked {session_timeout:g} s)"
    if not short:
        tightest = min((notices[t] - lapse - max(waits[t], absent_grace or 0.0), t) for t in notices if t in waits) \
            if any(t in waits for t in notices) else None
        margin = f"; tightest: {tightest[1]} with {tightest[0]:.0f} s to spare" if tightest else ""
        return Verdict(Status.PASS, f"a lost agent's session lapses within {lapse:g} s{granted_note}: every "
                       f"event type can still be approved before its NotBefore{margin}", details=details)
    worst_type = min(short, key=lambda t: short[t][0] - short[t][1])
    notice, hold = short[worst_type]
    limit = notice - hold - tick  # lapse + hold < notice, lapse being the session timeout plus a tick
    listed = ", ".join(f"{t} ({short[t][0]:g} s notice)" for t in sorted(short))
    said = (f"a lost agent holds approvals for {lapse:g} s (session timeout{granted_note} plus a tick) before "
            f"the drain wait: {listed} would start at NotBefore unapproved")
    if limit > 2 * tick:
        fix = (f"lower zookeeper.session_timeout below {limit:g} s (and the servers' maxSessionTimeout), or "
               f"accept that {', '.join(sorted(short))} then starts at NotBefore")
    else:
        fix = f"no session timeout fits; accept that {', '.join(sorted(short))} starts at NotBefore after a lost agent"
    status = Status.FAIL if any(short[t][0] >= 300 for t in short) else Status.WARN
    return Verdict(status, said, fix, details)
