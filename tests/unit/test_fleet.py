"""``coordinator fleet`` from hand-built inputs: the join of Resource Graph's events with the groups' statuses
(``coordinator.fleet.join``), the text (``coordinator.fleet.render``) and the refusals of the command line."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from coordinator.azure_graph import GraphEvent
from coordinator.cli import main
from coordinator.fleet.join import ClusterRead, build_fleet
from coordinator.fleet.model import FleetStatus
from coordinator.fleet.render import render, short_unit
from coordinator.groupstatus.model import GroupStatus

NOW = 1_800_000_000.0
SUB = "11111111-2222-3333-4444-555555555555"
SCALE_SET = f"/subscriptions/{SUB}/resourceGroups/rg-web/providers/Microsoft.Compute/virtualMachineScaleSets/web"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()


def record(event_id: str, resources: Sequence[str], *, state: str = "blocked", acks: Sequence[str] = (),
           blockers: Sequence[tuple[str, str | None, str]] = (), done_at: float | None = None) -> dict[str, Any]:
    return {"event_id": event_id, "type": "Freeze", "status": None if done_at else "Scheduled",
            "status_reported_by": None, "resources": list(resources), "published_by": resources[0],
            "published_at": iso(NOW - 60), "not_before": iso(NOW + 600), "not_before_in_seconds": 600.0,
            "acks": [{"vm": vm, "at": iso(NOW - 30)} for vm in acks],
            "missing_acks": [vm for vm in resources if vm not in acks], "admitted_at": iso(NOW - 20),
            "approval": None, "done_at": iso(done_at) if done_at else None, "approver": resources[0],
            "approver_as_leader": False, "state": state,
            "blockers": [{"kind": kind, "vm": vm, "reason": reason} for kind, vm, reason in blockers],
            "approver_reports": None}


def group(cluster: str, members: Sequence[str], registered: Sequence[str] = (),
          events: Sequence[dict[str, Any]] = (), done: Sequence[dict[str, Any]] = ()) -> GroupStatus:
    agent = {"reachable": False, "url": None}
    return GroupStatus.model_validate({
        "cluster": cluster, "base_path": f"/root/{cluster}", "zookeeper": "zk:2181", "read_at": iso(NOW),
        "read_only_server": False, "policy": "defaults", "paused": None,
        "leader": {"vm": members[0], "since": None} if members else None,
        "members": [{"vm": vm, "leader": i == 0, "agent": agent} for i, vm in enumerate(members)],
        "registered": sorted({*members, *registered}), "out_of_rotation": [], "absent": [],
        "events": list(events), "done": list(done), "attention": []})


def event(event_id: str, resources: Sequence[str], status: str = "Scheduled", *, not_before: float | None = NOW + 600,
          updated: float | None = NOW - 10, unit: str = SCALE_SET) -> GraphEvent:
    return GraphEvent(event_id=event_id, event_type="Freeze", status=status, resources=tuple(resources),
                      not_before=not_before, unit=unit, subscription=SUB, resource_group="rg-web",
                      description="Virtual machine is being paused", source="Platform", updated_at=updated)


def fleet(events: Sequence[GraphEvent], groups: Sequence[ClusterRead]) -> FleetStatus:
    return build_fleet(events, groups, read_at=NOW, subscriptions=[SUB], zookeeper="zk:2181", root="/root",
                       finished_hours=24, policy="defaults (no --config)")


def text(status: FleetStatus) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render(status))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_vms_are_matched_case_insensitively_to_live_members_then_to_registered_ones() -> None:
    web = group("web", ["web_0", "web_1"], registered=["web_7"],
                events=[record("E1", ["web_0", "web_7"], acks=["web_0"],
                               blockers=[("not_acknowledged", "web_7", "web_7 has not acknowledged")])])
    status = fleet([event("e1", ["WEB_0", "web_7", "stranger"])], [ClusterRead("web", web)])
    [shown] = status.events
    assert [(v.vm, v.group, v.agent) for v in shown.vms] == [("WEB_0", "web", True), ("web_7", "web", False),
                                                            ("stranger", None, False)]
    [held] = shown.records
    assert (held.cluster, held.state, held.acks, held.missing_acks) == ("web", "blocked", ["web_0"], ["web_7"])
    assert [b.reason for b in held.blockers] == ["web_7 has not acknowledged"]
    assert shown.not_before_in_seconds == 600 and status.uncoordinated == [] and status.unlisted == []


def test_an_event_whose_vms_run_no_agent_is_uncoordinated_even_if_one_was_registered() -> None:
    db = group("db", ["db0"], registered=["db1"])
    status = fleet([event("E2", ["db1"]), event("E3", ["lone"]), event("E4", ["db0"], "Started", not_before=None)],
                   [ClusterRead("db", db)])
    assert [e.event_id for e in status.uncoordinated] == ["E2", "E3"]
    assert [e.event_id for e in status.events] == ["E4"]
    assert status.uncoordinated[0].vms[0].group == "db" and not status.uncoordinated[0].vms[0].agent


def test_records_of_several_groups_and_done_ones_join_the_event() -> None:
    web = group("web", ["web_0"], events=[record("E5", ["web_0"], state="approvable")])
    other = group("batch", ["b0"], done=[record("E5", ["web_0"], state="done", done_at=NOW - 5)])
    status = fleet([event("E5", ["web_0"])], [ClusterRead("batch", other), ClusterRead("web", web)])
    assert [(r.cluster, r.state) for r in status.events[0].records] == [("batch", "done"), ("web", "approvable")]


def test_finished_latest_first_unlisted_records_and_unreadable_groups() -> None:
    web = group("web", ["web_0"], events=[record("NOT-IN-GRAPH", ["web_0"])])
    status = fleet([event("OLD", ["web_0"], "Completed", updated=NOW - 3600),
                    event("NEW", ["web_0"], "Canceled", updated=NOW - 60),
                    event("UNDATED", ["web_0"], "Completed", updated=None)],
                   [ClusterRead("web", web), ClusterRead("broken", error="cannot read ZooKeeper: NoAuthError")])
    assert [e.event_id for e in status.finished] == ["NEW", "OLD", "UNDATED"]
    assert [(u.cluster, u.event_id) for u in status.unlisted] == [("web", "NOT-IN-GRAPH")]
    broken = next(g for g in status.groups if g.cluster == "broken")
    assert broken.error == "cannot read ZooKeeper: NoAuthError" and broken.members == []


def test_pending_events_come_started_first_then_by_not_before() -> None:
    web = group("web", ["web_0"])
    status = fleet([event("LATE", ["web_0"], not_before=NOW + 900), event("SOON", ["web_0"], not_before=NOW + 60),
                    event("NOW", ["web_0"], "Started", not_before=None)], [ClusterRead("web", web)])
    assert [e.event_id for e in status.events] == ["NOW", "SOON", "LATE"]


def test_the_text_shows_every_section_and_never_none() -> None:
    web = group("web", ["web_0", "web_1"], registered=["web_9"],
                events=[record("E1", ["web_0"],
                               blockers=[("budget", None, "maintenance budget: 1 event(s) in maintenance (E0)")])])
    status = fleet([event("E1", ["web_0"]), event("E2", ["lone"], unit=f"/subscriptions/{SUB}/resourceGroups/rg/"
                                                                          "providers/Microsoft.Compute/virtualMachines/lone"),
                    event("E3", ["web_1"], "Started", not_before=None),
                    event("E4", ["web_1"], "Completed", updated=NOW - 120)],
                   [ClusterRead("web", web), ClusterRead("broken", error="no answer within 5 s")])
    out = text(status)
    assert "Pending events coordinated by a group (2)" in out
    assert "web_0: agent in web" in out and "web: BLOCKED" in out
    assert "held: maintenance budget: 1 event(s) in maintenance (E0)" in out and "no ack yet; missing web_0" in out
    assert "no group holds a record yet" in out  # E3: web_1 runs an agent, its group has no record yet
    assert "blank (started)" in out
    assert "nothing holds them, they start at NotBefore (1)" in out and "lone: no agent" in out
    assert "virtualMachineScaleSets/web" in out and "virtualMachines/lone" in out
    assert "Finished in the last 24 h (1)" in out and "Completed" in out and "2 min ago" in out
    assert "registered, no live agent: web_9" in out and "not read: no answer within 5 s" in out
    assert "Group records Resource Graph does not list" not in out
    assert "None" not in out and "null" not in out


def test_empty_sections_say_none_and_an_empty_root_says_so() -> None:
    out = text(fleet([], []))
    assert "Pending events coordinated by a group (0): none" in out
    assert "No group under /root" in out and "None" not in out


def test_short_unit() -> None:
    assert short_unit(SCALE_SET) == "virtualMachineScaleSets/web"
    assert short_unit("odd") == "odd" and short_unit("") == "unknown"


@pytest.mark.parametrize(("args", "said"), [
    (["--subscription", SUB], "give --config FILE (an agent's configuration), or --zookeeper HOSTS"),
    (["--subscription", SUB, "--zookeeper", "zk:2181", "--watch", "1"], "--watch must be at least 5 s"),
    (["--subscription", " ", "--zookeeper", "zk:2181"], "--subscription must not be empty"),
    (["--subscription", SUB, "--zookeeper", "zk:2181", "--finished-hours", "0"], "--finished-hours must be positive"),
])
def test_bad_arguments_are_refused_in_one_line(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coordinator: fleet: ") and said in err and err.count("\n") == 1
