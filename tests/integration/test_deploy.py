"""The deployment files: docker-compose.yml checked by the real Compose binary, and every agent service's
environment checked as a configuration."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coordinator.config import load_settings

ROOT = Path(__file__).parent.parent.parent
COMPOSE = ROOT / ".venv" / "tools" / "docker-compose"


def compose_config() -> dict[str, Any]:
    if not COMPOSE.exists():
        message = f"{COMPOSE} missing: scripts/setup.sh installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([str(COMPOSE), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def test_compose_file_is_valid_and_every_agent_configuration_too() -> None:
    services = compose_config()["services"]
    assert {"zookeeper", "imds-sim", "vm0", "vm1", "vm2"} <= set(services)
    for name in ("vm0", "vm1", "vm2"):
        environment = services[name]["environment"]
        settings = load_settings(None, environ=environment)
        assert settings.vm_name == name
        assert settings.zookeeper.hosts == "zookeeper:2181"
        assert settings.imds.url.startswith("http://imds-sim:")
        assert services[name]["command"][:2] == ["coordinator", "run"]


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    compose_config()  # the binary is there
    broken = tmp_path / "docker-compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("depends_on: [zookeeper, imds-sim]",
                                                                          "depends_on: [zookeeper, nowhere]"))
    result = subprocess.run([str(COMPOSE), "-f", str(broken), "config", "-q"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0
    assert "nowhere" in result.stderr
