"""Each part of the view reads, request by request, what the layout's table (``zk_paths.NODES``) says it does:
a request for a node of a kind that a part does not read (or for another VM's node where a part reads only
the VM's own) fails here, and so does a kind the table says a part reads that the part never asks for.
docs/architecture.md's "read and watched by" column is the same table (``tests/unit/test_docs.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from coordinator.store.base import Part, WriteResult
from coordinator.store.zk_paths import NODES, Node, node_at
from tests.fakezk import FakeClient
from tests.fakezk_group import FakeGroup, GroupStore
from tests.unit.test_policy import NOW, rec

A = "AAAAAAAA-0000-0000-0000-000000000001"
ME = "vm1"


@dataclass(frozen=True)
class Request:
    kind: str  # "list", "data" or "exists"
    path: str  # relative to the group's base
    watched: bool


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Request]]:
    """Every read a fake client sends, in order."""
    seen: list[Request] = []

    def spy(kind: str, method_name: str) -> None:
        method = getattr(FakeClient, method_name)

        def wrapper(self: FakeClient, path: str, watch: object = None, **kw: object) -> object:
            seen.append(Request(kind, path, watch is not None))
            return method(self, path, watch, **kw)

        monkeypatch.setattr(FakeClient, method_name, wrapper)

    spy("list", "get_children_async")
    spy("data", "get_async")
    spy("exists", "exists_async")
    yield seen


def busy_group() -> FakeGroup:
    """A group holding a node of every kind an agent reads: vm0 leads, an event of vm0 and vm1 with both
    acks and its admission, both VMs out for it, vm3 absent, a drain by hand of vm2, admitted, a pause."""
    group = FakeGroup(lambda: NOW)
    stores: dict[str, GroupStore] = {}
    for vm in ("vm0", "vm1", "vm2", "vm3"):
        stores[vm] = group.store(lambda: NOW)
        stores[vm].start()
        stores[vm].join(vm, {})
    stores["vm0"].campaign("vm0")
    stores["vm3"].stop()
    leader = stores["vm0"]
    assert leader.publish_event(rec(A, ("vm0", "vm1"))) is WriteResult.DONE
    for vm in ("vm0", "vm1"):
        assert stores[vm].acknowledge(A, vm, NOW) is WriteResult.DONE
        assert stores[vm].mark_out(vm, (A,), NOW) is WriteResult.DONE
    assert leader.admit(A, "vm0", NOW) is WriteResult.DONE
    assert leader.mark_absent("vm3", NOW) is WriteResult.DONE
    assert group.drain("vm2", "disk check", "ops", NOW)
    (drain,) = group.hand.drains.values()
    assert leader.admit_drain("vm2", drain.asked, "vm0", NOW) is WriteResult.DONE
    assert group.pause("a change freeze", "ops", NOW)
    return group


def _parent(pattern: str) -> str:
    return pattern.rsplit("/", 1)[0]


def owns(node: Node, relative: str) -> bool:
    """Whether the node at ``relative`` is the reading VM's own (its name is the node's ``{vm}``)."""
    return node.path.endswith("{vm}") and relative.rsplit("/", 1)[1] == ME


@pytest.mark.parametrize("part", list(Part), ids=lambda part: part.name)
def test_each_part_of_the_view_reads_what_the_layout_table_says(part: Part, requests: list[Request]) -> None:
    group = busy_group()
    reader = group.store(lambda: NOW)  # a client of its own: nothing it reads is known to it yet
    reader.start()
    base = reader.base_path
    requests.clear()
    view = reader.read_view(ME, part=part)
    assert view.part is part
    assert requests, "the view was read without a request"

    listed_kinds: set[str] = set()
    read_kinds: set[str] = set()
    for request in requests:
        assert request.path.startswith(base + "/"), request
        assert request.watched, f"{request} carries no watch: the view's reads are all watched"
        relative = request.path[len(base):]
        if request.kind == "list":
            kinds = [node for node in NODES if _parent(node.path) == _pattern_of(relative)]
            assert kinds, f"{part.name} lists {relative}, which holds no node of the layout"
            assert any(node.reads(part) for node in kinds), f"{part.name} lists {relative}: the table says no"
            listed_kinds.update(node.path for node in kinds if node.reads(part))
            continue
        node = node_at(relative)
        assert node is not None, f"{part.name} reads {relative}, which is no node of the layout"
        assert node.reads(part, own=owns(node, relative)), (
            f"{part.name} reads {relative} ({node.path}): the table says it does not")
        read_kinds.add(node.path)

    for node in NODES:
        if not node.reads(part, own=True):
            continue
        if node.reads(part) and "{" in node.path.rsplit("/", 1)[1]:
            # every node of the kind: its list is listed (admissions and approvals are the record's
            # copies, read with it, so they are children read by name only where the copy fails)
            assert node.path in listed_kinds | read_kinds or node.path.endswith(("/admitted", "/approval")), (
                f"{part.name} never lists the nodes of {node.path}")
        elif node.path.endswith(("/admitted", "/approval")):
            continue
        else:
            assert node.path in read_kinds, f"{part.name} never reads {node.path}"


def _pattern_of(relative: str) -> str:
    """The table's pattern for the node at ``relative`` (a list of the layout: ``/events/E/acks`` ->
    ``/events/{EVENT_ID}/acks``)."""
    node = node_at(relative)
    if node is not None:
        return node.path
    head, _, tail = relative.rpartition("/")
    parent = node_at(head) if head else None
    return f"{parent.path}/{tail}" if parent is not None else relative


def test_what_a_part_reads_grows_with_the_part() -> None:
    for node in NODES:
        readers = [part for part in Part if node.reads(part)]
        assert readers == [part for part in Part if node.read_from is not None and part.holds(node.read_from)]
        if node.own_from is not None:
            assert node.read_from is not None and not node.own_from.holds(node.read_from), node.path
            assert node.path.endswith("{vm}"), node.path
