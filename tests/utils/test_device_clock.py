"""The device clock measures the device thread's own CPU time, not its wall time."""

from __future__ import annotations

import threading

import pytest

from joynexus.utils.affinity import on_device
from joynexus.utils.device_clock import SpanRecorder, device_span, process_clock, thread_clock


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def test_a_thread_blocked_inside_its_span_accrues_no_cpu() -> None:
    inside, release = threading.Event(), threading.Event()

    def device_work() -> None:
        with device_span():
            inside.set()
            release.wait()

    with SpanRecorder() as rec:
        worker = threading.Thread(target=device_work)
        worker.start()
        assert inside.wait(30)
        _spin(300_000)  # this thread's work, while the device thread is blocked
        release.set()
        worker.join(30)
    (span,) = rec.spans
    wall = span.end - span.start
    # Blocked on an event: a few microseconds of CPU at most against a wall interval
    # that holds the other thread's whole loop.
    assert span.cpu_s < 0.5 * wall
    assert span.cpu_s < 0.01


def test_a_busy_span_is_its_thread_cpu_and_never_more_than_its_wall() -> None:
    cpu0, _ = thread_clock()
    with SpanRecorder() as rec, device_span():
        _spin(300_000)
    (span,) = rec.spans
    cpu1, _ = thread_clock()
    assert 0 < span.cpu_s <= cpu1 - cpu0
    # The thread cannot run longer than the span lasted. Schedstat's run time is brought
    # up to date at the scheduler's tick, not at each read, so the two clocks tick apart
    # by up to a tick (4 ms at 250 Hz; a run here measured 1.8 ms over): 5 ms of slack.
    assert span.cpu_s <= span.end - span.start + 5e-3


def test_nested_spans_count_once_and_nothing_is_kept_without_a_recorder() -> None:
    with device_span():
        pass  # no recorder open: nothing to keep
    with SpanRecorder() as rec, on_device(), device_span():
        _spin(1000)
    assert len(rec.spans) == 1
    after = len(rec.spans)
    with device_span():
        pass
    assert len(rec.spans) == after  # closed: records no more


def test_the_run_queue_wait_is_measured_where_linux_keeps_it() -> None:
    try:
        with open("/proc/thread-self/schedstat"):
            pass
    except OSError:
        pytest.skip("no per-thread schedstat here")
    with SpanRecorder() as rec, device_span():
        _spin(1000)
    (span,) = rec.spans
    assert span.wait_s is not None and span.wait_s >= 0.0


def test_the_process_clock_adds_up_every_live_thread() -> None:
    if process_clock() is None:
        pytest.skip("no per-thread schedstat here")
    stop = threading.Event()
    ran = [0.0]  # the spinning thread's own CPU seconds, as it last read them

    def spin() -> None:
        while not stop.is_set():
            _spin(2000)
            ran[0] = thread_clock()[0]

    before = process_clock()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        while ran[0] < 0.05:  # until the other thread has run a while (this one waits)
            stop.wait(0.01)
        seen = ran[0]
        after = process_clock()
    finally:
        stop.set()
        worker.join()
    assert before is not None and after is not None
    # The other thread's CPU is in the sum, although it is not the caller.
    assert after[0] - before[0] >= seen
    assert after[1] >= 0.0


def test_a_span_counts_the_pages_its_work_first_touched() -> None:
    import mmap
    import resource

    if not hasattr(resource, "RUSAGE_THREAD"):
        pytest.skip("no per-thread usage on this platform")
    size = 64 * 2**20
    with SpanRecorder() as rec:
        # A fresh anonymous mapping: none of its pages is resident before it is written
        # (a bytearray may reuse heap pages an earlier test already touched).
        with device_span(), mmap.mmap(-1, size) as pages:
            for i in range(0, size, 4096):
                pages[i] = 1
        with device_span():
            _spin(1000)
    touched, idle = rec.spans
    # 16,384 pages written for the first time; the loop touches next to none.
    assert touched.minor_faults is not None and touched.minor_faults >= 8000
    assert idle.minor_faults is not None and idle.minor_faults < 100
    # The kernel's share is measured and never more than the span's CPU (the kernel
    # samples it per tick, so a short span's share may read 0).
    assert touched.sys_s is not None and touched.sys_s <= touched.cpu_s + 0.02
