"""A token in a webhook header and in a command's environment reaches the receiver and the command, and
nothing else: not the effective configuration, its repr, ``check-config``, the agent's /status, the
errors, or any log record written while both actions fail (even when the receiver and the command
echo the token back)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.actions import ProbeAction, ProbeState
from coordinator.actions.base import ActionContext
from coordinator.agent import Agent
from coordinator.config import load_settings, redacted
from coordinator.decide import Policy
from coordinator.errors import ActionError
from coordinator.httpserver import HttpSurface
from coordinator.metrics import Metrics
from coordinator.models import Document, parse_document
from coordinator.runtime import build_actions
from coordinator.testbed.waiting import wait_until
from tests.fakezk_group import lone_store

TOKEN = "s3cr3t-T0KEN-5f1c"
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
# Exits 1 (a failed drain) having seen the real token, and says it on stderr; 3 if the token was wrong.
# (The argv is no secret: it holds the token reversed.)
COMMAND = f"""
import os, sys
token = os.environ.get("API_TOKEN", "")
sys.stderr.write(f"cannot reach the API with token {{token}}")
sys.exit(1 if token[::-1] == {TOKEN[::-1]!r} else 3)
"""


class EchoingReceiver:
    """Answers every POST 500 with the request's headers in the body, and keeps the Authorization seen."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.authorizations.append(self.headers.get("Authorization"))
                body = json.dumps({"error": "upstream down", "you sent": dict(self.headers)}).encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[EchoingReceiver]:
    receiver = EchoingReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def config_file(tmp_path: Path, receiver: EchoingReceiver, first: str) -> Path:
    webhook = {"type": "webhook", "name": "pager", "url": receiver.url, "retries": 1,
               "headers": {"Authorization": f"Bearer {TOKEN}"}}
    command = {"type": "command", "name": "api", "drain": [sys.executable, "-c", COMMAND],
               "env": {"API_TOKEN": TOKEN}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "web", "vm_name": "vm0", "state_file": None,
        "actions": [webhook, command] if first == "webhook" else [command, webhook],
    }))
    return path


class OneEvent:
    """IMDS showing one Reboot of vm0."""

    def get_document(self) -> Document:
        return parse_document({"DocumentIncarnation": 1, "Events": [{
            "EventId": EID, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
            "Resources": ["vm0"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]})

    def approve(self, event_ids: Sequence[str], *, fence: Callable[[], bool] | None = None) -> None:
        raise AssertionError("a failed drain must not be approved")


def status_over_http(agent: Agent) -> str:
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(), registry=CollectorRegistry(), status=agent.status)
    surface.start()
    try:
        host, port = surface.admin_address
        return httpx.get(f"http://{host}:{port}/status", trust_env=False).text
    finally:
        surface.stop()


@pytest.mark.parametrize("first", ["webhook", "command"])
def test_the_token_reaches_its_action_and_nowhere_else(
    tmp_path: Path, receiver: EchoingReceiver, caplog: pytest.LogCaptureFixture, first: str,
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore too
    path = config_file(tmp_path, receiver, first)
    settings = load_settings(path, environ={})
    shown = [json.dumps(redacted(settings)), repr(settings), str(settings), repr(settings.actions)]
    check = subprocess.run([sys.executable, "-m", "coordinator", "check-config", "--config", str(path)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert '"Authorization": "<redacted>"' in check.stdout and '"API_TOKEN": "<redacted>"' in check.stdout
    shown += [check.stdout, check.stderr]

    # Each action alone: the real value goes out, the error does not carry it back.
    webhook, command = sorted(build_actions(settings), key=lambda action: action.name != "pager")
    ctx = ActionContext(vm="vm0", events=OneEvent().get_document().events)
    for action, expected in ((webhook, "HTTP 500"), (command, "exited with status 1")):
        with pytest.raises(ActionError, match=expected) as info:
            action.drain(ctx)
        shown += [str(info.value), repr(info.value)]
    assert receiver.authorizations == [f"Bearer {TOKEN}"] * 2

    # The agent: the first action fails the drain, and /status says so.
    agent = Agent(vm="vm0", imds=OneEvent(), store=lone_store(),
                  actions=[ProbeAction(ProbeState()), *build_actions(settings)],
                  policy=Policy(drain_wait=0.0, max_events=None, keep_one_serving=False),
                  metrics=Metrics(CollectorRegistry()), poll_interval=0.1)

    def drain_failed() -> bool:
        agent.cycle()
        return agent.status()["action_error"] is not None

    assert wait_until(drain_failed, 20)
    status = status_over_http(agent)
    assert f"drain failed: {'webhook pager' if first == 'webhook' else 'command hook api'}" in status
    shown.append(status)

    records = [record.getMessage() for record in caplog.records]
    assert any("HTTP 500" in message and "<redacted>" in message for message in records)  # echoed, masked
    assert any("exited with status 1" in message and "<redacted>" in message for message in records)
    shown += [caplog.text, *records]
    assert [text for text in shown if TOKEN in text] == []
