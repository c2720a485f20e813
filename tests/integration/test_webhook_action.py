"""The webhook action against a real HTTP receiver on loopback (stdlib server in a thread)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from coordinator.actions.base import ActionContext
from coordinator.actions.webhook import WebhookAction
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent

EVENTS = (
    ScheduledEvent(event_id="A1B2", event_type="Freeze", event_status="Scheduled", resources=("vm0",)),
    ScheduledEvent(event_id="C3D4", event_type="Reboot", event_status="Scheduled", resources=("vm0",)),
)
DRAIN = ActionContext(vm="vm0", events=EVENTS)
RECOVER = ActionContext(vm="vm0", events=())
HOLD = 0  # a scripted status meaning "never answer until the test ends"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Receiver:
    """Answers POSTs with the scripted statuses in order (the last one repeats) and records them."""

    url: str
    statuses: list[int]
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self) -> int:
        with self.lock:
            return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def count(self) -> int:
        with self.lock:
            return len(self.received)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="", statuses=[200])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                state.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw))
                )
            status = state.next_status()
            if status == HOLD:
                state.release.wait(30)
                return
            body = json.dumps({"error": "try later" if status >= 500 else "ok", "pad": "z" * 2000}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and left

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/maintenance"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def webhook(url: str, **kwargs: Any) -> WebhookAction:
    # An explicit transport keeps proxies from the environment out of these loopback tests.
    options: dict[str, Any] = {"timeout": 5.0, "retries": 2, "backoff": 0.5, "transport": httpx.HTTPTransport()}
    options.update(kwargs)
    return WebhookAction("notify", url=url, **options)


def test_default_body(receiver: Receiver) -> None:
    action = webhook(receiver.url)
    action.drain(DRAIN)
    action.recover(RECOVER)
    assert [r.body for r in receiver.received] == [
        {"vm": "vm0", "phase": "drain", "events": [e.to_imds() for e in EVENTS]},
        {"vm": "vm0", "phase": "recover", "events": []},
    ]
    assert receiver.received[0].path == "/hooks/maintenance"
    assert receiver.received[0].headers["content-type"] == "application/json"


def test_body_from_template_and_headers(receiver: Receiver) -> None:
    template = {
        "text": "{vm} enters {phase} for {event_ids} ({event_types})",
        "meta": {"source": "coordinator", "tags": ["{phase}", 1, True, None, 2.5]},
        "literal": "{{vm}} stays literal",
    }
    headers = {"Authorization": SecretStr("Bearer s3cret"), "X-Team": SecretStr("ops")}
    action = webhook(receiver.url, body_template=template, headers=headers)
    action.drain(DRAIN)
    action.recover(RECOVER)

    drain, recover = receiver.received
    assert drain.body == {
        "text": "vm0 enters drain for A1B2,C3D4 (Freeze,Reboot)",
        "meta": {"source": "coordinator", "tags": ["drain", 1, True, None, 2.5]},
        "literal": "{vm} stays literal",
    }
    assert recover.body["text"] == "vm0 enters recover for  ()"
    assert drain.headers["authorization"] == "Bearer s3cret"
    assert drain.headers["x-team"] == "ops"


def test_phases_not_listed_in_on_send_nothing(receiver: Receiver) -> None:
    action = webhook(receiver.url, on={"recover"})
    action.drain(DRAIN)
    assert receiver.count() == 0
    action.recover(RECOVER)
    assert [r.body["phase"] for r in receiver.received] == ["recover"]


def test_retries_then_succeeds_on_500_then_200(receiver: Receiver) -> None:
    receiver.statuses[:] = [500, 200]
    sleep = RecordingSleep()
    webhook(receiver.url, sleep=sleep).drain(DRAIN)
    assert receiver.count() == 2
    assert receiver.received[0].body == receiver.received[1].body
    assert sleep.calls == [0.5]


def test_failure_reported_after_retries(receiver: Receiver) -> None:
    receiver.statuses[:] = [503]
    sleep = RecordingSleep()
    with pytest.raises(ActionError) as info:
        webhook(receiver.url, sleep=sleep).drain(DRAIN)
    message = str(info.value)
    assert "webhook notify drain to" in message and "(vm=vm0 events=A1B2,C3D4)" in message
    assert "failed after 3 attempt(s); last: HTTP 503" in message
    assert "try later" in message  # an excerpt of the body...
    assert len(message) < 1000  # ...not all of it
    assert receiver.count() == 3
    assert sleep.calls == [0.5, 1.0]  # exponential backoff


def test_client_errors_are_not_retried(receiver: Receiver) -> None:
    receiver.statuses[:] = [404]
    sleep = RecordingSleep()
    with pytest.raises(ActionError, match=r"failed: HTTP 404"):
        webhook(receiver.url, sleep=sleep).recover(RECOVER)
    assert receiver.count() == 1
    assert sleep.calls == []


def test_timeout_is_retried_then_reported(receiver: Receiver) -> None:
    receiver.statuses[:] = [HOLD]
    sleep = RecordingSleep()
    with pytest.raises(ActionError, match=r"failed after 2 attempt\(s\); last: ReadTimeout"):
        webhook(receiver.url, timeout=0.3, retries=1, sleep=sleep).drain(DRAIN)
    assert receiver.count() == 2
    assert sleep.calls == [0.5]


def test_timeout_then_success(receiver: Receiver) -> None:
    receiver.statuses[:] = [HOLD, 200]
    webhook(receiver.url, timeout=0.3, retries=1, sleep=RecordingSleep()).drain(DRAIN)
    assert receiver.count() == 2


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens: bound, never listening
        sleep = RecordingSleep()
        with pytest.raises(ActionError, match=r"failed after 3 attempt\(s\); last: ConnectError"):
            webhook(f"http://127.0.0.1:{port}/hook", sleep=sleep).drain(DRAIN)
    assert sleep.calls == [0.5, 1.0]


def test_errors_do_not_leak_query_string_secrets(receiver: Receiver) -> None:
    receiver.statuses[:] = [500]
    with pytest.raises(ActionError) as info:
        webhook(receiver.url + "?token=s3cret", retries=0).drain(DRAIN)
    assert "s3cret" not in str(info.value)
    assert receiver.url in str(info.value)
    assert receiver.received[0].path == "/hooks/maintenance?token=s3cret"  # still sent, of course
