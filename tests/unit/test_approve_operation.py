"""The ``Approve`` operation, as the live executor carries it out (``coordinator.execute``): the store's last
check per event, one POST of what it confirmed, and the fence asked before every attempt with what is true
at that moment."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coordinator.decide import Policy, Snapshot
from coordinator.errors import ImdsFenced, ImdsUnavailable
from coordinator.execute import LiveExecutor
from coordinator.executor import JobExecutor
from coordinator.metrics import Metrics
from coordinator.operations import ApprovalIntent, Approve
from coordinator.poller import ReadEachCycle
from coordinator.state import StateFile
from coordinator.telemetry import Telemetry
from tests.fakezk_group import FakeGroup
from tests.unit.test_policy import NOW, A, B, doc, ev, rec

POLICY = Policy(session_timeout=10.0)


@dataclass
class Clock:
    mono: float = 100.0

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> float:
        return NOW


@dataclass
class Imds:
    """IMDS's POST as the client makes it: ``fence`` asked before each attempt, ``before`` run first
    (what happens between the store's check and the attempt), ``fail`` raised after a passed fence."""

    attempts: int = 1
    before: Callable[[], None] = lambda: None
    fail: Exception | None = None
    posted: list[list[str]] = field(default_factory=list)

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        for _ in range(self.attempts):
            self.before()
            if fence is not None and not fence():
                raise ImdsFenced("fence closed")
            if self.fail is not None:
                raise self.fail
        self.posted.append(list(event_ids))


class Group:
    """vm0's store, a record of A and of B naming vm0, A acknowledged by vm0 and B not."""

    def __init__(self) -> None:
        self.cluster = FakeGroup(lambda: NOW)
        self.store = self.cluster.store(lambda: NOW)
        self.store.start()
        self.store.join("vm0", {})
        for key in (A, B):
            self.store.publish_event(rec(key, ("vm0",)))
        self.store.acknowledge(A, "vm0", NOW)
        self.metrics = Metrics(CollectorRegistry())
        self.clock = Clock()
        self.snap = Snapshot("vm0", NOW, self.clock.mono, doc(ev(A, ["vm0"]), ev(B, ["vm0"])), None,
                             self.store.read_view("vm0"))

    def send(self, imds: Imds, *keys: str, peers_confirmed_at: float | None = None,
             policy: Policy = POLICY) -> frozenset[str]:
        op = Approve(tuple(ApprovalIntent(key, key, ("vm0",), as_leader=False) for key in keys), NOW,
                     peers_confirmed_at)
        telemetry = Telemetry(self.metrics, "vm0", policy, started=0.0, live_after=30.0)
        executor = LiveExecutor(vm="vm0", store=self.store, imds=imds, actions=(), jobs=JobExecutor(),
                                state_file=StateFile(None), policy=policy, metrics=self.metrics, telemetry=telemetry,
                                clock=self.clock, readings=ReadEachCycle(lambda: doc(), self.clock.monotonic),
                                peers=None, wake=lambda: None)
        done = executor.carry(op, self.snap)
        assert done.ok
        return done.posted

    def count(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value("coordinator_approvals_total", {"outcome": outcome})
        return value or 0.0


def test_only_what_the_store_confirms_is_posted_in_one_request() -> None:
    group = Group()
    imds = Imds()
    assert group.send(imds, A, B) == {A}
    assert imds.posted == [[A]]  # B has no ack: refused by the store's check, not sent
    assert group.count("posted") == 1 and group.count("refused") == 1
    approval = group.store.read_view("vm0").records[A].approval
    assert approval is not None and approval.by == "vm0"


def test_nothing_is_posted_when_the_store_confirms_nothing() -> None:
    group = Group()
    imds = Imds()
    assert group.send(imds, B) == frozenset()
    assert imds.posted == [] and group.count("refused") == 1


def test_a_session_lost_after_the_check_posts_nothing() -> None:
    group = Group()
    imds = Imds(before=group.store.partition)
    assert group.send(imds, A) == frozenset()
    assert imds.posted == [] and group.count("fenced") == 1


@pytest.mark.parametrize(("case", "between"), [
    ("half a session passes", lambda g: setattr(g.clock, "mono", g.clock.mono + POLICY.session_timeout / 2)),
    ("an operator pauses", lambda g: g.cluster.pause("change freeze", "ops", NOW)),
])
def test_the_fence_is_asked_again_before_a_retry(case: str, between: Callable[[Group], None]) -> None:
    group = Group()
    attempts = []

    def before() -> None:
        attempts.append(1)
        if len(attempts) == 2:  # between the first attempt (failed in transit) and its retry
            between(group)

    imds = Imds(attempts=2, before=before)
    assert group.send(imds, A) == frozenset(), case
    assert imds.posted == [] and group.count("fenced") == 1 and group.count("posted") == 0


def test_peers_confirmed_too_long_before_the_attempt_close_the_fence() -> None:
    group = Group()
    imds = Imds(before=lambda: setattr(group.clock, "mono", group.clock.mono + 3.0))
    posted = group.send(imds, A, peers_confirmed_at=group.clock.mono,
                        policy=Policy(session_timeout=10.0, peer_fresh=2.5))
    assert posted == frozenset() and imds.posted == [] and group.count("fenced") == 1


def test_a_failed_post_is_counted_and_left_to_the_next_cycle(caplog: Any) -> None:
    group = Group()
    imds = Imds(fail=ImdsUnavailable("IMDS answered 500", outcome="status_500"))
    assert group.send(imds, A) == frozenset()
    assert group.count("failed") == 1 and group.count("posted") == 0
    assert "approval POST failed, retried next cycle" in caplog.text


def test_the_session_fence_counts_from_before_the_stores_check_not_after_it() -> None:
    # The check itself may be slow (a synced read and a transaction over a lossy link): what it showed
    # was true when it began, so half a session is counted from there.
    group = Group()
    check = group.store.approve

    def slow_check(*args: Any, **kwargs: Any) -> Any:
        group.clock.mono += 3.0
        return check(*args, **kwargs)

    group.store.approve = slow_check  # type: ignore[method-assign]
    imds = Imds(before=lambda: setattr(group.clock, "mono", group.clock.mono + 2.0))
    assert group.send(imds, A) == frozenset()  # 5 s after the check began: half of the 10 s session
    assert imds.posted == [] and group.count("fenced") == 1
