"""Scale: many groups of agents on one ZooKeeper, several agents per process.

    .venv/bin/python bench/run.py --only scale            # 20 groups of 10 agents, as docs/benchmarks.md
    .venv/bin/python bench/scale.py --worker SPEC.json    # (internal) one process of agents

Each group has its own IMDS simulator process; the agents of all groups share one ZooKeeper server and
run, many to a process, in worker processes (each agent with its own IMDS client, poller, ZooKeeper
session, loop and executor, as ``coordinator run`` wires them, without the HTTP surface and the peer
probes: the budget counts VMs by their ``/out`` nodes here). In each round every group gets a Freeze
on two of its VMs at once; the gate latency of each event is the simulator's POST time minus the
ZooKeeper ctime of its last ack, and an event not approved within a minute counts as missed.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from azuresim.client import SimControl  # noqa: E402
from bench.group import wait_for  # noqa: E402
from bench.simulator import start_simulator  # noqa: E402
from coordinator.actions import ProbeAction, ProbeState  # noqa: E402
from coordinator.agent import Agent  # noqa: E402
from coordinator.decide import Policy  # noqa: E402
from coordinator.imds import ImdsClient  # noqa: E402
from coordinator.metrics import Metrics  # noqa: E402
from coordinator.poller import ImdsPoller  # noqa: E402
from coordinator.state import StateFile  # noqa: E402
from coordinator.store.zookeeper import ZooKeeperStore  # noqa: E402
from coordinator.testbed.processes import stop_process  # noqa: E402
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper  # noqa: E402

__all__ = ["bench_scale"]

ZK_ROOT = "/azure-maintenance"
POLICY = Policy(drain_wait=0.2, return_wait=0.5, gone_after=1.0, session_timeout=15.0, peer_fresh=None)


# -- a worker: many agents in one process -------------------------------------------------------------


def _arrived(ref: list[Agent]) -> None:
    if ref:
        ref[0].reading_arrived()


def _worker(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads, closers = [], []
    for agent_spec in spec["agents"]:
        imds = ImdsClient(agent_spec["imds"], request_timeout=5, first_request_timeout=10)
        ref: list[Agent] = []
        poller = ImdsPoller(functools.partial(imds.get_document, attempts=1), interval=1.0,
                            on_reading=functools.partial(_arrived, ref))
        store = ZooKeeperStore(spec["zk"], ZK_ROOT, agent_spec["group"], session_timeout=15, operation_timeout=5)
        state = Path(spec["workdir"]) / f"state-{agent_spec['group']}-{agent_spec['vm']}.json"
        agent = Agent(vm=agent_spec["vm"], imds=imds, store=store, actions=[ProbeAction(ProbeState())],
                      policy=replace(POLICY, **spec.get("policy", {})), metrics=Metrics(CollectorRegistry()),
                      readings=poller, idle_cycle=5.0,
                      state_file=StateFile(state))
        ref.append(agent)
        thread = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{agent_spec['vm']}", daemon=True)
        thread.start()
        poller.start()
        threads.append((agent, thread))
        closers.append((poller, store, imds))
    Path(spec["ready"]).write_text("ready")
    while not stop.wait(0.5):
        pass
    for agent, _ in threads:
        agent.wake()
    for _, thread in threads:
        thread.join(5)
    for poller, store, imds in closers:
        poller.stop(timeout=0)
        store.stop()
        imds.close()
    return 0


# -- the benchmark ---------------------------------------------------------------------------------------


def bench_scale(zk: LocalZooKeeper | LocalEnsemble, workdir: Path, *, groups: int, size: int, workers: int,
                rounds: int, one_simulator: bool = False, progress: Any = print) -> dict[str, Any]:
    """``groups`` groups of ``size`` agents on ``zk`` (one server or an ensemble), each group with an IMDS
    simulator of its own, or (``one_simulator``) all of them in one simulator where each group is a delivery
    unit of its own (``--unit-size``), as the placement groups of one scale set are."""
    run = uuid.uuid4().hex[:6]
    if one_simulator:  # VM names unique across the groups: they share one simulator
        names = {f"s{run}g{g}": [f"g{g}vm{i}" for i in range(size)] for g in range(groups)}
    else:
        names = {f"s{run}g{g}": [f"vm{i}" for i in range(size)] for g in range(groups)}
    sims: dict[str, tuple[subprocess.Popen[bytes], SimControl, dict[str, str]]] = {}
    procs: list[subprocess.Popen[bytes]] = []
    observer = KazooClient(hosts=zk.hosts)
    gate_ms: list[float] = []
    missed: list[str] = []
    unmeasured = 0
    approved_per_round: list[int] = []
    stopped = ""  # why the run ended before its last round, if it did
    try:
        if one_simulator:
            progress(f"bench: scale: one simulator of {groups} delivery units")
            every = [vm for vms in names.values() for vm in vms]
            shared = _start_sim(workdir, "all", every, ["--unit-size", str(size)])
            sims = {group: shared for group in names}
        else:
            progress(f"bench: scale: {groups} simulators")
            for group, vms in names.items():
                sims[group] = _start_sim(workdir, group, vms)
        specs: list[list[dict[str, str]]] = [[] for _ in range(workers)]
        index = 0
        for group, vms in names.items():
            for vm in vms:
                specs[index % workers].append({"group": group, "vm": vm, "imds": sims[group][2][vm]})
                index += 1
        progress(f"bench: scale: {groups * size} agents in {workers} processes")
        for w, agents in enumerate(specs):
            spec = workdir / f"worker-{w}.json"
            ready = workdir / f"worker-{w}.ready"
            spec.write_text(json.dumps({"agents": agents, "zk": zk.hosts, "workdir": str(workdir),
                                        "ready": str(ready)}))
            log = open(workdir / f"worker-{w}.log", "ab")  # noqa: SIM115 - owned by the child
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__)), "--worker", str(spec)],
                                          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        observer.start(timeout=10)
        wait_for(lambda: all(_members(observer, g) >= size for g in names), 60 + groups * size / 5,
                 "every agent to join", interval=0.2)
        wait_for(lambda: all(_serving(observer, g, size) for g in names), 120, "every VM to serve", interval=0.2)
        for r in range(rounds):
            events = {g: sims[g][1].schedule("Freeze", [vms[(2 * r) % size], vms[(2 * r + 1) % size]])["event_id"]
                      for g, vms in names.items()}
            acks: dict[str, dict[str, float]] = {g: {} for g in names}
            posted: dict[str, float] = {}
            seen = {g: 0 for g in names}  # the simulator's log is read from where the last look ended
            deadline = time.monotonic() + 60
            while len(posted) < len(events) and time.monotonic() < deadline:
                for g, eid in events.items():
                    if g in posted:
                        continue
                    for vm in (names[g][(2 * r) % size], names[g][(2 * r + 1) % size]):
                        if vm not in acks[g]:
                            stat = observer.exists(f"{ZK_ROOT}/{g}/events/{eid}/acks/{vm}")
                            if stat is not None:
                                acks[g][vm] = stat.ctime / 1000
                    entries = sims[g][1].log(since=seen[g], kind="approval")
                    if entries:
                        seen[g] = entries[-1]["seq"]
                    post = next((e["t"] for e in entries
                                 if eid in e.get("event_ids", ()) and e.get("status") == 200), None)
                    if post is not None:
                        posted[g] = post
                time.sleep(0.2)  # the harness's own load stays small beside 200 agents on 2 cores
            for g, eid in events.items():
                if g not in posted:
                    missed.append(eid)
                elif len(acks[g]) == 2:
                    gate_ms.append((posted[g] - max(acks[g].values())) * 1e3)
                else:
                    unmeasured += 1  # the acks came and went between two looks
            progress(f"bench: scale: round {r + 1}/{rounds}: {len(posted)}/{len(events)} approved")
            approved_per_round.append(len(posted))
            try:
                wait_for(lambda: all(not control.events()["events"] for _, control, _ in _distinct(sims)), 60,
                         "every event to end", interval=0.2)
                wait_for(lambda: all(_serving(observer, g, size) for g in names), 60, "every VM to serve",
                         interval=0.2)
            except TimeoutError as exc:
                stopped = f"after round {r + 1}: {exc}"  # the group no longer keeps up: what was seen is kept
                progress(f"bench: scale: stopped {stopped}")
                break
    finally:
        for proc in procs:
            stop_process(proc, timeout=20)
        for proc, control, _ in _distinct(sims):
            control.close()
            stop_process(proc, timeout=10)
        observer.stop()
        observer.close()
    return {"groups": groups, "size": size, "workers": workers, "rounds": rounds, "gate_ms": gate_ms,
            "missed": missed, "unmeasured": unmeasured, "approved_per_round": approved_per_round,
            "stopped": stopped, "ensemble": getattr(zk, "size", 1), "one_simulator": one_simulator}


def _distinct(sims: dict[str, tuple[subprocess.Popen[bytes], SimControl, dict[str, str]]]
              ) -> list[tuple[subprocess.Popen[bytes], SimControl, dict[str, str]]]:
    """Each simulator once (with ``one_simulator`` every group maps to the same one)."""
    return list({id(sim): sim for sim in sims.values()}.values())


def _start_sim(workdir: Path, group: str, vms: list[str],
               extra: tuple[str, ...] | list[str] = ()) -> tuple[subprocess.Popen[bytes], SimControl, dict[str, str]]:
    proc, info = start_simulator(workdir, vms, ["--started-for", "2", *extra], name=f"sim-{group}", timeout=30)
    return proc, SimControl(info["control"]), dict(info["vms"])


def _members(observer: KazooClient, group: str) -> int:
    try:
        return len(observer.get_children(f"{ZK_ROOT}/{group}/members"))
    except Exception:
        return 0


def _serving(observer: KazooClient, group: str, size: int) -> bool:
    """Every VM joined and none out of rotation (no /out node)."""
    try:
        return (len(observer.get_children(f"{ZK_ROOT}/{group}/members")) >= size
                and not observer.get_children(f"{ZK_ROOT}/{group}/out"))
    except Exception:
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one worker process of the scale benchmark")
    parser.add_argument("--worker", type=Path, required=True)
    raise SystemExit(_worker(parser.parse_args().worker))
