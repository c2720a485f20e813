"""The layout version, against a real ZooKeeper: the first agent of a group writes ``/layout``; a group made
before the node existed reads as version 1; an agent that finds another version says so in one error that
names both, reads nothing of the group, takes no leadership and gives it up if it held it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from coordinator.errors import LayoutMismatch, StoreUnavailable
from coordinator.store.zk_paths import LAYOUT_VERSION
from tests.plugins.zookeeper import StoreMaker, wait_until


@pytest.fixture
def raw(zk_hosts: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_hosts, timeout=5.0)
    client.start(timeout=5.0)
    yield client
    client.stop()
    client.close()


def test_the_first_agent_writes_the_layout_version_and_a_group_without_one_reads_as_version_1(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker, raw: KazooClient
) -> None:
    a = make_store(zk_hosts, zk_chroot)
    path = f"{zk_chroot}/alpha/layout"
    assert json.loads(raw.get(path)[0]) == {"version": LAYOUT_VERSION} == {"version": 1}
    a.join("vm-a", {})
    assert "vm-a" in a.read_view("vm-a").members
    raw.delete(path)  # a group made before the node existed
    assert "vm-a" in a.read_view("vm-a").members
    make_store(zk_hosts, zk_chroot)  # the next agent to start writes it again
    assert json.loads(raw.get(path)[0]) == {"version": 1}


@pytest.mark.parametrize("data", [b'{"version": 2}', b"not json"])
def test_an_agent_that_finds_another_layout_reads_nothing_and_does_not_lead(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker, raw: KazooClient, data: bytes
) -> None:
    a = make_store(zk_hosts, zk_chroot)
    a.join("vm-a", {})
    assert a.campaign("vm-a") is True
    assert a.read_view("vm-a").i_am_leader
    raw.set(f"{zk_chroot}/alpha/layout", data)  # the group rolled to a layout this agent does not read

    def mismatch() -> LayoutMismatch | None:
        try:
            a.read_view("vm-a")
        except LayoutMismatch as exc:
            return exc
        return None

    exc = wait_until(mismatch, timeout=5.0, message="the new layout seen")
    assert isinstance(exc, StoreUnavailable)  # the agent's safe side: a view it cannot read
    assert "layout version" in str(exc) and "reads version 1 only" in str(exc)
    assert ("version 2;" in str(exc)) if data.startswith(b"{") else ("unreadable" in str(exc))
    # It gives up /leader and takes it no more while the group is in the other layout.
    assert a.campaign("vm-a") is False
    assert raw.exists(f"{zk_chroot}/alpha/leader") is None
    assert a.campaign("vm-a") is False and raw.exists(f"{zk_chroot}/alpha/leader") is None
    # Back to its own layout (the rollout undone): it reads the group and may lead again.
    raw.set(f"{zk_chroot}/alpha/layout", b'{"version": 1}')
    wait_until(lambda: mismatch() is None, timeout=5.0, message="its own layout again")
    assert a.campaign("vm-a") is True
