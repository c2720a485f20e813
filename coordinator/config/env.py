"""Environment overrides: ``COORDINATOR__SECTION__FIELD=value`` sets ``section.field``; the value is
plain text for the field's type to convert, or YAML when it starts as a flow list, mapping or quoted string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from coordinator.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "_env_path",
    "apply_env",
    "env_overrides",
    "env_value",
]


ENV_PREFIX = "COORDINATOR__"


def _env_path(key: str) -> tuple[str, ...]:
    return tuple(p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p)


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """The options the environment sets, as paths into the configuration, each with its variable's name."""
    return {path: key for key in sorted(environ) if key.startswith(ENV_PREFIX) and (path := _env_path(key))}


def env_value(key: str, raw: str) -> Any:
    """The value of one override. No YAML 1.1 guessing: a plain word stays a string (``on``, ``no`` and
    ``0700`` included) and the field's type converts it where it expects a number or a boolean; ``null``
    or ``~`` is null; a value that starts as a YAML flow list, mapping or quoted string is read as such."""
    text = raw.strip()
    if text in ("null", "Null", "NULL", "~"):
        return None
    if text[:1] in ("[", "{", '"', "'"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError(f"{key}: {problem} in its value {raw[:80]!r}") from None
    return raw


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    merged = dict(data)
    for path, key in env_overrides(environ).items():
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = env_value(key, environ[key])
    return merged
