"""Drains by hand through whole agents (the fake ZooKeeper, simulated time): the budget admits them, a
drained VM stays out across restarts and failed reads, and undoing the drain puts it back."""

from __future__ import annotations

from pathlib import Path

from coordinator.decide import Policy
from coordinator.store.base import BY_HAND
from tests.unit.test_safety_regressions import POLICY, Bench

E = "AAAA0000-1111-2222-3333-444455556666"


def _out_since(bench: Bench, name: str, mark: float) -> bool:
    """Whether ``name``'s probe has failed at every step since the monotonic time ``mark``."""
    return not any(serving for mono, serving in bench.vms[name].history if mono >= mark)


def _group(tmp_path: Path, policy: Policy = POLICY) -> Bench:
    bench = Bench(tmp_path, policy)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(20)
    assert all(vm.probe.serving for vm in bench.vms.values())
    return bench


def test_a_vm_drained_by_hand_stays_out_across_a_restart_with_zookeeper_unreachable(tmp_path: Path) -> None:
    bench = _group(tmp_path)
    bench.cluster.drain("vm1", "disk swap", "ops", bench.clock.now())
    bench.run(10)
    vm1 = bench.vms["vm1"]
    assert not vm1.probe.serving and BY_HAND in vm1.agent.status()["drained_for"]
    assert bench.cluster.out["vm1"].events == (BY_HAND,)
    mark = bench.clock.mono
    bench.crash("vm1")
    restarted = bench.add("vm1")
    restarted.store.partition()  # its restarted agent cannot read the group: its state file says it all
    bench.run(120)
    assert _out_since(bench, "vm1", mark)
    restarted.store.heal()
    bench.run(30)
    assert not restarted.probe.serving  # the view shows the drain: still out
    bench.cluster.undrain("vm1")
    bench.run(30)
    assert restarted.probe.serving and "vm1" not in bench.cluster.out


def test_an_unreadable_state_file_holds_a_drain_by_hand_until_a_view_says_there_is_none(tmp_path: Path) -> None:
    bench = _group(tmp_path)
    bench.cluster.drain("vm1", "disk swap", "ops", bench.clock.now())
    bench.run(10)
    mark = bench.clock.mono
    bench.crash("vm1")
    bench.vms["vm1"].state.write_text("{not json")
    restarted = bench.add("vm1")
    restarted.store.partition()
    bench.run(120)  # past the wait of a VM without a view (S2): it may not serve on IMDS alone
    assert _out_since(bench, "vm1", mark)
    bench.cluster.undrain("vm1")
    restarted.store.heal()
    bench.run(30)
    assert restarted.probe.serving  # a view without the drain puts it back


def test_a_second_drain_waits_for_the_budget_and_follows_once_the_first_is_undone(tmp_path: Path) -> None:
    bench = _group(tmp_path, Policy(drain_wait=10.0, return_wait=5.0, gone_after=3.0, latest_start=120.0,
                                    session_timeout=30.0, max_vms=1, keep_one_serving=True))
    bench.cluster.drain("vm1", "disk swap", "ops", bench.clock.now())
    bench.run(10)
    bench.cluster.drain("vm2", "kernel debugging", "ops", bench.clock.now())
    bench.run(60)
    assert not bench.vms["vm1"].probe.serving and bench.vms["vm2"].probe.serving
    leader = next(vm for vm in bench.vms.values() if vm.agent.status()["cluster"]["i_am_leader"])
    assert leader.agent.status()["cluster"]["drain_waits"] == {
        "vm2": "maintenance budget: 1 VM(s) in maintenance, at most 1"}
    bench.cluster.undrain("vm1")
    bench.run(60, until=lambda: not bench.vms["vm2"].probe.serving)
    assert not bench.vms["vm2"].probe.serving
    # vm2 left only once vm1 was back in its load balancer's rotation (its return wait over).
    back = next(mono for mono, serving in bench.vms["vm1"].history if serving and mono > bench.clock.mono - 60)
    out = next(mono for mono, serving in bench.vms["vm2"].history if not serving and mono > bench.clock.mono - 60)
    assert out > back
    # An event of the serving VM waits behind the VM out by hand, as behind any VM out of rotation.
    bench.group.schedule(E, ["vm0"])
    bench.run(40)
    assert bench.cluster.events[E].admitted is None and not bench.group.approved(E)
    bench.cluster.undrain("vm2")
    bench.run(120, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
