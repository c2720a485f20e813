"""Webhook template validation and retry policy, with ``httpx.MockTransport`` (no sockets)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from coordinator.actions.base import ActionContext
from coordinator.actions.webhook import WebhookAction
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent, parse_document

CTX = ActionContext(vm="vm0", events=(ScheduledEvent(event_id="E-1", event_type="Freeze", event_status="Scheduled"),))


def make(template: Any = None, **kwargs: Any) -> WebhookAction:
    options: dict[str, Any] = {"url": "https://hooks.example.test/x", "body_template": template}
    options.update(kwargs)
    return WebhookAction("notify", **options)


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ({"text": "{host}"}, r"body_template\.text: unknown placeholder \{host\}"),
        ({"a": {"b": ["ok", "{vm.__class__}"]}}, r"body_template\.a\.b\[1\]: unknown placeholder \{vm\.__class__\}"),
        ({"text": "{vm[0]}"}, "unknown placeholder"),
        ({"text": "{}"}, r"unknown placeholder \{\}"),
        ({"text": "{0}"}, "unknown placeholder"),
        ({"text": "{vm:{secret}}"}, r"unknown placeholder \{secret\}"),
        ({"text": "unbalanced {"}, "Single '{' encountered"),
        ({"text": "unbalanced }"}, "Single '}' encountered"),
        ({"when": object()}, "is not a JSON value"),
        ({1: "x"}, "keys must be strings"),
    ],
)
def test_bad_templates_fail_at_construction(template: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(template)


def test_good_template_renders_every_placeholder() -> None:
    action = make({"t": "{vm}|{phase}|{event_ids}|{event_types}|{vm!r}|{phase:>8}|{{x}}", "n": [{"k": "{vm}"}]})
    assert action.body("drain", CTX) == {"t": "vm0|drain|E-1|Freeze|'vm0'|   drain|{x}", "n": [{"k": "vm0"}]}


def test_placeholder_values_are_not_formatted_again() -> None:
    action = make({"t": "{vm}"})
    assert action.body("drain", ActionContext(vm="{phase}", events=())) == {"t": "{phase}"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "ftp://x/"},
        {"url": "not a url"},
        {"on": {"drain", "reboot"}},
        {"on": set()},
        {"on": "drain"},
        {"timeout": 0},
        {"retries": -1},
        {"retries": True},
        {"backoff": float("nan")},
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make(**kwargs)


def scripted(*outcomes: int | Exception) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(outcomes)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        outcome = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(outcome, Exception):
            raise outcome
        return httpx.Response(outcome, text=f"status {outcome}")

    return httpx.MockTransport(handler), seen


@pytest.mark.parametrize(
    ("outcomes", "attempts"),
    [
        ((200,), 1),
        ((204,), 1),
        ((502, 201), 2),
        ((429, 200), 2),
        ((httpx.ConnectError("refused"), 200), 2),
        ((httpx.ReadTimeout("slow"), httpx.ConnectTimeout("slow"), 200), 3),
    ],
)
def test_retryable_outcomes_then_success(outcomes: tuple[int | Exception, ...], attempts: int) -> None:
    transport, seen = scripted(*outcomes)
    sleeps: list[float] = []
    make(transport=transport, retries=3, backoff=0.25, sleep=sleeps.append).drain(CTX)
    assert len(seen) == attempts
    assert sleeps == [0.25 * 2**i for i in range(attempts - 1)]
    assert seen[0].headers["content-type"] == "application/json"


@pytest.mark.parametrize("status", [301, 400, 401, 403, 404, 409])
def test_non_retryable_statuses_fail_at_once(status: int) -> None:
    transport, seen = scripted(status)
    with pytest.raises(ActionError, match=rf"failed: HTTP {status}: 'status {status}'"):
        make(transport=transport, sleep=lambda s: None).drain(CTX)
    assert len(seen) == 1


def test_zero_retries_means_one_attempt() -> None:
    transport, seen = scripted(500)
    with pytest.raises(ActionError, match=r"after 1 attempt\(s\)"):
        make(transport=transport, retries=0, sleep=lambda s: None).recover(CTX)
    assert len(seen) == 1


def test_zero_backoff_does_not_sleep() -> None:
    transport, seen = scripted(500, 200)
    sleeps: list[float] = []
    make(transport=transport, backoff=0, sleep=sleeps.append).drain(CTX)
    assert (len(seen), sleeps) == (2, [])


def test_user_info_is_not_shown_in_errors() -> None:
    transport, _ = scripted(400)
    with pytest.raises(ActionError) as info:
        make(url="https://user:pa55@hooks.example.test/x?sig=abc", transport=transport).drain(CTX)
    assert "pa55" not in str(info.value) and "abc" not in str(info.value)
    assert "https://hooks.example.test/x" in str(info.value)


HOSTILE = parse_document({"DocumentIncarnation": 1, "Events": [{
    "EventId": "{vm}", "EventStatus": "Scheduled", "Resources": ["vm0"],
    "EventType": '{event_ids}", "injected": "1\n{phase}{{x}}{vm.__class__}{0}%s$(touch x)`id`',
}, {
    "EventId": "-x'\";", "EventStatus": "Scheduled", "EventType": "{", "Resources": ["vm0"],
}]}).events


def test_event_fields_are_inserted_once_as_json_strings() -> None:
    transport, seen = scripted(200)
    template = {"text": "{vm} {phase}: {event_ids} ({event_types})", "ids": "{event_ids}", "n": ["{event_types}"]}
    make(template, transport=transport).drain(ActionContext(vm="vm0", events=HOSTILE))
    ids = ",".join(event.event_id for event in HOSTILE)
    types = ",".join(event.event_type for event in HOSTILE)
    # The body is the template's own keys, each value holding the event fields as they are: a field that
    # looks like a placeholder or like JSON is neither expanded nor parsed.
    assert json.loads(seen[0].content) == {"text": f"vm0 drain: {ids} ({types})", "ids": ids, "n": [types]}
    assert ids == "{vm},-x'\";"


def test_event_fields_are_json_strings_in_the_default_body_too() -> None:
    transport, seen = scripted(200)
    make(transport=transport).recover(ActionContext(vm="vm0", events=HOSTILE))
    assert json.loads(seen[0].content)["events"] == [event.to_imds() for event in HOSTILE]
