"""The ZooKeeper node payload models: the stored format of earlier versions, extra fields, and garbage."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from coordinator.store.base import Approval, Closed, EventRecord
from coordinator.store.payloads import (
    AbsentNode,
    AckNode,
    AdmittedNode,
    ApprovalNode,
    ClosedNode,
    EventNode,
    LeaderNode,
    MemberNode,
    NodePayload,
    PayloadError,
    RegistryNode,
)

EVENT = "5AA1A3F2-3C39-4E5B-9C4B-9E3E5D2B1A01"
PATH = "/azure-maintenance/alpha/events/" + EVENT
T0 = 1_700_000_000.0


def previous(value: dict[str, Any]) -> bytes:
    """A node as the previous version wrote it: sorted keys, compact separators, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


PREVIOUS_EVENT = {
    "event_id": EVENT,
    "event_type": "Freeze",
    "resources": ["vm-a", "vm-b"],
    "not_before": T0 + 60,
    "published_by": "vm-a",
    "published_at": T0,
    "done_at": None,
}


def test_an_event_record_of_the_previous_format_parses() -> None:
    record = EventNode.from_bytes(previous(PREVIOUS_EVENT), PATH).to_record(
        EVENT, acks={"vm-a": T0 + 1}, approval=Approval("vm-a", T0 + 2, True), admitted_at=T0 + 3
    )
    assert record == EventRecord(
        event_id=EVENT,
        event_type="Freeze",
        resources=("vm-a", "vm-b"),
        not_before=T0 + 60,
        published_by="vm-a",
        published_at=T0,
        acks={"vm-a": T0 + 1},
        approval=Approval("vm-a", T0 + 2, True),
        done_at=None,
        admitted_at=T0 + 3,
    )


@pytest.mark.parametrize(
    ("model", "value", "expected"),
    [
        (LeaderNode, {"vm": "vm-a", "since": T0}, LeaderNode(vm="vm-a", since=T0)),
        (AbsentNode, {"since": T0}, AbsentNode(since=T0)),
        (AckNode, {"vm": "vm-a", "at": T0}, AckNode(vm="vm-a", at=T0)),
        (AdmittedNode, {"by": "vm-a", "at": T0}, AdmittedNode(by="vm-a", at=T0)),
        (ApprovalNode, {"as_leader": True, "at": T0, "by": "vm-a"}, ApprovalNode(by="vm-a", at=T0, as_leader=True)),
        (RegistryNode, {"first_seen": T0, "vm": "vm-a"}, RegistryNode(vm="vm-a", first_seen=T0)),
        # Integer times were accepted before: they still are.
        (AckNode, {"vm": "vm-a", "at": 1_700_000_000}, AckNode(vm="vm-a", at=T0)),
    ],
)
def test_every_node_kind_of_the_previous_format_parses(
    model: type[NodePayload], value: dict[str, Any], expected: NodePayload
) -> None:
    assert model.from_bytes(previous(value), PATH) == expected


def test_fields_only_written_by_the_writer_are_optional_on_reading() -> None:
    assert LeaderNode.from_bytes(b'{"vm":"vm-a"}', PATH).vm == "vm-a"
    assert AckNode.from_bytes(b'{"at":1}', PATH).at == 1.0
    assert AdmittedNode.from_bytes(b'{"at":1}', PATH).at == 1.0
    node = EventNode.from_bytes(b'{"event_type":"Reboot","published_by":"vm-a","published_at":1}', PATH)
    assert node.to_record(EVENT).resources == ()
    assert (node.not_before, node.done_at) == (None, None)


def test_what_is_written_has_the_field_names_of_the_previous_format() -> None:
    record = EventRecord(EVENT, "Freeze", ("vm-a", "vm-b"), T0 + 60, "vm-a", T0)
    # The fields added since: the publisher's delivery unit (null: unknown), the copy of the admission and
    # approval with the (data version, cversion) it holds at (``EventNode.mirrors``), and the history's
    # ``started_at`` and ``closed`` (set by ``mark_done``). Older agents keep them.
    assert json.loads(EventNode.of(record).to_bytes()) == {**PREVIOUS_EVENT, "unit": None, "admitted": None,
                                                           "approval": None, "mirrored": [0, 1],
                                                           "started_at": None, "closed": None, "vouched": None}
    assert EventNode.from_bytes(previous(PREVIOUS_EVENT), PATH).to_record(EVENT).unit is None
    assert EventNode.of(replace(record, unit="pg-1")).to_record(EVENT).unit == "pg-1"
    approval = Approval(by="vm-a", at=T0, as_leader=False)
    # Added since: the acks the approval was released on, and their times (null: not recorded).
    assert json.loads(ApprovalNode.of(approval).to_bytes()) == {"by": "vm-a", "at": T0, "as_leader": False,
                                                                "acks": None, "acked_at": None, "vouched": None,
                                                                "reason": None, "vouched_by": None}
    assert json.loads(AckNode(vm="vm-a", at=T0).to_bytes()) == {"vm": "vm-a", "at": T0}
    assert json.loads(AdmittedNode(by="vm-a", at=T0).to_bytes()) == {"by": "vm-a", "at": T0}
    assert json.loads(AbsentNode(since=T0).to_bytes()) == {"since": T0}
    assert json.loads(LeaderNode(vm="vm-a", since=T0).to_bytes()) == {"vm": "vm-a", "since": T0}
    assert json.loads(RegistryNode(vm="vm-a", first_seen=T0).to_bytes()) == {"vm": "vm-a", "first_seen": T0}
    assert ApprovalNode.from_bytes(ApprovalNode.of(approval).to_bytes(), PATH).to_approval() == approval


def test_the_acks_an_approval_was_released_on_round_trip_and_an_older_approval_has_none() -> None:
    released = Approval(by="vm-a", at=T0, as_leader=True, acks=("vm-a", "vm-b"))
    data = ApprovalNode.of(released).to_bytes()
    assert json.loads(data)["acks"] == ["vm-a", "vm-b"]
    assert ApprovalNode.from_bytes(data, PATH).to_approval() == released
    none_needed = Approval(by="vm-a", at=T0, as_leader=True, acks=())
    assert ApprovalNode.from_bytes(ApprovalNode.of(none_needed).to_bytes(), PATH).to_approval().acks == ()
    older = ApprovalNode.from_bytes(previous({"by": "vm-a", "at": T0, "as_leader": False}), PATH).to_approval()
    assert older == Approval(by="vm-a", at=T0, as_leader=False) and older.acks is None
    with pytest.raises(PayloadError, match="acks"):
        ApprovalNode.from_bytes(previous({"by": "vm-a", "at": T0, "as_leader": False, "acks": "vm-a"}), PATH)


def test_a_record_marked_done_keeps_when_it_started_and_what_it_was_admitted_and_approved_with() -> None:
    approval = ApprovalNode(by="vm-b", at=T0 + 30, as_leader=False, acks=("vm-a", "vm-b"))
    closed = ClosedNode(done_at=T0 + 90, admitted=AdmittedNode(by="vm-c", at=T0 + 10), approval=approval)
    done = EventNode.from_bytes(previous(PREVIOUS_EVENT), PATH).model_copy(
        update={"done_at": T0 + 90, "started_at": T0 + 61, "closed": closed})
    record = EventNode.from_bytes(done.to_bytes(), PATH).to_record(EVENT)
    assert (record.done_at, record.started_at) == (T0 + 90, T0 + 61)
    assert record.closed == Closed(admitted_at=T0 + 10, admitted_by="vm-c",
                                   approval=Approval("vm-b", T0 + 30, False, ("vm-a", "vm-b")))
    assert record.approval is None and record.admitted_at is None  # the history is no approval of now
    # Neither an admission nor an approval when it was done: kept as such, not as "unknown".
    bare = done.model_copy(update={"closed": ClosedNode(done_at=T0 + 90)})
    assert EventNode.from_bytes(bare.to_bytes(), PATH).to_record(EVENT).closed == Closed()


def test_a_done_record_of_an_earlier_version_or_a_stale_history_reads_as_not_recorded() -> None:
    older = EventNode.from_bytes(previous({**PREVIOUS_EVENT, "done_at": T0 + 90}), PATH).to_record(EVENT)
    assert older.done_at == T0 + 90 and older.started_at is None and older.closed is None
    # Reopened and marked done again by a version that keeps no history: what it kept as unknown fields
    # is of the first closing, which ``closed.done_at`` tells.
    stale = previous({**PREVIOUS_EVENT, "done_at": T0 + 500, "started_at": T0 + 61,
                      "closed": {"done_at": T0 + 90, "admitted": None, "approval": None}})
    assert EventNode.from_bytes(stale, PATH).to_record(EVENT).closed is None
    # A record not done has no history, whatever its data says.
    reopened = previous({**PREVIOUS_EVENT, "started_at": T0 + 61, "closed": {"done_at": T0 + 90}})
    record = EventNode.from_bytes(reopened, PATH).to_record(EVENT)
    assert (record.started_at, record.closed) == (None, None)


def test_extra_fields_are_ignored() -> None:
    data = previous({"by": "vm-a", "at": T0, "as_leader": True, "note": "added later", "nested": {"x": [1]}})
    node = ApprovalNode.from_bytes(data, PATH)
    assert node.to_approval() == Approval(by="vm-a", at=T0, as_leader=True)
    assert json.loads(node.to_bytes()) == {"by": "vm-a", "at": T0, "as_leader": True, "acks": None,
                                           "acked_at": None, "vouched": None, "reason": None,
                                           "vouched_by": None}
    assert LeaderNode.from_bytes(previous({"vm": "vm-a", "since": T0, "term": 7}), PATH).vm == "vm-a"


def test_an_event_record_keeps_extra_fields_when_rewritten() -> None:
    node = EventNode.from_bytes(previous({**PREVIOUS_EVENT, "priority": "high"}), PATH)
    assert node.to_record(EVENT).event_type == "Freeze"
    rewritten = json.loads(node.model_copy(update={"done_at": T0 + 100}).to_bytes())
    assert rewritten == {**PREVIOUS_EVENT, "priority": "high", "unit": None, "done_at": T0 + 100, "admitted": None,
                         "approval": None, "mirrored": None, "started_at": None, "closed": None, "vouched": None}


def test_the_member_node_carries_the_member_info_and_its_own_vm_name() -> None:
    node = MemberNode.of("vm-a", {"vm": "other", "version": "0.1.0", "admin": "127.0.0.1:9110", "zone": 2})
    assert json.loads(node.to_bytes()) == {"vm": "vm-a", "version": "0.1.0", "admin": "127.0.0.1:9110", "zone": 2}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "Invalid JSON"),
        (b"not json", "Invalid JSON"),
        (b"\xff\xfe", "Invalid JSON"),
        (b"[1, 2]", "object"),
        (b'{"by": "vm-a", "at": 1}', "as_leader: Field required"),
        (b'{"by": "vm-a", "at": "1", "as_leader": true}', "at: Input should be a valid number"),
        (b'{"by": "vm-a", "at": true, "as_leader": true}', "at: Input should be a valid number"),
        (b'{"by": 5, "at": 1, "as_leader": true}', "by: Input should be a valid string"),
        (b'{"by": "vm-a", "at": 1, "as_leader": "yes"}', "as_leader: Input should be a valid boolean"),
    ],
)
def test_garbage_raises_a_payload_error_naming_the_path(data: bytes, reason: str) -> None:
    with pytest.raises(PayloadError) as caught:
        ApprovalNode.from_bytes(data, PATH)
    assert isinstance(caught.value, ValueError)
    assert caught.value.path == PATH
    assert str(caught.value).startswith(f"{PATH}: ")
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_garbage_in_an_event_record() -> None:
    for value in (
        {**PREVIOUS_EVENT, "resources": "vm-a"},
        {**PREVIOUS_EVENT, "resources": ["vm-a", 3]},
        {**PREVIOUS_EVENT, "not_before": "soon"},
        {key: v for key, v in PREVIOUS_EVENT.items() if key != "published_at"},
    ):
        with pytest.raises(PayloadError):
            EventNode.from_bytes(previous(value), PATH)


def test_a_payload_error_is_brief_and_does_not_repeat_the_input() -> None:
    secret = "x" * 500
    with pytest.raises(PayloadError) as caught:
        ApprovalNode.from_bytes(previous({"by": 1, "at": secret, "as_leader": secret, "extra": secret}), PATH)
    assert secret not in str(caught.value)
    assert len(str(caught.value)) < 300
