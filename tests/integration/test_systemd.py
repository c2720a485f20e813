"""The systemd kit: the unit checked by `systemd-analyze verify` and scored by `systemd-analyze security
--offline`, its settings checked against the install script and the CLI, and deploy/systemd/install.sh
checked by bash -n and shellcheck and run, dry and for real, in a temporary root. No systemd runs here
as PID 1: the unit is never started."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli import build_parser

ROOT = Path(__file__).parent.parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"
UNIT = SYSTEMD / "coordinator.service"
INSTALL = SYSTEMD / "install.sh"
MAX_EXPOSURE = 2.0  # systemd-analyze security's overall exposure, 0 (locked down) to 10 (none)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is missing: scripts/setup.sh installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    assert path is not None
    return path


def _directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def _script_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", INSTALL.read_text(), re.M)
    assert match is not None, name
    return re.sub(r"\$(\w+)", lambda m: _script_value(m.group(1)), match.group(1))


def _verifiable_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with its ExecStart executable (a path in the virtualenv install.sh creates) pointing at
    this project's own `coordinator`, which exists here: verify checks that the executable exists."""
    here = Path(sys.executable).parent / "coordinator"
    assert here.exists()
    copy = tmp_path / "coordinator.service"
    source = UNIT.read_text() if text is None else text
    copy.write_text(source.replace(f"{_script_value('VENV')}/bin/coordinator", str(here)))
    return copy


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    result = _verify(_verifiable_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == "", "verify reported something about the unit"


def test_verify_reports_a_broken_unit(tmp_path: Path) -> None:
    broken = _verifiable_copy(tmp_path, UNIT.read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    result = _verify(broken)
    assert "Unknown key 'Restrat'" in result.stdout + result.stderr


def test_the_unit_exposure_score_stays_low(tmp_path: Path) -> None:
    unit = _verifiable_copy(tmp_path)
    analyze = _tool("systemd-analyze")
    result = subprocess.run([analyze, "security", "--offline=true", f"--threshold={int(MAX_EXPOSURE * 10)}",
                             str(unit)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    score = re.search(r"Overall exposure level for coordinator\.service: (\d+\.\d+)", result.stdout)
    assert score is not None, result.stdout
    assert float(score.group(1)) <= MAX_EXPOSURE
    # and the threshold does bite: the same unit without its hardening fails it
    bare = "\n".join(line for line in unit.read_text().splitlines()
                     if not line.startswith(("Protect", "Private", "Restrict", "SystemCall", "Capability",
                                             "NoNewPrivileges", "MemoryDeny", "LockPersonality")))
    (tmp_path / "bare").mkdir()
    bare_unit = tmp_path / "bare" / "coordinator.service"
    bare_unit.write_text(bare)
    loose = subprocess.run([analyze, "security", "--offline=true", f"--threshold={int(MAX_EXPOSURE * 10)}",
                            str(bare_unit)], capture_output=True, text=True, timeout=120, check=False)
    assert loose.returncode != 0


def test_the_unit_runs_the_agent_as_install_sh_lays_it_out() -> None:
    directives = _directives(UNIT.read_text())
    one = {key: values[-1] for key, values in directives.items()}
    assert one["Restart"] == "on-failure"
    assert 1 <= float(one["RestartSec"]) <= 60
    assert one["User"] == one["Group"] == _script_value("USER_NAME")
    assert f"/var/lib/{one['StateDirectory']}" == _script_value("STATE_DIR")
    assert f"/etc/{one['ConfigurationDirectory']}" == _script_value("CONFIG_DIR")
    argv = shlex.split(one["ExecStart"])
    assert argv[0] == f"{_script_value('VENV')}/bin/coordinator"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and str(args.config) == _script_value("CONFIG")
    assert _script_value("UNIT").endswith("/" + UNIT.name)


def test_the_unit_is_hardened() -> None:
    one = {key: values[-1] for key, values in _directives(UNIT.read_text()).items()}
    expected = {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet": "", "RestrictSUIDSGID": "yes", "RestrictNamespaces": "yes",
    }
    assert {key: one.get(key) for key in expected} == expected
    filters = _directives(UNIT.read_text())["SystemCallFilter"]
    assert "@system-service" in filters
    # the connections action reads /proc/net/tcp: ProcSubset=pid would hide it
    assert "ProcSubset" not in one


def test_install_sh_parses_and_passes_shellcheck() -> None:
    syntax = subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, text=True, timeout=30, check=False)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run([_tool("shellcheck"), str(INSTALL)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert os.access(INSTALL, os.X_OK)


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), "--root", str(root), "--python", sys.executable, *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_dry_run_prints_every_step_and_changes_nothing(tmp_path: Path) -> None:
    result = _install(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []
    planned = [line.removeprefix("install: would run: ") for line in result.stdout.splitlines()
               if line.startswith("install: would run: ")]
    venv, config, unit = (_script_value(name) for name in ("VENV", "CONFIG", "UNIT"))
    assert planned[0] == f"install -d -m 0755 {tmp_path}{venv}"
    assert planned[1].endswith(f" -m venv {tmp_path}{venv}")
    assert planned[2].startswith(f"{tmp_path}{venv}/bin/pip install --no-cache-dir ")
    assert planned[2].endswith(f" {ROOT}")
    assert planned[4].endswith(f"deploy/coordinator.example.yaml {tmp_path}{config}")
    assert planned[5].endswith(f"deploy/systemd/coordinator.service {tmp_path}{unit}")
    assert planned[6] == f"systemctl --root={tmp_path} enable coordinator.service"
    assert "not creating user" in result.stdout


def test_install_in_a_root_is_idempotent_and_keeps_an_edited_configuration(tmp_path: Path) -> None:
    """A real run in a temporary root. The package is already in the virtualenv (this project's own
    `coordinator`, behind a wrapper at the path install.sh uses), so pip is not needed: the script finds
    the same version and does not reinstall it."""
    _tool("systemctl")
    venv = tmp_path / _script_value("VENV").lstrip("/")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    wrapper = venv / "bin" / "coordinator"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} "
                       '-m coordinator "$@"\n')
    wrapper.chmod(0o755)

    first = _install(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "is installed in" in first.stdout and "pip install" not in first.stdout
    config = tmp_path / _script_value("CONFIG").lstrip("/")
    unit = tmp_path / _script_value("UNIT").lstrip("/")
    assert config.read_text() == (ROOT / "deploy" / "coordinator.example.yaml").read_text()
    assert unit.read_text() == UNIT.read_text()
    enabled = tmp_path / "etc/systemd/system/multi-user.target.wants/coordinator.service"
    assert enabled.is_symlink()
    # the installed configuration is one the installed agent accepts
    check = subprocess.run([str(wrapper), "check-config", "--config", str(config)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stderr

    config.write_text(config.read_text().replace("cluster: web-frontend", "cluster: payments"))
    second = _install(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "cluster: payments" in config.read_text()
    assert "kept as it is" in second.stdout and "is up to date" in second.stdout
    assert "running: install" not in second.stdout
    assert enabled.is_symlink()
