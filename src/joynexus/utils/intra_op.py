"""Serial intra-op work for one thread: small CPU tensor work without waking torch's pool.

torch parallelises a CPU op over its intra-op threads once the op has more than a grain
of elements (32,768). Between two requests those threads go to sleep, so each parallel
op of the next request first wakes them: for a one-row canonicalization (a dozen ops of
a few tens of thousands of elements) that wake-up costs more than the work itself
(RESULTS §8.1.4: 1.4 → 0.7 ms for one row, by a script). :func:`serial_intra_op` runs the enclosed
ops in the calling thread alone.

With the OpenMP backend (torch's default on Linux) an intra-op team's size is the
calling thread's own OpenMP setting, which torch reads on each op
(``at::get_num_threads`` is ``omp_get_max_threads``); setting it to 1 for one thread
leaves every other thread's steps and batches as parallel as they were, which the
process-wide ``torch.set_num_threads`` would not. Where the OpenMP runtime is not
reachable it changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any

__all__ = ["serial_intra_op", "thread_intra_op_threads"]


@functools.cache
def _openmp() -> Any | None:
    """The OpenMP runtime torch loaded (its symbols are global once torch is imported)."""
    import torch

    if not torch._C.has_openmp or "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        lib = ctypes.CDLL(None)
        set_threads = lib.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
    return lib


def thread_intra_op_threads() -> int:
    """The intra-op threads a parallel op of the calling thread would use now."""
    import torch

    return int(torch.get_num_threads())


@contextlib.contextmanager
def serial_intra_op(enabled: bool = True) -> Iterator[None]:
    """Run the enclosed torch CPU ops of this thread without intra-op parallelism.

    Args:
        enabled: False runs the block unchanged (callers decide by the work's size).
    """
    lib = _openmp() if enabled else None
    if lib is None:
        yield
        return
    # torch sets a thread's OpenMP size from the process-wide one the first time the
    # thread asks; asking first keeps that lazy setup from overwriting ours.
    before = thread_intra_op_threads()
    if before <= 1:
        yield
        return
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(before)
