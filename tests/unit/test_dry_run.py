"""A dry run says what it would do once per planned action, not every cycle: nothing it would write is
ever written, so the decision plans the same writes again each cycle."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.dryrun import DryRunStore, Planned
from coordinator.errors import StoreError
from coordinator.metrics import Metrics
from coordinator.state import StateFile
from tests.doubles import InlineExecutor
from tests.unit.test_safety_regressions import AT_ONCE, Bench, E, FakeImds


def _said(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    return Counter(r.getMessage() for r in caplog.records
                   if r.name == "coordinator.dryrun" and r.getMessage().startswith("dry-run: would"))


def test_each_planned_write_is_said_once_while_it_stays_planned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    bench = Bench(tmp_path, AT_ONCE)
    bench.add("vm1")
    bench.add("vm2")
    bench.add("vm0", dry_run=True)
    bench.group.schedule(E, ["vm0"], in_s=100)  # within latest_start: vm0 drains, and would stay out
    bench.run(40)
    said = _said(caplog)
    assert said[f"dry-run: would mark vm0 out of rotation for {E}"] == 1  # planned in each of ~40 cycles
    assert said[f"dry-run: would acknowledge event {E} for vm0"] == 1
    assert said[f"dry-run: would drain vm0 via probe for {E}"] == 1
    assert all(count == 1 for count in said.values()), said
    caplog.clear()
    bench.group.remove(E)
    bench.run(20)
    said = _said(caplog)
    # Its words changed (no event any more): said again, once; the withdrawal too.
    assert said == Counter({"dry-run: would mark vm0 out of rotation while it starts (the budget counts it "
                            "serving once its return wait ends)": 1,
                            f"dry-run: would withdraw the ack of vm0 for event {E}": 1,
                            "dry-run: would recover vm0 via probe": 1,
                            "dry-run: would save the drain state drained": 1,
                            "dry-run: would save the drain state recovering": 1,
                            "dry-run: would save the drain state serving": 1})


def test_an_action_is_said_again_when_it_changes_or_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    planned = Planned()
    cycles = [["a"], ["a"], ["a", "b"], ["b"], [], ["b"], ["a2"], ["a2"]]
    for said in cycles:
        planned.next_cycle()
        for message in said:
            planned.say(("approve", message[0]), message)
            planned.say(("approve", message[0]), message)  # twice in one cycle: still once
    assert [r.getMessage() for r in caplog.records] == [
        "dry-run: a", "dry-run: b",  # new
        "dry-run: b",  # back after a cycle without it
        "dry-run: a2",  # same action, other words
    ]


def test_a_dry_run_beside_the_agent_says_it_would_approve_when_the_agent_would(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Three VMs and a Reboot of vm1 with 900 s of notice, as a new user tries it: a dry run for vm1, beside
    vm1's agent, decides from the same operations the agent carries out, and so says it would approve the
    event (vm1 is its approver) once the agent's plan would. The group is paused until vm1's agent has
    drained and acknowledged, and that agent is then stopped (its session and its ack stand), so that only
    the dry run's decisions go on once the pause is lifted."""
    caplog.set_level(logging.INFO, logger="coordinator.dryrun")
    bench = Bench(tmp_path)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(5)
    imds = FakeImds(bench.group, "vm1")
    dry = Agent(vm="vm1", imds=imds, store=bench.cluster.store(bench.clock.now),
                actions=[ProbeAction(ProbeState(serving=False))], policy=bench.policy,
                metrics=Metrics(CollectorRegistry()), clock=bench.clock,
                jobs=InlineExecutor(),  # type: ignore[arg-type]
                state_file=StateFile(tmp_path / "dry.json"), dry_run=True)
    bench.cluster.pause("change freeze", "operator", bench.clock.now())
    bench.group.schedule(E, ["vm1"], in_s=900)

    def step() -> None:
        bench.step()
        dry.cycle()

    start = bench.clock.mono
    while E not in bench.cluster.events or "vm1" not in bench.cluster.events[E].acks:
        assert bench.clock.mono < start + 150, "vm1's agent never acknowledged"
        step()
    said = [r.getMessage() for r in caplog.records if r.name == "coordinator.dryrun"]
    assert any(line.startswith(f"dry-run: event {E} held: ") and "paused" in line for line in said), said
    assert not any("would approve" in line for line in said)
    bench.kill("vm1")
    bench.cluster.resume()
    for _ in range(10):
        step()
    said = [r.getMessage() for r in caplog.records if r.name == "coordinator.dryrun"]
    assert said.count(f"dry-run: would approve event {E} (required acks: vm1)") == 1, said
    assert bench.group.posts == []  # the dry run POSTed nothing; vm1's agent, stopped, could not
    assert not (tmp_path / "dry.json").exists()


def test_the_dry_runs_store_refuses_every_write(tmp_path: Path) -> None:
    """Whatever reaches it (its executor sends it nothing), a dry run's store writes nothing: every write is
    refused as a store error, which the live executor takes for a failed write."""
    bench = Bench(tmp_path)
    bench.add("vm0")
    bench.run(3)
    dry = DryRunStore(bench.cluster.store(bench.clock.now))
    dry.start()
    before = dry.read_view("vm0")
    writes: list[Callable[[], object]] = [
        lambda: dry.acknowledge(E, "vm0", 1.0), lambda: dry.withdraw_ack(E, "vm0"), lambda: dry.admit(E, "vm0", 1.0),
        lambda: dry.mark_out("vm0", (E,), 1.0), lambda: dry.clear_out("vm0"), lambda: dry.mark_done(E, 1.0),
        lambda: dry.reopen(E), lambda: dry.mark_absent("vm1", 1.0), lambda: dry.clear_absent("vm1"),
        lambda: dry.approve(E, "vm0", ("vm0",), as_leader=True, at=1.0), lambda: dry.admit_drain("vm0", 1, "vm0", 1.0),
        lambda: dry.forget_drain_admission("vm0"), lambda: dry.archive_done((E,), 1.0), lambda: dry.purge_done(1.0),
        lambda: dry.vouch(E, ("vm1",), by="vm0", reason="r", at=1.0),
        lambda: dry.approve_vouched(E, "vm0", ("vm0",), ("vm1",), reason="r", at=1.0),
    ]
    for write in writes:
        with pytest.raises(StoreError, match="a dry run writes nothing"):
            write()
    after = dry.read_view("vm0")
    assert (after.records, after.out, after.members) == (before.records, before.out, before.members)
