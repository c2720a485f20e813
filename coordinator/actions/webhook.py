"""POST a JSON notification on drain and/or recover (chat, paging, an orchestrator's API...).

The body is built from a template: a JSON-like structure whose string values may contain the
placeholders ``{vm}``, ``{phase}``, ``{event_ids}`` and ``{event_types}`` (comma-separated, one entry per
event; empty on recovery). ``{{`` and ``}}`` are literal braces. Any other placeholder, attribute or
index access (``{vm.__class__}``, ``{0}``) is rejected when the action is built, so a bad template is a
configuration error, never a failed drain. Without a template the body is
``{"vm": ..., "phase": ..., "events": [<event as IMDS serializes it>, ...]}``.

Placeholder values (VM name, event ids and types from IMDS) are inserted once, as data: a value that
itself looks like ``{vm}`` is not expanded again, and the body is serialized as JSON after rendering, so
quotes or newlines in a value stay inside its JSON string.

Header values are secrets (``SecretStr``): read only when a request is sent, and masked in the response
excerpt that errors and logs show (a receiver may echo them back).

Proxies from the environment (``HTTPS_PROXY``...) are honoured unless a ``transport`` is given: a
webhook may legitimately have to leave through one. Redirects are not followed.
"""

from __future__ import annotations

import json
import logging
import math
import string
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import httpx
from pydantic import SecretStr

from coordinator.actions.base import ActionContext, mask_secrets
from coordinator.errors import ActionError

__all__ = ["PLACEHOLDERS", "WebhookAction"]

log = logging.getLogger(__name__)

PLACEHOLDERS: frozenset[str] = frozenset({"vm", "phase", "event_ids", "event_types"})
_PHASES: frozenset[str] = frozenset({"drain", "recover"})
_RETRY_STATUSES = frozenset({429})  # plus every 5xx
_BODY_EXCERPT = 500


def _check_format(text: str, where: str) -> None:
    """Raise ValueError unless every replacement field of ``text`` is a bare allowed placeholder."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"body_template{where}: {exc} in {text!r}") from None
    for _literal, field, spec, _conversion in fields:
        if field is None:
            continue
        if field not in PLACEHOLDERS:
            raise ValueError(
                f"body_template{where}: unknown placeholder {{{field}}} in {text!r}; "
                f"allowed: {', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))}"
            )
        if spec:
            _check_format(spec, where)


def _check_template(value: object, where: str = "") -> None:
    if isinstance(value, str):
        _check_format(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"body_template{where}: keys must be strings, got {key!r}")
            _check_template(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_template(item, f"{where}[{index}]")
    elif value is not None and not isinstance(value, bool | int | float):
        raise ValueError(f"body_template{where}: {type(value).__name__} is not a JSON value")


def _render(value: Any, fields: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return value.format_map(fields)
    if isinstance(value, Mapping):
        return {key: _render(item, fields) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_render(item, fields) for item in value]
    return value


def _redact(url: httpx.URL) -> str:
    """Scheme, host, port and path only: query strings and user info often carry tokens."""
    return str(url.copy_with(query=None, fragment=None, username=None, password=None))


class WebhookAction:
    """An action that POSTs a JSON body to ``url`` in the phases listed in ``on``.

    Each call makes up to ``retries + 1`` attempts, each bounded by ``timeout`` seconds. Connection
    errors, timeouts, 5xx and 429 are retried after ``backoff * 2**n`` seconds (n = 0, 1, ...; slept
    with ``sleep``); any other non-2xx answer is final at once. When no attempt succeeded,
    ``ActionError`` names the URL (without query string), the status or transport error, and an
    excerpt of the response body. ``headers`` are sent as given and never logged.

    A phase not in ``on`` does nothing. Raises ``ValueError`` at construction for a bad URL, an empty or
    unknown phase in ``on``, or a template with an unknown placeholder.
    """

    always_recover = False

    def __init__(
        self,
        name: str,
        *,
        url: str,
        on: Collection[str] = _PHASES,
        body_template: Mapping[str, Any] | None = None,
        headers: Mapping[str, SecretStr] | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 1.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not name:
            raise ValueError("name must not be empty")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"url is not a valid URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"url must be an http(s) URL with a host, got {_redact(parsed)!r}")
        phases = frozenset(on)
        if isinstance(on, str) or not phases or not phases <= _PHASES:
            raise ValueError(f"on must be a non-empty subset of {sorted(_PHASES)}, got {on!r}")
        if body_template is not None:
            if not isinstance(body_template, Mapping):
                raise ValueError("body_template must be a mapping (a JSON object)")
            _check_template(body_template)
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        if not (backoff >= 0 and math.isfinite(backoff)):
            raise ValueError(f"backoff must be a non-negative number, got {backoff!r}")
        self.name = name
        self._url = parsed
        self._shown_url = _redact(parsed)
        self._on = phases
        self._template = body_template
        self._retries = retries
        self._backoff = float(backoff)
        self._sleep = sleep
        self._headers = dict(headers or {})
        self._client = httpx.Client(
            timeout=httpx.Timeout(float(timeout)),
            follow_redirects=False,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._client.close()

    def drain(self, ctx: ActionContext) -> None:
        self._notify("drain", ctx)

    def recover(self, ctx: ActionContext) -> None:
        self._notify("recover", ctx)

    def body(self, phase: str, ctx: ActionContext) -> Any:
        """The JSON value that would be sent for ``phase`` and ``ctx``."""
        if self._template is None:
            return {"vm": ctx.vm, "phase": phase, "events": [event.to_imds() for event in ctx.events]}
        fields = {
            "vm": ctx.vm,
            "phase": phase,
            "event_ids": ",".join(event.event_id for event in ctx.events),
            "event_types": ",".join(event.event_type for event in ctx.events),
        }
        return _render(self._template, fields)

    def _notify(self, phase: str, ctx: ActionContext) -> None:
        if phase not in self._on:
            log.debug("webhook %s not configured for %s (vm=%s)", self.name, phase, ctx.vm)
            return
        content = json.dumps(self.body(phase, ctx)).encode()
        where = f"webhook {self.name} {phase} to {self._shown_url} (vm={ctx.vm} events={ctx.event_ids})"
        attempts = self._retries + 1
        for attempt in range(1, attempts + 1):
            try:
                response = self._client.post(self._url, content=content, headers=self._request_headers())
            except httpx.TransportError as exc:
                detail = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    log.info("%s answered %d (attempt %d/%d)", where, status, attempt, attempts)
                    return
                # Masked before the cut, so that the cut never leaves part of a secret.
                excerpt = mask_secrets(response.text[: 4 * _BODY_EXCERPT], self._headers.values())[:_BODY_EXCERPT]
                detail = f"HTTP {status}: {excerpt!r}"
                if not (status >= 500 or status in _RETRY_STATUSES):
                    raise ActionError(f"{where} failed: {detail}")
            if attempt == attempts:
                break
            delay = self._backoff * 2.0 ** (attempt - 1)
            log.warning("%s attempt %d/%d failed (%s); retrying in %.1f s", where, attempt, attempts, detail, delay)
            if delay > 0:
                self._sleep(delay)
        raise ActionError(f"{where} failed after {attempts} attempt(s); last: {detail}")

    def _request_headers(self) -> dict[str, str]:
        secrets = {name: value.get_secret_value() for name, value in self._headers.items()}
        return {**secrets, "Content-Type": "application/json"}
