"""``coordinator drain`` / ``undrain`` against a real ZooKeeper: what the agents' stores see in each part of
the view, the leader's admission, and what the commands say."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from coordinator.control import ControlError, GroupAddress, drain, undrain
from coordinator.store.base import Part, WriteResult
from tests.plugins.zookeeper import StoreMaker, wait_until

pytestmark = pytest.mark.zookeeper

T0 = 1_700_000_000.0


def test_a_drain_by_hand_reaches_the_leader_and_its_vm_and_is_admitted_once(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    leader, vm_b, vm_c = (make_store(zk_hosts, zk_chroot) for _ in range(3))
    for store, vm in ((leader, "vm-a"), (vm_b, "vm-b"), (vm_c, "vm-c")):
        store.join(vm, {})
    group = GroupAddress(zk_hosts, zk_chroot, "alpha")
    _, created = drain(group, "VM-B", "disk swap [CHG-7]", by="ops@bastion", at=T0)
    assert created

    # Watched: the leader's whole view, and the VM's own part, show it without anything else changing; a
    # VM it does not name reads nothing of it.
    asked = wait_until(lambda: leader.read_view("vm-a").drains.get("vm-b"), message="the drain in the leader's view")
    assert (asked.reason, asked.by, asked.at, asked.admitted_at) == ("disk swap [CHG-7]", "ops@bastion", T0, None)
    wait_until(lambda: vm_b.read_view("vm-b", part=Part.OWN).drains == {"vm-b": asked}, message="in vm-b's own part")
    assert vm_c.read_view("vm-c", part=Part.OWN).drains == {}
    assert vm_c.read_view("vm-c", part=Part.NAMED).drains == {}

    assert leader.admit_drain("vm-b", asked.asked, "vm-a", T0 + 5) is WriteResult.DONE
    admitted = replace(asked, admitted_by="vm-a", admitted_at=T0 + 5)
    wait_until(lambda: vm_b.read_view("vm-b", part=Part.OWN).drains == {"vm-b": admitted},
               message="the admission in vm-b's own part")
    assert leader.admit_drain("vm-b", asked.asked, "vm-a", T0 + 6) is WriteResult.EXISTS  # the first one stands

    # Asking again keeps the first drain, admission and all.
    kept, created_again = drain(group, "vm-b", "another reason", by="someone@else")
    assert not created_again and kept == admitted

    # Undone and asked again: a new drain, which the old admission does not admit; the leader forgets it.
    assert undrain(group, "vm-b") is True
    wait_until(lambda: vm_b.read_view("vm-b", part=Part.OWN).drains == {}, message="the drain undone in vm-b's part")
    assert leader.admit_drain("vm-b", asked.asked, "vm-a", T0 + 7) is WriteResult.MISSING
    drain(group, "vm-b", "asked again", by="ops@bastion", at=T0 + 8)
    again = wait_until(lambda: vm_b.read_view("vm-b", part=Part.OWN).drains.get("vm-b"), message="asked again")
    assert again.admitted_at is None and again.asked != asked.asked
    assert leader.read_view("vm-a").stale_admissions == frozenset({"vm-b"})
    assert leader.forget_drain_admission("vm-b") is WriteResult.DONE
    wait_until(lambda: leader.read_view("vm-a").stale_admissions == frozenset(), message="the admission forgotten")
    assert leader.admit_drain("vm-b", again.asked, "vm-a", T0 + 9) is WriteResult.DONE
    assert leader.forget_drain_admission("vm-b") is WriteResult.EXISTS  # it admits the drain there is
    assert undrain(group, "vm-b") is True
    assert undrain(group, "vm-b") is False  # idempotent


def test_an_undecodable_drain_node_still_drains_and_waits_for_the_budget(
    zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=10)
    try:
        client.create(f"{zk_chroot}/alpha/drains/vm-a", b"not json")
    finally:
        client.stop()
    found = wait_until(lambda: store.read_view("vm-a", part=Part.OWN).drains.get("vm-a"), message="in the view")
    assert found.reason == "undecodable drain node" and found.admitted_at is None


def test_drain_refuses_what_it_cannot_do_in_one_line(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> None:
    make_store(zk_hosts, zk_chroot).join("vm-a", {})
    group = GroupAddress(zk_hosts, zk_chroot, "alpha")
    with pytest.raises(ControlError, match="needs a reason"):
        drain(group, "vm-a", " ")
    with pytest.raises(ControlError, match=r"vm-z has never run an agent in group alpha \(its VMs: vm-a\)"):
        drain(group, "vm-z", "typo")
    with pytest.raises(ControlError, match="invalid VM name"):
        drain(group, "../vm-a", "odd name")
    with pytest.raises(ControlError, match="no group 'nobody'"):
        drain(GroupAddress(zk_hosts, zk_chroot, "nobody"), "vm-a", "why")


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR__")}
    return subprocess.run([sys.executable, "-m", "coordinator", *argv], capture_output=True, text=True,
                          timeout=60, check=False, env=env)


def test_the_commands_say_what_happens_next_and_undo_it(
    tmp_path: Path, zk_hosts: str, zk_chroot: str, make_store: StoreMaker
) -> None:
    store = make_store(zk_hosts, zk_chroot)
    store.join("vm-a", {})
    config = tmp_path / "agent.yaml"
    config.write_text(f"cluster: alpha\nzookeeper:\n  hosts: {zk_hosts}\n  root: {zk_chroot}\nstate_file: null\n")
    run = _command("drain", "vm-a", "--config", str(config), "--reason", "kernel debugging")
    assert run.returncode == 0, run.stderr
    first, follow = run.stdout.strip().splitlines()
    assert first.startswith("group alpha: vm-a to be drained by hand (kernel debugging): its agent drains it once "
                            "the leader admits it into the maintenance budget"), first
    assert first.endswith(f"until: coordinator undrain vm-a --config {config}")
    assert follow == f"follow it with: coordinator status --config {config}"
    wait_until(lambda: "vm-a" in store.read_view("vm-a").drains, message="the drain in the view")
    again = _command("drain", "vm-a", "--config", str(config), "--reason", "other")
    assert "already drained by hand since" in again.stdout and "(kernel debugging), waiting for the maintenance " \
        "budget; kept as it is" in again.stdout, again.stdout
    undone = _command("undrain", "vm-a", "--config", str(config))
    assert undone.stdout.strip() == ("group alpha: drain by hand of vm-a undone: its agent puts it back in rotation "
                                     "unless an event holds it"), undone.stderr
    again_undone = _command("undrain", "vm-a", "--config", str(config))
    assert again_undone.stdout.strip() == "group alpha: vm-a was not drained by hand"
    missing = _command("drain", "vm-q", "--config", str(config), "--reason", "typo")
    assert missing.returncode == 1
    assert missing.stderr == ("coordinator: vm-q has never run an agent in group alpha (its VMs: vm-a): only a VM "
                              "whose agent runs can drain\n")
