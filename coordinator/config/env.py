"""Environment overrides: ``COORDINATOR__SECTION__FIELD=value`` sets ``section.field``; the value is
plain text for the field's type to convert, or YAML when it starts as a flow list, mapping or quoted string.
A variable that looks meant as an override but is not one (single underscores, the prefix in lower case)
is named by ``ignored_variables``, rather than silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from coordinator.errors import ConfigError

__all__ = ["ENV_PREFIX", "apply_env", "env_overrides", "env_value", "ignored_variables"]


ENV_PREFIX = "COORDINATOR__"
# What the agent itself sets for the commands it runs (coordinator.actions.command): not overrides.
_HOOK_VARIABLES = frozenset({"COORDINATOR_VM", "COORDINATOR_PHASE", "COORDINATOR_EVENT_IDS", "COORDINATOR_EVENT_TYPES"})


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


def ignored_variables(environ: Mapping[str, str], options: Iterable[tuple[str, ...]]) -> list[str]:
    """One warning per variable that looks meant for this configuration but is not read: its name starts
    with ``COORDINATOR_`` in any case, yet not with ``COORDINATOR__`` in capitals (``COORDINATOR_ZOOKEEPER_HOSTS``,
    ``coordinator__zookeeper__hosts``). Each names the variable, and the name that would set an option
    when one of ``options`` (paths into the configuration) matches it, underscores and case aside. The
    variables the agent sets for its commands are not warned about."""
    by_words = {"_".join(path): path for path in options}
    warnings = []
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) or not key.upper().startswith("COORDINATOR_") or key in _HOOK_VARIABLES:
            continue
        words = re.sub(r"_+", "_", key[len("COORDINATOR_"):].strip("_")).lower()
        path = by_words.get(words)
        meant = f"; to set {'.'.join(path)}, name it {ENV_PREFIX}{'__'.join(path).upper()}" if path else ""
        warnings.append(f"environment variable {key} is ignored: overrides are named {ENV_PREFIX}SECTION__OPTION, "
                        f"in capitals, with two underscores between the parts{meant}")
    return warnings
