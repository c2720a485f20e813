"""The text of ``coordinator fleet``: a header, the groups, then one table per section (events a group
coordinates, events no agent coordinates, events finished recently, group records Resource Graph does not
list). A cell with nothing to say is left out or says so in words: the text never shows ``None``.

Columns (``docs/fleet.md``): *Event* (type and EventId), *Status* (EventStatus), *NotBefore* (UTC clock,
and how far from now), *Unit* (the resource the event is published for, as type/name), *VMs* (each VM the
event names: the group whose agent runs it, or that no agent runs it), *Held by the group* (per group
holding a record: its state, approver, acks, admission, approval and what holds it)."""

from __future__ import annotations

from datetime import datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from coordinator.fleet.model import FleetEvent, FleetStatus, GroupRecord
from coordinator.groupstatus.render import clock, relative

__all__ = ["render", "render_error", "short_unit"]

_STATE = {"blocked": "BLOCKED", "approvable": "approvable", "approved": "APPROVED", "started": "started",
          "done": "done"}


def short_unit(unit: str) -> str:
    """``{type}/{name}`` of a resource id (``virtualMachineScaleSets/web``; the JSON has the whole id); the id
    as it is when it is not one."""
    parts = unit.strip("/").split("/")
    if len(parts) >= 8 and parts[0].lower() == "subscriptions" and parts[2].lower() == "resourcegroups":
        return "/".join(parts[6:])
    return unit or "unknown"


def render(status: FleetStatus) -> RenderableType:
    now = status.read_at
    parts: list[RenderableType] = [_header(status), _groups(status)]
    parts.append(_section(f"Pending events coordinated by a group ({len(status.events)})", status.events, now,
                          held=True, empty="none"))
    parts.append(_section(f"Pending events no agent coordinates: nothing holds them, they start at NotBefore "
                          f"({len(status.uncoordinated)})", status.uncoordinated, now, held=False, empty="none"))
    parts.append(_section(f"Finished in the last {status.finished_hours:g} h ({len(status.finished)})",
                          status.finished, now, held=False, empty="none", finished=True))
    if status.unlisted:
        parts.append(_unlisted(status))
    if status.skipped_rows:
        parts.append(Text("Resource Graph rows not understood: " + "; ".join(status.skipped_rows), style="yellow"))
    return Group(*parts)


def render_error(message: str, last: FleetStatus | None) -> RenderableType:
    """Under --watch, a failed read: the message, above the last table when there is one."""
    error = Text(f"cannot read: {message}", style="bold red")
    return error if last is None else Group(error, Text("last read:", style="dim"), render(last))


def _header(status: FleetStatus) -> Text:
    subscriptions = ", ".join(status.subscriptions)
    text = Text()
    text.append("Fleet", style="bold")
    text.append(f": subscription(s) {subscriptions}; groups under {status.root} on {status.zookeeper}; "
                f"read at {clock(status.read_at, status.read_at)}")
    return text


def _groups(status: FleetStatus) -> RenderableType:
    if not status.groups:
        return Text(f"No group under {status.root}: no agent has used this root yet.", style="yellow")
    table = Table(show_edge=False, pad_edge=False)
    for column in ("Group", "Live agents", "Leader", "Note"):
        table.add_column(column)
    for group in status.groups:
        if group.error is not None:
            table.add_row(group.cluster, "", "", Text(f"not read: {group.error}", style="red"))
            continue
        live = ", ".join(group.members) if group.members else "none"
        gone = sorted(set(group.registered) - set(group.members))
        notes = [f"PAUSED {group.paused}"] if group.paused else []
        if gone:
            notes.append("registered, no live agent: " + ", ".join(gone))
        table.add_row(group.cluster, f"{len(group.members)}: {live}", group.leader or "no leader", "; ".join(notes))
    return Group(Text(f"Groups ({len(status.groups)})", style="bold"), table)


def _section(title: str, events: list[FleetEvent], now: datetime, *, held: bool, empty: str,
             finished: bool = False) -> RenderableType:
    if not events:
        return Text(f"{title}: {empty}", style="bold")
    table = Table(show_edge=False, pad_edge=False, show_lines=True)
    table.add_column("Event", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Updated" if finished else "NotBefore", no_wrap=True)
    for column in ("Unit", "VMs", *(("Held by the group",) if held else ())):
        table.add_column(column, overflow="fold")
    for event in events:
        when = event.updated_at if finished else event.not_before
        when_text = f"{clock(when, now)}\n{relative(when, now)}" if when is not None else \
            ("not given" if finished else "blank (started)" if event.status == "Started" else "not given")
        row: list[RenderableType] = [Text(f"{event.type}\n{event.event_id}"), _status(event.status), when_text,
                                     short_unit(event.unit), _vms(event)]
        if held:
            row.append(_records(event, now))
        table.add_row(*row)
    return Group(Text(title, style="bold"), table)


def _status(status: str) -> Text:
    style = {"Scheduled": "yellow", "Started": "bold red", "Completed": "green", "Canceled": "dim"}.get(status, "")
    return Text(status, style=style)


def _vms(event: FleetEvent) -> Text:
    text = Text()
    for index, vm in enumerate(event.vms):
        if index:
            text.append("\n")
        text.append(vm.vm, style="bold")
        if vm.agent:
            text.append(f": agent in {vm.group}")
        elif vm.group is not None:
            text.append(f": no live agent (registered in {vm.group})", style="red")
        else:
            text.append(": no agent", style="red")
    if not event.vms:
        text.append("names no VM")
    return text


def _records(event: FleetEvent, now: datetime) -> Text:
    text = Text()
    if not event.records:
        text.append("no group holds a record yet (the agents publish it on their next IMDS poll)", style="yellow")
        return text
    for index, record in enumerate(event.records):
        if index:
            text.append("\n")
        text.append(f"{record.cluster}: ", style="bold")
        text.append(_STATE.get(record.state, record.state), style="red" if record.state == "blocked" else "")
        for line in _record_lines(record, now):
            text.append("\n  " + line)
    return text


def _record_lines(record: GroupRecord, now: datetime) -> list[str]:
    lines = [f"approver {record.approver}" if record.approver else "no approver"]
    acks = f"acks {', '.join(record.acks)}" if record.acks else "no ack yet"
    if record.missing_acks:
        acks += f"; missing {', '.join(record.missing_acks)}"
    lines.append(acks)
    if record.admitted_at is not None:
        lines.append(f"admitted {relative(record.admitted_at, now)}")
    if record.approval is not None:
        role = "leader" if record.approval.as_leader else "VM named"
        lines.append(f"approved by {record.approval.by} ({role}) {relative(record.approval.at, now)}")
    if record.done_at is not None:
        lines.append(f"done {relative(record.done_at, now)}")
    lines.extend(f"held: {blocker.reason}" for blocker in record.blockers)
    return lines


def _unlisted(status: FleetStatus) -> RenderableType:
    title = Text(f"Group records Resource Graph does not list ({len(status.unlisted)}): is publishing to Resource "
                 "Graph enabled (scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets)?", style="bold")
    table = Table(show_edge=False, pad_edge=False)
    for column in ("Group", "Event", "VMs", "State", "NotBefore"):
        table.add_column(column, overflow="fold")
    for record in status.unlisted:
        when = f"{clock(record.not_before, status.read_at)} ({relative(record.not_before, status.read_at)})" \
            if record.not_before is not None else "not given"
        table.add_row(record.cluster, f"{record.type} {record.event_id}", ", ".join(record.resources),
                      _STATE.get(record.state, record.state), when)
    return Group(title, table)
