"""Configuration: defaults, environment overrides, and every invalid example rejected naming the field."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.config import CommandActionConfig, Settings, WebhookActionConfig, load_settings, redacted
from coordinator.errors import ConfigError

ROOT = Path(__file__).parent.parent.parent


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_minimal_file_gets_the_documented_defaults(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, {"cluster": "web"}), environ={})
    assert settings.imds.poll_interval == 1.0
    assert settings.drain.effective_wait == 35.0  # 15 s x 2 + 5 s
    assert settings.policy.max_events_in_maintenance == 1
    assert settings.zookeeper.root == "/azure-maintenance"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    env = {
        "COORDINATOR__ZOOKEEPER__HOSTS": "zk1:2181,zk2:2181",
        "COORDINATOR__DRAIN__WAIT_SECONDS": "45",
        "COORDINATOR__POLICY__KEEP_ONE_SERVING": "false",
        "UNRELATED": "x",
    }
    settings = load_settings(write(tmp_path, {"cluster": "web", "drain": {"wait_seconds": 10}}), environ=env)
    assert settings.zookeeper.hosts == "zk1:2181,zk2:2181"
    assert settings.drain.wait_seconds == 45
    assert settings.policy.keep_one_serving is False


def test_documented_example_is_valid(tmp_path: Path) -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    example = re.search(r"## A complete example\n\n```yaml\n(.*?)```", text, re.S)
    assert example is not None
    # The files it names are read at load time: give them a home here.
    for name in ("zookeeper-password", "zookeeper-ca.pem"):
        (tmp_path / name).write_text("secret\n")
    settings = load_settings(write(tmp_path, example.group(1).replace("/etc/coordinator/", f"{tmp_path}/")),
                             environ={})
    assert settings.zookeeper.auth is not None and settings.zookeeper.tls is not None
    assert [a.type for a in settings.actions] == ["haproxy", "connections", "command", "webhook"]
    assert load_settings(ROOT / "deploy/coordinator.example.yaml", environ={}).cluster == "web-frontend"


INVALID = [
    # (configuration, the field the message must name)
    ({}, "cluster"),
    ({"cluster": "a/b"}, "cluster"),
    ({"cluster": "web", "vm_name": "../etc"}, "vm_name"),
    ({"cluster": "web", "imds": {"url": "https://169.254.169.254"}}, "imds.url"),
    ({"cluster": "web", "imds": {"url": "http://169.254.169.254/metadata/scheduledevents"}}, "imds.url"),
    ({"cluster": "web", "imds": {"poll_interval": 0}}, "imds.poll_interval"),
    ({"cluster": "web", "imds": {"max_requests_per_second": 10}}, "imds.max_requests_per_second"),
    ({"cluster": "web", "zookeeper": {"hosts": "zk1"}}, "zookeeper.hosts"),
    ({"cluster": "web", "zookeeper": {"root": "relative"}}, "zookeeper.root"),
    ({"cluster": "web", "zookeeper": {"session_timeout": 2}}, "zookeeper.session_timeout"),
    ({"cluster": "web", "zookeeper": {"session_timeout": 5, "operation_timeout": 6}}, "zookeeper.operation_timeout"),
    (
        {"cluster": "web", "imds": {"poll_interval": 5}, "zookeeper": {"session_timeout": 10}},
        "zookeeper.session_timeout",
    ),
    ({"cluster": "web", "policy": {"approver": "anyone"}}, "policy.approver"),
    ({"cluster": "web", "policy": {"approval": {"Hibernate": "never"}}}, "policy.approval"),
    ({"cluster": "web", "policy": {"approval": {"Freeze": "sometimes"}}}, "policy.approval.Freeze"),
    ({"cluster": "web", "policy": {"max_events_in_maintenance": 0}}, "policy.max_events_in_maintenance"),
    ({"cluster": "web", "policy": {"unknown_peers": "maybe"}}, "policy.unknown_peers"),
    ({"cluster": "web", "drain": {"probe_threshold": 0}}, "drain.probe_threshold"),
    ({"cluster": "web", "drain": {"wait_seconds": 200}}, "drain.latest_start_seconds"),
    ({"cluster": "web", "drain": {"lead_time_seconds": 60}}, "drain.lead_time_seconds"),
    ({"cluster": "web", "drain": {"wait_seconds_by_type": {"Nap": 1}}}, "drain.wait_seconds_by_type"),
    ({"cluster": "web", "probe": {"listen": "8090"}}, "probe.listen"),
    ({"cluster": "web", "http": {"listen": "localhost:99999"}}, "http.listen"),
    ({"cluster": "web", "logging": {"format": "xml"}}, "logging.format"),
    ({"cluster": "web", "zookeper": {}}, "zookeper"),
    ({"cluster": "web", "actions": [{"type": "ssh"}]}, "actions.0"),
    (
        {"cluster": "web", "actions": [{"type": "haproxy", "runtime": "/s", "server": "web0"}]},
        "actions.0.haproxy.backend",
    ),
    ({"cluster": "web", "actions": [{"type": "command", "name": "x"}]}, "actions.0.command"),
    ({"cluster": "web", "actions": [{"type": "command", "name": "a b", "drain": ["x"]}]}, "actions.0.command.name"),
    ({"cluster": "web", "actions": [{"type": "webhook", "name": "w", "url": "ftp://x"}]}, "actions.0.webhook.url"),
    (
        {"cluster": "web", "actions": [{"type": "webhook", "name": "w", "url": "http://x", "phases": ["start"]}]},
        "actions.0.webhook.phases.0",
    ),
    ({"cluster": "web", "actions": [{"type": "connections", "ports": [70000]}]}, "actions.0.connections.ports"),
    (
        {
            "cluster": "web",
            "actions": [
                {"type": "command", "name": "a", "drain": ["x"]},
                {"type": "command", "name": "a", "drain": ["y"]},
            ],
        },
        "actions",
    ),
]


@pytest.mark.parametrize(("data", "field"), INVALID, ids=[f for _, f in INVALID])
def test_invalid_configuration_names_the_field(tmp_path: Path, data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, data), environ={})
    assert re.search(rf"(^|\n  ){re.escape(field)}\b", str(info.value)), str(info.value)


@pytest.mark.parametrize("url", ["http://169.254.169.254/metadata/scheduledevents",
                                 "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
                                 "http://169.254.169.254/metadata/"])
def test_an_imds_url_with_microsofts_whole_path_is_refused_with_the_form_wanted(tmp_path: Path, url: str) -> None:
    """The agent adds /metadata/scheduledevents itself: with the whole path it asked for it twice and got
    404s, which the doctor blamed on a proxy."""
    with pytest.raises(ConfigError, match=r"imds.url: give the base URL only, as http://169.254.169.254"):
        load_settings(write(tmp_path, {"cluster": "web", "imds": {"url": url}}), environ={})
    for fine in ("http://169.254.169.254/", "http://127.0.0.1:8080", "http://127.0.0.1:8080/vm0"):
        assert load_settings(write(tmp_path, {"cluster": "web", "imds": {"url": fine}}), environ={}).imds.url == \
            fine.rstrip("/")


def test_a_value_of_the_wrong_kind_says_what_was_given_and_the_form_wanted(tmp_path: Path) -> None:
    data = {"cluster": "web", "zookeeper": {"hosts": ["zk1:2181", "zk2:2181"], "session_timeout": "20s"},
            "imds": {"stagger": "sometimes"}}
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, data), environ={})
    text = str(info.value)
    assert ("zookeeper.hosts: Input should be a valid string (got a list ['zk1:2181', 'zk2:2181']; wanted one "
            "string, as 'zk1:2181,zk2:2181': Ensemble as host:port,host:port (no chroot))") in text
    assert "zookeeper.session_timeout: " in text and "(got the string '20s'; wanted a bare number (20), no unit" in text
    assert "imds.stagger: " in text and "(got the string 'sometimes'; wanted true or false" in text


@pytest.mark.parametrize("text", ["cluster: [unclosed", "- just\n- a list\n"])
def test_broken_yaml_is_reported(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"agent\.yaml"):
        load_settings(write(tmp_path, text), environ={})


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml", environ={})


def test_check_config_command(tmp_path: Path) -> None:
    bad = write(tmp_path, {"cluster": "web", "zookeeper": {"session_timeout": 2}})
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "check-config", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "zookeeper.session_timeout" in result.stderr
    good = write(tmp_path, {"cluster": "web"})
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "check-config", "--config", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert '"effective_wait"' not in result.stdout and '"cluster": "web"' in result.stdout


def test_configuration_doc_lists_every_option_as_the_code_defines_it() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from config_reference import tables
    finally:
        sys.path.pop(0)
    text = (ROOT / "docs/configuration.md").read_text()
    documented = text.split("<!-- options:begin -->\n", 1)[1].split("<!-- options:end -->", 1)[0]
    assert documented == tables(), "docs/configuration.md is stale: regenerate with scripts/config_reference.py"
    for name in Settings.model_fields:
        assert f"`{name}" in documented


def test_secrets_in_webhook_headers_and_command_environments_are_redacted() -> None:
    settings = Settings.model_validate({
        "cluster": "web",
        "actions": [
            {"type": "webhook", "name": "pager", "url": "https://hooks.example/x",
             "headers": {"Authorization": "Bearer s3cr3t"}},
            {"type": "command", "name": "ckpt", "drain": ["/bin/true"], "env": {"API_TOKEN": "t0k3n"}},
        ],
    })
    shown = json.dumps(redacted(settings))
    assert "s3cr3t" not in shown and "t0k3n" not in shown
    assert "s3cr3t" not in repr(settings) and "t0k3n" not in str(settings)
    webhook, command = settings.actions
    assert isinstance(webhook, WebhookActionConfig) and isinstance(command, CommandActionConfig)
    assert webhook.headers["Authorization"].get_secret_value() == "Bearer s3cr3t"  # for the action to read
    assert command.env["API_TOKEN"].get_secret_value() == "t0k3n"
    actions = redacted(settings)["actions"]
    assert actions[0]["headers"] == {"Authorization": "<redacted>"}
    assert actions[1]["env"] == {"API_TOKEN": "<redacted>"}
