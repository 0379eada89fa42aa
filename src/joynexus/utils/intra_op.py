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

MKL, which torch's CPU matrix products call, keeps a thread count of its own that the
thread's OpenMP setting does not reach (``torch.set_num_threads`` sets both, process
wide). Left at 2, a serial forward's products still split over a second thread; when
the other core is busy (a front process, a client) each product waits for that thread
to get a core back. By a script, a tiny Qwen-VL forward of 7 rows took 4.3–4.8 ms
alone and 13–45 ms beside one busy process, and 4.6–5.2 ms either way with MKL's count
at 1 for the calling thread (RESULTS §8.1.9). :func:`serial_intra_op` sets that
thread-local count too, where torch carries MKL, unless its caller knows the other
cores are free (``blas=False``: a lone request, whose products a free core speeds up).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path
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


@functools.cache
def _mkl() -> Any | None:
    """MKL's service functions in torch's CPU library, or None where torch has no MKL."""
    import torch

    if not torch._C.has_mkl:
        return None
    libs = sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*"))
    try:
        lib = ctypes.CDLL(str(libs[0]))
        set_local, get_max = lib.mkl_set_num_threads_local_, lib.mkl_get_max_threads
    except (IndexError, OSError, AttributeError):
        return None
    # The Fortran entry (its argument by reference): the one spelling every MKL build
    # exports with the same calling convention.
    set_local.argtypes, set_local.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    get_max.argtypes, get_max.restype = [], ctypes.c_int
    return lib


def _set_mkl_local(lib: Any, threads: int) -> int:
    """Set MKL's thread count for the calling thread (0: the process-wide one); the
    previous thread-local count."""
    return int(lib.mkl_set_num_threads_local_(ctypes.byref(ctypes.c_int(threads))))


def thread_intra_op_threads() -> int:
    """The intra-op threads a parallel op of the calling thread would use now."""
    import torch

    return int(torch.get_num_threads())


@contextlib.contextmanager
def serial_intra_op(enabled: bool = True, *, blas: bool = True) -> Iterator[None]:
    """Run the enclosed torch CPU ops of this thread without intra-op parallelism.

    Args:
        enabled: False runs the block unchanged (callers decide by the work's size).
        blas: Make MKL's matrix products serial too. False leaves them on MKL's own
            threads: faster while the other cores are free, far slower while they are
            busy (see the module docstring).
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
    mkl = _mkl() if blas else None
    lib.omp_set_num_threads(1)
    mkl_before = None if mkl is None else _set_mkl_local(mkl, 1)
    try:
        yield
    finally:
        if mkl is not None and mkl_before is not None:
            _set_mkl_local(mkl, mkl_before)
        lib.omp_set_num_threads(before)
