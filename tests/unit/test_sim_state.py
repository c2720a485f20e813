"""The simulator's pure model: lifecycle, approval, incarnation, serialization, faults, log.

No sockets and no sleeps: time comes from a fake clock that the tests move by hand.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.models import format_not_before, parse_document
from coordinator.sim import (
    MINIMUM_NOTICE,
    InvalidRequest,
    RateLimiter,
    SimulatedGroup,
    UnknownEvent,
    UnknownVm,
    VmInfo,
)

SCENARIOS = Path(__file__).resolve().parents[1] / "fixtures" / "imds-scenarios"
T0 = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT


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
    ],
)
def test_malformed_faults_are_refused(group: SimulatedGroup, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        group.add_fault(**kwargs)
    assert group.faults() == []


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
    assert [e["kind"] for e in entries] == ["transition", "request", "approval", "transition"]
    assert [e["t"] for e in entries] == [T0, T0 + 1, T0 + 2, T0 + 2]
    assert json.loads(json.dumps(entries)) == entries
    assert group.log(since=2) == entries[2:]
    assert group.log(since=2, kind="transition") == entries[3:]
    assert group.log(since=99) == []
    assert group.last_seq == 4


def test_log_entries_cannot_be_changed_through_returned_copies(group: SimulatedGroup) -> None:
    group.schedule("Freeze", ["vm0"])
    group.log()[0]["kind"] = "tampered"
    assert group.log()[0]["kind"] == "transition"


def test_on_record_sees_every_entry(clock: FakeClock) -> None:
    seen: list[dict[str, Any]] = []
    group = SimulatedGroup(["vm0"], clock=clock, on_record=seen.append)
    eid = group.schedule("Freeze", ["vm0"])["event_id"]
    group.approve("vm0", [eid])
    assert [e["seq"] for e in seen] == [1, 2, 3]


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
