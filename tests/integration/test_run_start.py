"""What ``coordinator run`` loads and says as it starts, on a real process: it imports only the modules the
agent uses (the simulator, the testbed, the group reader, the Windows service, the dry run and the action
kinds the configuration does not name stay out of it), and its first line is short, naming what an
operator checks first, while the whole effective configuration is written at DEBUG only.

Each agent here but the last stops right after that line: its probe's port (a dry run's admin port) is
already taken, so it exits 2 before it would reach ZooKeeper."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator import __version__

# Loaded only by other subcommands, by ``--dry-run``, or by an action kind the configuration names.
NOT_LOADED_BY_RUN = (
    "azuresim",
    "coordinator.testbed",
    "coordinator.groupstatus",
    "coordinator.winservice",
    "coordinator.doctor",
    "coordinator.control",
    "coordinator.dryrun",
    "coordinator.actions.haproxy",
    "coordinator.actions.webhook",
    "coordinator.actions.azure_lb",
    "coordinator.actions.command",
    "statistics",
)

# ``coordinator run`` in this interpreter, then the names of every module it loaded, as JSON.
RUN_THEN_LIST_MODULES = """
import json, sys
from coordinator.cli import main
code = main(["run", "--config", sys.argv[1]])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def write_config(path: Path, probe_port: int, **extra: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "cluster": "web", "vm_name": "vm0", "probe": {"listen": f"127.0.0.1:{probe_port}", "path": "/health"},
        "http": {"listen": "127.0.0.1:0"}, "zookeeper": {"hosts": "127.0.0.1:1,127.0.0.1:2"},
        "imds": {"url": "http://127.0.0.1:3"}, "state_file": str(path.parent / "state.json"), **extra,
    }))
    return path


def run_agent(config: Path, *args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "coordinator", "run", "--config", str(config), *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr + run.stdout
    return run.stderr + run.stdout


def test_run_loads_no_module_that_only_other_commands_use(tmp_path: Path, taken_port: int) -> None:
    config = write_config(tmp_path / "agent.yaml", taken_port)
    run = subprocess.run([sys.executable, "-c", RUN_THEN_LIST_MODULES, str(config)],
                         capture_output=True, text=True, timeout=60)
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["code"] == 2  # stopped at the taken port, every import of the run path done
    modules = set(result["modules"])
    assert {"coordinator.runtime", "coordinator.agent", "coordinator.store.zookeeper", "kazoo.client"} <= modules
    loaded = sorted(m for m in modules if any(m == name or m.startswith(name + ".") for name in NOT_LOADED_BY_RUN))
    assert loaded == []


def test_an_action_kind_is_loaded_when_the_configuration_names_it(tmp_path: Path) -> None:
    config = write_config(tmp_path / "agent.yaml", 0,
                          actions=[{"type": "command", "name": "lb-off", "drain": ["true"]}])
    code = ("import json, sys\nfrom pathlib import Path\nfrom coordinator.config import load_settings\n"
            "from coordinator.runtime import build_actions\nactions = build_actions(load_settings(Path(sys.argv[1])))\n"
            "print(json.dumps({'actions': [a.name for a in actions], 'modules': sorted(sys.modules)}))")
    run = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=60)
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["actions"] == ["lb-off"]
    assert "coordinator.actions.command" in result["modules"]
    assert not {"coordinator.actions.webhook", "coordinator.actions.haproxy", "coordinator.actions.azure_lb"} & set(
        result["modules"])


def test_the_start_line_is_short_and_names_what_an_operator_checks(tmp_path: Path, taken_port: int) -> None:
    token = "hook-t0ken-in-the-url"
    config = write_config(tmp_path / "agent.yaml", taken_port, actions=[
        {"type": "haproxy", "runtime": "/run/haproxy.sock", "backend": "web", "server": "vm0"},
        {"type": "webhook", "name": "pager", "url": f"https://hooks.example/{token}",
         "headers": {"Authorization": "Bearer secret"}},
    ])
    output = run_agent(config)
    [line] = [line for line in output.splitlines() if " starting" in line]
    assert len(line) < 400
    for shown in ("vm vm0", "cluster web", "zookeeper 127.0.0.1:1,127.0.0.1:2", "imds http://127.0.0.1:3",
                  "drain: probe, haproxy web/vm0, webhook pager", f"probe on 127.0.0.1:{taken_port}/health",
                  "admin on 127.0.0.1:0"):
        assert shown in line
    assert "DRY-RUN" not in line
    assert "effective configuration" not in output
    assert token not in output and "secret" not in output


def test_the_whole_configuration_is_logged_at_debug(tmp_path: Path, taken_port: int) -> None:
    config = write_config(tmp_path / "agent.yaml", taken_port, logging={"level": "DEBUG", "format": "json"},
                          actions=[{"type": "command", "name": "api", "drain": ["true"], "env": {"TOKEN": "s3cr3t"}}])
    # A dry run serves no probe: it stops at its admin port, taken too.
    output = run_agent(config, "--dry-run", "--admin-listen", f"127.0.0.1:{taken_port}")
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(f"cannot listen on --admin-listen 127.0.0.1:{taken_port}" in r["message"] for r in records)
    [start] = [r for r in records if " starting" in r["message"]]
    assert start["level"] == "INFO"
    assert "in DRY-RUN mode" in start["message"] and "drain: probe, command api" in start["message"]
    [full] = [r for r in records if r["message"].startswith("effective configuration: ")]
    assert full["level"] == "DEBUG"
    effective = json.loads(full["message"].removeprefix("effective configuration: "))
    assert effective["zookeeper"]["hosts"] == "127.0.0.1:1,127.0.0.1:2"
    assert effective["actions"][0]["env"] == {"TOKEN": "<redacted>"}
    assert "s3cr3t" not in output


def test_a_dry_run_beside_the_agent_takes_neither_of_its_ports_and_serves_no_probe(tmp_path: Path) -> None:
    """The VM's real agent holds ``probe.listen`` and ``http.listen``: a dry run with the same file starts
    anyway, serves no health probe (the load balancer keeps seeing the real agent's answer, or none) and
    answers ``/status`` on a port of its own, which it names."""
    with socket.socket() as probe, socket.socket() as admin:
        for taken in (probe, admin):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        config = write_config(tmp_path / "agent.yaml", probe.getsockname()[1],
                              http={"listen": f"127.0.0.1:{admin.getsockname()[1]}"})
        proc = subprocess.Popen([sys.executable, "-m", "coordinator", "run", "--config", str(config), "--dry-run"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            lines: list[str] = []
            for line in proc.stdout:
                lines.append(line)
                if "admin (/status, /metrics) on" in line:
                    break
            assert proc.poll() is None, "".join(lines)
            output = "".join(lines)
            assert "DRY-RUN" in output and "no health probe" in output
            assert "cannot listen" not in output
            port = int(output.rsplit("127.0.0.1:", 1)[1].split()[0])
            assert port not in (probe.getsockname()[1], admin.getsockname()[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(b"GET /status HTTP/1.0\r\n\r\n")
                assert conn.recv(64).split(b" ")[1] == b"200"
            # Which VM, group and version this agent is, for rules without such target labels.
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                metrics = b""
                while chunk := conn.recv(65536):
                    metrics += chunk
            assert f'coordinator_info{{cluster="web",version="{__version__}",vm="vm0"}} 1.0'.encode() in metrics
        finally:
            proc.terminate()
            assert proc.wait(timeout=20) == 0
