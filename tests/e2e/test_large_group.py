"""End to end at the size of a real group: 30 agent processes, the simulator and a ZooKeeper server.

The harness of ``bench/groups.py`` plays a short story (a Freeze on two VMs, the Reboot of one update
domain, six VMs, and a Terminate), with real impacts (the Freeze pauses the named agents, the Reboot and
the Terminate kill them and the harness starts them again once the VMs are back). Correctness only, no
timing: every event is approved early, the chaos oracle finds no violation, and every VM is back in
rotation at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.groups import UPDATE_DOMAINS, GroupConfig, Step, run_group

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

AGENTS = 30


def _story(vms: Sequence[str], down: str | None) -> list[Step]:
    assert down is None
    kill = {"impact": "kill", "impact_seconds": 2.0}
    domain = tuple(vm for i, vm in enumerate(vms) if i % UPDATE_DOMAINS == 1)
    return [
        Step("Freeze on 2 VMs", "Freeze", (("vm3", "vm17"),), {"duration_in_seconds": 2}),
        Step(f"Reboot of update domain 1 ({len(domain)} VMs)", "Reboot", (domain,), kill),
        Step("Terminate of one VM", "Terminate", (("vm22",),), kill),
    ]


def test_a_group_of_thirty_agents_plays_a_story_safely_and_comes_back(tmp_path: Path) -> None:
    config = GroupConfig(idle_seconds=0.0, agent_down=False, start_batch=15, step_timeout=90.0)
    result = run_group(AGENTS, config, workdir=tmp_path, story=_story)
    assert result["error"] is None
    assert len(result["story"]) == 3
    assert [e["start_reason"] for e in result["story"]] == ["approved"] * 3
    assert result["approved_early"] == 3 and result["waited_for_not_before"] == 0
    assert result["restarts"] == 7  # six rebooted VMs and the terminated one, each back with its agent
    oracle = result["oracle"]
    assert oracle["violations"] == 0, oracle["first"]
    assert oracle["stats"]["events"] == 3 and oracle["stats"]["approved_early"] == 3
    assert result["back_in_rotation"] == AGENTS
