"""Keep freed host memory in the process heap (glibc ``mallopt``), an opt-in.

glibc serves allocations above its mmap threshold (128 KiB to start) with fresh
``mmap`` pages and gives them back on ``free``; every later allocation of that size
page-faults its pages in again, zeroed by the kernel. A grouped CPU training step
allocates its activations and their gradients at the size of all tenants' rows
together, above that threshold, while one tenant's rows stay below it: measured on the
tiny LoRA bench, ~1,000 minor page faults per grouped step against ~2 per serial one,
about a fifth of the grouped step's CPU time (docs/RESULTS.md §7.1). Raising the mmap
and trim thresholds keeps those blocks in the heap for reuse, as a caching allocator
does on a GPU; the price is that the process keeps its peak heap instead of returning
it. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)
# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def retain_freed_memory(mmap_threshold: int = 64 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Serve blocks below ``mmap_threshold`` bytes from the heap and keep up to
    ``trim_threshold`` free bytes at its top; True when the C library took both."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
    if not ok:
        _log.warning("mallopt refused the heap thresholds; freed memory is returned as before")
    return ok
