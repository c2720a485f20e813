"""``coordinator doctor``'s ``delivery`` check: this VM's delivery unit and mode as the configuration gives them
against IMDS's compute metadata (``placementGroupId``), a Scheduled Events document, and what the members
publish (``coordinator.delivery``); the verdict (a pure function) and the check on what the imds check read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.config import Settings
from coordinator.delivery import DeliveryMode
from coordinator.doctor.checks import CHECKS, Context, check_delivery, check_imds
from coordinator.doctor.verdicts import Status, agent_unit, delivery_verdict

PG0 = "5d3a7c1e-0000-4000-8000-000000000000"
PG1 = "9b1f2e4d-0000-4000-8000-000000000001"
E1 = "EA1B2C3D-0000-4000-8000-00000000000E"


def _verdict(**given: Any) -> Any:
    options: dict[str, Any] = {"configured_unit": None, "mode": DeliveryMode.AUTO, "vm_name_set": False,
                               "placement_group": PG0, "unnamed_events": [], "members": None}
    return delivery_verdict(**{**options, **given})


def _member(unit: str | None, delivery: str | None = "auto") -> dict[str, object]:
    info: dict[str, object] = {"version": "1.0", "probe": "http://10.0.0.5:8090/health", "unit": unit}
    if delivery is not None:
        info["delivery"] = delivery
    return info


# --- the unit the agent takes -------------------------------------------------------------------------


def test_the_agent_takes_imds_unit_else_the_placement_group_it_reads_without_vm_name() -> None:
    assert agent_unit(configured="as-web", vm_name_set=True, placement_group=PG0) == "as-web"
    assert agent_unit(configured=None, vm_name_set=False, placement_group=PG0) == PG0
    # vm_name set: the agent does not ask IMDS for the compute metadata, nor learns the placement group.
    assert agent_unit(configured=None, vm_name_set=True, placement_group=PG0) is None
    assert agent_unit(configured=None, vm_name_set=False, placement_group="") is None  # not a scale set


# --- PASS -----------------------------------------------------------------------------------------------


def test_a_scale_set_instance_learning_its_placement_group_passes_and_says_each_members_unit() -> None:
    members = {"web_0": _member(PG0), "web_1": _member(PG0), "web_2": _member(PG1)}
    verdict = _verdict(members=members, me="web_0")
    assert verdict.status is Status.PASS, verdict.summary
    assert verdict.summary.startswith(f"unit {PG0} (IMDS's placementGroupId), imds.delivery auto: delivery not "
                                      "known yet (auto: only events naming this VM count)")
    # A group may span several placement groups: different units, one mode, all said.
    assert f"members by unit (delivery): {PG0} (auto): web_0, web_1; {PG1} (auto): web_2" in verdict.summary
    assert verdict.details["unit"] == PG0 and verdict.details["members"]["web_2"] == {"unit": PG1, "delivery": "auto"}
    assert verdict.fix == ""


def test_auto_with_an_event_naming_other_vms_in_the_document_is_unit_wide_here() -> None:
    verdict = _verdict(unnamed_events=[E1])
    assert verdict.status is Status.PASS
    assert "imds.delivery auto: every event of the unit (this document lists 1 event(s) naming other VMs and not " \
        "this one)" in verdict.summary


def test_unit_delivery_is_never_disproved_by_one_document() -> None:
    # A document listing only this VM's events, or none, says nothing against unit-wide delivery.
    verdict = _verdict(mode=DeliveryMode.UNIT, unnamed_events=[])
    assert verdict.status is Status.PASS and f"unit {PG0}" in verdict.summary
    assert "imds.delivery unit: every event of the unit" in verdict.summary


def test_imds_unit_on_an_availability_set_vm_passes() -> None:
    verdict = _verdict(configured_unit="as-web", vm_name_set=True, placement_group="", mode=DeliveryMode.UNIT)
    assert verdict.status is Status.PASS
    assert verdict.summary.startswith("unit as-web (imds.unit), imds.delivery unit: every event of the unit")


def test_named_delivery_without_an_event_naming_others_passes() -> None:
    verdict = _verdict(mode=DeliveryMode.NAMED, unnamed_events=[])
    assert verdict.status is Status.PASS and "imds.delivery named: only events naming this VM" in verdict.summary


def test_what_was_not_read_is_said_not_judged() -> None:
    verdict = _verdict(placement_group=None, unnamed_events=None, members_error="no ZooKeeper session")
    assert verdict.status is Status.PASS
    assert "unit unknown (no imds.unit, and the compute metadata was not read: the agent learns placementGroupId " \
        "at start)" in verdict.summary
    assert "no document judged (see the imds check)" in verdict.summary
    assert verdict.summary.endswith("members not read: no ZooKeeper session")


# --- WARN: the configuration against IMDS ---------------------------------------------------------------


def test_imds_unit_other_than_the_placement_group_warns() -> None:
    verdict = _verdict(configured_unit=PG1)
    assert verdict.status is Status.WARN
    assert f"imds.unit is {PG1!r} while IMDS gives this VM placementGroupId {PG0!r}" in verdict.summary
    assert verdict.fix == f"set imds.unit to {PG0!r}, or remove it to use IMDS's placementGroupId"
    # With vm_name set, removing imds.unit would leave the unit unknown: only the first fix is offered.
    assert _verdict(configured_unit=PG1, vm_name_set=True).fix == f"set imds.unit to {PG0!r}"
    # The same unit, or a VM outside a scale set (no placementGroupId to disagree with): nothing to say.
    assert _verdict(configured_unit=PG0).status is Status.PASS
    assert _verdict(configured_unit=PG1, placement_group="").status is Status.PASS


def test_named_delivery_with_an_event_naming_other_vms_and_not_this_one_warns() -> None:
    verdict = _verdict(mode=DeliveryMode.NAMED, unnamed_events=[E1])
    assert verdict.status is Status.WARN
    assert f"imds.delivery is named, but this document lists 1 event(s) naming other VMs and not this one ({E1}): " \
        "IMDS shows this VM every event of its unit" in verdict.summary
    assert verdict.fix == "set imds.delivery to unit (or auto): IMDS delivers unit-wide to this VM"
    many = _verdict(mode=DeliveryMode.NAMED, unnamed_events=[f"E{i}" for i in range(5)])
    assert "(E0, E1, E2 and 2 more)" in many.summary
    unknown = _verdict(mode=DeliveryMode.NAMED, unnamed_events=[E1], placement_group="")
    assert unknown.fix.endswith(", and imds.unit to its availability set")


@pytest.mark.parametrize(("vm_name_set", "placement_group", "fix"), [
    (True, PG0, f"set imds.unit to {PG0!r}"),
    (False, "", "set imds.unit to this VM's availability set (or its scale set's placement group)"),
])
def test_unit_delivery_where_the_agent_cannot_know_its_unit_warns(vm_name_set: bool, placement_group: str,
                                                                  fix: str) -> None:
    verdict = _verdict(mode=DeliveryMode.UNIT, vm_name_set=vm_name_set, placement_group=placement_group)
    assert verdict.status is Status.WARN
    assert "imds.delivery is unit, but the agent does not know its unit: a VM speaks only for events of a unit it " \
        "knows, so unit-wide delivery helps nothing" in verdict.summary
    assert verdict.fix == fix
    if vm_name_set:
        assert f"unit unknown (vm_name is set, so the agent does not read IMDS's placementGroupId {PG0})" \
            in verdict.summary


# --- WARN: the members ----------------------------------------------------------------------------------


def test_members_publishing_different_delivery_modes_warn() -> None:
    members = {"web_0": _member(PG0, "auto"), "web_1": _member(PG0, "named"), "web_2": _member(PG0, None)}
    verdict = _verdict(members=members, me="web_0")
    assert verdict.status is Status.WARN
    assert "the members publish different delivery modes: auto (web_0), named (web_1), none (web_2)" in verdict.summary
    assert verdict.fix == ("set imds.delivery alike on the agents of a unit (IMDS delivers one way in it); upgrade "
                           "the agents that publish none")


def test_members_some_publishing_a_unit_and_others_none_warn() -> None:
    members = {"web_0": _member(PG0), "vm1": _member(None), "vm2": {"version": "1.0", "delivery": "auto"}}
    verdict = _verdict(members=members, me="web_0")
    assert verdict.status is Status.WARN
    assert "1 member(s) publish a unit and 2 none (vm1, vm2): the records these publish carry no unit" \
        in verdict.summary
    assert "no unit (auto): vm1, vm2" in verdict.summary
    assert verdict.fix.startswith("set imds.unit on the agents that publish none")
    # None of them publishing a unit (an availability set without imds.unit): alike, nothing to say.
    alike = _verdict(placement_group="", members={"vm1": _member(None), "vm2": _member(None)}, me="vm1")
    assert alike.status is Status.PASS and "no unit (auto): vm1, vm2" in alike.summary


def test_this_vms_running_agent_publishing_another_delivery_than_the_configuration_warns() -> None:
    members = {"web_0": _member(PG0, "auto"), "web_1": _member(PG0, "auto")}
    verdict = _verdict(configured_unit=PG0, mode=DeliveryMode.UNIT, members={**members, "web_0": _member(PG1, "unit")},
                       me="web_0")
    assert verdict.status is Status.WARN
    assert f"this VM's running agent publishes another delivery than this configuration gives (unit {PG1} against " \
        f"{PG0})" in verdict.summary
    assert verdict.fix.startswith("run coordinator doctor with the running agent's configuration file")
    mode = _verdict(members=members | {"web_0": _member(PG0, "named")}, me="web_0")
    assert "(delivery named against auto)" in mode.summary
    # An agent from before delivery was published says nothing of its own (the members check names its version).
    old = _verdict(members={"web_0": {"version": "0.9"}}, me="web_0")
    assert "running agent" not in old.summary


# --- the check, on what the imds check read -------------------------------------------------------------


def _imds(document: dict[str, Any], compute: dict[str, Any]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=document if request.url.path.endswith("/scheduledevents") else compute)
    return httpx.MockTransport(answer)


def _event(*resources: str) -> dict[str, Any]:
    return {"EventId": E1, "EventType": "Reboot", "EventStatus": "Scheduled", "ResourceType": "VirtualMachine",
            "Resources": list(resources), "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}


def _context(tmp_path: Path, **options: object) -> Context:
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "imds": {"url": "http://imds.test"},
                                        **options})
    return Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 30)


def test_the_check_runs_after_the_members_and_before_arm() -> None:
    names = [check.name for check in CHECKS]
    assert names.index("delivery") == names.index("members") + 1 and names[names.index("delivery") + 1] == "azure"


def test_the_check_judges_the_placement_group_and_document_the_imds_check_read(tmp_path: Path) -> None:
    ctx = _context(tmp_path, imds={"url": "http://imds.test", "delivery": "named"})
    compute = {"name": "web_3", "vmScaleSetName": "web", "placementGroupId": PG0, "resourceId": ""}
    document = {"DocumentIncarnation": 2, "Events": [_event("web_1", "web_2")]}
    assert check_imds(ctx, _imds(document, compute), lambda _: None).status is Status.PASS
    ctx.zookeeper = object()  # type: ignore[assignment]  # never read: the members are given
    ctx.cluster_exists = True
    ctx.members = {"web_3": _member(PG0, "named"), "web_1": _member(PG0, "named")}
    verdict = check_delivery(ctx)
    assert verdict.status is Status.WARN, verdict.summary
    assert verdict.summary.startswith(f"unit {PG0} (IMDS's placementGroupId), imds.delivery named")
    assert f"this document lists 1 event(s) naming other VMs and not this one ({E1})" in verdict.summary
    assert verdict.details["placement_group"] == PG0 and verdict.details["unnamed_events"] == [E1]


def test_the_check_takes_an_event_naming_this_vm_for_no_sign_of_unit_wide_delivery(tmp_path: Path) -> None:
    ctx = _context(tmp_path, vm_name="web_3", imds={"url": "http://imds.test", "delivery": "named"})
    compute = {"name": "web_3", "placementGroupId": "", "resourceId": ""}
    document = {"DocumentIncarnation": 2, "Events": [_event("WEB_3", "web_1")]}  # Azure's names ignore case
    check_imds(ctx, _imds(document, compute), lambda _: None)
    verdict = check_delivery(ctx)
    assert verdict.status is Status.PASS, verdict.summary
    assert verdict.summary.startswith("unit unknown (no imds.unit, and vm_name is set), imds.delivery named: only "
                                      "events naming this VM")
    assert verdict.summary.endswith("members not read: no ZooKeeper session")


def test_the_check_is_skipped_when_neither_imds_nor_the_members_were_read(tmp_path: Path) -> None:
    verdict = check_delivery(_context(tmp_path))
    assert verdict.status is Status.SKIP
    assert verdict.summary == ("not checked: IMDS was not read (see the imds check), nor the members (no ZooKeeper "
                               "session)")
