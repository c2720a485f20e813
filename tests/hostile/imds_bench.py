"""Hostile IMDS answers served by the simulator over HTTP, read by the real client and by a real agent.

``ImdsBench`` runs the simulator in process (VMs vm0 and vm1, loopback, no rate limit). ``trial`` takes
one hostile answer through two edges:

* the client alone (``ImdsClient.get_document``): it must return a document or raise an ``ImdsError``,
  never anything else;
* a real ``Agent`` of vm0 alone on the fake ZooKeeper, first drained for an event that names vm0 and a VM
  without an agent (so that nobody may approve it), then fed the hostile answer for several cycles on a
  fake clock, past the time after which an event counts as gone. No cycle may raise; if no hostile
  answer parsed, vm0 must still be drained (an unreadable document never means "event gone"); and every
  approval POSTed must be one the document allows: vm0 drained, the id present, every entry of that id
  naming vm0 alone (nobody else runs an agent here, so nobody else can have drained).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from azuresim import SimulatedGroup, SimulatorServer, VmInfo
from coordinator.actions.probe import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.decide import Phase, Policy
from coordinator.errors import ImdsError, InvalidName
from coordinator.imds import ImdsClient
from coordinator.metrics import Metrics
from coordinator.models import Document, format_not_before
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.state import StateFile
from tests.doubles import Clock, InlineExecutor
from tests.fakezk_group import lone_store
from tests.hostile.inputs import EVENT_ID, HostileBody, encode

__all__ = ["WALL", "ImdsBench", "Trial", "baseline_document", "valid_not_before"]

WALL = 1_700_000_000.0  # the agents' wall clock at the start of a trial
# Drains at once for an event nobody may approve (it names vmx, which runs no agent).
POLICY = Policy(drain_wait=1.0, return_wait=1.0, gone_after=3.0, latest_start=120.0, session_timeout=30.0,
                unapprovable_at_once=True, max_events=None, keep_one_serving=False)
CYCLES = 6  # hostile cycles, one second apart: past gone_after twice over


def valid_not_before(seconds_ahead: float = 900.0) -> str:
    return format_not_before(datetime.fromtimestamp(WALL + seconds_ahead, UTC))


def baseline_document() -> dict[str, Any]:
    return {"DocumentIncarnation": 2, "Events": [{
        "EventId": EVENT_ID, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
        "Resources": ["vm0", "vmx"], "NotBefore": valid_not_before(), "Description": "", "EventSource": "Platform",
        "DurationInSeconds": -1}]}


@dataclass
class _Post:
    ids: tuple[str, ...]
    serving: bool
    document: Document | None


class _RecordingImds:
    """The agent's IMDS: the real client, one attempt per read; every approval is recorded with whether
    vm0 was serving and the last document read, then POSTed for real."""

    def __init__(self, client: ImdsClient, probe: ProbeState) -> None:
        self.client = client
        self.probe = probe
        self.last: Document | None = None
        self.read: list[str] = []  # "document" or the error's class, per read
        self.posts: list[_Post] = []

    def get_document(self) -> Document:
        try:
            document = self.client.get_document(attempts=1)
        except ImdsError as exc:
            self.read.append(type(exc).__name__)
            raise
        self.last = document
        self.read.append("document")
        return document

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        self.posts.append(_Post(tuple(event_ids), self.probe.serving, self.last))
        self.client.approve(event_ids, fence=fence)


@dataclass
class Trial:
    """What one hostile answer did. ``crashes`` and ``unsafe`` name each failure; both empty is a pass."""

    label: str
    client_outcome: str = ""
    crashes: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)


def unsafe_posts(posts: Sequence[_Post]) -> list[str]:
    """The approvals vm0 may not have sent: only vm0 runs an agent, so an id may be approved only while
    vm0 is drained and only if every entry of it in the document names vm0 and nobody else."""
    found = []
    for post in posts:
        if post.serving:
            found.append(f"POST {post.ids} while vm0 was serving")
        for event_id in post.ids:
            try:
                key = normalize_event_id(event_id)
            except InvalidName:
                found.append(f"POST of an invalid id {event_id[:40]!r}")
                continue
            entries = [e for e in (post.document.events if post.document else ()) if _key(e.event_id) == key]
            if not entries:
                found.append(f"POST of {key}, absent from the last document")
            for entry in entries:
                names = {_vm(name) for name in entry.resources}
                if names != {"vm0"}:
                    found.append(f"POST of {key} whose entry names {sorted(map(str, names))[:4]}")
    return found


def _key(event_id: str) -> str | None:
    try:
        return normalize_event_id(event_id)
    except InvalidName:
        return None


def _vm(name: str) -> str | None:
    try:
        return normalize_vm_name(name)
    except InvalidName:
        return None


class ImdsBench:
    """The simulator (in process, vm0 and vm1 on loopback) and the trials run against it."""

    def __init__(self) -> None:
        self.group = SimulatedGroup([VmInfo("vm0"), VmInfo("vm1")], approval_delay=0.0)
        self.server = SimulatorServer(
            self.group, {"vm0": ("127.0.0.1", 0), "vm1": ("127.0.0.1", 0)}, ("127.0.0.1", 0), rate_limit=0
        )
        self.server.start()
        self.url = self.server.urls["vm0"]

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> ImdsBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self) -> ImdsClient:
        return ImdsClient(self.url, request_timeout=3.0, first_request_timeout=3.0, max_requests_per_second=10_000,
                          backoff_base=0.0, backoff_max=0.0)

    def serve(self, body: HostileBody) -> None:
        """Serve ``body`` to vm0's every GET of the Scheduled Events endpoint, until the next ``serve``."""
        self.group.clear_faults("vm0")
        arguments = body.fault("vm0")
        self.group.add_fault(arguments.pop("kind"), **arguments)

    def read_once(self, body: HostileBody) -> Trial:
        """The client alone: a document or an ``ImdsError``."""
        trial = Trial(body.encoding)
        self.serve(body)
        with self.client() as client:
            try:
                client.get_document(attempts=1)
                trial.client_outcome = "document"
            except ImdsError as exc:
                trial.client_outcome = type(exc).__name__
            except Exception as exc:
                trial.client_outcome = "crash"
                trial.crashes.append(f"client raised {type(exc).__name__}: {str(exc)[:200]}")
        return trial

    def trial(self, body: HostileBody) -> Trial:
        """The client alone, then a drained agent fed ``body`` (see the module docstring)."""
        trial = self.read_once(body)
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp, self.client() as client:
            clock = Clock(WALL)
            probe = ProbeState()
            imds = _RecordingImds(client, probe)
            agent = Agent(vm="vm0", imds=imds, store=lone_store(clock.now),
                          actions=[ProbeAction(probe)], policy=POLICY, metrics=Metrics(CollectorRegistry()),
                          clock=clock, jobs=InlineExecutor(),  # type: ignore[arg-type]
                          state_file=StateFile(Path(tmp) / "vm0.json"))
            self.serve(encode(baseline_document(), "utf-8"))
            for _ in range(10):
                agent.cycle()
                clock.advance(1.0)
                if agent.status()["phase"] == Phase.DRAINED.value and not probe.serving:
                    break
            else:
                raise AssertionError(f"vm0 did not drain for the baseline event: {agent.status()}")
            self.serve(body)
            reads = len(imds.read)
            for _ in range(CYCLES):
                try:
                    agent.cycle()
                except Exception as exc:
                    trial.crashes.append(f"cycle raised {type(exc).__name__}: {str(exc)[:200]}")
                clock.advance(1.0)
            hostile = imds.read[reads:]
            if "document" not in hostile and probe.serving:
                trial.unsafe.append(f"vm0 serving again after reads that all failed: {sorted(set(hostile))}")
            trial.unsafe.extend(unsafe_posts(imds.posts))
        return trial
