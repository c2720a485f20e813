"""The agent against every recorded document of ``tests/fixtures/imds-scenarios`` (and the hand-made sequences of
``tests/fixtures/timelines``), through the simulator's replay.

For each fixture (a single document or a ``*.sequence.json``), a group is started with one agent per VM
the fixture names plus a bystander VM that it does not name, a real ZooKeeper, and the simulator
replaying the fixture's documents (``--replay``) followed by an empty document. The test moves from one
document to the next (``POST /replay/next``) once the agents have acted on it, and checks:

* every agent parses every document: it reports the document's incarnation, and its
  ``coordinator_imds_documents_invalid_total`` stays 0;
* exactly the VMs a document names are drained (probe 503, phase drained), the others serve;
* no approval reaches the simulator for an event before every VM it names has acknowledged, and an
  event alone in its document, Scheduled and naming VMs, is approved (the agents run without a
  disruption budget: these tests are about the documents);
* after the final empty document every VM serves again.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from azuresim.replay import parse_replay
from coordinator.models import EventType
from coordinator.testbed.cluster import LocalCluster
from tests.e2e.observer import Observer

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures"
SCENARIOS = FIXTURE_DIR / "imds-scenarios"
# The recorded documents, and the hand-made sequences for what no recording shows.
FIXTURES = sorted(SCENARIOS.rglob("*.json")) + sorted((FIXTURE_DIR / "timelines").glob("*.sequence.json"))
BYSTANDER = "bystander0"


def documents_of(path: Path) -> list[dict[str, Any]]:
    kind, documents = parse_replay(path.read_text(), path.name)
    assert kind == "documents"
    return documents


def named(document: dict[str, Any], vm: str) -> bool:
    return any(vm.lower() == r.lower() for e in document["Events"] for r in e.get("Resources", []))


def vms_of(documents: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, str] = {}
    for document in documents:
        for event in document["Events"]:
            for name in event.get("Resources", []):
                seen.setdefault(name.lower(), name)
    return [*seen.values(), BYSTANDER]


def lone_scheduled_event(document: dict[str, Any]) -> dict[str, Any] | None:
    """The event the agents must approve: alone in its document, Scheduled, of a known type, naming VMs."""
    events = document["Events"]
    if len(events) != 1:
        return None
    event = events[0]
    known = event["EventType"] in {t.value for t in EventType}
    return event if event["EventStatus"] == "Scheduled" and known and event.get("Resources") else None


@pytest.fixture
def replayed(tmp_path: Path, zk_hosts: str, request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, list[Any]]]:
    path: Path = request.param
    documents = documents_of(path)
    last = documents[-1]["DocumentIncarnation"]
    documents.append({"DocumentIncarnation": last + 1, "Events": []})  # the events end: everyone recovers
    sequence = tmp_path / "replay.sequence.json"
    sequence.write_text(json.dumps(documents))
    cluster = LocalCluster(tmp_path / "group", vms=vms_of(documents), cluster=f"r{uuid.uuid4().hex[:8]}",
                           zk_hosts=zk_hosts, drain_wait=1.0, poll_interval=0.3,
                           # No disruption budget: these tests are about reading documents; the budget
                           # has its own tests. Preempt's drain wait shortened like the others.
                           extra_config={"drain": {"wait_seconds_by_type": {"Preempt": 1.0}},
                                         "policy": {"max_events_in_maintenance": None}},
                           sim_args=["--replay", str(sequence)])
    try:
        cluster.start()
        yield cluster, documents
    finally:
        for agent in cluster.agents.values():  # stop them all at once, then collect them
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGTERM)
        cluster.stop()


def agent_read(cluster: LocalCluster, vm: str, incarnation: int) -> bool:
    status = cluster.agents[vm].status() or {}
    imds = status.get("imds") or {}
    return bool(imds.get("fresh")) and imds.get("incarnation") == incarnation


def settled(cluster: LocalCluster, document: dict[str, Any]) -> bool:
    """Every agent read this document; the VMs it names are drained, the others serve."""
    for vm, agent in cluster.agents.items():
        if not agent_read(cluster, vm, document["DocumentIncarnation"]):
            return False
        if named(document, vm):
            if (agent.status() or {}).get("phase") != "drained" or agent.probe() != 503:
                return False
        elif agent.probe() != 200:
            return False
    return True


def acked_by_all(observer: Observer, cluster: LocalCluster, document: dict[str, Any]) -> bool:
    agents = {vm.lower() for vm in cluster.agents}
    return all(
        (event["EventId"].upper(), name.lower()) in observer.seen.ack_ctime
        for event in document["Events"]
        for name in event.get("Resources", [])
        if name.lower() in agents
    )


@pytest.mark.parametrize("replayed", FIXTURES, ids=[str(p.relative_to(FIXTURE_DIR)) for p in FIXTURES], indirect=True)
def test_agent_handles_every_recorded_document(replayed: tuple[LocalCluster, list[Any]]) -> None:
    cluster, documents = replayed
    assert cluster.sim is not None
    with Observer(cluster) as observer:
        for index, document in enumerate(documents):
            if index:
                assert cluster.sim.replay_next()["index"] == index
            cluster.wait(lambda document=document: settled(cluster, document), 20,  # type: ignore[misc]
                         f"the agents to act on document {index}")
            cluster.wait(lambda document=document: acked_by_all(observer, cluster, document), 10,  # type: ignore[misc]
                         f"the acknowledgements of document {index}")
            lone = lone_scheduled_event(document)
            if lone is not None:
                cluster.wait(lambda lone=lone: any(lone["EventId"] in a["accepted"]  # type: ignore[misc]
                                                   for a in cluster.sim.log(kind="approval")),  # type: ignore[union-attr]
                             10, f"event {lone['EventId']} to be approved")

    # The bystander, named by no document, served all along.
    assert observer.seen.probe_codes(BYSTANDER) == {200}
    # Every approval came after the acknowledgement of every VM its event names.
    resources = {e["EventId"]: e.get("Resources", []) for d in documents for e in d["Events"]}
    for approval in cluster.sim.log(kind="approval"):
        assert approval["status"] == 200, approval
        for event_id in approval["accepted"]:
            for name in resources[event_id]:
                ack = observer.seen.ack_ctime.get((event_id.upper(), name.lower()))
                assert ack is not None and ack <= approval["t"], (event_id, name, approval)
    for vm, agent in cluster.agents.items():
        assert agent.alive(), vm
        assert "coordinator_imds_documents_invalid_total 0.0" in agent.metrics(), vm
