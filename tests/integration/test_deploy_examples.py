"""The example configurations of deploy/examples/, one per drain integration, each accepted by
`coordinator check-config` (the command an operator runs) and buildable into the agent's actions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.config import load_settings
from coordinator.runtime import build_actions
from coordinator.store.zk_security import digest_identity

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "deploy" / "examples"
# example -> the action types it shows (the health probe is always there)
INTEGRATIONS = {
    "probe-only.yaml": set(),
    "haproxy.yaml": {"haproxy", "connections"},
    "command-hooks.yaml": {"command"},
    "webhooks.yaml": {"webhook"},
    "zookeeper-auth-tls.yaml": set(),
}
# zookeeper-auth-tls.yaml names files that check-config opens: they are made in a temporary directory
SECRETS_DIR = "/etc/coordinator/zookeeper/"


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


def _runnable(name: str, tmp_path: Path) -> Path:
    """The example as shipped, or for the TLS one, with its secrets directory moved to ``tmp_path``."""
    path = EXAMPLES / name
    text = path.read_text()
    if SECRETS_DIR not in text:
        return path
    secrets = tmp_path / "zookeeper"
    secrets.mkdir()
    for name_ in ("agent.password", "ca.pem", "client.pem", "client.key"):
        (secrets / name_).write_text("a password\n" if name_.endswith(".password") else "PEM\n")
    moved = tmp_path / name
    moved.write_text(text.replace(SECRETS_DIR, f"{secrets}/"))
    return moved


def test_there_is_one_example_per_integration() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(INTEGRATIONS)


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_check_config_accepts_the_example(name: str, tmp_path: Path) -> None:
    path = _runnable(name, tmp_path)
    result = _check_config(path)
    assert result.returncode == 0, result.stderr
    assert f"{path}: configuration is valid" in result.stderr
    settings = load_settings(path, environ={})
    assert {action.type for action in settings.actions} == INTEGRATIONS[name]
    assert settings.probe.listen == "0.0.0.0:8090" and settings.probe.path == "/health"
    assert len(build_actions(settings)) == len(settings.actions)
    assert f"coordinator check-config --config {name}" in (EXAMPLES / name).read_text()


def test_the_tls_example_names_exactly_the_files_it_needs(tmp_path: Path) -> None:
    text = (EXAMPLES / "zookeeper-auth-tls.yaml").read_text()
    settings = load_settings(_runnable("zookeeper-auth-tls.yaml", tmp_path), environ={})
    assert settings.zookeeper.auth is not None and settings.zookeeper.tls is not None
    assert settings.zookeeper.acls is not None  # the namespace is closed
    named = {line.split(SECRETS_DIR)[1].strip() for line in text.splitlines() if SECRETS_DIR in line}
    assert named == {"agent.password", "ca.pem", "client.pem", "client.key"}
    if not Path(SECRETS_DIR).exists():
        # as shipped, on a machine without them, check-config names each missing file
        result = _check_config(EXAMPLES / "zookeeper-auth-tls.yaml")
        assert result.returncode == 2
        for name in named:
            assert SECRETS_DIR + name in result.stderr


def test_the_tls_example_ships_no_usable_credential(tmp_path: Path) -> None:
    settings = load_settings(_runnable("zookeeper-auth-tls.yaml", tmp_path), environ={})
    for identity in [*settings.zookeeper.acl.operators, *settings.zookeeper.acl.readers]:
        scheme, user, digest = identity.split(":")
        assert "PLACEHOLDER" in digest, identity  # visibly not a credential to keep
        for password in ("secret", "password", "changeme", user):
            assert f"{scheme}:{user}:{digest}" != f"digest:{digest_identity(user, password).id}"


def test_the_deployment_doc_says_what_the_tls_example_needs() -> None:
    text = " ".join((ROOT / "docs/deployment.md").read_text().split())
    assert "except `zookeeper-auth-tls.yaml`, accepted once the four files it names exist" in text
    for name in ("/etc/coordinator/zookeeper/agent.password", "`ca.pem`", "`client.pem`", "`client.key`"):
        assert name in text
