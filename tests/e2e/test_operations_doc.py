"""Every command of docs/operations.md, run in the order written against a live group: the runbook
keeps working as the product changes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.support import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "operations.md"
CONFIG = "/etc/coordinator/coordinator.yaml"
ADMIN = "http://127.0.0.1:9110"


def _commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def test_the_runbook_has_commands_and_only_kinds_this_test_runs() -> None:
    commands = _commands()
    assert len(commands) >= 6
    for command in commands:
        assert command.startswith(("coordinator ", "curl ")), command


def test_every_command_of_the_runbook_works_on_a_live_group(make_cluster: ClusterFactory) -> None:
    # The simulator's ARM answers the fleet view's Resource Graph query, for vm0's identity as Reader.
    cluster = make_cluster(sim_args=["--arm", "127.0.0.1:0"])
    assert cluster.sim is not None
    cluster.sim.set_role("vm0", "reader")
    agent = cluster.agents["vm0"]
    for command in _commands():
        line = command.replace(CONFIG, str(agent.config_path)).replace(ADMIN, agent.admin_url)
        words = shlex.split(line)
        if words[1] == "fleet":
            words += ["--arm-url", cluster.arm_url]  # Azure's, in the runbook
        if words[0] == "curl":
            url = words[-1]
            response = httpx.get(url, timeout=10, trust_env=False)
            assert response.status_code == 200, f"{command}: {response.status_code} {response.text[:200]}"
            continue
        result = subprocess.run([sys.executable, "-m", "coordinator", *words[1:]], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        assert result.stdout.strip() or result.stderr.strip(), f"{command}: said nothing"
