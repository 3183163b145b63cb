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

__all__ = ["keep_freed_memory", "free_memory_bytes", "device_max_elements"]

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


def free_memory_bytes(device) -> int:
    """Memory free for new tensors on ``device``: the CUDA allocator's free bytes plus what
    torch's cache holds, or the host's available memory (``/proc/meminfo``; 4 GiB if unknown)."""
    import torch
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


# bytes a verify call holds per element of target_probs at its peak: the float32 inputs, the
# float64 rows the reference computes in, residuals, cumulative sums and the driver's copies
BYTES_PER_ELEMENT_AT_PEAK = 64


def device_max_elements(device, share: float = 0.5, floor: int = 1 << 20, ceiling: int = 1 << 31) -> int:
    """How many target_probs elements (B * (k+1) * V) one verify call may take on ``device``:
    ``share`` of the free memory over the bytes a call holds per element. The batch then grows
    with the device rather than being a constant. A different size changes which random
    numbers each trial gets, so audits keep ``exactcheck.options.DEFAULT_CALL_ELEMENTS`` unless asked
    (``call_elements``), and a report
    records the size it used."""
    budget = int(free_memory_bytes(device) * share) // BYTES_PER_ELEMENT_AT_PEAK
    return max(floor, min(ceiling, budget))
