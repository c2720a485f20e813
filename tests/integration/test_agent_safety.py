"""The agent loop against a real ZooKeeper, with faults placed exactly where they hurt most.

A fake IMDS (in process, recording every approval) stands in for the simulator so that the fault can
be injected between the decision and the last check, which no timing-based test can hit reliably.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.config import ApproverMode
from coordinator.decide import Phase, Policy
from coordinator.errors import ImdsUnavailable
from coordinator.metrics import Metrics
from coordinator.models import Document, parse_document
from coordinator.store.base import ApprovalResult
from coordinator.store.zookeeper import ZooKeeperStore
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.plugins.zookeeper import StoreMaker, expire_session, wait_until

pytestmark = pytest.mark.zookeeper

EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


class FakeImds:
    def __init__(self, resources: Sequence[str]) -> None:
        self.document: Document | None = self.scheduled(resources)
        self.approved: list[list[str]] = []

    @staticmethod
    def scheduled(resources: Sequence[str]) -> Document:
        return parse_document({"DocumentIncarnation": 2, "Events": [{
            "EventId": EID, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
            "Resources": list(resources), "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]})

    def get_document(self) -> Document:
        if self.document is None:
            raise ImdsUnavailable("simulated outage", outcome="timeout")
        return self.document

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        self.approved.append(list(event_ids))


class ExpireBeforeApprove:
    """Delegates to a real store, but expires its session on the server just before ``approve``."""

    def __init__(self, inner: ZooKeeperStore) -> None:
        self.inner = inner
        self.expired = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def approve(self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool,
                at: float, admission: bool = False) -> ApprovalResult:
        if self.expired == 0:
            expire_session(self.inner)
            self.expired += 1
        return self.inner.approve(event_id, vm, required, as_leader=as_leader, at=at, admission=admission)


@pytest.fixture
def store_factory(zk_hosts: str, zk_chroot: str, make_store: StoreMaker) -> Callable[[], ZooKeeperStore]:
    return lambda: make_store(zk_hosts, zk_chroot, "safety", operation_timeout=2.0)


def make_agent(vm: str, imds: FakeImds, store: Any, mode: ApproverMode = ApproverMode.LEADER) -> tuple[Agent, Metrics]:
    metrics = Metrics(CollectorRegistry())
    agent = Agent(vm=vm, imds=imds, store=store, actions=[ProbeAction(ProbeState())],
                  policy=Policy(approver=mode, drain_wait=0.0, max_events=None, keep_one_serving=False),
                  metrics=metrics, poll_interval=0.1)
    return agent, metrics


def cycle_until(agent: Agent, condition: Any, timeout: float = 10.0) -> None:
    def step() -> bool:
        agent.cycle()
        return bool(condition())

    wait_until(step, timeout=timeout, interval=0.05, message="agent to reach the expected state")


def test_leader_whose_session_expires_before_the_final_check_never_approves(store_factory: Any) -> None:
    imds = FakeImds(["vm0"])
    store = ExpireBeforeApprove(store_factory())
    agent, metrics = make_agent("vm0", imds, store)
    # Drain, ack, decide to approve as leader: the session is expired server-side right then.
    cycle_until(agent, lambda: store.expired == 1)
    assert imds.approved == []
    refused = metrics.approvals.labels("refused")._value.get() + metrics.approvals.labels("unknown")._value.get()
    assert refused >= 1
    # With a new session the agent re-joins, wins leadership again, re-checks the ack, and approves.
    cycle_until(agent, lambda: imds.approved != [])
    assert imds.approved == [[EID]]


def test_old_leader_paused_past_its_session_does_not_approve(store_factory: Any) -> None:
    """A leader frozen (an Azure Freeze of its own VM) past its session timeout comes back to a
    cluster with another leader: its next cycles must not approve, the new leader does."""
    imds_a, imds_b = FakeImds(["vmx"]), FakeImds(["vmx"])
    store_a, store_b = store_factory(), store_factory()
    agent_a, _ = make_agent("vm0", imds_a, store_a)
    agent_b, _ = make_agent("vm1", imds_b, store_b)
    agent_a.cycle()
    agent_b.cycle()
    assert agent_a.status()["cluster"]["leader"] == "vm0"
    # vmx's session (it runs no decision loop here) has drained and acknowledged: its ack, held by its own
    # member's session as every ack must be, is the only requirement.
    store_x = store_factory()
    store_x.join("vmx", {})
    store_x.acknowledge(EID, "vmx", 0.0)
    expire_session(store_a)
    cycle_until(agent_b, lambda: imds_b.approved != [])
    # The old leader's cycles, first without a session, then with a new one, never approve.
    cycle_until(agent_a, lambda: (agent_a.status().get("cluster") or {}).get("leader") == "vm1", timeout=20)
    agent_a.cycle()
    assert imds_a.approved == []
    assert imds_b.approved == [[EID]]


def test_no_approval_while_zookeeper_is_paused(zk_server_factory: Any) -> None:
    server: LocalZooKeeper = zk_server_factory()
    store = ZooKeeperStore(server.hosts, "/azure-maintenance", "paused", session_timeout=4.0, operation_timeout=1.0)
    store.start()
    imds = FakeImds(["vm1"])  # vm1 runs no agent and has not acknowledged: vm0 waits as leader
    agent, _ = make_agent("vm0", imds, store)
    try:
        agent.cycle()
        server.pause()
        try:
            for _ in range(6):
                agent.cycle()
            assert imds.approved == []
            assert agent.status()["cluster"] is None or agent.status()["cluster"]["connection"] != "connected"
        finally:
            server.resume()
        helper = ZooKeeperStore(server.hosts, "/azure-maintenance", "paused", session_timeout=4.0,
                                operation_timeout=2.0)
        helper.start()  # stands for vm1's agent: its ack is ephemeral, so it lives as long as this session
        try:
            wait_until(lambda: _try_ack(helper), timeout=10, message="ack written after resume")
            cycle_until(agent, lambda: imds.approved != [], timeout=20)
        finally:
            helper.stop()
        assert imds.approved == [[EID]]
    finally:
        store.stop()


def _try_ack(store: ZooKeeperStore) -> bool:
    try:
        store.join("vm1", {})  # an ack counts only when vm1's member node has the same session
        store.acknowledge(EID, "vm1", 0.0)
    except Exception:
        return False
    return True


def test_imds_outage_keeps_a_drained_vm_drained(store_factory: Any) -> None:
    imds = FakeImds(["vm0"])
    agent, _ = make_agent("vm0", imds, store_factory(), ApproverMode.FIRST_RESOURCE)
    cycle_until(agent, lambda: agent.status()["phase"] == Phase.DRAINED.value)
    imds.document = None  # IMDS stops answering; the event may still be there
    for _ in range(3):
        agent.cycle()
    assert agent.status()["phase"] == Phase.DRAINED.value
    imds.document = parse_document({"DocumentIncarnation": 5, "Events": []})
    cycle_until(agent, lambda: agent.status()["phase"] == Phase.SERVING.value)
