"""What the end-to-end tests share: reading the simulator's log and the agents, and the checks of the
two safety properties against the ``Observer``'s independent record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from azuresim.client import SimControl
from coordinator.testbed.cluster import LocalCluster
from tests.e2e.observer import Observer

ClusterFactory = Callable[..., LocalCluster]
VMS = ("vm0", "vm1", "vm2")


def sim(cluster: LocalCluster) -> SimControl:
    assert cluster.sim is not None
    return cluster.sim


def serving(cluster: LocalCluster, vms: tuple[str, ...] = VMS) -> bool:
    return all(cluster.agents[vm].probe() == 200 for vm in vms)


def gone(cluster: LocalCluster, event_id: str) -> bool:
    return sim(cluster).event(event_id) is None


def approvals(cluster: LocalCluster, event_id: str) -> list[dict[str, Any]]:
    return [e for e in sim(cluster).log(kind="approval") if event_id in e["accepted"]]


def transitions(cluster: LocalCluster, event_id: str) -> list[tuple[str | None, str | None, str]]:
    return [(e["from"], e["to"], e["reason"]) for e in sim(cluster).log(kind="transition") if e["event_id"] == event_id]


def transition(cluster: LocalCluster, event_id: str, to: str | None) -> dict[str, Any]:
    return next(e for e in sim(cluster).log(kind="transition") if e["event_id"] == event_id and e["to"] == to)


def acked(observer: Observer, event_id: str, *vms: str) -> bool:
    return all((event_id.upper(), vm) in observer.seen.ack_ctime for vm in vms)


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (T: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def probes_between(observer: Observer, vm: str, start: float, end: float) -> list[int | None]:
    return [code for t, code in list(observer.seen.probes.get(vm, [])) if start <= t <= end]


def register_agents(cluster: LocalCluster, *vms: str) -> dict[str, int]:
    """Tell the simulator which processes stand for these VMs (their agents); returns the PIDs."""
    pids = {}
    for vm in vms:
        pid = cluster.agents[vm].pid
        assert pid is not None
        sim(cluster).register_pids(vm, [pid])
        pids[vm] = pid
    return pids


def assert_no_approval_before_acks(cluster: LocalCluster, observer: Observer) -> None:
    """Every approval the simulator accepted came after the ack of every VM its event names."""
    log = sim(cluster).log()
    resources: dict[str, list[str]] = {}
    for entry in log:
        if entry["kind"] == "transition":
            resources.setdefault(entry["event_id"], entry["resources"])
    for approval in (e for e in log if e["kind"] == "approval"):
        for event_id in approval["accepted"]:
            for vm in resources[event_id]:
                ack = observer.seen.ack_ctime.get((event_id.upper(), vm.lower()))
                assert ack is not None, f"{event_id} approved by {approval['vm']} without an ack from {vm}"
                assert ack <= approval["t"], f"{event_id} approved {ack - approval['t']:.3f} s before {vm}'s ack"


def assert_recovered(cluster: LocalCluster, observer: Observer, drained: set[str]) -> None:
    """Every VM serves again; those in ``drained`` did drain (503 seen), the others never did."""
    cluster.wait(lambda: serving(cluster), 20, "every VM serving again")
    for vm in VMS:
        codes = observer.seen.probe_codes(vm)
        if vm in drained:
            assert 503 in codes, (vm, codes)
        else:
            assert 503 not in codes, (vm, codes)
    assert all(agent.alive() for agent in cluster.agents.values())




def waiting_for(cluster: LocalCluster, vm: str, fragment: str) -> bool:
    """Whether ``vm``'s agent reports an event waiting for a reason containing ``fragment``."""
    status = cluster.agents[vm].status() or {}
    return any(fragment in reason for e in status.get("events", []) for reason in e["waiting_for"])


def assert_acked_before_approval(observer: Observer, cluster: LocalCluster, event_id: str,
                                 vms: set[str]) -> dict[str, Any]:
    """Exactly one approval of ``event_id``, after the acks of ``vms``; returns the approval entry."""
    posted = approvals(cluster, event_id)
    assert len(posted) == 1, posted
    acks = {vm: t for (eid, vm), t in observer.seen.ack_ctime.items() if eid == event_id.upper()}
    assert set(acks) >= vms, acks
    assert posted[0]["t"] >= max(acks[vm] for vm in vms)
    return posted[0]
