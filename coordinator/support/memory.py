"""Keeping the agent's resident memory small on glibc.

glibc gives every thread that allocates a malloc arena of its own, up to eight per core, and memory freed
in an arena stays mapped there. The agent runs a handful of threads (the loop, the IMDS poller, the
peer probes, kazoo's, a thread per HTTP request), each of which allocates a little now and then: left
alone, they spread a few MiB of resident memory over many arenas. Two arenas serve them all; the
contention this adds is negligible at the agent's rates.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["limit_malloc_arenas"]

_M_ARENA_MAX = -8  # from glibc's malloc.h


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas, before any thread starts. Leaves an operator's ``MALLOC_ARENA_MAX``
    alone. Returns whether the cap was set (False off glibc or when the variable is set)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False
