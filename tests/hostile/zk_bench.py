"""Garbage in the ZooKeeper nodes an agent reads, on a real server, judged by what reaches IMDS.

One trial: a group whose event ``E`` names vm0 and vm1. vm0 runs a real agent (the ZooKeeper store, the
real IMDS client against the simulator); vm1 is a member but never drains, so ``E`` must never be
approved. Garbage goes into nodes of the group's namespace (``coordinator.store.zk_paths``), some before
the agent's first cycle (member, registry, leader, pause, absence, out-of-rotation nodes, the event
record, records of other events, names that are not canonical), some once vm0 has acknowledged (vm1's
ack, the approval, the admission). Then the agent cycles on. The trial fails on a cycle that raises
(a crash), on any approval POSTed (unsafe: vm1 never drained), and on any change to the server's tree
outside the group's root.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, ZookeeperError
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.decide import Phase
from coordinator.metrics import Metrics
from coordinator.state import StateFile
from coordinator.store.zk_paths import ZooKeeperPaths
from coordinator.store.zookeeper import ZooKeeperStore
from tests.doubles import Clock, InlineExecutor
from tests.hostile.imds_bench import POLICY, WALL, ImdsBench, _RecordingImds, valid_not_before
from tests.hostile.inputs import EVENT_ID, OTHER_ID, encode

__all__ = ["TARGETS", "Garbage", "ZkBench", "ZkTrial"]

log = logging.getLogger(__name__)
CLUSTER = "alpha"

# name -> (when it is written: "before" the agent's first cycle or "after" vm0 acknowledged, the path below
# the group's base, what a node there would claim of somebody else)
TARGETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "member-vm1": ("before", "members/vm1", {"vm": "vm0"}),
    "registry-vm1": ("before", "registry/vm1", {"vm": "vm0", "first_seen": 1.0}),
    "leader": ("before", "leader", {"vm": "vm1", "since": 1.0}),
    "pause": ("before", "pause", {"reason": "maintenance", "by": "vm1", "at": 1.0}),
    "absent-vm1": ("before", "absent/vm1", {"since": 1.0}),
    "out-vm1": ("before", "out/vm1", {"vm": "vm0", "since": 1.0, "events": [OTHER_ID]}),
    "out-vm0": ("before", "out/vm0", {"vm": "vm1", "since": 1.0, "events": []}),
    "record": ("before", f"events/{EVENT_ID}", {
        "event_id": OTHER_ID, "event_type": "Reboot", "resources": ["vm0"], "published_by": "vm1",
        "published_at": 1.0}),
    "other-record": ("before", f"events/{OTHER_ID}", {
        "event_id": EVENT_ID, "event_type": "Reboot", "resources": ["vm1"], "published_by": "vm1",
        "published_at": 1.0}),
    "other-ack": ("before", f"events/{OTHER_ID}/acks/vm1", {"vm": "vm1", "at": 1.0}),
    "member-odd-name": ("before", "members/VM1", {"vm": "vm1"}),
    "event-odd-name": ("before", f"events/{EVENT_ID.lower()}", {"event_type": "Reboot", "published_by": "vm1",
                                                                "published_at": 1.0}),
    "ack-vm1": ("after", f"events/{EVENT_ID}/acks/vm1", {"vm": "vm0", "at": 1.0}),
    "ack-odd-name": ("after", f"events/{EVENT_ID}/acks/VM1", {"vm": "vm1", "at": 1.0}),
    "approval": ("after", f"events/{EVENT_ID}/approval", {"by": "vm1", "at": 1.0, "as_leader": True}),
    "admitted": ("after", f"events/{EVENT_ID}/admitted", {"by": "vm1", "at": 1.0}),
}


@dataclass(frozen=True)
class Garbage:
    target: str
    data: bytes

    @property
    def when(self) -> str:
        return TARGETS[self.target][0]

    def path(self, paths: ZooKeeperPaths) -> str:
        return f"{paths.base}/{TARGETS[self.target][1]}"


@dataclass
class ZkTrial:
    targets: list[str]
    crashes: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)
    posts: int = 0  # approvals POSTed
    outside: list[str] = field(default_factory=list)  # nodes changed outside the group's root


def tree(client: KazooClient, path: str = "/", skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every node below ``path`` with its data, leaving out the subtrees in ``skip`` and ``/zookeeper``."""
    found: dict[str, bytes] = {}
    stack = [path]
    while stack:
        node = stack.pop()
        if node == "/zookeeper" or any(node == s or node.startswith(s + "/") for s in skip):
            continue
        try:
            data, _ = client.get(node)
            children = client.get_children(node)
        except NoNodeError:
            continue
        found[node] = data
        stack.extend(f"{node.rstrip('/')}/{child}" for child in children)
    return found


class ZkBench:
    """A ZooKeeper server (given by its connection string) and the simulator; ``trial`` runs one trial
    under a root path of its own below ``prefix``."""

    def __init__(self, hosts: str, prefix: str, imds: ImdsBench) -> None:
        self.hosts = hosts
        self.prefix = prefix
        self.imds = imds
        self.client = KazooClient(hosts=hosts, timeout=5.0)
        self.client.start(timeout=10.0)
        self.client.ensure_path(prefix)
        self._count = 0

    def close(self) -> None:
        self.client.stop()
        self.client.close()

    def trial(self, garbage: list[Garbage], *, cycles: int = 8, vm1_acks: bool = False) -> ZkTrial:
        """One trial (see the module docstring). ``vm1_acks``: a real agent session of vm1 acknowledges
        instead, the control case in which an approval is right."""
        self._count += 1
        root = f"{self.prefix}/t{self._count:05d}"
        paths = ZooKeeperPaths(f"{root}/{CLUSTER}")
        result = ZkTrial([g.target for g in garbage])
        outside_before = tree(self.client, skip=(root,))
        self.imds.serve(encode(_document(), "utf-8"))
        with tempfile.TemporaryDirectory(prefix="hostile-zk-") as tmp, self.imds.client() as client:
            clock = Clock(WALL)
            probe = ProbeState()
            imds = _RecordingImds(client, probe)
            store = ZooKeeperStore(self.hosts, root, CLUSTER, session_timeout=10.0, operation_timeout=3.0)
            vm1 = ZooKeeperStore(self.hosts, root, CLUSTER, session_timeout=10.0, operation_timeout=3.0)
            try:
                store.start()
                vm1.start()
                vm1.join("vm1", {"vm": "vm1"})  # vm1 is a live member: its ack is required
                for item in garbage:
                    if item.when == "before":
                        self._write(item.path(paths), item.data)
                agent = Agent(vm="vm0", imds=imds, store=store, actions=[ProbeAction(probe)], policy=POLICY,
                              metrics=Metrics(CollectorRegistry()), clock=clock,
                              jobs=InlineExecutor(),  # type: ignore[arg-type]
                              state_file=StateFile(Path(tmp) / "vm0.json"))
                after = [g for g in garbage if g.when == "after"]
                for number in range(cycles):
                    try:
                        agent.cycle()
                    except Exception as exc:
                        result.crashes.append(f"cycle raised {type(exc).__name__}: {str(exc)[:200]}")
                    clock.advance(1.0)
                    if after and (number >= cycles // 2 or _acknowledged(self.client, paths)):
                        for item in after:
                            self._write(item.path(paths), item.data)
                        after = []
                    if vm1_acks and number == 1:
                        vm1.acknowledge(EVENT_ID, "vm1", clock.now())
                result.posts = len(imds.posts)
                if not vm1_acks:
                    result.unsafe.extend(f"POST {post.ids} while vm1 never drained" for post in imds.posts)
                    if agent.status()["phase"] == Phase.SERVING.value:
                        result.unsafe.append("vm0 serving while its event is still there")
            finally:
                store.stop()
                vm1.stop()
        outside_after = tree(self.client, skip=(root,))
        for path in sorted(set(outside_before) | set(outside_after)):
            if outside_before.get(path) != outside_after.get(path):
                result.outside.append(path)
        self.client.delete(root, recursive=True)
        return result

    def _write(self, path: str, data: bytes) -> None:
        """Create ``path`` with ``data`` (its parents empty), or overwrite it."""
        try:
            self.client.create(path, data, makepath=True)
        except NodeExistsError:
            self.client.set(path, data)
        except ZookeeperError as exc:  # too large for the server, say: the trial goes on without it
            log.info("garbage not written to %s: %r", path, exc)


def _acknowledged(client: KazooClient, paths: ZooKeeperPaths) -> bool:
    try:
        return "vm0" in client.get_children(paths.acks(EVENT_ID))
    except NoNodeError:
        return False


def _document() -> dict[str, Any]:
    return {"DocumentIncarnation": 2, "Events": [{
        "EventId": EVENT_ID, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
        "Resources": ["vm0", "vm1"], "NotBefore": valid_not_before(), "Description": "", "EventSource": "Platform",
        "DurationInSeconds": -1}]}
