"""The simulator's pure model: lifecycle, approval, incarnation, serialization, faults, log.

No sockets and no sleeps: time comes from a fake clock that the tests move by hand.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azuresim import (
    MINIMUM_NOTICE,
    InvalidRequest,
    RateLimiter,
    SimulatedGroup,
    UnknownEvent,
    UnknownVm,
    VmInfo,
)
from azuresim.catalogue import DEFAULT_DESCRIPTIONS, DEFAULT_IMPACT_SECONDS, WRONG_TYPE_FIELDS
from azuresim.clock import ScaledClock
from azuresim.faults import mutate_document
from azuresim.replay import parse_replay
from coordinator.errors import MalformedDocument
from coordinator.models import format_not_before, parse_document

SCENARIOS = Path(__file__).resolve().parents[1] / "fixtures" / "imds-scenarios"
T0 = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
# Fake PIDs for the fake signal sender. Linux never hands out a PID above 2**22 (the ceiling of
# pid_max), so none of these can be this process's own, which the simulator refuses to register.
PID_A, PID_B, PID_C, PID_D, PID_E, PID_F, PID_G, PID_H = ((1 << 22) + n for n in range(1, 9))


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def group(clock: FakeClock) -> SimulatedGroup:
    return SimulatedGroup(["vm0", "vm1", "vm2"], clock=clock)


def statuses(group: SimulatedGroup, vm: str = "vm0") -> dict[str, str]:
    return {e["EventId"]: e["EventStatus"] for e in group.document(vm)["Events"]}


def transitions(group: SimulatedGroup) -> list[tuple[str, str | None, str | None, str]]:
    return [(e["event_id"], e["from"], e["to"], e["reason"]) for e in group.log(kind="transition")]


def rfc1123(epoch: float) -> str:
    return format_not_before(datetime.fromtimestamp(epoch, UTC))


# -- lifecycle -------------------------------------------------------------------------------------


def test_new_group_serves_an_empty_document_with_incarnation_1(group: SimulatedGroup) -> None:
    assert group.document("vm0") == {"DocumentIncarnation": 1, "Events": []}


def test_approved_event_goes_scheduled_started_removed(group: SimulatedGroup, clock: FakeClock) -> None:
    event = group.schedule("Freeze", ["vm0"], duration_in_seconds=5)
    eid = event["event_id"]
    doc = group.document("vm0")
    assert doc["DocumentIncarnation"] == 2
    [served] = doc["Events"]
    assert served["EventStatus"] == "Scheduled"
    assert served["NotBefore"] == rfc1123(T0 + 900)
    assert served["DurationInSeconds"] == 5

    assert group.approve("vm0", [eid]) == {eid: "approved"}
    doc = group.document("vm0")
    assert doc["DocumentIncarnation"] == 3
    assert doc["Events"][0]["EventStatus"] == "Started"
    assert doc["Events"][0]["NotBefore"] == ""
    assert doc["Events"][0]["EventId"] == eid

    clock.advance(4.9)
    assert statuses(group) == {eid: "Started"}
    clock.advance(0.1)
    assert group.document("vm0") == {"DocumentIncarnation": 4, "Events": []}
    assert transitions(group) == [
        (eid, None, "Scheduled", "scheduled"),
        (eid, "Scheduled", "Started", "approved"),
        (eid, "Started", None, "started_for_elapsed"),
    ]


def test_event_starts_at_not_before_without_approval(group: SimulatedGroup, clock: FakeClock) -> None:
    eid = group.schedule("Reboot", ["vm1"])["event_id"]
    clock.advance(899.5)
    assert group.tick() == []
    assert statuses(group) == {eid: "Scheduled"}
    clock.advance(1)
    [entry] = group.tick()
    assert (entry["from"], entry["to"], entry["reason"]) == ("Scheduled", "Started", "not_before")
    assert entry["t"] == clock.now
    assert group.event(eid)["approved_by"] == []


@pytest.mark.parametrize(("event_type", "notice"), sorted(MINIMUM_NOTICE.items()))
def test_default_notice_is_the_documented_minimum(
    group: SimulatedGroup, clock: FakeClock, event_type: str, notice: float
) -> None:
    event = group.schedule(event_type, ["vm0"])
    assert event["not_before"] == T0 + notice
    assert group.document("vm0")["Events"][0]["NotBefore"] == rfc1123(T0 + notice)
    assert {"Freeze": 900, "Reboot": 900, "Redeploy": 600, "Preempt": 30, "Terminate": 300}[
        event_type
    ] == notice


def test_not_before_rounds_up_to_the_second_it_announces(clock: FakeClock) -> None:
    clock.now = T0 + 0.25
    group = SimulatedGroup(["vm0"], clock=clock)
    eid = group.schedule("Preempt", ["vm0"], not_before_in=30)["event_id"]
    clock.now = T0 + 30.5
    assert statuses(group) == {eid: "Scheduled"}
    clock.now = T0 + 31
    assert statuses(group) == {eid: "Started"}


def test_approval_by_any_vm_releases_the_event_for_all_its_resources(group: SimulatedGroup) -> None:
    eid = group.schedule("Freeze", ["vm0", "vm1"])["event_id"]
    assert group.approve("vm2", [eid]) == {eid: "approved"}
    for vm in ("vm0", "vm1", "vm2"):
        assert statuses(group, vm) == {eid: "Started"}
    assert group.event(eid)["approved_by"] == ["vm2"]


def test_approval_is_idempotent(group: SimulatedGroup, clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0", "vm1"], clock=clock, approval_delay=10)
    eid = group.schedule("Reboot", ["vm0", "vm1"])["event_id"]
    assert group.approve("vm0", [eid]) == {eid: "approved"}
    incarnation = group.incarnation
    clock.advance(3)
    assert group.approve("vm1", [eid]) == {eid: "already_approved"}
    assert group.approve("vm0", [eid, eid]) == {eid: "already_approved"}
    assert group.incarnation == incarnation
    view = group.event(eid)
    assert view["approved_by"] == ["vm0", "vm1"]
    assert view["approved_at"] == T0
    approvals = group.log(kind="approval")
    assert [(a["vm"], a["accepted"], a["status"]) for a in approvals] == [
        ("vm0", [eid], 200),
        ("vm1", [eid], 200),
        ("vm0", [eid, eid], 200),
    ]
    clock.advance(7)
    assert statuses(group) == {eid: "Started"}
    assert group.approve("vm1", [eid]) == {eid: "already_started"}
    assert group.approval_status({eid: "already_started"}) == 200


def test_approval_delay_holds_the_start(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0"], clock=clock, approval_delay=2.5)
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    group.approve("vm0", [eid])
    clock.advance(2.4)
    assert statuses(group) == {eid: "Scheduled"}
    clock.advance(0.1)
    assert statuses(group) == {eid: "Started"}
    assert transitions(group)[-1][3] == "approved"


def test_not_before_wins_when_it_comes_before_the_approval_delay(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0"], clock=clock, approval_delay=60)
    eid = group.schedule("Preempt", ["vm0"], not_before_in=30)["event_id"]
    group.approve("vm0", [eid])
    clock.advance(45)
    assert statuses(group) == {eid: "Started"}
    assert transitions(group)[-1][3] == "not_before"


def test_unknown_event_id_is_reported_and_answered_as_configured(clock: FakeClock) -> None:
    lenient = SimulatedGroup(["vm0"], clock=clock)
    assert lenient.approve("vm0", ["NOPE"]) == {"NOPE": "unknown"}
    assert lenient.log(kind="approval")[-1]["status"] == 200
    assert lenient.log(kind="approval")[-1]["accepted"] == []

    strict = SimulatedGroup(["vm0"], clock=clock, unknown_approval_status=400)
    eid = strict.schedule("Freeze", ["vm0"])["event_id"]
    results = strict.approve("vm0", [eid, "NOPE"])
    assert results == {eid: "approved", "NOPE": "unknown"}
    assert strict.approval_status(results) == 400
    assert strict.log(kind="approval")[-1]["accepted"] == [eid]


def test_event_ids_are_matched_exactly(group: SimulatedGroup) -> None:
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    assert group.approve("vm0", [eid.lower()]) == {eid.lower(): "unknown"}
    assert statuses(group) == {eid: "Scheduled"}


def test_cancel_removes_a_scheduled_event_without_starting_it(group: SimulatedGroup) -> None:
    eid = group.schedule("Redeploy", ["vm1"])["event_id"]
    removed = group.cancel(eid)
    assert removed["status"] == "Scheduled"
    assert group.document("vm1") == {"DocumentIncarnation": 3, "Events": []}
    assert transitions(group)[-1] == (eid, "Scheduled", None, "cancelled")
    with pytest.raises(UnknownEvent):
        group.cancel(eid)


def test_cancel_of_a_started_event_ends_it_early(group: SimulatedGroup) -> None:
    eid = group.schedule("Reboot", ["vm0"], status="Started")["event_id"]
    group.cancel(eid)
    assert transitions(group)[-1] == (eid, "Started", None, "cancelled")


def test_hardware_failure_appears_directly_started(group: SimulatedGroup, clock: FakeClock) -> None:
    event = group.schedule("Redeploy", ["vm2"], status="Started", started_for=30)
    assert event["not_before"] is None
    assert event["started_at"] == T0
    [served] = group.document("vm0")["Events"]
    assert (served["EventStatus"], served["NotBefore"]) == ("Started", "")
    assert transitions(group) == [(event["event_id"], None, "Started", "scheduled")]
    clock.advance(30)
    assert group.document("vm0")["Events"] == []


def test_started_for_defaults_to_the_longer_of_duration_and_group_default(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0"], clock=clock, started_for=5)
    assert group.schedule("Freeze", ["vm0"], duration_in_seconds=2)["started_for"] == 5
    assert group.schedule("Freeze", ["vm0"], duration_in_seconds=30)["started_for"] == 30
    assert group.schedule("Freeze", ["vm0"], duration_in_seconds=-1)["started_for"] == 5
    assert group.schedule("Freeze", ["vm0"], duration_in_seconds=30, started_for=1)["started_for"] == 1


def test_incarnation_grows_on_every_change_of_the_events_array(
    group: SimulatedGroup, clock: FakeClock
) -> None:
    seen = [group.document("vm0")["DocumentIncarnation"]]

    def changed() -> None:
        seen.append(group.document("vm0")["DocumentIncarnation"])

    a = group.schedule("Freeze", ["vm0"], duration_in_seconds=5)["event_id"]
    changed()
    b = group.schedule("Reboot", ["vm1"])["event_id"]
    changed()
    group.approve("vm1", [a])  # status change
    changed()
    group.document("vm0")  # a read changes nothing
    changed()
    clock.advance(5)  # removal
    changed()
    group.cancel(b)
    changed()
    assert seen == [1, 2, 3, 4, 4, 5, 6]


def test_two_transitions_in_one_tick_raise_the_incarnation_by_two(
    group: SimulatedGroup, clock: FakeClock
) -> None:
    group.schedule("Preempt", ["vm0"], not_before_in=30)
    group.schedule("Preempt", ["vm1"], not_before_in=30)
    clock.advance(30)
    assert [e["incarnation"] for e in group.tick()] == [4, 5]


def test_every_vm_sees_every_event_of_the_group(group: SimulatedGroup) -> None:
    a = group.schedule("Freeze", ["vm0"])["event_id"]
    b = group.schedule("Reboot", ["vm1", "vm2"], status="Started")["event_id"]
    c = group.schedule("Redeploy", ["somebody-else"])["event_id"]
    d = group.schedule("Freeze", [])["event_id"]
    for vm in ("vm0", "vm1", "vm2"):
        assert statuses(group, vm) == {a: "Scheduled", b: "Started", c: "Scheduled", d: "Scheduled"}


def test_several_events_have_independent_lifecycles(group: SimulatedGroup, clock: FakeClock) -> None:
    a = group.schedule("Freeze", ["vm0"], not_before_in=60, duration_in_seconds=5)["event_id"]
    b = group.schedule("Reboot", ["vm1"], not_before_in=120, started_for=10)["event_id"]
    group.approve("vm1", [b])
    assert statuses(group) == {a: "Scheduled", b: "Started"}
    clock.advance(10)
    assert statuses(group) == {a: "Scheduled"}
    clock.advance(50)
    assert statuses(group) == {a: "Started"}
    clock.advance(5)
    assert statuses(group) == {}


def test_vm_names_are_case_insensitive_and_shown_as_given(clock: FakeClock) -> None:
    group = SimulatedGroup(["WestNO_0"], clock=clock)
    eid = group.schedule("Freeze", ["WestNO_0"])["event_id"]
    group.approve("westno_0", [eid])
    assert group.event(eid)["approved_by"] == ["WestNO_0"]
    assert group.compute("WESTNO_0")["name"] == "WestNO_0"
    with pytest.raises(UnknownVm):
        group.document("vm9")


def test_unknown_event_types_are_served_as_they_are(group: SimulatedGroup) -> None:
    event = group.schedule("Hibernate", ["vm0"])
    assert event["not_before"] == T0 + 900
    [served] = group.document("vm0")["Events"]
    assert served["EventType"] == "Hibernate"


# -- serialization ---------------------------------------------------------------------------------

NEWER_FIELDS = {"Description": "2019-04-01", "EventSource": "2019-08-01", "DurationInSeconds": "2020-07-01"}
BASE_FIELDS = {"EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"}


@pytest.mark.parametrize(
    "api_version",
    ["2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"],
)
def test_older_api_versions_omit_newer_fields(group: SimulatedGroup, api_version: str) -> None:
    group.schedule("Freeze", ["vm0"], duration_in_seconds=5)
    [served] = group.document("vm0", api_version)["Events"]
    expected = BASE_FIELDS | {name for name, since in NEWER_FIELDS.items() if api_version >= since}
    assert set(served) == expected


@pytest.mark.parametrize(
    ("api_version", "types"),
    [
        ("2017-08-01", {"Freeze"}),
        ("2017-11-01", {"Freeze", "Preempt"}),
        ("2019-01-01", {"Freeze", "Preempt", "Terminate"}),
        (None, {"Freeze", "Preempt", "Terminate"}),
    ],
)
def test_event_types_newer_than_the_api_version_are_left_out(
    group: SimulatedGroup, api_version: str | None, types: set[str]
) -> None:
    for event_type in ("Freeze", "Preempt", "Terminate"):
        group.schedule(event_type, ["vm0"])
    document = group.document("vm0", api_version)
    assert {e["EventType"] for e in document["Events"]} == types
    assert document["DocumentIncarnation"] == 4


def test_preview_api_version_prefixes_resources_with_an_underscore(group: SimulatedGroup) -> None:
    group.schedule("Reboot", ["vm0", "vm1"])
    assert group.document("vm0", "2017-03-01")["Events"][0]["Resources"] == ["_vm0", "_vm1"]
    assert group.document("vm0", "2017-08-01")["Events"][0]["Resources"] == ["vm0", "vm1"]


@pytest.mark.parametrize("api_version", ["{latest}", "2018-01-01", "latest", ""])
def test_unknown_api_versions_are_refused(group: SimulatedGroup, api_version: str) -> None:
    with pytest.raises(InvalidRequest):
        group.document("vm0", api_version)


def test_defaults_match_real_documents(group: SimulatedGroup) -> None:
    group.schedule("Preempt", ["vm0"])
    [served] = group.document("vm0")["Events"]
    assert served["EventId"] == served["EventId"].upper()
    assert len(served["EventId"]) == 36
    assert served["Description"] == ""
    assert served["EventSource"] == "Platform"
    assert served["DurationInSeconds"] == -1
    assert served["ResourceType"] == "VirtualMachine"


def test_replays_the_documented_live_migration_sequence_exactly() -> None:
    """The published two-VM Freeze example, document for document."""
    expected = json.loads((SCENARIOS / "field" / "docs-live-migration-freeze.sequence.json").read_text())
    not_before = datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC).timestamp()
    clock = FakeClock(not_before - 900)
    group = SimulatedGroup(["WestNO_0", "WestNO_1"], clock=clock)
    served = [group.document("WestNO_0")]
    eid = group.schedule(
        "Freeze",
        ["WestNO_0", "WestNO_1"],
        duration_in_seconds=5,
        event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123",
    )["event_id"]
    served.append(group.document("WestNO_1"))
    group.approve("WestNO_0", [eid])
    served.append(group.document("WestNO_0"))
    clock.advance(5)
    served.append(group.document("WestNO_1"))
    assert served == expected


def test_documents_parse_with_the_agents_model(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"], duration_in_seconds=5)
    group.schedule("Reboot", ["vm1"], status="Started", source="User")
    for api_version in (None, "2017-08-01", "2019-08-01"):
        document = parse_document(json.dumps(group.document("vm0", api_version)))
        assert document.document_incarnation == 3
        assert {e.event_status for e in document.events} == {"Scheduled", "Started"}


def test_compute_metadata_uses_imds_string_fields(clock: FakeClock) -> None:
    group = SimulatedGroup(
        [
            VmInfo("web-0", fault_domain=1, update_domain=3, zone="2"),
            VmInfo("pool_7", scale_set_name="pool", fault_domain=0),
        ],
        clock=clock,
    )
    web = group.compute("web-0")
    assert (web["name"], web["vmScaleSetName"], web["platformFaultDomain"]) == ("web-0", "", "1")
    assert (web["platformUpdateDomain"], web["zone"]) == ("3", "2")
    assert web["resourceId"].endswith("/virtualMachines/web-0")
    pool = group.compute("pool_7")
    assert pool["vmScaleSetName"] == "pool"
    assert pool["resourceId"].endswith("/virtualMachineScaleSets/pool/virtualMachines/7")
    assert web["vmId"] != pool["vmId"]


# -- input validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"event_type": ""},
        {"resources": "vm0"},
        {"resources": [1]},
        {"not_before_in": -1},
        {"not_before_in": float("nan")},
        {"duration_in_seconds": -2},
        {"duration_in_seconds": 1.5},
        {"duration_in_seconds": True},
        {"started_for": -1},
        {"status": "Completed"},
        {"event_id": ""},
        {"event_id": "A\nB"},
        {"source": ""},
    ],
)
def test_schedule_refuses_malformed_input(group: SimulatedGroup, kwargs: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"event_type": "Freeze", "resources": ["vm0"], **kwargs}
    with pytest.raises(InvalidRequest):
        group.schedule(**arguments)
    assert group.incarnation == 1


def test_event_ids_must_be_unique_among_current_events(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"], event_id="E1")
    with pytest.raises(InvalidRequest, match="already exists"):
        group.schedule("Freeze", ["vm0"], event_id="E1")


def test_group_refuses_duplicate_or_missing_vms(clock: FakeClock) -> None:
    with pytest.raises(InvalidRequest):
        SimulatedGroup([], clock=clock)
    with pytest.raises(InvalidRequest):
        SimulatedGroup(["vm0", "VM0"], clock=clock)


# -- faults ----------------------------------------------------------------------------------------


def test_faults_are_served_in_order_then_run_out(group: SimulatedGroup) -> None:
    group.add_fault("status", vm="vm0", count=2, status=500)
    group.add_fault("drop", vm="vm0")
    served = [group.take_fault("vm0", "GET") for _ in range(4)]
    assert [(f.kind, f.status) if f else None for f in served] == [
        ("status", 500),
        ("status", 500),
        ("drop", None),
        None,
    ]
    assert group.take_fault("vm1", "GET") is None
    entries = group.log(kind="fault")
    assert [(e["vm"], e["fault"], e["remaining"]) for e in entries] == [
        ("vm0", "status", 1),
        ("vm0", "status", 0),
        ("vm0", "drop", 0),
    ]


def test_fault_for_all_vms_queues_one_copy_per_vm(group: SimulatedGroup) -> None:
    queued = group.add_fault("malformed", count=1)
    assert [f["vm"] for f in queued] == ["vm0", "vm1", "vm2"]
    for vm in ("vm0", "vm1", "vm2"):
        fault = group.take_fault(vm, "GET")
        assert fault is not None and fault.kind == "malformed"


def test_faults_apply_to_post_only_when_asked(group: SimulatedGroup) -> None:
    group.add_fault("status", vm="vm0", status=503)
    assert group.take_fault("vm0", "POST") is None
    group.clear_faults()
    group.add_fault("status", vm="vm0", status=503, methods=["GET", "POST"])
    assert group.take_fault("vm0", "POST") is not None


def test_unlimited_fault_lasts_until_cleared(group: SimulatedGroup) -> None:
    group.add_fault("delay", vm="vm1", count=None, seconds=0.5)
    for _ in range(20):
        fault = group.take_fault("vm1", "GET")
        assert fault is not None and fault.seconds == 0.5
    assert group.faults()[0]["remaining"] is None
    assert group.clear_faults("vm1") == 1
    assert group.take_fault("vm1", "GET") is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "explode"},
        {"kind": "status"},
        {"kind": "status", "status": 200},
        {"kind": "delay"},
        {"kind": "delay", "seconds": -1},
        {"kind": "drop", "seconds": 1},
        {"kind": "drop", "count": 0},
        {"kind": "drop", "methods": ["PUT"]},
        {"kind": "drop", "methods": []},
        {"kind": "body"},
        {"kind": "body", "body": "not base64!"},
        {"kind": "body", "body": "", "status": 199},
        {"kind": "body", "body": "e30=", "repeat": 0},
        {"kind": "body", "body": "e30=", "repeat": 9 * 1024 * 1024},
        {"kind": "body", "body": "e30=", "headers": {"X-A": "b\r\nX-Injected: 1"}},
        {"kind": "body", "body": "e30=", "headers": {"Bad Name": "x"}},
        {"kind": "body", "body": "e30=", "content_length": -1},
        {"kind": "drop", "body": "e30="},
        {"kind": "status", "status": 500, "content_type": "text/plain"},
    ],
)
def test_malformed_faults_are_refused(group: SimulatedGroup, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        group.add_fault(**kwargs)
    assert group.faults() == []


def test_body_fault_serves_its_exact_bytes_repeated_with_its_headers(group: SimulatedGroup) -> None:
    queued = group.add_fault(
        "body", vm="vm0", count=None, body=base64.b64encode(b"[\x00").decode(), repeat=3, status=200,
        content_type="", headers={"Content-Encoding": "gzip"}, content_length=100,
    )
    assert queued[0]["body_bytes"] == 6 and queued[0]["content_length"] == 100
    for _ in range(2):
        fault = group.take_fault("vm0", "GET")
        assert fault is not None and fault.kind == "body"
        assert fault.body == b"[\x00[\x00[\x00"
        assert fault.content_type == "" and fault.headers == (("Content-Encoding", "gzip"),)
    assert group.clear_faults("vm0") == 1


def test_fault_for_an_unknown_vm_is_refused(group: SimulatedGroup) -> None:
    with pytest.raises(UnknownVm):
        group.add_fault("drop", vm="vm9")


# -- rate limiter ----------------------------------------------------------------------------------


def test_rate_limiter_admits_five_per_sliding_second() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter(5, clock=clock)
    assert [limiter.admit() for _ in range(6)] == [True] * 5 + [False]
    clock.advance(0.5)
    assert limiter.admit() is False  # refused requests do not count, admitted ones still do
    clock.advance(0.5)
    assert [limiter.admit() for _ in range(6)] == [True] * 5 + [False]


def test_rate_limiter_window_slides() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter(5, clock=clock)
    for _ in range(5):
        assert limiter.admit()
        clock.advance(0.3)
    # At t=101.5 the admissions of t=100.0 and t=100.3 have left the window; three remain.
    assert [limiter.admit() for _ in range(3)] == [True, True, False]


def test_rate_limit_zero_disables_the_limiter() -> None:
    limiter = RateLimiter(0, clock=FakeClock())
    assert all(limiter.admit() for _ in range(100))


# -- log -------------------------------------------------------------------------------------------


def test_log_entries_are_ordered_timestamped_and_json(group: SimulatedGroup, clock: FakeClock) -> None:
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    clock.advance(1)
    group.record("request", vm="vm0", method="GET", path="/metadata/scheduledevents", query="", status=200)
    clock.advance(1)
    group.approve("vm1", [eid])
    entries = group.log()
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert [e["kind"] for e in entries] == ["transition", "request", "approval", "transition", "impact"]
    assert [e["t"] for e in entries] == [T0, T0 + 1, T0 + 2, T0 + 2, T0 + 2]
    assert [e["sim_t"] for e in entries] == [e["t"] for e in entries]  # one clock: the same time
    assert json.loads(json.dumps(entries)) == entries
    assert group.log(since=2) == entries[2:]
    assert group.log(since=2, kind="transition") == entries[3:4]
    assert group.log(since=99) == []
    assert group.last_seq == 5


def test_log_entries_cannot_be_changed_through_returned_copies(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"])
    group.log()[0]["kind"] = "tampered"
    assert group.log()[0]["kind"] == "transition"


def test_on_record_sees_every_entry(clock: FakeClock) -> None:
    seen: list[dict[str, Any]] = []
    group = SimulatedGroup(["vm0"], clock=clock, on_record=seen.append)
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    group.approve("vm0", [eid])
    assert [e["seq"] for e in seen] == [1, 2, 3, 4]
    assert [e["kind"] for e in seen] == ["transition", "approval", "transition", "impact"]


# -- properties ------------------------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("schedule"),
            st.sampled_from(["Freeze", "Reboot", "Preempt", "Terminate", "Redeploy"]),
            st.sampled_from(["Scheduled", "Started"]),
            st.floats(min_value=0, max_value=60),
        ),
        st.tuples(st.just("approve"), st.sampled_from(["vm0", "vm1"]), st.integers(0, 5)),
        st.tuples(st.just("cancel"), st.integers(0, 5)),
        st.tuples(st.just("advance"), st.floats(min_value=0, max_value=40)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_any_sequence_keeps_the_invariants(ops: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    group = SimulatedGroup(["vm0", "vm1"], clock=clock, approval_delay=1, started_for=3)
    ids: list[str] = []
    last_incarnation = 1
    for op in ops:
        if op[0] == "schedule":
            ids.append(group.schedule(op[1], ["vm0"], status=op[2], not_before_in=op[3])["event_id"])
        elif op[0] == "approve" and ids:
            group.approve(op[1], [ids[op[2] % len(ids)]])
        elif op[0] == "cancel" and ids:
            with contextlib.suppress(UnknownEvent):
                group.cancel(ids[op[1] % len(ids)])
        elif op[0] == "advance":
            clock.advance(op[1])
        document = parse_document(json.dumps(group.document("vm1")))
        assert document.document_incarnation >= last_incarnation
        last_incarnation = document.document_incarnation
        for event in document.events:
            assert (event.not_before is None) == event.is_started
    entries = group.log()
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert group.incarnation == 1 + len(group.log(kind="transition"))
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(entries))


# -- time scale ------------------------------------------------------------------------------------


class FakeSignals:
    """Records signals instead of sending them; ``dead`` PIDs raise ProcessLookupError."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []
        self.dead: set[int] = set()

    def __call__(self, pid: int, signum: int) -> None:
        if pid in self.dead:
            raise ProcessLookupError(pid)
        self.sent.append((pid, signal.Signals(signum).name))


@pytest.fixture
def signals() -> FakeSignals:
    return FakeSignals()


def test_scaled_clock_runs_faster_from_its_start() -> None:
    real = FakeClock(50.0)
    scaled = ScaledClock(60, start=T0, monotonic=real)
    assert scaled() == T0
    real.advance(1.5)
    assert scaled() == T0 + 90
    assert scaled.real_seconds(900) == 15
    with pytest.raises(InvalidRequest):
        ScaledClock(0)


def test_time_scale_keeps_not_before_in_the_simulated_clock() -> None:
    """A 15-minute notice lasts 15 real seconds at scale 60; NotBefore is shown in simulated time."""
    real = FakeClock(50.0)
    wall = FakeClock(T0)
    scaled = ScaledClock(60, start=T0, monotonic=real)
    group = SimulatedGroup(["vm0"], clock=scaled, wall_clock=wall, time_scale=60)
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    assert group.document("vm0")["Events"][0]["NotBefore"] == rfc1123(T0 + 900)
    assert group.real_seconds(900) == 15
    real.advance(14.9)
    wall.advance(14.9)
    assert statuses(group) == {eid: "Scheduled"}
    real.advance(0.1)
    wall.advance(0.1)
    assert statuses(group) == {eid: "Started"}
    started = group.log(kind="transition")[-1]
    assert started["reason"] == "not_before"
    assert started["sim_t"] == pytest.approx(T0 + 900)
    assert started["t"] == pytest.approx(T0 + 15)  # the wall clock, comparable with other observers


def test_not_before_can_be_rendered_in_real_time_for_clients_that_compare_it() -> None:
    real = FakeClock(50.0)
    wall = FakeClock(T0)
    group = SimulatedGroup(
        ["vm0"],
        clock=ScaledClock(60, start=T0, monotonic=real),
        wall_clock=wall,
        time_scale=60,
        not_before_clock="real",
    )
    real.advance(10)
    wall.advance(10)  # the simulated clock is now 600 s ahead of the wall clock
    event = group.schedule("Freeze", ["vm0"])
    assert event["not_before"] == T0 + 600 + 900  # the model keeps simulated time
    assert event["not_before_text"] == rfc1123(T0 + 10 + 15)  # served: when it will really start
    assert group.document("vm0")["Events"][0]["NotBefore"] == rfc1123(T0 + 10 + 15)
    with pytest.raises(InvalidRequest):
        SimulatedGroup(["vm0"], not_before_clock="lunar")


def test_terminate_notice_is_configurable_within_five_to_fifteen_minutes(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0"], clock=clock, terminate_notice=600)
    assert group.schedule("Terminate", ["vm0"])["not_before"] == T0 + 600
    for notice in (299, 901):
        with pytest.raises(InvalidRequest, match="terminate_notice"):
            SimulatedGroup(["vm0"], clock=clock, terminate_notice=notice)


def test_events_can_share_one_not_before(group: SimulatedGroup, clock: FakeClock) -> None:
    a = group.schedule("Terminate", ["vm0"], not_before_at=T0 + 300.2)
    clock.advance(0.7)
    b = group.schedule("Terminate", ["vm1"], not_before_at=a["not_before"])
    assert a["not_before"] == b["not_before"] == T0 + 301
    with pytest.raises(InvalidRequest, match="not both"):
        group.schedule("Terminate", ["vm0"], not_before_in=5, not_before_at=T0 + 300)


def test_predicted_hardware_failure_can_be_announced_days_ahead(group: SimulatedGroup) -> None:
    event = group.schedule("Redeploy", ["vm0"], not_before_in=7 * 86400)
    assert group.document("vm0")["Events"][0]["NotBefore"] == rfc1123(T0 + 7 * 86400)
    assert event["status"] == "Scheduled"


def test_served_formats_match_real_documents(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"], duration_in_seconds=5)
    started = group.schedule("Reboot", ["vm1"], status="Started")
    events = {e["EventStatus"]: e for e in group.document("vm0")["Events"]}
    guid = re.compile(r"[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}")
    assert all(guid.fullmatch(e["EventId"]) for e in events.values())
    rfc = re.compile(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT")
    assert rfc.fullmatch(events["Scheduled"]["NotBefore"])
    assert events["Started"]["NotBefore"] == ""
    assert events["Started"]["EventId"] == started["event_id"]


# -- impacts on the VMs ----------------------------------------------------------------------------


def impact_group(clock: FakeClock, signals: FakeSignals, **options: Any) -> SimulatedGroup:
    group = SimulatedGroup(["vm0", "vm1", "vm2"], clock=clock, signal_sender=signals, **options)
    group.register_pids("vm0", [PID_A, PID_B])
    group.register_pids("vm1", [PID_C])
    return group


def test_freeze_pauses_the_registered_pids_of_the_named_vms_for_its_duration(
    clock: FakeClock, signals: FakeSignals
) -> None:
    group = impact_group(clock, signals)
    eid = group.schedule("Freeze", ["vm0"], duration_in_seconds=5, started_for=30)["event_id"]
    assert signals.sent == []  # nothing happens while Scheduled
    group.approve("vm0", [eid])
    assert signals.sent == [(PID_A, "SIGSTOP"), (PID_B, "SIGSTOP")]  # vm1's PID is not touched
    [impact] = group.log(kind="impact")
    assert (impact["impact"], impact["seconds"], impact["vms"], impact["reason"]) == ("freeze", 5.0, ["vm0"], "started")
    clock.advance(4.9)
    group.tick()
    assert len(signals.sent) == 2
    assert set(group.paused()) == {PID_A, PID_B}
    clock.advance(0.1)
    group.tick()
    assert signals.sent[2:] == [(PID_A, "SIGCONT"), (PID_B, "SIGCONT")]
    assert group.paused() == {}
    entries = group.log(kind="signal")
    assert [(e["vm"], e["pid"], e["signal"], e["reason"], e["result"]) for e in entries] == [
        ("vm0", PID_A, "SIGSTOP", "freeze", "sent"),
        ("vm0", PID_B, "SIGSTOP", "freeze", "sent"),
        ("vm0", PID_A, "SIGCONT", "impact_over", "sent"),
        ("vm0", PID_B, "SIGCONT", "impact_over", "sent"),
    ]
    assert statuses(group) == {eid: "Started"}  # the pause ended; the event is still there


def test_freeze_impact_is_scaled_with_the_clock(signals: FakeSignals) -> None:
    real = FakeClock(0.0)
    group = SimulatedGroup(["vm0"], clock=ScaledClock(10, start=T0, monotonic=real), time_scale=10,
                           signal_sender=signals)
    group.register_pids("vm0", [PID_D])
    group.schedule("Freeze", ["vm0"], duration_in_seconds=30, status="Started")
    real.advance(2.9)
    group.tick()
    assert signals.sent == [(PID_D, "SIGSTOP")]
    real.advance(0.1)
    group.tick()
    assert signals.sent == [(PID_D, "SIGSTOP"), (PID_D, "SIGCONT")]


def test_reboot_kills_the_registered_pids_and_forgets_them(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    eid = group.schedule("Reboot", ["vm1", "vm9"])["event_id"]
    group.approve("vm1", [eid])
    assert signals.sent == [(PID_C, "SIGKILL")]
    assert group.pids("vm1") == []  # a killed PID may be reused: never signalled again
    assert group.pids("vm0") == [PID_A, PID_B]


@pytest.mark.parametrize("event_type", ["Redeploy", "Preempt", "Terminate"])
def test_other_disruptive_types_kill_too(clock: FakeClock, signals: FakeSignals, event_type: str) -> None:
    group = impact_group(clock, signals)
    group.schedule(event_type, ["vm1"], status="Started")
    assert signals.sent == [(PID_C, "SIGKILL")]


def test_hardware_failure_hits_at_once(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    group.schedule("Reboot", ["vm0"], status="Started")
    assert signals.sent == [(PID_A, "SIGKILL"), (PID_B, "SIGKILL")]
    assert group.log(kind="impact")[0]["reason"] == "started"


def test_reboot_that_turns_out_to_be_a_freeze(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    eid = group.schedule("Reboot", ["vm1"], impact="freeze", impact_seconds=3)["event_id"]
    group.approve("vm1", [eid])
    [served] = group.document("vm1")["Events"]
    assert (served["EventType"], served["EventStatus"]) == ("Reboot", "Started")
    assert signals.sent == [(PID_C, "SIGSTOP")]
    clock.advance(3)
    group.tick()
    assert signals.sent == [(PID_C, "SIGSTOP"), (PID_C, "SIGCONT")]
    assert group.pids("vm1") == [PID_C]


def test_freeze_of_zero_seconds_and_impact_none_signal_nothing(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    group.schedule("Freeze", ["vm0"], duration_in_seconds=0, status="Started")
    group.schedule("Reboot", ["vm1"], impact="none", status="Started")
    assert signals.sent == []
    assert [e["impact"] for e in group.log(kind="impact")] == ["freeze", "none"]


def test_unknown_duration_freezes_for_the_typical_impact(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    event = group.schedule("Freeze", ["vm1"], status="Started")
    assert event["impact_seconds"] == DEFAULT_IMPACT_SECONDS == 7
    clock.advance(7)
    group.tick()
    assert signals.sent == [(PID_C, "SIGSTOP"), (PID_C, "SIGCONT")]


def test_second_impact_while_started_keeps_the_event_and_may_pause_again(
    clock: FakeClock, signals: FakeSignals
) -> None:
    group = impact_group(clock, signals)
    eid = group.schedule("Freeze", ["vm1"], duration_in_seconds=2, started_for=60)["event_id"]
    with pytest.raises(InvalidRequest, match="Started"):
        group.impact(eid)
    group.approve("vm1", [eid])
    clock.advance(2)
    group.tick()
    incarnation = group.incarnation
    logged = group.impact(eid)  # logged only
    assert (logged["reason"], logged["impact"]) == ("second", "none")
    assert signals.sent == [(PID_C, "SIGSTOP"), (PID_C, "SIGCONT")]
    group.impact(eid, seconds=1, pause=True)
    assert signals.sent[-1] == (PID_C, "SIGSTOP")
    clock.advance(1)
    group.tick()
    assert signals.sent[-1] == (PID_C, "SIGCONT")
    assert statuses(group) == {eid: "Started"}
    assert group.incarnation == incarnation  # the Events array did not change
    with pytest.raises(UnknownEvent):
        group.impact("NOPE")


def test_overlapping_pauses_continue_once_at_the_later_end(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    a = group.schedule("Freeze", ["vm1"], duration_in_seconds=5, status="Started", started_for=60)["event_id"]
    clock.advance(1)
    group.impact(a, seconds=10, pause=True)
    clock.advance(5)
    group.tick()
    assert signals.sent == [(PID_C, "SIGSTOP")]
    clock.advance(6)
    group.tick()
    assert signals.sent == [(PID_C, "SIGSTOP"), (PID_C, "SIGCONT")]


def test_a_vanished_process_is_reported_and_forgotten(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    signals.dead.add(PID_B)
    group.schedule("Freeze", ["vm0"], duration_in_seconds=5, status="Started")
    results = {(e["pid"], e["result"]) for e in group.log(kind="signal")}
    assert results == {(PID_A, "sent"), (PID_B, "no such process")}
    assert group.pids("vm0") == [PID_A]
    assert set(group.paused()) == {PID_A}


def test_release_paused_continues_everything_it_paused(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals)
    group.schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=60, status="Started")
    assert group.release_paused() == 3
    assert [s for _, s in signals.sent] == ["SIGSTOP"] * 3 + ["SIGCONT"] * 3
    assert group.paused() == {}


@pytest.mark.parametrize("pids", [[1], [0], [-5], ["123"], [True], "123", [os.getpid()]])
def test_only_plausible_foreign_pids_can_be_registered(group: SimulatedGroup, pids: Any) -> None:
    with pytest.raises(InvalidRequest):
        group.register_pids("vm0", pids)
    assert group.pids("vm0") == []


def test_registering_replaces_the_pids_of_a_vm(group: SimulatedGroup) -> None:
    group.register_pids("vm0", [PID_F, PID_F, PID_G])
    assert group.register_pids("VM0", [PID_H]) == {"vm": "vm0", "pids": [PID_H]}
    assert [e["pids"] for e in group.log(kind="pids")] == [[PID_F, PID_G], [PID_H]]
    with pytest.raises(UnknownVm):
        group.register_pids("vm9", [PID_F])


# -- Terminate batch rule --------------------------------------------------------------------------


def test_approved_terminate_waits_while_another_delete_is_pending(group: SimulatedGroup, clock: FakeClock) -> None:
    a = group.schedule("Terminate", ["vm0"])["event_id"]
    b = group.schedule("Terminate", ["vm1"], not_before_at=T0 + 300)["event_id"]
    group.approve("vm0", [a])
    assert statuses(group) == {a: "Scheduled", b: "Scheduled"}
    [hold] = group.log(kind="hold")
    assert (hold["event_id"], hold["held_by"], hold["rule"]) == (a, [b], "terminate_pending")
    assert group.event(a)["held_by"] == [b]
    clock.advance(10)
    group.approve("vm1", [b])
    assert statuses(group) == {a: "Started", b: "Started"}
    started = [e for e in group.log(kind="transition") if e["to"] == "Started"]
    assert [(e["event_id"], e["reason"], e["t"]) for e in started] == [
        (a, "approved", T0 + 10),
        (b, "approved", T0 + 10),
    ]
    assert len(group.log(kind="hold")) == 1


def test_deletes_sharing_a_not_before_start_together_at_not_before(group: SimulatedGroup, clock: FakeClock) -> None:
    a = group.schedule("Terminate", ["vm0"], not_before_in=300)["event_id"]
    b = group.schedule("Terminate", ["vm1"], not_before_in=300)["event_id"]
    group.approve("vm0", [a])
    clock.advance(299)
    assert statuses(group) == {a: "Scheduled", b: "Scheduled"}
    clock.advance(1)
    assert statuses(group) == {a: "Started", b: "Started"}
    assert {e["reason"] for e in group.log(kind="transition") if e["to"] == "Started"} == {"not_before"}


def test_cancelled_delete_releases_the_held_one(group: SimulatedGroup) -> None:
    a = group.schedule("Terminate", ["vm0"])["event_id"]
    b = group.schedule("Terminate", ["vm1"])["event_id"]
    group.approve("vm0", [a])
    group.cancel(b)
    assert statuses(group) == {a: "Started"}


def test_the_batch_rule_concerns_deletes_only(group: SimulatedGroup) -> None:
    group.schedule("Terminate", ["vm1"])
    freeze = group.schedule("Freeze", ["vm0"])["event_id"]
    group.approve("vm0", [freeze])
    assert group.event(freeze)["status"] == "Started"
    assert group.log(kind="hold") == []


# -- back-to-back events across fault domains ------------------------------------------------------


def test_rollout_schedules_one_event_per_fault_domain_each_after_the_previous(clock: FakeClock) -> None:
    infos = [VmInfo("vm0", fault_domain=0), VmInfo("vm1", fault_domain=1), VmInfo("vm2", fault_domain=0)]
    group = SimulatedGroup(infos, clock=clock, started_for=5)
    rollout = group.rollout("Freeze", duration_in_seconds=2, not_before_in=600)
    assert rollout["groups"] == [["vm0", "vm2"], ["vm1"]]
    first = rollout["event"]
    assert (first["resources"], first["not_before"], first["rollout"]) == (["vm0", "vm2"], T0 + 600, 1)
    group.approve("vm0", [first["event_id"]])
    clock.advance(4.9)
    assert [e["resources"] for e in group.events()["events"]] == [["vm0", "vm2"]]
    clock.advance(0.1)
    [second] = group.events()["events"]  # created as soon as the first is gone
    assert second["resources"] == ["vm1"]
    assert second["not_before"] == T0 + 5 + 600
    assert second["created_at"] == T0 + 5
    clock.advance(600)
    group.tick()
    clock.advance(5)
    assert group.events()["events"] == []
    assert group.rollouts()[0]["done"] is True
    kinds = [(e["resources"], e["from"], e["to"]) for e in group.log(kind="transition")]
    assert kinds == [
        (["vm0", "vm2"], None, "Scheduled"),
        (["vm0", "vm2"], "Scheduled", "Started"),
        (["vm0", "vm2"], "Started", None),
        (["vm1"], None, "Scheduled"),
        (["vm1"], "Scheduled", "Started"),
        (["vm1"], "Started", None),
    ]


def test_rollout_groups_gap_and_cancellation(group: SimulatedGroup, clock: FakeClock) -> None:
    rollout = group.rollout("Reboot", groups=[["vm2"], ["vm0", "vm1"]], gap=30)
    group.cancel(rollout["event"]["event_id"])  # a cancelled step is followed too
    clock.advance(29)
    assert group.events()["events"] == []
    clock.advance(1)
    [second] = group.events()["events"]
    assert second["resources"] == ["vm0", "vm1"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"groups": []},
        {"groups": [[]]},
        {"groups": "vm0"},
        {"resources": ["vm0"]},
        {"event_id": "X"},
        {"gap": -1},
        {"duration_in_seconds": "5"},
    ],
)
def test_rollout_refuses_malformed_input(group: SimulatedGroup, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        group.rollout("Freeze", **kwargs)
    assert group.incarnation == 1


# -- who sees what ---------------------------------------------------------------------------------


def test_gpu_events_are_delivered_to_the_named_vms_only(group: SimulatedGroup) -> None:
    own = group.schedule("Freeze", ["VM1"], deliver_to_named_only=True)["event_id"]
    shared = group.schedule("Freeze", ["vm2"])["event_id"]
    assert statuses(group, "vm1") == {own: "Scheduled", shared: "Scheduled"}
    assert statuses(group, "vm0") == {shared: "Scheduled"}
    assert statuses(group, "vm2") == {shared: "Scheduled"}


def test_user_initiated_events_wait_for_approval_like_platform_ones(group: SimulatedGroup, clock: FakeClock) -> None:
    eid = group.schedule("Reboot", ["vm0"], source="User")["event_id"]
    [served] = group.document("vm0")["Events"]
    assert served["EventSource"] == "User"
    assert served["Description"] == DEFAULT_DESCRIPTIONS["Reboot"]
    clock.advance(100)
    assert statuses(group) == {eid: "Scheduled"}
    group.approve("vm0", [eid])
    assert statuses(group) == {eid: "Started"}


def test_one_document_holds_several_events_with_several_resources(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0", "vm1"])
    group.schedule("Redeploy", ["vm2"])
    document = parse_document(json.dumps(group.document("vm2")))
    assert [e.resources for e in document.events] == [("vm0", "vm1"), ("vm2",)]


# -- the service of a VM: first call, idle reset, incarnation --------------------------------------


def test_first_request_enables_the_service_and_is_held(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0", "vm1"], clock=clock, first_call_delay=120)
    assert group.begin_request("vm0") == 120
    assert group.begin_request("vm0") == 0
    assert group.begin_request("vm1") == 120  # per VM
    assert [(e["vm"], e["action"], e["delay"]) for e in group.log(kind="service")] == [
        ("vm0", "enabled", 120),
        ("vm1", "enabled", 120),
    ]


def test_idle_service_switches_off_and_restarts_the_incarnation_low(clock: FakeClock) -> None:
    group = SimulatedGroup(["vm0", "vm1"], clock=clock, idle_reset_after=86400, first_call_delay=60)
    eid = group.schedule("Freeze", ["vm0"], not_before_in=7 * 86400)["event_id"]
    group.schedule("Freeze", ["vm1"], not_before_in=7 * 86400)
    assert group.begin_request("vm0") == 60
    group.begin_request("vm1")
    assert group.document("vm0")["DocumentIncarnation"] == 3
    clock.advance(86399)
    assert group.begin_request("vm1") == 0  # vm1 keeps polling
    clock.advance(60 + 1)
    assert group.begin_request("vm0") == 60  # enabled again, slow again
    document = group.document("vm0")
    assert document["DocumentIncarnation"] == 1
    assert [e["EventId"] for e in document["Events"]] == [eid, document["Events"][1]["EventId"]]  # same events
    assert group.document("vm1")["DocumentIncarnation"] == 3
    [reset] = [e for e in group.log(kind="service") if e["action"] == "reset"]
    assert (reset["vm"], reset["served_incarnation"]) == ("vm0", 1)
    group.cancel(eid)
    assert group.document("vm0")["DocumentIncarnation"] == 2  # grows from there
    assert group.incarnation == 4  # the group's own counter is untouched


def test_skipped_and_reset_incarnations(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"])
    assert group.document("vm1")["DocumentIncarnation"] == 2
    [entry] = group.skip_incarnation("vm1", by=2)
    assert (entry["action"], entry["served"]) == ("skip", 4)
    assert group.document("vm1")["DocumentIncarnation"] == 4
    assert group.document("vm0")["DocumentIncarnation"] == 2
    entries = group.reset_incarnation()
    assert [e["served"] for e in entries] == [1, 1, 1]
    assert {group.served_incarnation(vm) for vm in ("vm0", "vm1", "vm2")} == {1}
    with pytest.raises(InvalidRequest):
        group.skip_incarnation("vm0", by=0)


# -- more faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", WRONG_TYPE_FIELDS)
def test_wrong_type_documents_are_refused_by_the_agents_model(group: SimulatedGroup, field: str) -> None:
    group.schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=5)
    document = group.document("vm0")
    mutated = mutate_document(document, field)
    assert mutated != document
    assert parse_document(json.dumps(document)).events  # the original is fine
    if field == "NotBefore":
        # Refused field by field: the event stays visible, without a time, and is never approved early.
        [event] = parse_document(json.dumps(mutated)).events
        assert event.not_before is None and event.not_before_error
        return
    with pytest.raises(MalformedDocument):
        parse_document(json.dumps(mutated))


def test_wrong_type_fault_is_queued_with_its_field(group: SimulatedGroup) -> None:
    [queued] = group.add_fault("wrong_type", vm="vm0", field="Resources")
    assert queued["field"] == "Resources"
    assert group.add_fault("wrong_type", vm="vm1")[0]["field"] == "DocumentIncarnation"
    fault = group.take_fault("vm0", "GET")
    assert fault is not None and fault.field == "Resources"
    assert group.log(kind="fault")[-1]["field"] == "Resources"
    with pytest.raises(InvalidRequest):
        group.add_fault("wrong_type", field="Description")
    with pytest.raises(InvalidRequest):
        group.add_fault("status", status=500, field="Events")


def test_refuse_happens_at_once_through_the_handler(group: SimulatedGroup) -> None:
    refused: list[tuple[str, float]] = []
    group.set_refuse_handler(lambda vm, seconds: refused.append((vm, seconds)))
    views = group.add_fault("refuse", vm="vm1", seconds=2)
    assert refused == [("vm1", 2.0)]
    assert views[0]["remaining"] == 0
    assert group.faults() == []  # not queued
    assert group.log(kind="fault")[-1]["fault"] == "refuse"
    group.add_fault("refuse", seconds=1)
    assert [vm for vm, _ in refused[1:]] == ["vm0", "vm1", "vm2"]
    with pytest.raises(InvalidRequest):
        group.add_fault("refuse", vm="vm0")


# -- replay ----------------------------------------------------------------------------------------


def test_parse_replay_recognises_sequences_documents_and_timelines() -> None:
    sequence = (SCENARIOS / "field" / "docs-live-migration-freeze.sequence.json").read_text()
    kind, items = parse_replay(sequence)
    assert (kind, len(items)) == ("documents", 4)
    single = (SCENARIOS / "azure-scheduledevents-manager" / "events.json").read_text()
    kind, items = parse_replay(single)
    assert (kind, len(items), items[0]["DocumentIncarnation"]) == ("documents", 1, 5)
    timeline = "- at: 0\n  schedule: {event_type: Freeze, resources: [vm0]}\n- at: 5\n  cancel: E1\n"
    kind, items = parse_replay(timeline)
    assert (kind, [s["at"] for s in items]) == ("timeline", [0, 5])
    for bad in ("[]", "{}", "not: [valid", '[{"at": 1, "cancel": "X"}, {"DocumentIncarnation": 1}]', '"text"'):
        with pytest.raises(InvalidRequest):
            parse_replay(bad)


@pytest.mark.parametrize(
    "step",
    [
        {"at": -1, "cancel": "X"},
        {"at": 1},
        {"at": 1, "cancel": "X", "schedule": {}},
        {"at": 1, "explode": {}},
        {"at": 1, "schedule": {"event_type": "Freeze"}},
        {"at": 1, "schedule": {"event_type": "Freeze", "resources": [], "when": 3}},
        {"at": 1, "cancel": 5},
        {"at": 1, "fault": {"status": 500}},
    ],
)
def test_malformed_timeline_steps_are_refused(group: SimulatedGroup, step: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        group.load_timeline([step])


def test_replayed_documents_are_served_verbatim_and_approvals_logged(group: SimulatedGroup) -> None:
    documents = json.loads((SCENARIOS / "field" / "docs-live-migration-freeze.sequence.json").read_text())
    view = group.load_documents(documents)
    assert (view["index"], view["count"], view["at_end"]) == (0, 4, False)
    assert group.document("vm0") == documents[0]
    group.replay_next()
    assert group.document("vm2", "2017-08-01") == documents[1]  # as recorded, whatever the version
    eid = documents[1]["Events"][0]["EventId"]
    assert group.approve("vm1", [eid, "OTHER"]) == {eid: "approved", "OTHER": "unknown"}
    assert group.approve("vm0", [eid]) == {eid: "already_approved"}
    assert group.document("vm0") == documents[1]  # a recording: approval changes nothing
    group.replay_next()
    assert group.approve("vm0", [eid]) == {eid: "already_started"}
    group.replay_next()
    assert group.replay_next()["index"] == 3  # stays on the last document
    assert [e["index"] for e in group.log(kind="replay")] == [0, 1, 2, 3]
    assert [e["vm"] for e in group.log(kind="approval")] == ["vm1", "vm0", "vm0"]
    with pytest.raises(InvalidRequest, match="replaying"):
        group.schedule("Freeze", ["vm0"])
    with pytest.raises(InvalidRequest, match="replaying"):
        group.reset_incarnation()


def test_replay_advances_on_its_own_every_interval(group: SimulatedGroup, clock: FakeClock) -> None:
    documents = [{"DocumentIncarnation": n, "Events": []} for n in (5, 6, 9)]
    group.load_documents(documents, interval=10)
    clock.advance(9.9)
    assert group.document("vm0")["DocumentIncarnation"] == 5
    clock.advance(0.1)
    assert group.document("vm0")["DocumentIncarnation"] == 6
    clock.advance(100)
    assert group.document("vm0")["DocumentIncarnation"] == 9
    assert group.replay()["at_end"] is True


def test_timeline_runs_control_operations_when_due(clock: FakeClock, signals: FakeSignals) -> None:
    group = SimulatedGroup(["vm0", "vm1"], clock=clock, signal_sender=signals)
    group.register_pids("vm1", [PID_E])
    steps = [
        {"at": 0, "schedule": {"event_type": "Freeze", "resources": ["vm0"], "event_id": "E1"}},
        {"at": 5, "schedule": {"event_type": "Reboot", "resources": ["vm1"], "event_id": "E2", "status": "Started",
                               "impact": "freeze", "impact_seconds": 1, "started_for": 60}},
        {"at": 7, "impact": {"event_id": "E2", "seconds": 2, "pause": True}},
        {"at": 7, "cancel": "NO-SUCH-EVENT"},
        {"at": 8, "skip_incarnation": {"vm": "vm0", "by": 3}},
        {"at": 10, "cancel": "E1"},
        {"at": 11, "fault": {"kind": "status", "status": 500, "vm": "vm1"}},
        {"at": 12, "approve": {"vm": "vm0", "event_ids": ["E2"]}},
    ]
    assert group.load_timeline(steps) == 8
    assert statuses(group) == {"E1": "Scheduled"}
    clock.advance(5)
    assert statuses(group) == {"E1": "Scheduled", "E2": "Started"}
    for _ in range(5):
        clock.advance(1)
        group.tick()
    assert statuses(group, "vm1") == {"E2": "Started"}
    assert group.document("vm0")["DocumentIncarnation"] == 4 + 3
    clock.advance(2)
    group.tick()
    assert [f["status"] for f in group.faults()] == [500]
    assert group.log(kind="approval")[-1]["results"] == {"E2": "already_started"}
    errors = [e for e in group.log(kind="timeline") if "error" in e]
    assert [(e["index"], e["action"]) for e in errors] == [(3, "cancel")]
    assert [s for _, s in signals.sent] == ["SIGSTOP", "SIGCONT", "SIGSTOP", "SIGCONT"]


def test_a_started_event_stays_until_its_freeze_of_unknown_length_is_over(
    clock: FakeClock, signals: FakeSignals
) -> None:
    # Unknown DurationInSeconds: the pause is the typical 7 s, longer than the group's started_for of 5 s.
    group = impact_group(clock, signals, started_for=5)
    eid = group.schedule("Freeze", ["vm1"], status="Started")["event_id"]
    clock.advance(5)
    group.tick()
    assert statuses(group) == {eid: "Started"}  # still frozen: the event is still there
    assert signals.sent == [(PID_C, "SIGSTOP")]
    clock.advance(DEFAULT_IMPACT_SECONDS - 5)
    group.tick()
    assert statuses(group) == {}
    assert signals.sent == [(PID_C, "SIGSTOP"), (PID_C, "SIGCONT")]


def test_a_second_pause_keeps_the_event_started_until_it_ends(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals, started_for=5)
    eid = group.schedule("Freeze", ["vm1"], status="Started", duration_in_seconds=1)["event_id"]
    clock.advance(4)
    group.impact(eid, seconds=10, pause=True)
    clock.advance(5)
    group.tick()
    assert statuses(group) == {eid: "Started"}
    clock.advance(5)
    group.tick()
    assert statuses(group) == {}
    assert signals.sent[-1] == (PID_C, "SIGCONT")


def test_killed_vms_are_back_before_their_event_leaves_the_document(clock: FakeClock, signals: FakeSignals) -> None:
    group = impact_group(clock, signals, started_for=5)
    eid = group.schedule("Reboot", ["vm1"], status="Started", impact_seconds=60)["event_id"]
    assert signals.sent == [(PID_C, "SIGKILL")]
    assert group.event(eid)["impact_until"] == T0 + 60
    clock.advance(30)
    group.tick()
    assert statuses(group) == {eid: "Started"}
    assert group.log(kind="back") == []
    clock.advance(30)
    group.tick()
    assert statuses(group) == {}
    [back] = group.log(kind="back")
    assert (back["vm"], back["event_id"]) == ("vm1", eid)
    removed = [e for e in group.log(kind="transition") if e["event_id"] == eid and e["to"] is None]
    assert removed and removed[0]["seq"] > back["seq"]
