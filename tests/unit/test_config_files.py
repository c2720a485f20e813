"""What a newcomer's configuration file meets before any field is validated: its encoding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.config import Settings, load_settings
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
