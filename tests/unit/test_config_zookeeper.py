"""The ZooKeeper security options: validated like every other option, errors naming the field, and the
secrets they carry never shown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.security import Permissions

from coordinator.config import Settings, load_settings, redacted
from coordinator.errors import ConfigError
from coordinator.store.zk_security import digest_identity

HASH = "operator:" + "A" * 27 + "="


def load(tmp_path: Path, zookeeper: dict[str, Any]) -> Settings:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"cluster": "web", "zookeeper": zookeeper}))
    return load_settings(path, environ={})


def error(tmp_path: Path, zookeeper: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, zookeeper)
    return str(raised.value)


def test_without_auth_the_namespace_is_open_and_nothing_is_sent(tmp_path: Path) -> None:
    options = load(tmp_path, {}).zookeeper.client_options()
    assert options.acls is None and options.auth_data == () and options.tls is None


def test_auth_from_a_password_file_gives_the_agents_every_permission(tmp_path: Path) -> None:
    (tmp_path / "zk-password").write_text("s3cret\n")
    zookeeper = load(tmp_path, {"auth": {"username": "coordinator", "password_file": str(tmp_path / "zk-password")},
                                "acl": {"operators": [f"digest:{HASH}"], "readers": ["x509:O=example,CN=ops"]}})
    options = zookeeper.zookeeper.client_options()
    assert options.auth_data == (("digest", "coordinator:s3cret"),)
    assert options.acls is not None
    agent = digest_identity("coordinator", "s3cret")
    default = {(entry.id.scheme, entry.id.id): entry.perms for entry in options.acls.default}
    assert default[("digest", agent.id)] == Permissions.ALL
    assert default[("digest", HASH)] == Permissions.READ
    assert default[("x509", "O=example,CN=ops")] == Permissions.READ
    base = {(entry.id.scheme, entry.id.id): entry.perms for entry in options.acls.base}
    assert base[("digest", HASH)] == Permissions.READ | Permissions.CREATE | Permissions.DELETE
    assert ("world", "anyone") not in default and ("world", "anyone") not in base


@pytest.mark.parametrize(("zookeeper", "message"), [
    ({"auth": {"username": "coordinator"}}, "exactly one of password and password_file"),
    ({"auth": {"username": "coordinator", "password": "a", "password_file": "/x"}}, "exactly one of password"),
    ({"auth": {"username": "co:ordinator", "password": "a"}}, "zookeeper.auth.username"),
    ({"auth": {"username": "coordinator", "password": ""}}, "the password is empty"),
    ({"auth": {"username": "coordinator", "password_file": "/nonexistent/zk-password"}},
     "zookeeper.auth.password_file: cannot read /nonexistent/zk-password"),
    ({"acl": {"readers": ["digest:reader:not-a-hash"]}},
     "zookeeper.acl.readers: 'digest:reader:not-a-hash': a digest identity"),
    ({"acl": {"readers": ["kerberos:ops"]}}, "SCHEME one of digest, x509"),
    ({"acl": {"readers": ["world:everyone"]}}, "world:anyone"),
    ({"acl": {"readers": [f"digest:{HASH}"]}}, "need an agent identity too"),
    ({"tls": {"certfile": "/nonexistent/client.crt"}}, "zookeeper.tls.certfile: Value error, cannot read"),
    ({"tls": {"cert": "x"}}, "zookeeper.tls.cert"),
])
def test_broken_security_options_name_their_field(tmp_path: Path, zookeeper: dict[str, Any], message: str) -> None:
    text = error(tmp_path, zookeeper)
    assert message.replace("Value error, ", "") in text, text


def test_a_certificate_needs_its_key(tmp_path: Path) -> None:
    (tmp_path / "client.crt").write_text("-")
    assert "certfile and keyfile go together" in error(tmp_path, {"tls": {"certfile": str(tmp_path / "client.crt")}})


def test_passwords_never_show_in_check_config_or_the_settings_repr(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.crt", "client.key"):
        (tmp_path / name).write_text("-")
    config = {"cluster": "web", "zookeeper": {
        "auth": {"username": "coordinator", "password": "zk-pass-1234"},
        "tls": {"ca": str(tmp_path / "ca.pem"), "certfile": str(tmp_path / "client.crt"),
                "keyfile": str(tmp_path / "client.key"), "keyfile_password": "key-pass-5678"}}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    settings = load_settings(path, environ={})
    shown = [repr(settings), str(settings), repr(settings.zookeeper.client_options()), str(redacted(settings))]
    result = subprocess.run([sys.executable, "-m", "coordinator", "check-config", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shown.append(result.stdout + result.stderr)
    for text in shown:
        assert "zk-pass-1234" not in text and "key-pass-5678" not in text
    assert "coordinator" in result.stdout  # the user name is no secret


def test_credentials_can_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"cluster": "web"}))
    settings = load_settings(path, environ={"COORDINATOR__ZOOKEEPER__AUTH__USERNAME": "coordinator",
                                            "COORDINATOR__ZOOKEEPER__AUTH__PASSWORD": "from-env"})
    assert settings.zookeeper.client_options().auth_data == (("digest", "coordinator:from-env"),)
