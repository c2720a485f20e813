"""The simulator's delivery units (``VmInfo.unit``) and delivery modes (``delivery``), on the pure model and in
the command line's parsing.

Azure delivers an event to every VM of its availability set or scale-set placement group, and to no other;
GPU VMs of a one-fault-domain scale set see only the events naming them. One coordinated group may span
several units. No sockets, no sleeps: time comes from a fake clock.
"""

from __future__ import annotations

import argparse
import json
import uuid

import pytest

from azuresim import InvalidRequest, SimulatedGroup, VmInfo
from azuresim.cli import add_arguments
from azuresim.layout import vm_infos
from coordinator.models import parse_document
from tests.unit.test_sim_state import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def two_units(clock: FakeClock, delivery: str = "unit", scale_set: str = "") -> SimulatedGroup:
    """vm0, vm1 in unit pg0; vm2, vm3 in unit pg1; fault domain i % 2."""
    return SimulatedGroup(
        [
            VmInfo(f"vm{i}", scale_set_name=scale_set, unit="pg0" if i < 2 else "pg1", fault_domain=i % 2)
            for i in range(4)
        ],
        clock=clock,
        delivery=delivery,
    )


def seen_by(group: SimulatedGroup, event_id: str) -> list[str]:
    """The VMs whose document lists ``event_id``."""
    return [info.name for info in group.vms
            if any(e["EventId"] == event_id for e in group.document(info.name)["Events"])]


# -- who sees what ---------------------------------------------------------------------------------


def test_an_event_is_served_to_every_vm_of_its_unit_and_to_no_other(clock: FakeClock) -> None:
    group = two_units(clock)
    freeze = group.schedule("Freeze", ["vm3"])
    assert freeze["unit"] == "pg1"
    assert seen_by(group, freeze["event_id"]) == ["vm2", "vm3"]
    assert group.document("vm0") == {"DocumentIncarnation": 2, "Events": []}
    [served] = parse_document(json.dumps(group.document("vm2"))).events
    assert served.resources == ("vm3",)


def test_a_vm_of_the_unit_not_named_approves_the_event(clock: FakeClock) -> None:
    group = two_units(clock)
    eid = group.schedule("Freeze", ["vm3"])["event_id"]
    assert group.approve("vm2", [eid]) == {eid: "approved"}
    assert group.event(eid)["status"] == "Started"
    assert group.event(eid)["approved_by"] == ["vm2"]
    assert [e["EventStatus"] for e in group.document("vm3")["Events"]] == ["Started"]


def test_named_delivery_serves_an_event_only_to_the_vms_it_names(clock: FakeClock) -> None:
    group = two_units(clock, delivery="named")
    assert group.delivery == "named"
    eid = group.schedule("Freeze", ["vm3"])["event_id"]
    assert seen_by(group, eid) == ["vm3"]
    both = group.schedule("Reboot", ["vm0", "vm1"])["event_id"]
    assert seen_by(group, both) == ["vm0", "vm1"]


def test_deliver_to_named_only_still_narrows_an_event_within_its_unit(clock: FakeClock) -> None:
    group = two_units(clock)
    own = group.schedule("Freeze", ["vm3"], deliver_to_named_only=True)["event_id"]
    shared = group.schedule("Freeze", ["vm2"])["event_id"]
    assert seen_by(group, own) == ["vm3"]
    assert seen_by(group, shared) == ["vm2", "vm3"]


def test_a_group_without_units_is_one_unit_seen_by_every_vm(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0", "vm1", "vm2"], clock=clock)
    eid = group.schedule("Freeze", ["vm1"])["event_id"]
    assert group.event(eid)["unit"] == ""
    assert seen_by(group, eid) == ["vm0", "vm1", "vm2"]
    outside = group.schedule("Freeze", ["elsewhere"])["event_id"]
    nobody = group.schedule("Freeze", [])["event_id"]
    assert seen_by(group, outside) == seen_by(group, nobody) == ["vm0", "vm1", "vm2"]


def test_an_event_naming_no_vm_of_the_group_is_of_the_default_unit_or_the_one_given(clock: FakeClock) -> None:
    group = SimulatedGroup(
        [VmInfo("vm0"), VmInfo("vm1", unit="as-web"), VmInfo("vm2", unit="AS-WEB")], clock=clock
    )
    outside = group.schedule("Freeze", ["elsewhere"])
    assert outside["unit"] == ""
    assert seen_by(group, outside["event_id"]) == ["vm0"]
    placed = group.schedule("Freeze", [], unit="as-WEB")  # units compare case-insensitively
    assert placed["unit"] == "as-web"  # as the unit's first VM spells it
    assert seen_by(group, placed["event_id"]) == ["vm1", "vm2"]
    assert group.schedule("Freeze", ["VM2", "elsewhere"], unit="AS-web")["unit"] == "as-web"


def test_an_event_naming_vms_of_two_units_is_refused(clock: FakeClock) -> None:
    group = two_units(clock)
    with pytest.raises(InvalidRequest, match=r"two delivery units \(vm1 of unit 'pg0', vm2 of unit 'pg1'\)"):
        group.schedule("Freeze", ["vm1", "elsewhere", "VM2"])
    with pytest.raises(InvalidRequest, match="not the unit of vm0"):
        group.schedule("Freeze", ["vm0"], unit="pg1")
    with pytest.raises(InvalidRequest, match=r"'pg7' is not a delivery unit of the group \(its units: 'pg0', 'pg1'\)"):
        group.schedule("Freeze", [], unit="pg7")
    assert group.events()["events"] == []
    assert group.incarnation == 1
    assert group.schedule("Freeze", ["vm2", "vm3"])["unit"] == "pg1"


def test_a_timeline_step_across_two_units_is_logged_as_failed(clock: FakeClock) -> None:
    group = two_units(clock)
    group.load_timeline([{"at": 0, "schedule": {"event_type": "Freeze", "resources": ["vm0", "vm3"]}},
                         {"at": 0, "schedule": {"event_type": "Freeze", "resources": ["vm0"]}}])
    group.tick()
    [failed] = [e for e in group.log(kind="timeline") if "error" in e]
    assert "two delivery units" in failed["error"]
    assert [e["resources"] for e in group.events()["events"]] == [["vm0"]]


# -- rollouts --------------------------------------------------------------------------------------


def test_default_rollout_goes_unit_by_unit_and_fault_domain_by_fault_domain(clock: FakeClock) -> None:
    group = SimulatedGroup([
        VmInfo("vm0", unit="pg0", fault_domain=1),
        VmInfo("vm1", unit="pg1", fault_domain=0),
        VmInfo("vm2", unit="pg0", fault_domain=0),
        VmInfo("vm3", unit="pg1", fault_domain=0),
    ], clock=clock, started_for=5)
    rollout = group.rollout("Freeze", duration_in_seconds=0, not_before_in=60)
    assert rollout["groups"] == [["vm2"], ["vm0"], ["vm1", "vm3"]]
    assert seen_by(group, rollout["event"]["event_id"]) == ["vm0", "vm2"]
    for _ in range(2):
        group.approve("vm0", [group.events()["events"][0]["event_id"]])
        clock.advance(5)
    [last] = group.events()["events"]
    assert (last["resources"], last["unit"]) == (["vm1", "vm3"], "pg1")
    assert seen_by(group, last["event_id"]) == ["vm1", "vm3"]


def test_a_rollout_group_naming_vms_of_two_units_is_refused(clock: FakeClock) -> None:
    group = two_units(clock)
    with pytest.raises(InvalidRequest, match=r"groups\[1\]: the event names VMs of two delivery units"):
        group.rollout("Freeze", groups=[["vm0", "vm1"], ["vm1", "vm2"]])
    assert group.rollouts() == []
    assert group.events()["events"] == []


# -- layout and compute metadata -------------------------------------------------------------------


def test_compute_metadata_of_scale_set_instances_carries_the_unit_as_placement_group(clock: FakeClock) -> None:
    group = two_units(clock, scale_set="pool")
    assert [group.compute(f"vm{i}")["placementGroupId"] for i in range(4)] == ["pg0", "pg0", "pg1", "pg1"]


def test_placement_group_without_a_unit_is_one_guid_per_scale_set_and_empty_outside_scale_sets(
    clock: FakeClock,
) -> None:
    group = SimulatedGroup(
        [VmInfo("pool_0", scale_set_name="pool"), VmInfo("pool_1", scale_set_name="Pool"),
         VmInfo("web_0", scale_set_name="web"), VmInfo("single", unit="as-1")],
        clock=clock,
    )
    pool = group.compute("pool_0")["placementGroupId"]
    assert uuid.UUID(pool).version == 5
    assert group.compute("pool_1")["placementGroupId"] == pool
    assert group.compute("web_0")["placementGroupId"] not in ("", pool)
    assert group.compute("single")["placementGroupId"] == ""  # not in a scale set: IMDS serves ""
    assert SimulatedGroup([VmInfo("pool_0", scale_set_name="pool")]).compute("pool_0")["placementGroupId"] == pool


def test_layout_lists_each_vm_with_its_unit_and_the_group_delivery(clock: FakeClock) -> None:
    layout = two_units(clock, delivery="named", scale_set="pool").layout()
    assert layout["delivery"] == "named"
    assert layout["units"] == {"pg0": ["vm0", "vm1"], "pg1": ["vm2", "vm3"]}
    assert layout["vms"][2] == {"name": "vm2", "unit": "pg1", "scale_set_name": "pool", "placement_group_id": "pg1",
                                "fault_domain": 0, "update_domain": 0, "zone": ""}


@pytest.mark.parametrize(
    ("vms", "options", "message"),
    [
        ([VmInfo("vm0", unit="pg\n0")], {}, "invalid delivery unit"),
        ([VmInfo("vm0")], {"delivery": "everyone"}, "delivery: Input should be 'unit' or 'named'"),
    ],
)
def test_bad_layouts_are_refused(vms: list[VmInfo], options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        SimulatedGroup(vms, **options)  # type: ignore[arg-type]


# -- the command line ------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


NAMES = ["vm0", "vm1", "vm2", "vm3", "vm4"]


def units(args: argparse.Namespace, names: list[str] = NAMES) -> list[str]:
    return [info.unit for info in vm_infos(args, names)]


def test_cli_units_are_named_pg_in_turn_or_as_given() -> None:
    assert units(parse("--units", "vm0,vm1/vm2,vm3")) == ["pg0", "pg0", "pg1", "pg1", ""]
    assert units(parse("--units", "as-web=vm0,VM1/vm4")) == ["as-web", "as-web", "", "", "pg1"]
    assert units(parse("--unit-size", "2")) == ["pg0", "pg0", "pg1", "pg1", "pg2"]
    assert units(parse()) == [""] * 5
    assert parse().delivery == "unit"
    assert parse("--delivery", "named").delivery == "named"


def test_cli_layout_gives_units_with_the_other_vm_options() -> None:
    infos = vm_infos(parse("--unit-size", "2", "--scale-set", "pool", "--fault-domains", "3"), NAMES)
    assert [(i.unit, i.scale_set_name, i.fault_domain) for i in infos][3] == ("pg1", "pool", 0)


@pytest.mark.parametrize(
    ("argv", "option", "message"),
    [
        (["--units", "vm0,vm1//vm2"], "--units", "unit 1 lists no VM"),
        (["--units", "a b=vm0"], "--units", "invalid unit name 'a b'"),
        (["--units", "vm0,bad!name"], "--units", "invalid VM name"),
        (["--units", "vm0/vm1", "--unit-size", "2"], "--unit-size", "not allowed with argument --units"),
        (["--unit-size", "0"], "--unit-size", "expected an integer >= 1"),
        (["--delivery", "all"], "--delivery", "invalid choice: 'all'"),
    ],
)
def test_cli_refuses_a_malformed_layout_naming_the_option(argv: list[str], option: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentError) as error:
        parse(*argv)
    assert error.value.argument_name == option
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--units", "vm0/vm9"], "--units: 'vm9' is not a VM of the group (vm0, vm1, vm2, vm3, vm4)"),
        (["--units", "vm0,vm1/VM1"], "--units: VM 'VM1' is in two units ('pg0' and 'pg1')"),
        (["--units", "x=vm0/X=vm1"], "--units: two units are named 'X'"),
    ],
)
def test_cli_refuses_a_layout_that_does_not_fit_the_vms(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        vm_infos(parse(*argv), NAMES)
    assert str(error.value) == message
