"""bench/groups.py: what the harness tells the simulator about the agents' processes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.groups import GroupRun


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
