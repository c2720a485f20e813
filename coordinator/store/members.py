"""Whose is a live member node that another session holds: this VM's previous agent process, or another
agent configured with the same VM name? Used by the ZooKeeper store's ``join`` and ``campaign``.

A member node held by another session is taken over only when its payload proves that it belongs to
this VM's previous agent process (one that restarted before its old session expired). The proof, from
the fields the agent writes into its member info (``coordinator.support.hostos.agent_identity`` and the
agent's ``started_at``), compared with the info this agent joins with:

* the same ``host`` name, and
* the node's agent started before this one (``started_at``, each by its own clock), and
* either another ``boot_id`` (no process of an earlier boot can still run), or the same ``boot_id`` and
  no process running with the node's ``pid`` and ``pid_start`` any more (gone, or the pid reused).

Anything else is a duplicate: another host, a process that still runs, a field missing or unreadable on
either side (a payload that does not parse, an agent that does not say who it is, a system without a
boot id). The start-time condition means that of two live agents at most one can ever take the other's
node, whatever their clocks say: two agents that wrongly pass the rest (two clones with one host name,
two containers of one kernel) never replace each other's node back and forth; the one that loses its
node is refused from then on and says so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

from coordinator.errors import DuplicateMember
from coordinator.support.hostos import process_running

__all__ = ["duplicate_member", "predecessor"]

Running = Callable[[int, "str | None"], "bool | None"]


def predecessor(theirs: Mapping[str, object], ours: Mapping[str, object], *,
                running: Running = process_running) -> str | None:
    """Why the member node whose info is ``theirs`` provably belongs to this VM's previous agent process,
    when the agent joining with ``ours`` may replace it; None when nothing proves it (a duplicate).
    ``running(pid, pid_start)`` tells whether a process runs on this machine (None: cannot tell)."""
    host, our_host = _text(theirs, "host"), _text(ours, "host")
    if host is None or host != our_host:
        return None
    started, our_started = _number(theirs, "started_at"), _number(ours, "started_at")
    if started is None or our_started is None or not started < our_started:
        return None
    boot, our_boot = _text(theirs, "boot_id"), _text(ours, "boot_id")
    pid = theirs.get("pid")
    if boot is None or our_boot is None or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    if boot != our_boot:
        return f"written by pid {pid} of {host} before it restarted (boot id {boot}, now {our_boot})"
    if running(pid, _text(theirs, "pid_start")) is False:
        return f"written by pid {pid} of {host}, which no longer runs"
    return None


def duplicate_member(
    vm: str, session: int, theirs: Mapping[str, object] | None, since: float | None
) -> DuplicateMember:
    """The error for a member node of ``vm`` held by ``session`` that this agent may not replace;
    ``theirs`` is what the node says (None: it does not parse), ``since`` when it was created."""
    info = theirs or {}
    pid = info.get("pid")
    when = (dt.datetime.fromtimestamp(since, dt.UTC).isoformat(timespec="seconds") if since is not None else "?")
    return DuplicateMember(vm, session, _text(info, "host"),
                           pid if isinstance(pid, int) and not isinstance(pid, bool) else None, when)


def _text(info: Mapping[str, object], key: str) -> str | None:
    value = info.get(key)
    return value[:200] if isinstance(value, str) and value else None


def _number(info: Mapping[str, object], key: str) -> float | None:
    value = info.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
