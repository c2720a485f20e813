"""The group status as a terminal view (rich): pause banner, leader, what needs attention, members, VMs
out of rotation or absent, one panel per pending event, and the recently finished ones; and the group's
history (``--history``): every finished event the store keeps, each with its timeline.

Times are shown relative to the read ("12 s ago", "in 4 min"), with the clock time where it matters
(NotBefore). Every value that comes from ZooKeeper or an agent goes through ``Text``, never through rich
markup: a reason with brackets in it is shown as it is.
"""

from __future__ import annotations

from datetime import datetime

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from coordinator.groupstatus.model import EventStatus, GroupHistory, GroupStatus, HistoryEntry, Member

__all__ = ["DONE_SHOWN", "clock", "relative", "render", "render_error", "render_history"]

DONE_SHOWN = 5  # recently finished events in the table (--json lists every one)

_PHASE_STYLE = {"serving": "green", "draining": "yellow", "drained": "yellow", "recovering": "cyan",
                "unknown": "dim", "starting": "dim"}
_STATE_STYLE = {"blocked": "bold red", "approvable": "bold yellow", "approved": "bold green",
                "started": "bold cyan", "done": "dim"}


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def relative(when: datetime | None, now: datetime) -> str:
    """``when`` relative to ``now``: "12 s ago", "in 4 min", "now"; "-" for None."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    if abs(delta) < 0.5:
        return "now"
    return f"in {_span(delta)}" if delta > 0 else f"{_span(-delta)} ago"


def clock(when: datetime, now: datetime) -> str:
    """The UTC clock time of ``when``, with the date when it is not ``now``'s day."""
    if when.date() == now.date():
        return when.strftime("%H:%M:%S UTC")
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def render(status: GroupStatus) -> RenderableType:
    now = status.read_at
    parts: list[RenderableType] = [_header(status)]
    if status.paused is not None:
        paused = status.paused
        since = f" since {relative(paused.at, now)} ({clock(paused.at, now)})" if paused.at else ""
        parts.append(Panel(Text(f"PAUSED{since} by {paused.by}: {paused.reason}", style="bold"),
                           style="bold red", title="group paused", title_align="left"))
    parts.append(_leader(status))
    parts.append(_attention(status))
    parts.append(_members(status))
    if status.drained_by_hand:
        parts.append(_by_hand(status))
    if status.out_of_rotation or status.absent:
        parts.append(_out_and_absent(status))
    if status.events:
        parts.append(Text(f"Events ({len(status.events)} pending)", style="bold"))
        parts.extend(_event_panel(event, status) for event in status.events)
    else:
        parts.append(Text("No pending events.", style="green"))
    if status.done:
        parts.append(_done(status))
    return Group(*parts)


def render_error(message: str, last: GroupStatus | None) -> RenderableType:
    """What --watch shows when a read fails: the error, then the last good read (if any), dimmed."""
    error = Panel(Text(message), style="bold red", title="cannot read the group", title_align="left")
    if last is None:
        return error
    return Group(error, Text(f"last good read: {last.read_at.strftime('%H:%M:%S UTC')}", style="dim"),
                 render(last))


def _header(status: GroupStatus) -> Text:
    text = Text()
    text.append(f"Group {status.cluster}", style="bold")
    text.append(f"  ZooKeeper {status.zookeeper} {status.base_path}  read at {clock(status.read_at, status.read_at)}"
                f"  policy: {status.policy}", style="dim")
    if status.read_only_server:
        text.append("  (read-only server)", style="yellow")
    return text


def _leader(status: GroupStatus) -> Text:
    if status.leader is None:
        return Text("Leader: none", style="bold red")
    text = Text("Leader: ")
    text.append(status.leader.vm, style="bold")
    if status.leader.since is not None:
        text.append(f" (since {relative(status.leader.since, status.read_at)})")
    return text


def _attention(status: GroupStatus) -> RenderableType:
    if not status.attention:
        blocked = sum(1 for event in status.events if event.state == "blocked")
        if blocked:
            return Text(f"Nothing needs attention yet; {blocked} blocked event{'s' if blocked > 1 else ''} "
                        f"below say{'' if blocked > 1 else 's'} what {'they wait' if blocked > 1 else 'it waits'} "
                        "for.", style="yellow")
        return Text("Nothing looks stuck.", style="green")
    lines = Text("\n").join(Text(f"- {item.message}") for item in status.attention)
    return Panel(lines, title="needs attention", title_align="left", style="yellow")


def _phase(member: Member) -> Text:
    agent = member.agent
    if not agent.reachable and agent.url is None and agent.error == "not asked":
        return Text("not asked", style="dim")  # --no-agents
    if not agent.reachable:
        return Text("unreachable", style="red")
    phase = agent.phase or "?"
    return Text(phase, style=_PHASE_STYLE.get(phase, ""))


def _members(status: GroupStatus) -> Table:
    table = Table(title=f"Members ({len(status.members)} live)", title_justify="left", title_style="bold",
                  expand=False)
    for column in ("VM", "Version", "FD/UD", "Unit", "Phase", "Last cycle", "Probe", "Admin"):
        table.add_column(column, overflow="fold")
    for member in status.members:
        name = Text(member.vm, style="bold")
        if member.leader:
            name.append(" (leader)", style="cyan")
        placement = member.placement
        domains = f"{placement.fault_domain or '-'}/{placement.update_domain or '-'}"
        if placement.zone:
            domains += f" z{placement.zone}"
        agent = member.agent
        if agent.reachable:
            cycle = Text(f"#{agent.cycles}: " if agent.cycles is not None else "")
            cycle.append(agent.last_cycle or "-")
        else:
            cycle = Text(agent.error or "-", style="dim red")
        unit = f"{placement.unit or '?'} ({placement.delivery or '?'})"
        table.add_row(name, Text(member.version or "-"), Text(domains), Text(unit), _phase(member), cycle,
                      Text(member.probe or "-"), Text(member.admin or "-"))
    return table


def _by_hand(status: GroupStatus) -> Table:
    table = Table(title="Drained by hand (coordinator undrain VM puts it back)", title_justify="left",
                  title_style="bold")
    for column in ("VM", "Asked", "Reason", "State"):
        table.add_column(column, overflow="fold")
    now = status.read_at
    for drain in status.drained_by_hand:
        if drain.admitted_at is None:
            state = Text("waiting for the maintenance budget" + (f": {drain.waiting}" if drain.waiting else ""),
                         style="yellow")
        else:
            admitted = f"admitted {relative(drain.admitted_at, now)} by {drain.admitted_by or '?'}"
            doing = ("out of rotation" + (f", {drain.phase}" if drain.phase else "")) if drain.out else "draining"
            state = Text(f"{doing} ({admitted})")
        table.add_row(Text(drain.vm, style="bold"), Text(f"{relative(drain.at, now)} by {drain.by}"),
                      Text(drain.reason), state)
    return table


def _out_and_absent(status: GroupStatus) -> Table:
    table = Table(title="Out of rotation / without an agent", title_justify="left", title_style="bold")
    for column in ("VM", "Out of rotation", "For events", "Agent"):
        table.add_column(column, overflow="fold")
    now = status.read_at
    absent = {a.vm: a for a in status.absent}
    for mark in status.out_of_rotation:
        agent = "live" if mark.member else (f"absent since {relative(absent[mark.vm].since, now)}"
                                            if mark.vm in absent else "none")
        table.add_row(Text(mark.vm, style="bold"), Text(f"since {relative(mark.since, now)}"),
                      Text(", ".join(mark.events) or "(none: starting up or back from a crash)"),
                      Text(agent, style="" if mark.member else "red"))
    out = {m.vm for m in status.out_of_rotation}
    for item in status.absent:
        if item.vm not in out:
            table.add_row(Text(item.vm, style="bold"), Text("-"), Text("-"),
                          Text(f"absent since {relative(item.since, now)}", style="red"))
    return table


def _acks(event: EventStatus, now: datetime) -> Text:
    text = Text()
    acked = {ack.vm: ack for ack in event.acks}
    for index, vm in enumerate([*event.resources, *sorted(set(acked) - set(event.resources))]):
        if index:
            text.append(" · ")
        if vm in acked:
            text.append(f"{vm} acked {relative(acked[vm].at, now)}", style="green")
        else:
            text.append(f"{vm} not acked", style="red")
    return text


def _event_panel(event: EventStatus, status: GroupStatus) -> Panel:
    now = status.read_at
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    if event.status is None:  # gone from IMDS, not marked done yet
        shown = f"gone from IMDS (per {event.status_reported_by}): the leader marks it done"
    elif event.status_reported_by:
        shown = f"{event.status} (per {event.status_reported_by})"
    else:
        shown = f"{event.status} (assumed: no agent reported it)"
    grid.add_row("Status", Text(shown))
    if event.not_before is not None:
        grid.add_row("NotBefore", Text(f"{relative(event.not_before, now)} ({clock(event.not_before, now)})",
                                       style="bold"))
    else:
        grid.add_row("NotBefore", Text("none"))
    grid.add_row("Resources", Text(", ".join(event.resources) or "(none)"))
    grid.add_row("Published", Text(f"by {event.published_by} {relative(event.published_at, now)}"))
    grid.add_row("Acks", _acks(event, now))
    grid.add_row("Admitted", Text(relative(event.admitted_at, now) if event.admitted_at else "no"))
    if event.vouched is not None:
        word = event.vouched
        grid.add_row("Vouched", Text(f"{', '.join(word.vms)} (no agent), by {word.by} {relative(word.at, now)}: "
                                     f"{word.reason}", style="yellow"))
    if event.approval is not None:
        approval = event.approval
        role = "as leader" if approval.as_leader else "as first live VM in Resources"
        grid.add_row("Approval", Text(f"by {approval.by} {role} {relative(approval.at, now)}", style="green"))
    elif event.state == "done":
        grid.add_row("Approval", Text("none"))
    else:
        approver = event.approver or "nobody"
        role = ""
        if event.approver is not None:
            role = " (the leader)" if event.approver_as_leader else " (first live VM in Resources)"
        grid.add_row("Approval", Text(f"none yet; approver {approver}{role}"))
    if event.state == "blocked":
        reasons = Text("\n").join(Text(b.reason, style="bold red" if b.vm else "red") for b in event.blockers)
        grid.add_row("Blocked by", reasons)
    elif event.state == "approvable":
        grid.add_row("Next", Text(f"approvable: {event.approver} approves it on its next cycle", style="yellow"))
    reports = event.approver_reports
    if reports is not None and set(reports) != {b.reason for b in event.blockers}:
        grid.add_row(f"{event.approver} says", Text("; ".join(reports) or "nothing to wait for"))
    return Panel(grid, title=Text(f"{event.type} {event.event_id}", style="bold"), title_align="left",
                 subtitle=Text(event.state.upper(), style=_STATE_STYLE[event.state]), subtitle_align="right")


def _done(status: GroupStatus) -> Table:
    now = status.read_at
    shown = status.done[:DONE_SHOWN]
    more = f", {len(status.done) - len(shown)} more in --json" if len(status.done) > len(shown) else ""
    table = Table(title=f"Recently finished ({len(shown)} shown{more})", title_justify="left", title_style="bold")
    for column in ("Event", "Type", "Resources", "Done", "Acks still standing"):
        table.add_column(column, overflow="fold")
    for event in shown:
        table.add_row(Text(event.event_id), Text(event.type), Text(", ".join(event.resources)),
                      Text(relative(event.done_at, now)), Text(", ".join(a.vm for a in event.acks) or "-"))
    return table


# -- the history ------------------------------------------------------------------------------------------

_EARLIER_VERSION = "not recorded (marked done by an agent of an earlier version)"


def render_history(history: GroupHistory) -> RenderableType:
    """``--history``: a header, one timeline per finished event (newest first), and how long they are kept."""
    now = history.read_at
    header = Text()
    header.append(f"History of group {history.cluster}", style="bold")
    header.append(f"  ZooKeeper {history.zookeeper} {history.base_path}  read at {clock(now, now)}"
                  f"  policy: {history.policy}", style="dim")
    if history.read_only_server:
        header.append("  (read-only server)", style="yellow")
    parts: list[RenderableType] = [header]
    count = len(history.events)
    if count:
        parts.append(Text(f"Finished events ({count} kept, newest first)", style="bold"))
        parts.extend(_timeline(entry, history) for entry in history.events)
    else:
        parts.append(Text("No finished event is kept in the store.", style="green"))
    kept = f"{_span(history.kept_for_seconds)} (done_retention_seconds: {history.kept_for_seconds:g})"
    parts.append(Text())
    parts.append(Text(f"Kept as long as the records are: the leader purges a finished event's record {kept} after "
                      "it was done; no history is kept beyond that.", style="dim"))
    return Group(*parts)


def _timeline(entry: HistoryEntry, history: GroupHistory) -> RenderableType:
    now = history.read_at
    title = Text(f"{entry.type} {entry.event_id}", style="bold")
    title.append(f"  on {', '.join(entry.resources)}" if entry.resources else "  on no VM named")
    if entry.not_before is not None:
        title.append(f"  NotBefore {clock(entry.not_before, now)}", style="dim")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("  announced", Text(f"{clock(entry.published_at, now)} by {entry.published_by}"))
    admitted = _admitted(entry, history)
    if admitted is not None:
        grid.add_row("  admitted", Text(admitted))
    acked = entry.approval.acked_at if entry.approval is not None else None
    if acked:
        grid.add_row("  acked", Text(", ".join(f"{vm} {clock(at, now)}" for vm, at in acked.items())
                                     + ": drained for it, each by its own acknowledgement"))
    grid.add_row("  approved", Text(_approved(entry, now), style="green" if entry.approval is not None else ""))
    started = entry.started_at
    grid.add_row("  started", Text(f"{clock(started, now)}: first seen Started in the IMDS document of the agent "
                                   "that marked it done" if started is not None else "not recorded"))
    grid.add_row("  gone", Text(f"{clock(entry.done_at, now)} ({relative(entry.done_at, now)}): it left the IMDS "
                                "documents and its record was marked done"))
    return Group(Text(), title, grid)


def _admitted(entry: HistoryEntry, history: GroupHistory) -> str | None:
    """The admission line; None (no line) when the group has no budget and the event was not admitted."""
    if entry.admitted is not None:
        by = f"the leader {entry.admitted.by}" if entry.admitted.by else "the leader (its admission does not say which)"
        return f"{clock(entry.admitted.at, history.read_at)} by {by}"
    if not entry.recorded:
        return _EARLIER_VERSION
    return "not admitted" if history.budgeted else None


def _approved(entry: HistoryEntry, now: datetime) -> str:
    approval = entry.approval
    if approval is None:
        if not entry.recorded:
            return _EARLIER_VERSION
        if entry.started_at is not None:
            return "not approved early: it started at NotBefore"
        if entry.not_before is not None and entry.done_at < entry.not_before:
            return "not approved early: it was gone before its NotBefore"
        return "not approved early: it started at NotBefore, or was gone before it started"
    if approval.at is None:
        return "approved, by whom and when not recorded (its approval node did not parse)"
    role = "as the leader" if approval.as_leader else "as the first live VM named in Resources"
    text = f"{clock(approval.at, now)} by {approval.by} {role}"
    if entry.not_before is not None and approval.at < entry.not_before:
        text += f", {_span((entry.not_before - approval.at).total_seconds())} before NotBefore"
    if approval.vouched:
        text += (f"; {', '.join(approval.vouched)} (no agent) vouched for by {approval.vouched_by or 'an operator'}"
                 + (f": {approval.reason}" if approval.reason else ""))
    if approval.acks is None:
        return text + "; the acks it was released on not recorded"
    if not approval.acks:
        return text + "; no acknowledgement was required"
    return text + f"; released by the acks of {', '.join(approval.acks)}"
