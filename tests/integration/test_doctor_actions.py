"""``coordinator doctor``'s ``actions`` check against real parts: an HAProxy runtime API (the ``haproxy``
fixture), programs on this machine, a listening socket. Each action is tried without changing anything,
and a drain that would fail is a FAIL naming the action and the cause."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from coordinator.config import Settings
from coordinator.doctor.actions import actions_verdict, observe
from coordinator.doctor.outcome import Status
from tests.plugins.haproxy import RunningHAProxy


def _settings(actions: list[dict[str, Any]]) -> Settings:
    return Settings.model_validate({"cluster": "web", "actions": actions})


def test_actions_that_would_drain_pass_and_each_broken_one_fails_with_its_cause(
    haproxy: RunningHAProxy, tmp_path: Path,
) -> None:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    not_executable = tmp_path / "drain.sh"
    not_executable.write_text("#!/bin/sh\n")
    try:
        good = _settings([
            {"type": "haproxy", "runtime": str(haproxy.socket_path), "backend": haproxy.backend,
             "server": haproxy.servers[0]},
            {"type": "command", "name": "lb-off", "drain": [sys.executable, "-c", "pass"], "recover": ["true"]},
            {"type": "webhook", "name": "pager", "url": f"http://127.0.0.1:{listening.getsockname()[1]}/hook"},
            {"type": "connections", "ports": [80]},
        ])
        verdict = actions_verdict(observe(good, 5.0), len(good.actions))
        assert verdict.status is Status.PASS, verdict
        assert f"haproxy {haproxy.backend}/{haproxy.servers[0]}: ready, " in verdict.summary
        assert f"command lb-off: drain {sys.executable}, recover " in verdict.summary
        assert "webhook pager: 127.0.0.1:" in verdict.summary
        assert haproxy.proxy.socket_path.exists()

        bad = _settings([
            {"type": "haproxy", "runtime": str(tmp_path / "no.sock"), "backend": haproxy.backend,
             "server": haproxy.servers[0]},
            {"type": "haproxy", "runtime": str(haproxy.socket_path), "backend": haproxy.backend, "server": "web9"},
            {"type": "command", "name": "missing", "drain": ["no-such-program-here"]},
            {"type": "command", "name": "plain", "recover": [str(not_executable)]},
            {"type": "webhook", "name": "down", "url": f"http://127.0.0.1:{closed.getsockname()[1]}/hook"},
        ])
        verdict = actions_verdict(observe(bad, 5.0), len(bad.actions))
        assert verdict.status is Status.FAIL
        problems = {a["action"]: a["problem"] for a in verdict.details["actions"]}
        assert str(tmp_path / "no.sock") in problems[f"haproxy {haproxy.backend}/{haproxy.servers[0]}"]
        assert "has no server" in problems[f"haproxy {haproxy.backend}/web9"]
        assert "'no-such-program-here' is not on PATH" in problems["command missing"]
        assert "is not executable by this user" in problems["command plain"]
        assert "does not accept a connection" in problems["webhook down"]
        assert "the event waits for NotBefore" in verdict.fix
    finally:
        listening.close()
        closed.close()


def test_no_action_but_the_probe_passes() -> None:
    verdict = actions_verdict(observe(_settings([]), 1.0), 0)
    assert (verdict.status, verdict.summary) == (Status.PASS, "no action but the probe")
