"""Replacing a file so that a reader, or a restart after a crash, sees the old content or the new, never a mix."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(
    path: Path,
    data: bytes | str,
    *,
    system: str | None = None,
    replace: Callable[[str, Path], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8), atomically and durably.

    The data goes to a temporary file in the same directory (a rename never crosses file systems), is
    flushed and fsynced, renamed over ``path`` with ``os.replace``, and then the directory is fsynced so
    that the rename itself survives a crash. The parent directory must exist. On any failure the
    temporary file is removed, ``path`` keeps its old content (or stays absent) and the error propagates;
    only a failure of the final directory fsync leaves the new content in place.

    On Windows (``system``, default ``sys.platform``) ``os.replace`` is ``MoveFileExW`` with
    ``MOVEFILE_REPLACE_EXISTING``: on NTFS a reader sees the old file or the new one, but the rename
    fails with ``PermissionError`` while another process (a virus scanner, a backup agent, an editor)
    holds ``path`` open without delete sharing; it is then tried again, 5 times over about 1.5 s, before
    the error propagates. A directory cannot be opened for fsync there: NTFS journals the rename itself.
    ``replace`` and ``sleep`` default to ``os.replace`` and ``time.sleep``.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    windows = (sys.platform if system is None else system) == "win32"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        for attempt in range(_WINDOWS_REPLACE_ATTEMPTS if windows else 1):
            try:
                (replace or os.replace)(tmp, path)
                break
            except PermissionError:
                if attempt + 1 >= _WINDOWS_REPLACE_ATTEMPTS or not windows:
                    raise
                (sleep or time.sleep)(0.1 * (attempt + 1))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not windows:
        _fsync_directory(path.parent)


_WINDOWS_REPLACE_ATTEMPTS = 6


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
