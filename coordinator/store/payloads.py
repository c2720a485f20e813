"""The data of the ZooKeeper store's nodes: one pydantic model per node kind, UTF-8 JSON on the wire.

Field names are the stored format (see the layout in ``coordinator.store.base``) and must not change:
nodes written by one version of the agent are read by the next, and by the previous one during a rolling
upgrade. Reading rules, shared by every model:

* Unknown fields are accepted (a newer agent may add some). They are ignored, except on the two kinds
  that keep them: ``EventNode``, so that rewriting a record (``mark_done``) does not drop what a newer
  agent stored in it, and ``MemberNode``, whose extra fields are the agent's free-form member info.
* A field is required on reading only if the reader of this version needs it; the other fields the
  writer always sets are optional, so that no node that was readable before is rejected now.
* Types are strict: a time is a JSON number (not a string, not a boolean), a name a JSON string, a flag a
  JSON boolean; no coercion.
* Data that is not UTF-8 JSON, not an object, or does not validate raises ``PayloadError``, which names
  the node's path and what was wrong. What a caller does with it depends on the node (skip it, fall back,
  or refuse); see ``coordinator.store.zookeeper``.

The models are a storage detail: the rest of the code uses the dataclasses of ``coordinator.store.base``
(``EventRecord``, ``Approval``), to and from which the models convert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from coordinator.store.base import Approval, Closed, EventRecord, Vouch

if TYPE_CHECKING:
    from kazoo.protocol.states import ZnodeStat

__all__ = [
    "AbsentNode",
    "AckNode",
    "AdmittedNode",
    "ApprovalNode",
    "ClosedNode",
    "DrainAdmittedNode",
    "DrainNode",
    "EventNode",
    "LayoutNode",
    "LeaderNode",
    "MemberNode",
    "NodePayload",
    "OutNode",
    "PauseNode",
    "PayloadError",
    "RegistryNode",
    "VouchNode",
]

_MAX_ERRORS = 3  # in a PayloadError message; the rest are counted


class PayloadError(ValueError):
    """The data of the node at ``path`` is not a valid payload of the expected kind."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _brief(exc: ValidationError) -> str:
    """A one-line summary of a validation error: location and message of the first few problems (never
    the input, which may be large)."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in error['loc']) or 'data'}: {error['msg']}" for error in errors[:_MAX_ERRORS]]
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more")
    return "; ".join(parts)


class NodePayload(BaseModel):
    """Base of every node model: strict, immutable, unknown fields ignored, JSON in UTF-8."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", ser_json_inf_nan="constants")

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> Self:
        """Parse the data of the node at ``path``. Raises ``PayloadError`` (naming ``path``) if it is not
        UTF-8 JSON, not an object, or does not validate."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise PayloadError(path, _brief(exc)) from exc

    def to_bytes(self) -> bytes:
        """The node data to write: compact UTF-8 JSON, every field present (``null`` for unset ones)."""
        return self.model_dump_json().encode("utf-8")


class MemberNode(NodePayload):
    """``/members/{vm}``: the VM name, plus the agent's member info as extra fields (``started_at``,
    ``version``, ``admin``, ``probe``, placement...), stored as given; read back by ``member_info``."""

    model_config = ConfigDict(extra="allow")

    vm: str

    @classmethod
    def of(cls, vm: str, info: Mapping[str, object]) -> MemberNode:
        """The member node of ``vm`` with ``info``; ``vm`` wins over an ``info["vm"]``."""
        return cls.model_validate({**info, "vm": vm})


class RegistryNode(NodePayload):
    """``/registry/{vm}``: when the VM first joined. The store never reads it back."""

    vm: str
    first_seen: float


class AbsentNode(NodePayload):
    """``/absent/{vm}``: since when the leader has seen the registered VM without an agent."""

    since: float


class OutNode(NodePayload):
    """``/out/{vm}``: the VM is out of its load balancer's rotation since ``since``, for ``events``."""

    vm: str | None = None
    since: float
    events: tuple[str, ...] = ()


class LeaderNode(NodePayload):
    """``/leader``: the VM that holds leadership, and since when (optional on reading: not needed)."""

    vm: str
    since: float | None = None


class LayoutNode(NodePayload):
    """``/layout``: the version of the layout the group's nodes are written in (``zk_paths.LAYOUT_VERSION``).
    Created by the first agent that creates the layout; a group made before it existed is of version 1."""

    version: int


class PauseNode(NodePayload):
    """``/pause``: early approvals are paused for the whole group, by whom, why and since when. Written
    and deleted by ``coordinator pause`` / ``resume``, never by an agent."""

    reason: str
    by: str
    at: float


class DrainNode(NodePayload):
    """``/drains/{vm}``: an operator takes the VM out of rotation by hand (``coordinator drain``), why, who
    and when. Deleted by ``coordinator undrain``."""

    vm: str | None = None
    reason: str
    by: str
    at: float


class DrainAdmittedNode(NodePayload):
    """``/drains-admitted/{vm}``: the leader ``by`` admitted, at ``at``, the drain by hand of the VM whose
    node was created with zxid ``drain`` (its ``czxid``): an admission of an earlier drain of the VM, undone
    since, admits nothing."""

    by: str
    at: float
    drain: int


class VouchNode(NodePayload):
    """An operator's word for the VMs an event names that run no agent (``coordinator approve``): who, when,
    why, and which; the group then waits for every other VM's ack only, and approves it itself."""

    by: str
    at: float
    reason: str
    vms: tuple[str, ...]


class EventNode(NodePayload):
    """``/events/{EVENT_ID}``: the event as first seen, and when it was done.

    ``event_id`` is optional on reading: the node's name is authoritative. Unknown fields are kept (not
    only ignored) so that ``mark_done``, which rewrites the node, preserves them.

    ``admitted`` and ``approval`` copy the record's child nodes of those names, written in the transaction
    that creates them (or, at ``mark_done``, deletes them), so that a reader of the record needs its data
    only, not its children and theirs. The copy holds only while ``mirrored`` is the node's data version
    and ``cversion`` (the count of its children's changes), as its stat gives them with the data: every
    write of this version sets it to what the write makes them. A child created or deleted by hand, or a
    rewrite by an agent of a version that keeps no copy (it rewrites the bytes it read), moves the one
    or the other and not ``mirrored``: readers then read the record's children, as before.

    ``started_at`` and ``closed`` (optional, for the history only) are set by the rewrite of ``mark_done``:
    when the agent that marked it done first saw the event Started in its own documents, and what the
    ``admitted`` and ``approval`` it deleted held (``ClosedNode``); a reopening clears both. A ``closed``
    whose ``done_at`` is not the record's is stale (a record reopened and marked done again by a version
    that keeps none, preserving it as an unknown field) and is not read.
    """

    model_config = ConfigDict(extra="allow")

    event_id: str | None = None
    event_type: str
    resources: tuple[str, ...] = ()
    not_before: float | None = None
    published_by: str
    published_at: float
    unit: str | None = None
    done_at: float | None = None
    admitted: AdmittedNode | None = None
    approval: ApprovalNode | None = None
    mirrored: tuple[int, int] | None = None  # (data version, cversion) at which the copy holds
    started_at: float | None = None
    closed: ClosedNode | None = None
    vouched: VouchNode | None = None  # ``coordinator approve``: a versioned rewrite; cleared with the done mark

    def mirrors(self, stat: ZnodeStat) -> bool:
        """Whether ``admitted`` and ``approval`` are those of the children of the node whose stat is ``stat``."""
        return self.mirrored == (stat.version, stat.cversion)

    def rewritten(self, stat: ZnodeStat, children_changed: int, **fields: object) -> bytes:
        """The node's data with ``fields`` replaced, for a write over the node as ``stat`` found it that
        creates or deletes ``children_changed`` children in the same transaction."""
        mirrored = (stat.version + 1, stat.cversion + children_changed)
        return self.model_copy(update={**fields, "mirrored": mirrored}).to_bytes()

    @classmethod
    def of(cls, record: EventRecord) -> EventNode:
        """The node for ``record`` as given (callers normalise names first), as ``publish_event`` creates it
        with its ``acks`` child: its ``acks``, ``approval`` and ``admitted_at`` are not part of it (they have
        their own nodes, created later), and its copy of them (none) holds at version 0, one child created."""
        return cls(
            event_id=record.event_id,
            event_type=record.event_type,
            resources=tuple(record.resources),
            not_before=record.not_before,
            published_by=record.published_by,
            published_at=record.published_at,
            unit=record.unit,
            done_at=record.done_at,
            mirrored=(0, 1),
        )

    def record_of_copies(self, event_id: str, acks: Mapping[str, float | None] | None = None) -> EventRecord:
        """``to_record`` with the admission and approval this node's data copies (``mirrors``: for a node
        whose copy holds, or one that no longer has the children, a record moved to the history)."""
        return self.to_record(event_id, acks=acks,
                              approval=self.approval.to_approval() if self.approval is not None else None,
                              admitted_at=self.admitted.at if self.admitted is not None else None)

    def to_record(
        self,
        event_id: str,
        *,
        acks: Mapping[str, float | None] | None = None,
        approval: Approval | None = None,
        admitted_at: float | None = None,
    ) -> EventRecord:
        """The record of the event named ``event_id`` (the node's name), with what was read from its
        child nodes."""
        return EventRecord(
            event_id=event_id,
            event_type=self.event_type,
            resources=self.resources,
            not_before=self.not_before,
            published_by=self.published_by,
            published_at=self.published_at,
            acks=dict(acks or {}),
            approval=approval,
            done_at=self.done_at,
            admitted_at=admitted_at,
            unit=self.unit,
            started_at=self.started_at if self.done_at is not None else None,
            closed=(self.closed.to_closed() if self.closed is not None and self.done_at is not None
                    and self.closed.done_at == self.done_at else None),
            vouched=(Vouch(by=self.vouched.by, at=self.vouched.at, reason=self.vouched.reason,
                           vms=self.vouched.vms) if self.vouched is not None and self.done_at is None else None),
        )


class AckNode(NodePayload):
    """``/events/{EVENT_ID}/acks/{vm}``: when the VM had drained for the event."""

    vm: str | None = None
    at: float

    @classmethod
    def of_vm(cls, data: bytes, path: str, vm: str) -> AckNode:
        """Parse the ack of ``vm`` at ``path``. Raises ``PayloadError`` if it does not parse or names another VM:
        such a node is no acknowledgement, whatever its name."""
        node = cls.from_bytes(data, path)
        if node.vm is not None and node.vm != vm:
            raise PayloadError(path, f"the ack names {node.vm[:80]!r}, not {vm!r}")
        return node


class AdmittedNode(NodePayload):
    """``/events/{EVENT_ID}/admitted``: when, and by which leader, the event was admitted."""

    by: str | None = None
    at: float

    @classmethod
    def or_created(cls, data: bytes, path: str, stat: ZnodeStat) -> AdmittedNode:
        """The admission at ``path``; one that does not parse counts from its node's creation time (the node
        exists: the event was admitted)."""
        try:
            return cls.from_bytes(data, path)
        except PayloadError:
            return cls(by=None, at=stat.ctime / 1000.0)


class ApprovalNode(NodePayload):
    """``/events/{EVENT_ID}/approval``: who approved the event, when, and whether as the leader; ``acks``
    (optional: null in a node written by an earlier version), the VMs whose acknowledgements the approval
    gate found, right before it wrote the node, and released the approval on; ``acked_at`` (optional), when
    each of them acknowledged, as its ack node says."""

    by: str
    at: float
    as_leader: bool
    acks: tuple[str, ...] | None = None
    acked_at: dict[str, float] | None = None
    vouched: tuple[str, ...] | None = None  # an operator's approval (``coordinator approve``): for these VMs
    reason: str | None = None
    vouched_by: str | None = None

    @classmethod
    def of(cls, approval: Approval) -> ApprovalNode:
        acked_at = dict(approval.acked_at) if approval.acked_at is not None else None
        return cls(by=approval.by, at=approval.at, as_leader=approval.as_leader, acks=approval.acks,
                   acked_at=acked_at, vouched=approval.vouched, reason=approval.reason, vouched_by=approval.vouched_by)

    def to_approval(self) -> Approval:
        return Approval(by=self.by, at=self.at, as_leader=self.as_leader, acks=self.acks, acked_at=self.acked_at,
                        vouched=self.vouched, reason=self.reason, vouched_by=self.vouched_by)

    @classmethod
    def unknown(cls) -> ApprovalNode:
        """What an approval node that does not parse stands for: it exists, so the event *is* approved, by
        someone unknown."""
        return cls(by="?", at=0.0, as_leader=False)


class ClosedNode(NodePayload):
    """``closed`` in the data of a record marked done: its ``admitted`` and ``approval`` as they were when
    ``mark_done`` (at ``done_at``) deleted them, each null when the record had none. For the history only."""

    done_at: float
    admitted: AdmittedNode | None = None
    approval: ApprovalNode | None = None

    def to_closed(self) -> Closed:
        return Closed(admitted_at=self.admitted.at if self.admitted is not None else None,
                      admitted_by=self.admitted.by if self.admitted is not None else None,
                      approval=self.approval.to_approval() if self.approval is not None else None)


EventNode.model_rebuild()  # its ``admitted``, ``approval`` and ``closed`` are defined below it
