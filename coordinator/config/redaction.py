"""The effective configuration as shown in logs and by ``check-config``, every secret masked.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from coordinator.config.settings import Settings

__all__ = ["REDACTED", "redacted"]


REDACTED = "<redacted>"


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective configuration for logging and ``check-config``: every secret (webhook header values,
    command environment values: they carry tokens) is shown as ``<redacted>``, its name kept. Secrets are
    found by their type, so a secret field added later is masked too.

    The drain waits are shown as the agent uses them, not as written: ``drain.wait_seconds`` is the
    effective wait (computed from the probe's timing when the file leaves it null), and
    ``drain.wait_seconds_by_type`` names the wait of every event type. Loaded again, the printout gives
    the same waits."""
    shown = settings.model_dump()
    shown["drain"] = {**shown["drain"], "wait_seconds": settings.drain.effective_wait,
                      "wait_seconds_by_type": settings.drain.waits()}
    return dict(to_jsonable_python(_mask_secrets(shown)))


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return REDACTED
    if isinstance(value, dict):
        return {key: _mask_secrets(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_secrets(item) for item in value]
    return value
