"""serial_intra_op: one thread's torch ops without intra-op parallelism, no one else's."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from joynexus.utils.intra_op import serial_intra_op, thread_intra_op_threads
from tests.utils.blas import thread_blas_threads

needs_mkl = pytest.mark.skipif(thread_blas_threads() is None, reason="torch without MKL")


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_the_calling_thread_runs_serially_and_gets_its_threads_back(two_threads: None) -> None:
    assert thread_intra_op_threads() == 2
    with serial_intra_op():
        assert thread_intra_op_threads() == 1
        x = torch.arange(100_000, dtype=torch.float32)
        assert float((x * 2).sum()) == pytest.approx(float(x.sum()) * 2)
    assert thread_intra_op_threads() == 2
    with serial_intra_op(enabled=False):
        assert thread_intra_op_threads() == 2


@pytest.mark.parametrize(
    "threads",
    [thread_intra_op_threads, pytest.param(thread_blas_threads, marks=needs_mkl)],
    ids=["torch", "mkl"],
)
def test_other_threads_keep_their_parallelism_meanwhile(
    two_threads: None, threads: Callable[[], int | None]
) -> None:
    inside, entered, release = [], threading.Event(), threading.Event()

    def serial() -> None:
        with serial_intra_op():
            inside.append(threads())
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=serial)
    worker.start()
    try:
        assert entered.wait(10)
        assert inside == [1]
        assert threads() == 2  # this thread is not touched
    finally:
        release.set()
        worker.join(10)


def test_an_error_inside_still_restores(two_threads: None) -> None:
    with pytest.raises(ValueError), serial_intra_op():
        raise ValueError("boom")
    assert thread_intra_op_threads() == 2


@needs_mkl
def test_mkls_own_thread_count_is_serial_inside_and_restored(two_threads: None) -> None:
    """Regression: MKL's count is its own; a serial block left its products on 2 threads,
    which waited for a busy second core."""
    assert thread_blas_threads() == 2
    with serial_intra_op():
        assert thread_blas_threads() == 1
        a = torch.ones(64, 64)
        assert torch.equal(a @ a, torch.full((64, 64), 64.0))
    assert thread_blas_threads() == 2
    with pytest.raises(ValueError), serial_intra_op():
        raise ValueError("boom")
    assert thread_blas_threads() == 2
    with serial_intra_op(blas=False):  # torch's ops serial, MKL's products on its threads
        assert thread_intra_op_threads() == 1
        assert thread_blas_threads() == 2
