"""Validation of identifiers that come from IMDS or configuration.

VM names and event ids end up in ZooKeeper paths and log lines. Nothing from IMDS is used there
unless it passes these checks; anything odd is refused with an ``InvalidName`` that says why.

Azure VM names are 1-64 characters of letters, digits, ``-``, ``_`` and ``.`` (15 on Windows);
scale-set instances appear in ``Resources`` as ``{scaleSetName}_{instanceId}``. Azure treats names
case-insensitively, so names are compared and stored in lower case.
"""

from __future__ import annotations

import re

from coordinator.errors import InvalidName

__all__ = ["is_valid_vm_name", "normalize_event_id", "normalize_vm_name", "same_vm", "scale_set_instance"]

_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Event ids are GUIDs in every capture; allow any short token of safe characters so that an
# unusual id is still handled, but never a path separator, dot-dot or control character.
_EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_SCALE_SET_INSTANCE = re.compile(r"(?P<scale_set>.+)_(?P<instance_id>[0-9]+)")


def normalize_vm_name(name: object) -> str:
    """Return the canonical (lower-case) form of a VM name, or raise ``InvalidName``."""
    if not isinstance(name, str):
        raise InvalidName(f"VM name must be a string, got {type(name).__name__}")
    if not _VM_NAME.fullmatch(name) or name.endswith("."):
        raise InvalidName(
            f"invalid VM name {name[:80]!r}: expected 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit and not ending with '.'"
        )
    return name.lower()


def is_valid_vm_name(name: object) -> bool:
    try:
        normalize_vm_name(name)
    except InvalidName:
        return False
    return True


def normalize_event_id(event_id: object) -> str:
    """Return the canonical (upper-case) form of an event id, or raise ``InvalidName``.

    The original spelling must still be used when approving: IMDS is given back exactly what it sent.
    """
    if not isinstance(event_id, str):
        raise InvalidName(f"event id must be a string, got {type(event_id).__name__}")
    if not _EVENT_ID.fullmatch(event_id):
        raise InvalidName(
            f"invalid event id {event_id[:80]!r}: expected up to 128 letters, digits, '_' or '-'"
        )
    return event_id.upper()


def same_vm(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def scale_set_instance(name: str) -> tuple[str, int] | None:
    """Split ``{scaleSetName}_{instanceId}`` into its parts, or return None for other names."""
    match = _SCALE_SET_INSTANCE.fullmatch(name)
    if match is None:
        return None
    return match["scale_set"], int(match["instance_id"])
