"""Process-wide allocator tuning for processes exactcheck owns (the command, benchmarks).

glibc serves blocks above its mmap threshold (at most 32 MiB by default) with fresh mappings and
returns them on free, so every batch-sized tensor page-faults anew; that more than doubles the
cost of a driver step at B = 200,000. Raising the threshold keeps freed blocks in the heap for
reuse, as jemalloc or tcmalloc would. The library never calls this on import: a user's process
keeps its own allocator settings unless they call it.
"""
from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Ask glibc to reuse large freed blocks; returns False where that is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
