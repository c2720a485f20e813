"""Reading the configuration file: its encoding (UTF-8, or a byte order mark), YAML without duplicate
keys, the environment's overrides over it, and validation into ``Settings`` with every error worded.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from coordinator.config.env import ENV_PREFIX, apply_env, env_overrides
from coordinator.config.settings import Settings
from coordinator.config.wording import error_lines, later_errors
from coordinator.errors import ConfigError

__all__ = ["decode_config", "load_settings"]


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        if any(key_node.tag == "tag:yaml.org,2002:merge" for key_node, _ in node.value):
            return super().construct_mapping(node, deep=deep)  # `<<: *base` then overrides: meant
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, list | dict):
                continue  # unhashable: the constructor below refuses it
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(f"line {line}: the key {key!r} is given twice (first on line {seen[key]}); "
                                    "YAML would keep only the last")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16 LE: its BOM starts with UTF-16 LE's
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),  # Windows PowerShell 5.1 writes this with `>` and Out-File
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_config(raw: bytes, path: Path) -> str:
    """The text of a configuration file: UTF-8, or UTF-8, UTF-16 or UTF-32 with a byte order mark. Any
    other bytes raise ``ConfigError`` naming the file and the offset of the first undecodable byte."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not {exc.encoding.upper()} text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            "cannot be decoded; save the file as UTF-8"
        ) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: where (line and column in the file) and what. PyYAML's own text
    spans several lines and names the text it parsed (``"<unicode string>"``), not the file."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"not valid YAML: {' '.join(str(exc).split())}"
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "not valid YAML"
    if "'\\t'" in problem:
        problem = "a tab character: YAML indents with spaces only"
    elif exc.context and exc.context_mark is not None and exc.context_mark is not mark:
        problem += f" ({exc.context} on line {exc.context_mark.line + 1})"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}not valid YAML: {problem}"


def load_settings(path: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read, merge environment overrides and validate. Raises ``ConfigError`` naming the field."""
    data: Any = {}
    if path is not None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        text = decode_config(raw, path)
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # a SafeLoader
        except _DuplicateKey as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: {_yaml_problem(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    environ = os.environ if environ is None else environ
    file_data = data
    data = apply_env(data, environ)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = error_lines(exc, env_overrides(environ), file_data)
        lines += [line for line in later_errors(data, exc, env_overrides(environ), file_data) if line not in lines]
        if all(line.startswith(ENV_PREFIX) for line in lines):
            where = "invalid configuration from the environment" + (f" (over {path})" if path else "")
        else:
            where = (f"{path}: " if path else "") + "invalid configuration"
        raise ConfigError(where + ":\n  " + "\n  ".join(lines)) from None
