"""How validation errors are worded: each names its field, and the environment variable it came from;
the errors pydantic reports only once the first are fixed are found by validating again without them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from coordinator.config.settings import Settings

__all__ = ["error_lines", "later_errors"]


def _in_file(data: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not in_list and not (isinstance(data, dict) and part in data):
            return False
        data = data[part]
    return True


def _variable_of(loc: tuple[str | int, ...], overrides: Mapping[tuple[str, ...], str], file_data: Any) -> str | None:
    """The environment variable an error at ``loc`` comes from, if any: one that sets ``loc`` or an option
    inside it, or one that creates ``loc`` (a misspelt section) where the file has nothing."""
    for path, key in overrides.items():
        if loc[: len(path)] == path:
            return key
    for path, key in overrides.items():
        if loc and path[: len(loc)] == loc and not _in_file(file_data, loc):
            return key
    return None


def later_errors(data: dict[str, Any], exc: ValidationError, overrides: Mapping[tuple[str, ...], str],
                  file_data: Any) -> list[str]:
    """The errors pydantic reports only once the first ones are fixed: a rule between fields runs only when
    every field it reads is valid. The invalid values are taken out (their fields fall back to defaults, a
    bad list item is dropped), the rules of sections that failed already are turned off, and the rest is
    validated again, until nothing more comes up. The defaults standing in for what was taken out are
    named in the context (``stand_ins``), so that no rule reports a problem computed from one of them."""
    lines: list[str] = []
    rules_off: set[str] = set()
    stand_ins: set[str] = set()
    for _ in range(4):
        data = copy.deepcopy(data)
        if not _take_out(data, [tuple(error["loc"]) for error in exc.errors()], rules_off, stand_ins):
            break
        try:
            Settings.model_validate(data, context={"rules_off": rules_off, "stand_ins": stand_ins})
            break
        except ValidationError as again:
            exc = again
            lines += error_lines(again, overrides, file_data)
    return lines


def _take_out(data: dict[str, Any], locs: list[tuple[str | int, ...]], rules_off: set[str],
              stand_ins: set[str]) -> bool:
    """Remove what each error points at: the value (a missing cluster gets a stand-in), or the list item
    it lies in; each path removed is added to ``stand_ins`` (dotted), as its default now stands in for it.
    An error about a whole section that is a mapping comes from a rule between its fields: that rule is
    turned off (added to ``rules_off``). Returns whether anything changed."""
    targets: set[tuple[str | int, ...]] = set()
    changed = False
    for loc in locs:
        if loc == ("cluster",) and "cluster" not in data:
            data["cluster"] = "stand-in"
            changed = True
            continue
        node: Any = data
        path: list[str | int] = []
        for part in loc:
            if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                path.append(part)
                break  # the whole item goes
            if not isinstance(node, dict) or part not in node:
                path = []
                break
            path.append(part)
            node = node[part]
        else:
            section = ".".join(str(p) for p in loc)
            if isinstance(node, dict) and loc and section not in rules_off:
                rules_off.add(section)  # a section that is a mapping: its own rule failed
                changed = True
                path = []
            elif isinstance(node, dict):
                path = []
        if path:
            targets.add(tuple(path))
            stand_ins.add(".".join(str(p) for p in path))
    # Deepest and last first, so that taking out one list item does not move another still to go.
    for target in sorted(targets, key=lambda t: [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in t],
                         reverse=True):
        *parents, last = target
        node = data
        try:
            for part in parents:
                node = node[part]
            del node[last]
            changed = True
        except (KeyError, IndexError, TypeError):
            pass
    return changed


# Errors of a value of the wrong kind: the line then says what was given and the form wanted.
_KIND_ERRORS = {"string_type": "a string", "float_type": "a number", "float_parsing": "a number",
                "int_type": "a whole number", "int_parsing": "a whole number", "bool_type": "true or false",
                "bool_parsing": "true or false", "list_type": "a list", "dict_type": "a mapping",
                "model_type": "a mapping", "int_from_float": "a whole number"}


def _given(value: Any) -> str:
    kind = {list: "a list", dict: "a mapping", str: "the string", bool: "", int: "", float: ""}.get(type(value), "")
    shown = repr(value)
    return f"{kind} {shown[:80]}".strip()


def _wanted(loc: tuple[str | int, ...], kind: str, value: Any) -> str:
    """``(got ...; wanted ...)`` for an error of kind at ``loc``: the form from the kind, with the field's own
    description (``Field(description=...)``) where the model has one."""
    model: Any = Settings
    description = ""
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or not fields or part not in fields:
            description = ""
            break
        info = fields[part]
        description = info.description or ""
        model = info.annotation
    wanted = _KIND_ERRORS[kind]
    if kind in ("float_parsing", "int_parsing") and isinstance(value, str) and value.strip()[-1:].isalpha():
        wanted = f"a bare number ({value.strip().rstrip('smh ') or '20'}), no unit"
    if kind == "string_type" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        wanted = f"one string, as {','.join(value)!r}"
    about = description.split(";")[0].split(" (see")[0].strip()
    about = f": {about[:100]}" if about else ""
    return f" (got {_given(value)}; wanted {wanted}{about})"


def error_lines(exc: ValidationError, overrides: Mapping[tuple[str, ...], str], file_data: Any) -> list[str]:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        where = ".".join(str(p) for p in loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] in _KIND_ERRORS and "input" in error:
            message += _wanted(loc, error["type"], error["input"])
        # Cross-field checks name their fields themselves, from the top.
        line = message if not where or message.startswith(where + ".") else f"{where}: {message}"
        variable = _variable_of(loc, overrides, file_data)
        lines.append(f"{variable} (environment): {line}" if variable else line)
    return lines
