"""What a newcomer's configuration file meets before any field is validated: its encoding."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.config import Settings, host_problems, load_settings
from coordinator.errors import ConfigError
from coordinator.runtime import policy_from

TEXT = "cluster: web  # café\nzookeeper:\n  hosts: zk1:2181\n"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-8-sig", "utf-32"])
def test_a_file_with_a_byte_order_mark_is_read_in_its_encoding(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "agent.yaml"
    # "utf-16" writes a BOM in the machine's order (what PowerShell 5.1's `>` writes); "utf-16-be" none:
    # give it one by hand.
    raw = TEXT.encode(encoding)
    if encoding == "utf-16-be":
        raw = b"\xfe\xff" + raw
    path.write_bytes(raw)
    settings = load_settings(path, environ={})
    assert settings.cluster == "web" and settings.zookeeper.hosts == "zk1:2181"


def test_latin1_is_one_error_naming_the_file_and_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(TEXT.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and f"offset {TEXT.index('é')}" in message and "0xe9" in message


@pytest.mark.parametrize("command", [["check-config"], ["run"], ["status"], ["pause", "--reason", "x"],
                                     ["resume"]])
def test_every_command_reading_a_latin1_file_says_so_in_one_line(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(TEXT.encode("latin-1"))
    result = subprocess.run([sys.executable, "-m", "coordinator", *command[:1], "--config", str(path),
                             *command[1:]], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(path) in result.stderr and f"offset {TEXT.index('é')}" in result.stderr


def _settings(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return load_settings(path, environ=environ or {})


def test_a_per_type_drain_wait_merges_over_the_defaults(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds_by_type: {Reboot: 100}\n")
    assert settings.drain.wait_seconds_by_type == {"Preempt": 5.0, "Reboot": 100.0}
    assert policy_from(settings).drain_wait_by_type == {"Preempt": 5.0, "Reboot": 100.0}
    assert settings.drain.wait_for("Preempt") == 5.0 and settings.drain.wait_for("Freeze") == 35.0
    dropped = _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds_by_type: {Preempt: null}\n")
    assert dropped.drain.wait_seconds_by_type == {}


def test_latest_start_must_cover_the_drain_wait_of_each_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds_by_type: {Reboot: 600}\n")
    assert "drain.latest_start_seconds (120)" in str(info.value) and "Reboot 600 s" in str(info.value)
    # a longer start time covers it
    _settings(tmp_path, "cluster: web\ndrain:\n  latest_start_seconds: 600\n  wait_seconds_by_type: {Reboot: 600}\n")


PROBE_ONLY = Path(__file__).parent.parent.parent / "deploy/examples/probe-only.yaml"


def test_an_error_from_the_environment_names_the_variable_not_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(PROBE_ONLY, environ={"COORDINATOR__ZOOKEEPR__HOSTS": "zk1:2181"})
    message = str(info.value)
    assert "COORDINATOR__ZOOKEEPR__HOSTS (environment): zookeepr: " in message
    assert not message.startswith(f"{PROBE_ONLY}: ")
    with pytest.raises(ConfigError) as info:
        load_settings(PROBE_ONLY, environ={"COORDINATOR__DRAIN__WAIT_SECONDS": "forty"})
    assert "COORDINATOR__DRAIN__WAIT_SECONDS (environment): drain.wait_seconds: " in str(info.value)
    with pytest.raises(ConfigError, match="COORDINATOR__ZOOKEEPER__ACL__READERS: "):
        load_settings(PROBE_ONLY, environ={"COORDINATOR__ZOOKEEPER__ACL__READERS": "[unclosed"})


def test_an_error_in_the_file_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cluster: web\ndrain:\n  probe_threshold: 0\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={"COORDINATOR__IMDS__POLL_INTERVAL": "0"})
    message = str(info.value)
    assert message.startswith(f"{path}: invalid configuration")
    assert "\n  drain.probe_threshold: " in message
    assert "\n  COORDINATOR__IMDS__POLL_INTERVAL (environment): imds.poll_interval: " in message


def test_environment_values_are_not_guessed_as_yaml_1_1() -> None:
    settings = load_settings(PROBE_ONLY, environ={
        "COORDINATOR__CLUSTER": "on",
        "COORDINATOR__VM_NAME": "no",
        "COORDINATOR__IMDS__STAGGER": "off",  # a boolean option still takes the usual words
        "COORDINATOR__DRAIN__WAIT_SECONDS": "45",
        "COORDINATOR__POLICY__ABSENT_PEER_GRACE_SECONDS": "null",
        "COORDINATOR__POLICY__MAX_EVENTS_IN_MAINTENANCE": "2",
        "COORDINATOR__DRAIN__WAIT_SECONDS_BY_TYPE": "{Reboot: 60}",
        "COORDINATOR__PROBE__PATH": "'/health'",
    })
    assert settings.cluster == "on" and settings.vm_name == "no"
    assert settings.imds.stagger is False and settings.drain.wait_seconds == 45.0
    assert settings.policy.absent_peer_grace_seconds is None and settings.policy.max_events_in_maintenance == 2
    assert settings.drain.wait_seconds_by_type == {"Preempt": 5.0, "Reboot": 60.0}
    assert settings.probe.path == "/health"


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds: 10\nhttp: {}\ndrain:\n  wait_seconds: 20\n")
    message = str(info.value)
    assert "\n" not in message
    assert "line 5: the key 'drain' is given twice (first on line 2)" in message
    with pytest.raises(ConfigError, match="line 4: the key 'name' is given twice"):
        _settings(tmp_path, "cluster: web\nactions:\n  - {type: command, name: a, drain: [x],\n     name: b}\n")
    # a YAML merge key followed by an override is meant, not a mistake
    merged = _settings(tmp_path, "cluster: web\nlogging:\n  <<: {format: json}\n  format: text\n")
    assert merged.logging.format == "text"


@pytest.mark.parametrize("level", ["debug", "Info", "warning", "ERROR"])
def test_the_log_level_is_taken_in_any_case(tmp_path: Path, level: str) -> None:
    assert _settings(tmp_path, f"cluster: web\nlogging:\n  level: {level}\n").logging.level == level.upper()


@pytest.mark.parametrize("field", ["drain.grace_seconds", "drain.latest_start_seconds", "imds.poll_interval",
                                   "policy.absent_peer_grace_seconds", "drain.wait_seconds_by_type.Reboot"])
@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_an_infinite_number_is_refused_at_its_own_field(tmp_path: Path, field: str, value: str) -> None:
    *sections, leaf = field.split(".")
    text = "cluster: web\n" + "".join("  " * i + f"{s}:\n" for i, s in enumerate(sections)) \
        + "  " * len(sections) + f"{leaf}: {value}\n"
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, text)
    assert str(info.value).splitlines()[1:] == [f"  {field}: Input should be a finite number"]


def test_check_config_never_prints_infinity(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cluster: web\ndrain:\n  latest_start_seconds: .inf\n")
    result = subprocess.run([sys.executable, "-m", "coordinator", "check-config", "--config", str(path)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "drain.latest_start_seconds: Input should be a finite number" in result.stderr
    assert "Infinity" not in result.stdout + result.stderr


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", *argv], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("where", ["under a file", "a directory"])
def test_check_config_and_run_refuse_a_state_file_that_cannot_be_written(tmp_path: Path, where: str) -> None:
    (tmp_path / "plain").write_text("")
    state = tmp_path / "plain" / "state.json" if where == "under a file" else tmp_path
    path = tmp_path / "agent.yaml"
    path.write_text(f"cluster: web\nstate_file: {state}\n")
    for command in ("check-config", "run"):
        result = _command(command, "--config", str(path))
        assert result.returncode == 2, (command, result.stderr)
        assert "state_file: " in result.stderr and "Traceback" not in result.stderr


def test_a_state_file_in_a_directory_this_user_cannot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path, f"cluster: web\nstate_file: {tmp_path}/state.json\n")
    monkeypatch.setattr("coordinator.config.host.os.access", lambda path, mode: False)
    errors, _ = host_problems(settings, at_start=False)
    assert errors == [f"state_file: cannot write files in {tmp_path}: permission denied "
                      f"(checked as user {getpass.getuser()})"]
    # a directory still to be made: the agent refuses to start, check-config (maybe another user) warns
    later = _settings(tmp_path, f"cluster: web\nstate_file: {tmp_path}/coordinator/state.json\n")
    assert host_problems(later, at_start=True)[0] and not host_problems(later, at_start=False)[0]
    assert "systemd creates it" in host_problems(later, at_start=False)[1][0]


@pytest.mark.parametrize(("probe", "http"), [("127.0.0.1:9110", "127.0.0.1:9110"), ("0.0.0.0:8090", "127.0.0.1:8090"),
                                             ("10.0.0.4:8090", "[::]:8090")])
def test_the_probe_and_the_admin_endpoints_cannot_share_a_port(tmp_path: Path, probe: str, http: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, f"cluster: web\nprobe:\n  listen: '{probe}'\nhttp:\n  listen: '{http}'\n")
    assert "probe.listen and http.listen must be different ports" in str(info.value)
    _settings(tmp_path, "cluster: web\nprobe:\n  listen: '10.0.0.4:8090'\nhttp:\n  listen: '127.0.0.1:8090'\n")


def test_rules_between_fields_are_reported_with_the_field_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, """
imds: {poll_interval: 5, url: "https://169.254.169.254"}
zookeeper: {session_timeout: 10}
drain: {probe_threshold: 0, wait_seconds: 200}
probe: {listen: "127.0.0.1:9110"}
policy:
  maintenance_windows: [{start: "25:00", end: "01:00"}]
actions:
  - {type: command, name: a, drain: [x]}
  - {type: command, name: b, drain: [y], timeout_seconds: -1}
  - {type: command, name: a, drain: [z]}
""")
    lines = str(info.value).splitlines()[1:]
    fields = [line.split(":")[0].strip() for line in lines]
    assert fields == [
        "cluster", "imds.url", "policy.maintenance_windows.0.start", "drain.probe_threshold",
        "actions.1.command.timeout_seconds",  # the field errors, then what they hid:
        "drain.latest_start_seconds (120) must be at least the drain wait of every event type (Freeze 200 s, "
        "Reboot 200 s, Redeploy 200 s, Terminate 200 s), or a late drain cannot finish before NotBefore",
        "zookeeper.session_timeout must be at least 3 x imds.poll_interval (10 < 3 x 5)",
        "actions", "probe.listen and http.listen must be different ports (127.0.0.1",
    ], lines


def test_a_valid_file_with_one_bad_field_reports_only_that_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds: 10\n  probe_threshold: 0\n"
                  "policy:\n  absent_peer_grace_seconds: 10\n")
    assert str(info.value).splitlines()[1:] == ["  drain.probe_threshold: Input should be greater than or equal to 1"]


def test_a_map_of_waits_under_wait_seconds_points_to_wait_seconds_by_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds: {Reboot: 60}\n")
    assert str(info.value).splitlines()[1:] == [
        "  drain.wait_seconds: takes one number, the wait of every event type; a wait per type goes in "
        "drain.wait_seconds_by_type (wait_seconds_by_type: {Reboot: 60})"]


def test_a_tab_in_the_yaml_is_one_line_naming_the_file_and_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\nzookeeper:\n\thosts: zk1:2181\n")
    assert str(info.value) == (f"{tmp_path / 'agent.yaml'}: line 3, column 1: not valid YAML: a tab character: YAML "
                               "indents with spaces only")
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: [unclosed\n")
    assert "\n" not in str(info.value) and "<unicode string>" not in str(info.value)
    assert "(while parsing a flow sequence on line 1)" in str(info.value)


@pytest.mark.parametrize("text", [
    "probe:\n  listen: '10.0.0.4:80800'\nhttp:\n  listen: 0.0.0.0:8090\n",  # the default probe.listen's port
    "probe:\n  listen: '10.0.0.4'\napp_health:\n  listen: 127.0.0.1:8090\n",
])
def test_a_bad_probe_listen_is_the_only_error_not_one_about_its_default(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\n" + text)
    [line] = str(info.value).splitlines()[1:]
    assert line.startswith("  probe.listen: expected HOST:PORT, got '10.0.0.4")


def test_no_rule_judges_the_default_that_stands_in_for_a_bad_drain_wait(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds: forty\n  latest_start_seconds: 30\n"
                  "policy:\n  absent_peer_grace_seconds: 20\n")
    assert [line.split(":")[0] for line in str(info.value).splitlines()[1:]] == ["  drain.wait_seconds"]


def test_the_printed_configuration_shows_the_wait_of_every_event_type(tmp_path: Path) -> None:
    from coordinator.config import redacted

    settings = _settings(tmp_path, "cluster: web\ndrain:\n  wait_seconds_by_type: {Reboot: 100}\n")
    shown = redacted(settings)["drain"]
    assert shown["wait_seconds"] == 35.0
    assert shown["wait_seconds_by_type"] == {"Freeze": 35.0, "Reboot": 100.0, "Redeploy": 35.0, "Preempt": 5.0,
                                             "Terminate": 35.0}
    again = Settings.model_validate({"cluster": "web", "drain": shown})
    assert again.drain.waits() == settings.drain.waits()
