"""What MKL would do on the calling thread: the probe the intra-op tests assert with."""

from __future__ import annotations

from joynexus.utils import intra_op


def thread_blas_threads() -> int | None:
    """The threads an MKL matrix product of the calling thread would use now (None
    where torch has no MKL)."""
    lib = intra_op._mkl()  # the library handle serial_intra_op itself sets threads with
    return None if lib is None else int(lib.mkl_get_max_threads())
