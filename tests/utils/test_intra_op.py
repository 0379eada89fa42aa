"""serial_intra_op: one thread's torch ops without intra-op parallelism, no one else's."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from joynexus.utils.intra_op import serial_intra_op, thread_intra_op_threads


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


def test_other_threads_keep_their_parallelism_meanwhile(two_threads: None) -> None:
    inside, entered, release = [], threading.Event(), threading.Event()

    def serial() -> None:
        with serial_intra_op():
            inside.append(thread_intra_op_threads())
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=serial)
    worker.start()
    try:
        assert entered.wait(10)
        assert inside == [1]
        assert thread_intra_op_threads() == 2  # this thread is not touched
    finally:
        release.set()
        worker.join(10)


def test_an_error_inside_still_restores(two_threads: None) -> None:
    with pytest.raises(ValueError), serial_intra_op():
        raise ValueError("boom")
    assert thread_intra_op_threads() == 2
