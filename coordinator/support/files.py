"""Replacing a file so that a reader, or a restart after a crash, sees the old content or the new, never a mix."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8), atomically and durably.

    The data goes to a temporary file in the same directory (a rename never crosses file systems), is
    flushed and fsynced, renamed over ``path`` with ``os.replace``, and then the directory is fsynced so
    that the rename itself survives a crash. The parent directory must exist. On any failure the
    temporary file is removed, ``path`` keeps its old content (or stays absent) and the error propagates;
    only a failure of the final directory fsync leaves the new content in place.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
