"""``coordinator fleet`` run as the operator runs it (a process of its own) against the simulator's Resource
Graph and a real ZooKeeper: two groups written through the store (web: web_0 and web_1; db: db0, with db1
registered and gone) and a VM, lone, that runs no agent. The simulator's events are the Resource Graph rows;
the groups' records say who holds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.store.base import EventRecord
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.plugins.simulator import RunningSimulator, SimulatorFactory
from tests.plugins.zookeeper import StoreMaker

ROOT = Path(__file__).parent.parent.parent
SUB = "00000000-0000-0000-0000-000000000000"  # the simulator's VMs' subscription
E_WEB = "A1B2C3D4-0000-4000-8000-000000000001"
E_DB = "A1B2C3D4-0000-4000-8000-000000000002"
E_LONE = "A1B2C3D4-0000-4000-8000-000000000003"
E_GONE = "A1B2C3D4-0000-4000-8000-000000000004"
RG = f"/subscriptions/{SUB}/resourceGroups/maintenance-sim/providers/Microsoft.Compute"
#: What opening and closing a session costs the ensemble: createSession and closeSession are transactions.
SESSION_TRANSACTIONS = 2


def fleet_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}.items()
           if not k.startswith("COORDINATOR__")}
    return subprocess.run([sys.executable, "-m", "coordinator", "fleet", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, check=False)


@pytest.fixture
def fleet(imds_sim: SimulatorFactory, zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> dict[str, Any]:
    sim = imds_sim(("web_0", "web_1", "db0", "db1", "lone"),
                   extra_args=["--arm", "127.0.0.1:0", "--units", "web=web_0,web_1/db=db0,db1",
                               "--graph-page-size", "2"])
    sim.control.set_role("web_0", "reader")  # the identity the command uses: web_0's, through its IMDS port
    now = time.time()
    scheduled = {event_id: sim.control.schedule(kind, vms, event_id=event_id, not_before_in=900)
                 for event_id, kind, vms in ((E_WEB, "Freeze", ["web_0"]), (E_DB, "Reboot", ["db0"]),
                                             (E_LONE, "Redeploy", ["lone"]), (E_GONE, "Freeze", ["web_1"]))}
    sim.control.cancel(E_GONE)  # deleted before it started: Canceled
    info = {"admin": "127.0.0.1:1", "probe": "http://127.0.0.1:2/health", "version": "9.9.9", "started_at": now - 60}
    web0, web1 = make_store(zk_hosts, zk_chroot, "web"), make_store(zk_hosts, zk_chroot, "web")
    web0.join("web_0", info)
    web1.join("web_1", info)
    assert web0.campaign("web_0")
    web0.publish_event(EventRecord(E_WEB, "Freeze", ("web_0",), now + 900, "web_0", now - 5))
    web0.acknowledge(E_WEB, "web_0", now - 4)
    web0.admit(E_WEB, "web_0", now - 3)
    db0, gone = make_store(zk_hosts, zk_chroot, "db"), make_store(zk_hosts, zk_chroot, "db")
    gone.join("db1", info)
    gone.stop()
    db0.join("db0", info)
    assert db0.campaign("db0")
    db0.publish_event(EventRecord(E_DB, "Reboot", ("db0",), now + 900, "db0", now - 5))
    # A record of the web group that Resource Graph does not list (its scale set does not publish there).
    web0.publish_event(EventRecord("B0000000-0000-4000-8000-00000000000F", "Reboot", ("web_1",), now + 600, "web_1",
                                   now - 2))
    args = ["--subscription", SUB, "--zookeeper", zk_hosts, "--root", zk_chroot, "--imds-url", sim.urls["web_0"],
            "--arm-url", sim.arm_url]
    return {"sim": sim, "scheduled": scheduled, "args": args}


def test_fleet_json_joins_the_graph_with_both_groups_and_the_vm_without_agent(fleet: dict[str, Any],
                                                                             zk_server: LocalZooKeeper) -> None:
    before = zk_server.zxid()
    run = fleet_command(*fleet["args"], "--json")
    assert run.returncode == 0, run.stderr
    # Three sessions (one lists the root, one per group), each created and closed: no write at all.
    assert zk_server.zxid() - before == 3 * SESSION_TRANSACTIONS
    data = json.loads(run.stdout)
    groups = {g["cluster"]: g for g in data["groups"]}
    assert set(groups) == {"web", "db"}
    assert groups["web"]["members"] == ["web_0", "web_1"] and groups["web"]["leader"] == "web_0"
    assert groups["db"]["members"] == ["db0"] and groups["db"]["registered"] == ["db0", "db1"]
    assert all(g["error"] is None for g in data["groups"])

    events = {e["event_id"]: e for e in data["events"]}
    assert set(events) == {E_WEB, E_DB}
    web = events[E_WEB]
    assert (web["type"], web["status"], web["unit"]) == ("Freeze", "Scheduled", f"{RG}/availabilitySets/web")
    assert 800 < web["not_before_in_seconds"] <= 900
    assert web["vms"] == [{"vm": "web_0", "group": "web", "agent": True}]
    [record] = web["records"]
    assert record["cluster"] == "web" and record["acks"] == ["web_0"] and record["admitted_at"] is not None
    assert record["approver"] == "web_0" and record["state"] in ("approvable", "blocked")
    db = events[E_DB]
    assert db["vms"] == [{"vm": "db0", "group": "db", "agent": True}]
    [db_record] = db["records"]
    assert db_record["state"] == "blocked" and db_record["missing_acks"] == ["db0"]
    assert {"kind": "not_acknowledged", "vm": "db0", "reason": "db0 has not acknowledged",
            "lasting": False} in db_record["blockers"]

    [lone] = data["uncoordinated"]
    assert (lone["event_id"], lone["type"], lone["unit"]) == (E_LONE, "Redeploy", f"{RG}/virtualMachines/lone")
    assert lone["vms"] == [{"vm": "lone", "group": None, "agent": False}] and lone["records"] == []

    [canceled] = data["finished"]
    assert (canceled["event_id"], canceled["status"]) == (E_GONE, "Canceled")
    assert canceled["updated_at"] is not None and canceled["not_before"] is not None
    assert [(u["cluster"], u["type"]) for u in data["unlisted"]] == [("web", "Reboot")]
    # Four rows on pages of two: the command followed $skipToken.
    assert fleet["sim"].control.arm_calls()["calls"]["graph_query"] == 2


def test_fleet_table_shows_each_section_and_never_none(fleet: dict[str, Any]) -> None:
    run = fleet_command(*fleet["args"])
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "Pending events coordinated by a group (2)" in out
    assert "Pending events no agent coordinates" in out and "lone: no agent" in out
    assert "web_0: agent in web" in out and "db0: agent in db" in out
    assert "held: db0 has not acknowledged" in out and "acks web_0" in out
    assert "availabilitySets/web" in out and "virtualMachines/lone" in out
    assert "Finished in the last 24 h (1)" in out and "Canceled" in out
    assert "registered, no live agent: db1" in out
    assert "Group records Resource Graph does not list (1)" in out
    assert "None" not in out and "null" not in out


def test_fleet_waits_out_a_429_and_names_the_role_on_403(fleet: dict[str, Any]) -> None:
    sim: RunningSimulator = fleet["sim"]
    sim.control.add_azure_fault("graph", status=429, retry_after=1)
    began = time.monotonic()
    run = fleet_command(*fleet["args"], "--json")
    assert run.returncode == 0, run.stderr
    assert time.monotonic() - began >= 1.0
    assert {e["event_id"] for e in json.loads(run.stdout)["events"]} == {E_WEB, E_DB}
    assert sim.control.arm_calls()["statuses"]["graph_query 429"] == 1

    sim.control.set_role("web_0", "none")
    refused = fleet_command(*fleet["args"])
    assert refused.returncode == 1 and refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line.startswith("coordinator: fleet: this VM's system-assigned identity may not read the scheduled "
                           "events (403 AuthorizationFailed: ")
    assert line.endswith(f"give it the Reader role on subscription(s) {SUB}")


def test_fleet_without_a_token_is_one_line(fleet: dict[str, Any]) -> None:
    run = fleet_command(*fleet["args"][:-4], "--imds-url", "http://127.0.0.1:9", "--arm-url", fleet["sim"].arm_url,
                        "--timeout", "2")
    assert run.returncode == 1
    [line] = run.stderr.splitlines()
    assert line.startswith("coordinator: fleet: no token for this VM's system-assigned identity: ")
    assert "--auth cli" in line


def test_rows_carry_what_imds_serves(fleet: dict[str, Any]) -> None:
    sim: RunningSimulator = fleet["sim"]
    served = {e["EventId"]: e["NotBefore"] for e in sim.control.document("web_0")["Events"]}
    rows = {r["name"]: r["properties"] for r in sim.control.graph_settings()["rows"]}
    assert rows[E_WEB]["NotBefore"] == served[E_WEB]
    # Canceled at once, before any sync of the rows saw it current: its NotBefore is still the one served.
    assert rows[E_GONE]["NotBefore"] == fleet["scheduled"][E_GONE]["not_before_text"]
    assert rows[E_GONE]["EventStatus"] == "Canceled" and rows[E_LONE]["EventStatus"] == "Scheduled"
    assert rows[E_GONE]["Description"] == fleet["scheduled"][E_GONE]["description"]


def test_fleet_takes_zookeeper_root_and_imds_from_an_agents_configuration(fleet: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    args = dict(zip(fleet["args"][::2], fleet["args"][1::2], strict=True))
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"cluster": "web", "vm_name": "web_0",
                                  "zookeeper": {"hosts": args["--zookeeper"], "root": args["--root"]},
                                  "imds": {"url": args["--imds-url"]}}))
    run = fleet_command("--subscription", SUB, "--config", str(config), "--arm-url", args["--arm-url"], "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["policy"] == str(config) and data["root"] == args["--root"]
    assert {g["cluster"] for g in data["groups"]} == {"web", "db"}
    assert {e["event_id"] for e in data["events"]} == {E_WEB, E_DB}


def test_fleet_watch_reads_again_and_stops_on_sigterm(fleet: dict[str, Any]) -> None:
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT)}.items() if not k.startswith("COORDINATOR__")}
    process = subprocess.Popen([sys.executable, "-m", "coordinator", "fleet", *fleet["args"], "--json", "--watch", "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        fleet["sim"].control.cancel(E_LONE)  # the next read shows it Canceled
        second = json.loads(process.stdout.readline())
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert [e["event_id"] for e in first["uncoordinated"]] == [E_LONE]
    assert second["uncoordinated"] == []
    assert {e["event_id"]: e["status"] for e in second["finished"]} == {E_GONE: "Canceled", E_LONE: "Canceled"}
    assert second["read_at"] > first["read_at"]
