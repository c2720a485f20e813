"""``coordinator status`` for the whole group against a real ZooKeeper, run as the operator runs it (a
process of its own): what it shows of a group written through the store, that it writes nothing, and its
errors (no such cluster, ZooKeeper down). The group with real agents is in tests/e2e/test_group_status.py."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from coordinator.actions import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.decide import Policy
from coordinator.metrics import Metrics
from coordinator.models import Document, format_not_before, parse_document
from coordinator.store.base import EventRecord
from coordinator.testbed.processes import free_port
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.plugins.zookeeper import StoreMaker, wait_until

ROOT = Path(__file__).parent.parent.parent
#: What opening and closing a session costs the ensemble, whoever opens it: createSession and
#: closeSession are transactions (each moves the zxid by one); reads and pings are not.
SESSION_TRANSACTIONS = 2


def status_command(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("COORDINATOR__")}
    return subprocess.run([sys.executable, "-m", "coordinator", "status", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, check=False)


def bare_session_cost(server: LocalZooKeeper) -> int:
    """The zxid advance of a session that sends nothing (calibrates ``SESSION_TRANSACTIONS``)."""
    before = server.zxid()
    client = KazooClient(hosts=server.hosts, timeout=5.0)
    client.start(timeout=5)
    client.stop()
    client.close()
    return server.zxid() - before


@pytest.fixture
def group(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> Iterator[dict[str, Any]]:
    """A group written through the store: vm0 (leader) and vm1 live, vm9 absent, a Freeze on vm0 and vm1
    acknowledged by vm0 and admitted, vm0 out of rotation for it, a finished Reboot, and a pause node."""
    now = time.time()
    vm0 = make_store(zk_hosts, zk_chroot, "alpha")
    vm1 = make_store(zk_hosts, zk_chroot, "alpha")
    gone = make_store(zk_hosts, zk_chroot, "alpha")
    info = {"admin": "127.0.0.1:1", "probe": "http://127.0.0.1:2/health", "version": "9.9.9", "started_at": now - 60}
    vm0.join("vm0", {**info, "fault_domain": "1", "update_domain": "4"})
    vm1.join("vm1", info)
    gone.join("vm9", info)
    gone.stop()
    assert vm0.campaign("vm0")
    event = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
    vm0.publish_event(EventRecord(event, "Freeze", ("vm0", "vm1"), now + 600, "vm0", now - 20))
    vm0.admit(event, "vm0", now - 15)
    vm0.mark_out("vm0", (event,), now - 14)
    vm0.acknowledge(event, "vm0", now - 10)
    vm0.mark_absent("vm9", now - 5)
    vm0.publish_event(EventRecord("OLD-REBOOT", "Reboot", ("vm1",), now - 900, "vm1", now - 1200))
    vm0.mark_done("OLD-REBOOT", now - 300)
    client = KazooClient(hosts=zk_hosts, timeout=5.0)
    client.start(timeout=5)
    client.create(f"{zk_chroot}/alpha/pause", json.dumps({"reason": "kernel upgrade", "by": "alice",
                                                         "at": now - 120}).encode())
    yield {"event": event, "root": zk_chroot, "hosts": zk_hosts, "kazoo": client, "now": now}
    client.stop()
    client.close()


def test_status_shows_the_group_and_writes_nothing(group: dict[str, Any], zk_server: LocalZooKeeper) -> None:
    assert bare_session_cost(zk_server) == SESSION_TRANSACTIONS
    before = zk_server.zxid()
    run = status_command("--zookeeper", group["hosts"], "--root", group["root"], "--cluster", "alpha", "--json",
                         "--http-timeout", "0.5")
    after = zk_server.zxid()
    assert run.returncode == 0, run.stderr
    assert after - before == SESSION_TRANSACTIONS  # its session's own creation and close: no write at all
    data = json.loads(run.stdout)
    assert data["paused"]["reason"] == "kernel upgrade" and data["paused"]["by"] == "alice"
    assert data["leader"]["vm"] == "vm0" and data["leader"]["since"] is not None
    assert [m["vm"] for m in data["members"]] == ["vm0", "vm1"]
    vm0 = data["members"][0]
    assert (vm0["version"], vm0["placement"]["fault_domain"], vm0["placement"]["update_domain"]) == ("9.9.9", "1", "4")
    assert vm0["leader"] is True and vm0["admin"] == "127.0.0.1:1"
    assert vm0["agent"]["reachable"] is False and vm0["agent"]["url"] == "http://127.0.0.1:1/status"
    assert data["registered"] == ["vm0", "vm1", "vm9"]
    assert [(o["vm"], o["events"], o["member"]) for o in data["out_of_rotation"]] == [("vm0", [group["event"]], True)]
    assert [a["vm"] for a in data["absent"]] == ["vm9"]
    [event] = data["events"]
    assert (event["event_id"], event["type"], event["resources"]) == (group["event"], "Freeze", ["vm0", "vm1"])
    assert [a["vm"] for a in event["acks"]] == ["vm0"] and event["missing_acks"] == ["vm1"]
    assert event["admitted_at"] is not None and event["approval"] is None and event["done_at"] is None
    assert (event["approver"], event["approver_as_leader"], event["state"]) == ("vm0", False, "blocked")
    assert event["blockers"] == [
        {"kind": "paused", "vm": None, "reason": "approvals paused by alice: kernel upgrade", "lasting": False},
        {"kind": "not_acknowledged", "vm": "vm1", "reason": "vm1 has not acknowledged", "lasting": False}]
    assert (event["status"], event["status_reported_by"]) == ("Scheduled", None)  # no agent answered
    assert 590 < event["not_before_in_seconds"] <= 600
    assert [(d["event_id"], d["state"]) for d in data["done"]] == [("OLD-REBOOT", "done")]


def test_status_table_of_the_same_group(group: dict[str, Any]) -> None:
    run = status_command("--zookeeper", group["hosts"], "--root", group["root"], "--cluster", "alpha",
                         "--no-agents")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "PAUSED since 2 min ago" in out and "by alice: kernel upgrade" in out
    assert "Leader: vm0" in out
    assert f"Freeze {group['event']}" in out and "BLOCKED" in out
    assert "vm1 has not acknowledged" in out
    assert "in 10 min" in out
    assert "Recently finished" in out and "OLD-REBOOT" in out


def test_unknown_cluster_is_a_clear_one_line_error(group: dict[str, Any]) -> None:
    run = status_command("--zookeeper", group["hosts"], "--root", group["root"], "--cluster", "nosuch")
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("coordinator: no cluster 'nosuch' in ZooKeeper at ")
    assert f"{group['root']}/nosuch does not exist (clusters under {group['root']}: alpha)" in run.stderr


def test_zookeeper_down_is_a_one_line_error_and_exit_1() -> None:
    port = free_port()  # nothing listens there
    began = time.monotonic()
    run = status_command("--zookeeper", f"127.0.0.1:{port}", "--cluster", "demo", "--timeout", "1")
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr == (f"coordinator: cannot reach ZooKeeper at 127.0.0.1:{port}: no ZooKeeper connection to "
                          f"127.0.0.1:{port} within 1.0s\n")
    assert "Traceback" not in run.stderr
    assert time.monotonic() - began < 10


_SYS_TGKILL = 234  # x86-64 Linux
# ``python -m coordinator`` with Ctrl-C turned into KeyboardInterrupt even when this test run was started in
# the background by a shell without job control, which starts it (and so every child) with SIGINT ignored:
# a Python started so keeps ignoring it, as a background command should.
_INTERRUPTIBLE = [sys.executable, "-c", "import runpy, signal; "
                  "signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "runpy.run_module('coordinator', run_name='__main__', alter_sys=True)"]


@contextlib.contextmanager
def watching(group: dict[str, Any], *, as_json: bool = True) -> Iterator[subprocess.Popen[str]]:
    """``coordinator status --watch 30 [--json]`` on the group, Ctrl-C-able; killed at the end if still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR__")} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*_INTERRUPTIBLE, "status", "--zookeeper", group["hosts"], "--root", group["root"],
         "--cluster", "alpha", "--no-agents", *(["--json"] if as_json else []), "--watch", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_stops_on_a_ctrl_c_the_kernel_gave_to_another_thread(group: dict[str, Any]) -> None:
    """A process-wide signal may be delivered to any thread that does not block it; Python runs the handler
    on the main thread only, when it next runs Python code. Sent here to one of kazoo's threads (tgkill),
    as the kernel sometimes does: the main thread, waiting for the next change or the 30 s interval, must
    still notice within a moment (found: a full test run's Ctrl-C waited out the interval)."""
    with watching(group) as proc:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())
        others = [int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task") if int(tid) != proc.pid]
        assert others, "the command runs kazoo's threads"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(_SYS_TGKILL, proc.pid, others[0], signal.SIGINT) == 0
        began = time.monotonic()
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - began < 10  # the close is bounded at 5 s; the wait was up to 30 s


def test_watch_into_a_pipe_writes_each_frame_as_it_is_read(group: dict[str, Any]) -> None:
    """``coordinator status --watch | tee incident.log``: not a terminal, so no table redrawn in place (which
    wrote nothing until the command ended, then one frame): each read is written at once, under a line with
    the time it was read."""
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
    lines: queue.Queue[str] = queue.Queue()
    with watching(group, as_json=False) as proc:
        assert proc.stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()

        def frame() -> list[str]:
            """The next frame: from its time line to the members' table, read as it is written."""
            while not stamp.search(lines.get(timeout=10)):
                pass
            body = [lines.get(timeout=5)]
            while "Members" not in body[-1]:
                body.append(lines.get(timeout=5))
            return body

        assert any("PAUSED" in line for line in frame())
        group["kazoo"].delete(f"{group['root']}/alpha/pause")
        began = time.monotonic()
        assert not any("PAUSED" in line for line in frame())
        assert time.monotonic() - began < 5  # written as read, not held until the end
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0


def test_watch_follows_changes_until_interrupted(group: dict[str, Any]) -> None:
    with watching(group) as proc:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["paused"]["by"] == "alice"
        began = time.monotonic()
        group["kazoo"].delete(f"{group['root']}/alpha/pause")  # a watch fires: no waiting for the 30 s
        second = json.loads(proc.stdout.readline())
        assert second["paused"] is None
        assert time.monotonic() - began < 5
        proc.send_signal(signal.SIGINT)
        # The command waits for kazoo's close 5 s at most (it waits for its writer up to the session timeout).
        assert proc.wait(timeout=15) == 0


# -- the history (--history) --------------------------------------------------------------------------------

HISTORY_EVENT = "5AA1A3F2-3C39-4E5B-9C4B-9E3E5D2B1A01"


class SharedImds:
    """One IMDS document that every agent of the test reads; an approval records who posted it and starts the
    event, as the platform does."""

    def __init__(self, resources: list[str]) -> None:
        self.events = [{"EventId": HISTORY_EVENT, "EventStatus": "Scheduled", "EventType": "Reboot",
                        "ResourceType": "VirtualMachine", "Resources": resources,
                        "NotBefore": format_not_before(datetime.fromtimestamp(time.time() + 900, UTC))}]
        self.incarnation = 1
        self.posted: list[list[str]] = []

    def get_document(self) -> Document:
        return parse_document({"DocumentIncarnation": self.incarnation, "Events": self.events})

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        self.posted.append(list(event_ids))
        for event in self.events:
            event["EventStatus"], event["NotBefore"] = "Started", ""
        self.incarnation += 1

    def end(self) -> None:
        self.events, self.incarnation = [], self.incarnation + 1


@pytest.fixture
def finished(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> dict[str, Any]:
    """A group of three agents on ZooKeeper (the default budget: one event at a time, one VM kept serving)
    through one Reboot of vm0 and vm1, from announced to gone: admitted by the leader, approved on the acks
    of both, Started, gone from the documents, its record marked done, and moved to the history once both
    VMs serve again (``archive_after``), where ``coordinator status`` reads it."""
    imds = SharedImds(["vm0", "vm1"])
    stores = [make_store(zk_hosts, zk_chroot, "beta") for _ in range(3)]
    agents = [Agent(vm=f"vm{i}", imds=imds, store=store, actions=[ProbeAction(ProbeState())],
                    policy=Policy(drain_wait=0.0, gone_after=1.0, archive_after=0.5),
                    metrics=Metrics(CollectorRegistry()),
                    poll_interval=0.1) for i, store in enumerate(stores)]

    def cycle_until(condition: Callable[[], bool], message: str) -> None:
        def step() -> bool:
            for agent in agents:
                agent.cycle()
            return condition()

        wait_until(step, timeout=30, interval=0.05, message=message)

    began = time.time()
    cycle_until(lambda: bool(imds.posted), "the event approved")
    cycle_until(lambda: all(a.status()["events"] and a.status()["events"][0]["status"] == "Started"
                            for a in agents[:2]), "the event seen Started")
    imds.end()
    cycle_until(lambda: stores[2].read_view("vm2").records[HISTORY_EVENT].done_at is not None,
                "the record marked done")
    cycle_until(lambda: HISTORY_EVENT not in stores[2].read_view("vm2").records, "the record moved to the history")
    assert stores[2].read_history()[HISTORY_EVENT].done_at is not None
    leader = agents[0].status()["cluster"]["leader"]
    return {"hosts": zk_hosts, "root": zk_chroot, "began": began, "leader": leader}


def test_history_shows_a_finished_event_from_announced_to_gone(finished: dict[str, Any]) -> None:
    address = ("--zookeeper", finished["hosts"], "--root", finished["root"], "--cluster", "beta")
    run = status_command(*address, "--history", "--json")
    assert run.returncode == 0, run.stderr
    history = json.loads(run.stdout)
    assert (history["cluster"], history["budgeted"], history["kept_for_seconds"]) == ("beta", True, 7 * 86400)
    [event] = history["events"]
    assert (event["event_id"], event["type"], event["resources"]) == (HISTORY_EVENT, "Reboot", ["vm0", "vm1"])
    assert event["recorded"] is True and event["published_by"] in ("vm0", "vm1")
    assert event["admitted"]["by"] == finished["leader"]
    approval = event["approval"]
    assert (approval["by"], approval["as_leader"], approval["acks"]) == ("vm0", False, ["vm0", "vm1"])
    acked = {vm: datetime.fromisoformat(at).timestamp() for vm, at in approval["acked_at"].items()}
    assert set(acked) == {"vm0", "vm1"}
    times = [datetime.fromisoformat(event[k]).timestamp() if k != "approval" and k != "admitted" else
             datetime.fromisoformat(event[k]["at"]).timestamp()
             for k in ("published_at", "admitted", "approval", "started_at", "done_at")]
    assert finished["began"] - 1 <= times[0] and times == sorted(times)  # in the order it went through
    assert all(times[0] <= at <= times[2] for at in acked.values())  # acked after announced, before approved
    text = status_command(*address, "--history")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"Reboot {HISTORY_EVENT}  on vm0, vm1" in out
    for line in ("announced", f"by the leader {finished['leader']}",
                 "by vm0 as the first live VM named in Resources", "released by the acks of vm0, vm1",
                 "drained for it, each by its own acknowledgement",
                 "first seen Started in the IMDS document of the agent that marked it done",
                 "it left the IMDS documents and its record was marked done",
                 "Kept as long as the records are", "done_retention_seconds: 604800"):
        assert line in out, (line, out)
    assert "None" not in out


def test_history_is_refused_with_watch_in_one_line(finished: dict[str, Any]) -> None:
    run = status_command("--zookeeper", finished["hosts"], "--root", finished["root"], "--cluster", "beta",
                         "--history", "--watch")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == "coordinator: status: --history shows what the store keeps, once: it does not combine " \
                         "with --watch\n"


def test_watch_stopped_by_sigterm_while_it_connects_ends_as_ctrl_c_does() -> None:
    """A supervisor or ``timeout`` may stop ``--watch`` before its first frame (ZooKeeper slow to answer, or
    not there): it ends with status 0, as between two frames, not killed by the signal (143 under
    ``timeout --preserve-status``)."""
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT)}.items() if not k.startswith("COORDINATOR__")}
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "coordinator", "status", "--zookeeper", f"127.0.0.1:{port}",
                             "--cluster", "beta", "--watch", "1", "--timeout", "30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        time.sleep(2.0)  # started, connecting
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
