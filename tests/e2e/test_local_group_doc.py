"""docs/local-group.md, run as written: every `bash` block in order, in one shell, on free ports. The page
starts ZooKeeper from Debian's package, the simulator, three agents, Prometheus and Alertmanager, plays an
event, fires an alert and stops everything; if the product and the page disagree, this fails."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from coordinator.testbed.zookeeper import find_classpath
from tests.doc_blocks import bash_blocks, free_ports, run_blocks, substitute

pytestmark = [pytest.mark.e2e, pytest.mark.zookeeper]

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "local-group.md"

# The ports the page names: ZooKeeper, the simulator's control API, the probes, the admin listeners,
# Prometheus and Alertmanager; and the simulator's three IMDS ports, consecutive from --base-port.
SINGLE = (2181, 18099, 8090, 8091, 8092, 9110, 9111, 9112, 19090, 19093)
RUNS = {18100: 3}
COMMANDS = ("java", "curl", "timeout", "prometheus", "prometheus-alertmanager", "promtool", "amtool")


def _script() -> str:
    return "\n".join(bash_blocks(PAGE.read_text()))


def _require_tools() -> None:
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    try:
        find_classpath()
    except RuntimeError as exc:
        missing.append(str(exc))
    if not (ROOT / ".venv" / "bin" / "coordinator").exists():
        missing.append(".venv/bin/coordinator (bash scripts/setup.sh)")
    if missing:
        reason = f"docs/local-group.md needs {', '.join(missing)} (bash scripts/setup.sh installs them)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def test_the_page_names_its_ports_and_runs_every_step_it_promises() -> None:
    script = _script()
    named = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", script)}
    named |= {int(p) for p in re.findall(r"--base-port (\d+)", script)}
    known = set(SINGLE) | {first + i for first, length in RUNS.items() for i in range(length)}
    assert named - known == set(), "the page uses ports this test does not move to free ones"
    for port in known:
        assert re.search(rf"(?<![\w.]){port}(?!\w)", script), f"the page no longer uses port {port}"
    for step in ("org.apache.zookeeper.server.quorum.QuorumPeerMain", "/usr/share/java/zookeeper.jar",
                 "coordinator imds-sim --vms vm0,vm1,vm2", "coordinator run --config", "coordinator check-config",
                 "coordinator status --config vm0.yaml --watch", "/events", "prometheus --config.file",
                 "prometheus-alertmanager --config.file", "CoordinatorDrainFailed", "coordinator run --config vm1.yaml "
                 "--dry-run", "coordinator drain vm2", "coordinator undrain vm2"):
        assert step in script, step
    assert script.rstrip().endswith('rm -rf "$GROUP"'), "the page ends by stopping everything"


def test_the_page_runs_as_written(tmp_path: Path) -> None:
    _require_tools()
    script = substitute(_script(), free_ports(SINGLE, RUNS))
    run = run_blocks(script, cwd=ROOT, workdir=tmp_path, timeout=240)
    said = f"\n--- the page's output ({run.seconds:.0f} s) ---\n{run.output[-12000:]}"
    assert run.returncode is not None, f"the page did not finish within 240 s{said}"
    assert run.returncode == 0, f"a step failed (exit {run.returncode}){said}"
    assert run.left_running == [], f"the page left processes running: {run.left_running}{said}"
    out = run.output
    assert "Mode: standalone" in out, said
    assert out.count("\nserving") >= 3 and "ok: coordinating" in out, said  # probes back; vm2 ready again
    assert "Members (3 live)" in out and "Nothing looks stuck." in out, said
    assert '"results":{"E-FREEZE":"approved"}' in out, said  # approved early, by the first VM named
    assert '"vm":"vm0"' in out, said
    assert "=> 3" in out, said  # Prometheus scrapes the three agents
    assert "CoordinatorDrainFailed" in out and "failing-drain" in out, said
    assert "dry-run: would acknowledge event E-DRY for vm1" in out, said  # the dry run beside the agent
    assert re.search(r"dry-run: event E-DRY held: approvals paused by [^;\n]*\n", out), said
    assert "Drained by hand" in out and "drain by hand of vm2 undone" in out, said
    assert not any(tmp_path.glob("tmp.*")), "the page left its working directory behind"
    print(f"docs/local-group.md ran in {run.seconds:.1f} s")
