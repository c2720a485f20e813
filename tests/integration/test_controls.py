"""``coordinator pause`` / ``resume`` against a real ZooKeeper: what the agents' store sees, and the gate."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coordinator.control import ControlError, GroupAddress, pause, resume
from coordinator.store.base import ApprovalOutcome, EventRecord, Pause
from coordinator.testbed.processes import free_port
from tests.plugins.zookeeper import StoreMaker, wait_until

pytestmark = pytest.mark.zookeeper

EVENT = "5AA1A3F2-3C39-4E5B-9C4B-9E3E5D2B1A01"
T0 = 1_700_000_000.0


def _acked_event(store: object, vm: str) -> None:
    store.publish_event(EventRecord(EVENT, "Reboot", (vm,), T0 + 600, vm, T0))  # type: ignore[attr-defined]
    store.acknowledge(EVENT, vm, T0 + 1)  # type: ignore[attr-defined]


def test_a_pause_reaches_every_agents_view_and_the_gate_refuses_until_resumed(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    _acked_event(store, "vm-a")
    assert store.read_view("vm-a").paused is None
    group = GroupAddress(zk_hosts, zk_chroot, "alpha")

    found, created = pause(group, "incident 4711", by="ops@bastion", at=T0)
    assert created and found == Pause("incident 4711", "ops@bastion", T0)
    # The view is watched: the pause is seen without anything else changing.
    wait_until(lambda: store.read_view("vm-a").paused == found, message="the pause in the view")
    refused = store.approve(EVENT, "vm-a", ("vm-a",), as_leader=False, at=T0 + 2, admission=False)
    assert refused.outcome is ApprovalOutcome.REFUSED and "paused" in refused.reason

    # A second pause keeps the first: its author and reason are what the on-call engineer reads.
    kept, created_again = pause(group, "another reason", by="someone@else")
    assert not created_again and kept == found

    assert resume(group) is True
    wait_until(lambda: store.read_view("vm-a").paused is None, message="the pause lifted in the view")
    approved = store.approve(EVENT, "vm-a", ("vm-a",), as_leader=False, at=T0 + 3, admission=False)
    assert approved.outcome is ApprovalOutcome.APPROVED
    assert resume(group) is False  # idempotent: not paused any more


def test_an_undecodable_pause_node_still_pauses(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    _acked_event(store, "vm-a")
    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=10)
    try:
        client.create(f"{zk_chroot}/alpha/pause", b"not json")
    finally:
        client.stop()
    wait_until(lambda: store.read_view("vm-a").paused is not None, message="the pause in the view")
    assert store.read_view("vm-a").paused.reason == "undecodable pause node"  # type: ignore[union-attr]
    refused = store.approve(EVENT, "vm-a", ("vm-a",), as_leader=False, at=T0 + 2, admission=False)
    assert refused.outcome is ApprovalOutcome.REFUSED


def test_controls_say_clearly_what_went_wrong(zk_hosts: str, zk_chroot: str) -> None:
    with pytest.raises(ControlError, match="needs a reason"):
        pause(GroupAddress(zk_hosts, zk_chroot, "alpha"), "  ")
    with pytest.raises(ControlError, match="no group 'nobody'"):
        pause(GroupAddress(zk_hosts, zk_chroot, "nobody"), "why")
    with pytest.raises(ControlError, match="cannot reach ZooKeeper"):
        resume(GroupAddress(f"127.0.0.1:{free_port()}", zk_chroot, "alpha", timeout=2.0))  # nobody listens


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR__")}
    return subprocess.run([sys.executable, "-m", "coordinator", *argv], capture_output=True, text=True,
                          timeout=60, check=False, env=env)


@pytest.mark.parametrize("command", [["pause", "--reason", "incident"], ["resume"]])
def test_with_zookeeper_down_pause_and_resume_are_one_line_bounded_by_timeout(command: list[str]) -> None:
    port = free_port()  # nothing listens there
    began = time.monotonic()
    run = _command(*command, "--zookeeper", f"127.0.0.1:{port}", "--cluster", "alpha", "--timeout", "1")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == f"coordinator: cannot reach ZooKeeper at 127.0.0.1:{port} within 1 s (--timeout)\n"
    assert time.monotonic() - began < 5


def test_the_pause_hint_repeats_how_the_group_was_named(
    tmp_path: Path, zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    make_store(zk_hosts, zk_chroot).join("vm-a", {})
    config = tmp_path / "agent.yaml"
    config.write_text(f"cluster: alpha\nzookeeper:\n  hosts: {zk_hosts}\n  root: {zk_chroot}\nstate_file: null\n")
    run = _command("pause", "--config", str(config), "--reason", "incident 4711")
    assert run.returncode == 0, run.stderr
    hint = run.stdout.strip().split("Lift with: ", 1)[1]
    assert hint == f"coordinator resume --config {config}"
    lifted = _command(*hint.split()[1:])
    assert lifted.stdout.strip() == "group alpha: pause lifted: early approvals resume", lifted.stderr
