"""Print the option tables of docs/configuration.md from the configuration models.

    .venv/bin/python scripts/config_reference.py > /tmp/tables.md

tests/unit/test_config.py checks that the doc holds exactly this output between its
``<!-- options:begin -->`` and ``<!-- options:end -->`` markers.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from coordinator.config import (
    AzureLbActionConfig,
    CommandActionConfig,
    ConnectionsActionConfig,
    HAProxyActionConfig,
    MaintenanceWindowConfig,
    Settings,
    WebhookActionConfig,
)


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "(required)"
    return "`" + json.dumps(getattr(value, "value", value), default=str) + "`"


def _optional_section(annotation: Any) -> type[BaseModel] | None:
    """The model of an optional section (``SomeConfig | None``), else None."""
    arms = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(arms) == 1 and isinstance(arms[0], type) and issubclass(arms[0], BaseModel):
        return arms[0]
    return None


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        section = _optional_section(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _rows(annotation, f"{prefix}{name}.")
        elif section is not None:
            rows.append(f"| `{prefix}{name}` | {_default(field)} | {field.description or ''} |")
            rows += _rows(section, f"{prefix}{name}.")
        elif name not in ("type", "actions"):
            rows.append(f"| `{prefix}{name}` | {_default(field)} | {field.description or ''} |")
    return rows


def tables() -> str:
    header = "| option | default | meaning |\n|---|---|---|\n"
    parts = [header + "\n".join(_rows(Settings))]
    for model, kind in (
        (HAProxyActionConfig, "haproxy"),
        (CommandActionConfig, "command"),
        (WebhookActionConfig, "webhook"),
        (ConnectionsActionConfig, "connections"),
        (AzureLbActionConfig, "azure-lb"),
    ):
        parts.append(f"#### `actions` entries with `type: {kind}`\n\n" + header + "\n".join(_rows(model)))
    parts.append("#### `policy.maintenance_windows` entries\n\n" + header + "\n".join(_rows(MaintenanceWindowConfig)))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    print(tables(), end="")
