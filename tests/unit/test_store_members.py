"""Whose is a member node another session holds (``coordinator.store.members``), and the identity of an
agent process it rests on (``coordinator.support.hostos``), with a fake ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.errors import DuplicateMember, StoreError
from coordinator.store.members import duplicate_member, predecessor
from coordinator.support.hostos import agent_identity, boot_id, process_running, process_start

OURS = {"host": "vm1", "boot_id": "b2", "pid": 200, "pid_start": "900", "started_at": 100.0}


def node(**fields: object) -> dict[str, object]:
    return {"host": "vm1", "boot_id": "b2", "pid": 100, "pid_start": "500", "started_at": 50.0, **fields}


def never_running(pid: int, start: str | None) -> bool | None:
    return False


def always_running(pid: int, start: str | None) -> bool | None:
    return True


def cannot_tell(pid: int, start: str | None) -> bool | None:
    return None


def test_this_hosts_agent_process_that_has_ended_is_a_predecessor() -> None:
    assert predecessor(node(), OURS, running=never_running) is not None
    assert predecessor(node(boot_id="b1"), OURS, running=always_running) is not None  # an earlier boot


@pytest.mark.parametrize("theirs", [
    node(host="vm2"),                 # another host
    node(started_at=100.0),           # not started before us
    node(started_at=150.0),
    node(host=None), node(boot_id=None), node(pid=None), node(pid=True), node(started_at=None),
    node(started_at="50"),
    {"vm": "vm1"},                    # says nothing of its process
])
def test_anything_not_proven_is_a_duplicate(theirs: dict[str, object]) -> None:
    assert predecessor(theirs, OURS, running=never_running) is None


def test_a_process_that_runs_or_cannot_be_seen_is_a_duplicate() -> None:
    assert predecessor(node(), OURS, running=always_running) is None
    assert predecessor(node(), OURS, running=cannot_tell) is None
    assert predecessor(node(boot_id="b1"), {**OURS, "boot_id": None}, running=never_running) is None


def test_the_duplicate_message_is_one_line_naming_who_holds_the_node() -> None:
    error = duplicate_member("vm1", 0x1F, node(host="web-7", pid=4242), 1_700_000_000.0)
    assert isinstance(error, StoreError) and isinstance(error, DuplicateMember)
    assert str(error) == (
        "another agent runs as vm1 (member node held by session 0x1f from host web-7 pid 4242 since "
        "2023-11-14T22:13:20+00:00): this agent stays out of rotation until it is gone; check vm_name in "
        "the configuration")
    assert "from host ? pid ? since ?" in str(duplicate_member("vm1", 1, None, None))


def _fake_proc(tmp_path: Path, pid: int, start: str) -> Path:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("1234-abcd\n")
    (tmp_path / str(pid)).mkdir()
    # The command name may hold spaces and parentheses.
    fields = ["S"] + [str(n) for n in range(4, 22)] + [start] + ["0"] * 10
    (tmp_path / str(pid) / "stat").write_text(f"{pid} (odd ) name) " + " ".join(fields) + "\n")
    return tmp_path


def test_identity_and_liveness_from_proc(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 321, "777")
    assert boot_id("linux", proc) == "1234-abcd"
    assert process_start(321, "linux", proc) == "777"
    assert process_running(321, "777", "linux", proc) is True
    assert process_running(321, None, "linux", proc) is True
    assert process_running(321, "778", "linux", proc) is False  # the pid was reused
    assert process_running(322, "777", "linux", proc) is False  # no such process
    assert boot_id("linux", tmp_path / "missing") is None


def test_identity_elsewhere_than_linux() -> None:
    assert boot_id("win32") is None and process_start(1, "win32") is None
    assert process_running(os.getpid(), None, "win32") is None  # never signalled: it would end the process
    identity = agent_identity("win32")
    assert identity["pid"] == os.getpid() and identity["boot_id"] is None and identity["host"]
