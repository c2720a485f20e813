"""docs/simulator.md, "Setting up ARM by hand", run as written on free ports: the load balancer, the pool and
the roles through the control API, a token and a pool read through ARM; and its `azure-lb` action is a valid
configuration."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from coordinator.config.settings import Settings
from tests.doc_blocks import bash_blocks, free_ports, run_blocks, section, substitute

ROOT = Path(__file__).resolve().parent.parent.parent
SECTION = section((ROOT / "docs" / "simulator.md").read_text(), "Setting up ARM by hand")
SINGLE = (18098, 18099)
RUNS = {18100: 3}


def test_the_arm_set_up_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("curl is required in CI (bash scripts/setup.sh installs it)", pytrace=False)
        pytest.skip("no curl (bash scripts/setup.sh installs it)")
    blocks = bash_blocks(SECTION)
    assert len(blocks) == 1
    named = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", blocks[0])}
    assert named == {18098, 18099, 18100}, named
    run = run_blocks(substitute(blocks[0], free_ports(SINGLE, RUNS)), cwd=tmp_path, workdir=tmp_path, timeout=30,
                     env={"PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"})
    said = f"\n--- output ---\n{run.output[-6000:]}"
    assert run.returncode == 0, f"exit {run.returncode}{said}"
    assert run.left_running == [], f"left running: {run.left_running}{said}"
    decoder = json.JSONDecoder()  # each answer is one line, which the shell's trace may follow
    answers = [decoder.raw_decode(line)[0] for line in run.output.splitlines() if line.startswith("{")]
    pool = next(a for a in answers if a.get("type") == "Microsoft.Network/loadBalancers/backendAddressPools")
    addresses = {a["name"]: a["properties"] for a in pool["properties"]["loadBalancerBackendAddresses"]}
    assert addresses == {f"vm{i}": {"ipAddress": f"10.0.0.{4 + i}", "adminState": "None"} for i in range(3)}
    roles = {a["principal"]: a["roles"] for a in answers if "principal" in a}
    assert roles == {"vm1": ["network-contributor", "reader"], "vm2": ["reader"]}
    view = next(a for a in answers if "pools" in a)["pools"][0]
    assert view["effective"] == {"vm0": "None", "vm1": "None", "vm2": "None"}
    balancer = next(a for a in answers if a.get("config", {}).get("probes"))
    assert balancer["config"]["probes"][0]["request_path"] == "/health"


def test_the_azure_lb_action_it_shows_is_a_valid_configuration() -> None:
    snippet = re.findall(r"^```yaml\n(.*?)^```", SECTION, re.M | re.S)
    assert len(snippet) == 1
    settings = Settings.model_validate({"cluster": "web-frontend", "vm_name": "vm0", **yaml.safe_load(snippet[0])})
    action = settings.actions[0]
    pool = re.search(r"^POOL=\$LB(/\S+)$", SECTION, re.M)
    lb = re.search(r"^LB=(\S+)$", SECTION, re.M)
    assert pool and lb
    assert action.model_dump()["backend_pools"] == [lb.group(1) + pool.group(1)]
