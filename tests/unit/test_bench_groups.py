"""bench/groups.py: what the harness tells the simulator about the agents' processes, and its hung VMs
(``--groups-hung``): which VMs, the story without them, their stop and resumption by PID, the agents'
configuration, and how the oracle judges the events a hung VM is not named in."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.groups import (
    GroupConfig,
    GroupRun,
    Step,
    agent_extra_config,
    build_story,
    choose_hung,
    hung_key,
    oracle_settings,
    render_hung,
)
from bench.run import groups_config
from coordinator.config.settings import Settings
from coordinator.testbed.cluster import LocalCluster
from tests.oracle import (
    HarnessRecord,
    NodeSighting,
    Observations,
    ProbeSample,
    ProcessRecord,
    check,
)
from tests.oracle.context import Context
from tests.oracle.faults import Leaders, faults, on_path

E1 = "11111111-1111-1111-1111-111111111111"
E2 = "22222222-2222-2222-2222-222222222222"


class _Sim:
    def __init__(self) -> None:
        self.registered: dict[str, list[int]] = {}

    def register_pids(self, vm: str, pids: list[int]) -> dict[str, Any]:
        self.registered[vm] = list(pids)
        return {"vm": vm, "pids": list(pids)}


class _Proc:
    def __init__(self, pid: int, returncode: int | None) -> None:
        self.pid, self.returncode = pid, returncode

    def poll(self) -> int | None:
        return self.returncode


def _run(sim: _Sim, procs: dict[str, _Proc]) -> GroupRun:
    run = GroupRun.__new__(GroupRun)  # only what ``_register`` reads
    run.cluster = SimpleNamespace(sim=sim, agents={vm: SimpleNamespace(proc=p) for vm, p in procs.items()})
    return run  # type: ignore[no-any-return]


def test_an_agent_the_harness_stopped_leaves_no_pid_with_the_simulator() -> None:
    """The VM whose agent is down for the story kept its PID registered: an impact on it later sent
    SIGKILL to that PID, by then a thread of another VM's agent, which died (a group of 100 agents)."""
    sim = _Sim()
    _run(sim, {"vm0": _Proc(4242, None), "vm1": _Proc(4243, 0)})._register("vm0")
    _run(sim, {"vm0": _Proc(4242, None), "vm1": _Proc(4243, 0)})._register("vm1")
    assert sim.registered == {"vm0": [4242], "vm1": []}


# -- hung VMs (``--groups-hung``) ------------------------------------------------------------------------


class _Signalled:
    """A child process as ``GroupRun`` sees it, recording the signals sent to it."""

    def __init__(self, pid: int, returncode: int | None = None) -> None:
        self.pid, self.returncode = pid, returncode
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def _bare(n: int = 10, **config: Any) -> GroupRun:
    """A ``GroupRun`` with no process behind it: only what choosing, hanging and resuming read."""
    run = GroupRun.__new__(GroupRun)
    run.n, run.vms, run.config = n, [f"vm{i}" for i in range(n)], GroupConfig(**config)
    run.down = run.vms[-1]
    run._story, run.say, run._lock = None, lambda _: None, threading.Lock()
    run.hung, run._stopped, run.hung_at, run.harness = (), {}, {}, []
    return run


def test_the_hung_vms_are_the_last_ones_neither_down_nor_leading() -> None:
    vms = [f"vm{i}" for i in range(10)]
    assert choose_hung(vms, 1, {"vm9", "vm0"}) == ("vm8",)
    assert choose_hung(vms, 3, {"vm9", "vm8"}) == ("vm5", "vm6", "vm7")
    assert choose_hung(vms, 0, {"vm9"}) == ()
    with pytest.raises(ValueError, match="cannot hang 3 of 4 VMs"):
        choose_hung(vms[:4], 3, {"vm3", "vm0"})


def test_no_event_of_the_story_names_a_hung_vm_and_it_still_has_thirty_events() -> None:
    vms = [f"vm{i}" for i in range(10)]
    config = GroupConfig()
    hung = ("vm6", "vm7", "vm8")
    story = build_story(vms, "vm9", config, hung=hung)
    named = {vm for step in story for names in step.events for vm in names}
    assert not named & set(hung)
    assert named == set(vms) - set(hung)  # every other VM, the down one included, is still named
    assert sum(len(step.events) for step in story) >= 30
    assert build_story(vms, "vm9", config) == build_story(vms, "vm9", config, hung=())
    with pytest.raises(ValueError, match="at least 3"):
        build_story(vms[:5], None, config, hung=("vm2", "vm3", "vm4"))


def test_a_story_given_to_the_run_keeps_its_vms_and_the_hung_ones_avoid_them() -> None:
    run = _bare(10, hung=2, agent_down=False)
    run.down = None
    run._story = lambda vms, down: [Step("Freeze", "Freeze", (("vm8", "vm9"),))]
    run._leader = lambda: "vm7"  # type: ignore[method-assign]
    story = run._make_story()
    assert run.hung == ("vm5", "vm6") and len(story) == 1


def test_the_default_story_is_built_without_the_hung_vms() -> None:
    run = _bare(10, hung=1)
    run._leader = lambda: "vm8"  # type: ignore[method-assign]
    story = run._make_story()
    assert run.hung == ("vm7",)
    assert all("vm7" not in names for step in story for names in step.events)


def test_hung_agents_are_stopped_then_continued_once_by_pid_and_the_oracle_is_told() -> None:
    run = _bare(10, hung=2)
    procs = {"vm6": _Signalled(606), "vm7": _Signalled(707)}
    run.cluster = SimpleNamespace(agents={vm: SimpleNamespace(proc=p) for vm, p in procs.items()})
    run.hung = ("vm6", "vm7")
    run._hang()
    assert [p.signals for p in procs.values()] == [[signal.SIGSTOP], [signal.SIGSTOP]]
    procs["vm7"].returncode = -9  # gone meanwhile: its PID may be another process's now, never signalled
    run._resume("the story is over")
    run._resume("the run ends")  # again, as the way out does: nothing more is sent
    assert procs["vm6"].signals == [signal.SIGSTOP, signal.SIGCONT]
    assert procs["vm7"].signals == [signal.SIGSTOP]
    assert [(r.kind, r.target, r.pid) for r in run.harness] == [
        ("sigstop", "vm6", 606), ("sigstop", "vm7", 707), ("sigcont", "vm6", 606)]


def test_the_agents_get_the_probe_timeout_and_the_configuration_is_valid(tmp_path: Path) -> None:
    config = GroupConfig(hung=1, peer_probe_timeout=5.0)
    cluster = LocalCluster(tmp_path, ["vm0"], zk_hosts="127.0.0.1:2181", drain_wait=config.drain_wait,
                           poll_interval=config.poll_interval, session_timeout=config.session_timeout,
                           with_agents=False, extra_config=agent_extra_config(config))
    cluster.imds_urls = {"vm0": "http://127.0.0.1:1"}
    settings = Settings.model_validate(cluster.agent_config("vm0", 1, 2))
    assert settings.policy.peer_probe_timeout_seconds == 5.0
    assert settings.policy.approver.value == "first-resource"  # merged into LocalCluster's policy section
    assert settings.drain.return_wait_seconds == config.return_wait
    assert "policy" not in agent_extra_config(GroupConfig())  # no timeout given: the product's default


def test_the_command_line_gives_hung_runs_a_five_second_probe_timeout_unless_told_otherwise() -> None:
    def args(hung: int, timeout: float | None) -> argparse.Namespace:
        return argparse.Namespace(groups_freezes=22, groups_idle=60.0, groups_batch=20, groups_hung=hung,
                                  groups_probe_timeout=timeout)

    assert (groups_config(args(1, None)).hung, groups_config(args(1, None)).peer_probe_timeout) == (1, 5.0)
    assert groups_config(args(3, 2.0)).peer_probe_timeout == 2.0
    assert groups_config(args(0, None)).peer_probe_timeout is None
    assert hung_key(30, 3) == "30/3"


def test_the_oracle_is_told_the_probe_timeout_poll_interval_and_session() -> None:
    settings = oracle_settings(GroupConfig(peer_probe_timeout=5.0), ["vm0", "vm1"], {}, 0.5)
    assert settings.l1_bound("Freeze") == pytest.approx(0.5 + 5 * 1.0 + 5.0 + 2.0)
    assert settings.session_lapse_seconds == pytest.approx(15.5)
    assert settings.l2_bound() == pytest.approx(1.0 + 4 * 1.0 + 2.0)
    assert oracle_settings(GroupConfig(), ["vm0"], {}, 0.5).peer_probe_timeout_seconds == 0.5


def test_the_oracle_is_told_the_drain_wait_of_a_preempt_the_agents_keep() -> None:
    """The agents keep the product's wait by type (a Preempt's 5 s, over the run's 0.5 s drain): judged with
    the run's drain alone, a Preempt approved 6 s after it became allowable on a loaded machine was an L1
    miss that the agents' configuration explains."""
    settings = oracle_settings(GroupConfig(), ["vm0", "vm1"], {}, 0.5)
    config = Settings.model_validate({"vm_name": "vm0", "cluster": "g", "zookeeper": {"hosts": "127.0.0.1:1"},
                                      "drain": {"wait_seconds": 0.5}})
    assert settings.drain_wait("Preempt") == config.drain.wait_seconds_by_type["Preempt"] == 5.0
    assert settings.drain_wait("Freeze") == 0.5
    assert settings.l1_bound("Preempt") == pytest.approx(5.0 + 5 * 1.0 + 0.5 + 2.0)


def _hung_record() -> Observations:
    """A groups run's record, as ``GroupRun`` takes it (no HAProxy, no leader or admission nodes): five
    agents, vm3 hung (SIGSTOP) from 1 s to 40 s, its member node gone at 17 s (its session expired). E1
    (vm0, vm1) is drained from 3 s and approved at 5 s; E2 names vm3 and starts at its NotBefore."""
    vms = [f"vm{i}" for i in range(5)]
    t0 = 1_700_000_000.0
    obs = Observations(settings=oracle_settings(GroupConfig(hung=1, peer_probe_timeout=5.0), vms, {}, 0.5),
                       started_at=t0, ended_at=t0 + 45.0)

    def probes(vm: str, a: float, b: float, code: int | None) -> None:
        obs.probes.extend(ProbeSample(vm, t0 + a + i / 10, t0 + a + i / 10 + 0.005, code)
                          for i in range(round((b - a) * 10)))

    def sim(t: float, kind: str, **fields: Any) -> None:
        obs.sim_log.append({"seq": len(obs.sim_log) + 1, "t": t0 + t, "kind": kind, **fields})

    for i, vm in enumerate(vms):
        obs.processes.append(ProcessRecord(vm, 100 + i, t0 - 10))
        obs.nodes.append(NodeSighting("member", None, vm, t0 - 9, 0xA + i, t0 - 9,
                                      t0 + 17.0 if vm == "vm3" else None))
    for vm in ("vm2", "vm4"):
        probes(vm, 0, 45, 200)
    for vm in ("vm0", "vm1"):
        probes(vm, 0, 3, 200)
        probes(vm, 3, 9, 503)
        probes(vm, 9, 45, 200)
    probes("vm3", 0, 1, 200)
    probes("vm3", 1, 40, None)
    probes("vm3", 40, 45, 200)
    obs.harness += [HarnessRecord(t0 + 1.0, "sigstop", "vm3", 103), HarnessRecord(t0 + 40.0, "sigcont", "vm3", 103)]
    e1 = {"event_id": E1, "event_type": "Freeze", "resources": ["vm0", "vm1"], "incarnation": 1}
    e2 = {"event_id": E2, "event_type": "Freeze", "resources": ["vm2", "vm3"], "incarnation": 1}
    sim(2.0, "transition", **e1, **{"from": None, "to": "Scheduled"}, reason="scheduled")
    obs.nodes += [NodeSighting("ack", E1, vm, t0 + 4.5, 0xA + i, t0 + 4.6, t0 + 9.0) for i, vm in enumerate(("vm0",
                                                                                                              "vm1"))]
    sim(5.0, "approval", vm="vm0", event_ids=[E1], accepted=[E1], results={E1: "approved"}, status=200)
    sim(5.0, "transition", **e1, **{"from": "Scheduled", "to": "Started"}, reason="approved")
    sim(8.0, "transition", **e1, **{"from": "Started", "to": None}, reason="started_for_elapsed")
    sim(12.0, "transition", **e2, **{"from": None, "to": "Scheduled"}, reason="scheduled")
    sim(30.0, "transition", **e2, **{"from": "Scheduled", "to": "Started"}, reason="not_before")
    sim(33.0, "transition", **e2, **{"from": "Started", "to": None}, reason="started_for_elapsed")
    return obs


def test_a_hung_vm_is_a_fault_on_its_own_events_path_only() -> None:
    """The event that does not name the hung VM is judged as if nothing were hung: allowable at once,
    approved in time, its time counted with no fault on its path; the one that names it is never
    allowable (its agent stopped, by a recorded fault) and no miss."""
    obs = _hung_record()
    verdict = check(obs)
    assert verdict.ok, verdict.render(obs.started_at)
    judged = verdict.stats["liveness"]
    outcomes = {e["event"]: e["outcome"] for e in judged["events"]}
    assert outcomes == {E1: "approved in time", E2: "never allowable"}
    assert judged["allowable_to_approved"] == {"n": 1, "p50": 3.0, "p99": 3.0, "max": 3.0}
    assert judged["allowable_to_approved_with_faults"]["n"] == 0
    assert judged["misses"] == [] and judged["misses_unexplained"] == 0
    ctx = Context(obs)
    (stop,) = [f for f in faults(ctx) if f.kind == "agent stopped (SIGSTOP)"]
    assert stop.target == "vm3"
    assert not on_path(stop, ("vm0", "vm1"), Leaders(ctx)) and on_path(stop, ("vm2", "vm3"), Leaders(ctx))


def test_the_report_of_hung_runs_says_what_was_measured_and_how() -> None:
    run = {"date": "2026-01-01", "command": ".venv/bin/python bench/run.py --only groups --groups-hung 1",
           "machine": "test", "note": "", "agents": 10, "events": 31, "wall_seconds": 300.0, "error": None,
           "load_average_before": [1.5, 1, 1], "load_average_after": [2.0, 1, 1], "oracle": {"violations": 0},
           "config": {"drain_wait": 0.5, "poll_interval": 1.0, "session_timeout": 15.0},
           "hung": {"vms": ["vm8"], "peer_probe_timeout_seconds": 5.0, "allowed_early": 29, "approved_early": 29,
                    "not_approved_early": [], "misses_unexplained": 0, "member_until_s": {"vm8": 15.3},
                    "allowable_to_approved": {"n": 20, "p50": 0.9, "p99": 6.0, "max": 6.06},
                    "allowable_to_approved_with_faults": {"n": 0, "p50": None, "p99": None, "max": None},
                    "created_to_approved_s": {"n": 29, "p50": 1.0, "p90": 2.0, "p99": 6.1, "max": 6.1},
                    "outcomes": {"approved in time": 20},
                    "while_member": [{"step": "Freeze on 2 VMs", "created_s": 0.3, "gate_ms": 5099.2,
                                      "created_to_approved_s": 6.09, "allowable_to_approved_s": 6.0}]}}
    text = render_hung({hung_key(10, 1): run})
    assert ("| 10 | 1 (vm8) | 5.0 | 31 | 29 of 29 | 0.90 / 6.00 / 6.06 (n 20) | - (n 0) | 1.00 / 6.10 / 6.10 (n 29) "
            "| 15.3 | 1, 5,099 | 0 | 0 | 300 | 1.5 / 2.0 |") in text
    assert "is 12.5 s" in text  # 0.5 + 5 x 1 + 5 + 2
    assert "`.venv/bin/python bench/run.py --only groups --groups-hung 1`" in text
    assert "Freeze on 2 VMs (created at 0.3 s): gate 5099 ms, created -> approved 6.09 s" in text
