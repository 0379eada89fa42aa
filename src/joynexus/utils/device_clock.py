"""The device's own time: CPU seconds and run-queue wait of the thread doing device work.

A training step or an inference batch is timed in wall-clock seconds where it runs
(the busy intervals of the Metrics Service). On a shared machine a wall interval also
holds the time the device thread was ready to run but another thread or process had
its core, so a busy machine makes the device look slower. This module measures, for
each stretch of device work (:func:`~joynexus.utils.affinity.on_device` opens one), what
the thread itself got:

* ``cpu_s`` — the thread's own CPU time (``CLOCK_THREAD_CPUTIME_ID``; with one torch
  intra-op thread, as the pinned demo runs, the calling thread does every kernel);
* ``wait_s`` — the thread's run-queue wait: runnable, but the core ran something else
  (Linux ``/proc/thread-self/schedstat``; None where the kernel does not keep it).
  Other processes' load shows here, and so does the service's own host work (event
  loop, worker threads) when the kernel runs it on the device's core while a step is
  ready: on a GPU that host work would run beside the device.

Beside them, where the platform has ``RUSAGE_THREAD``, ``sys_s`` (the kernel's share of
``cpu_s``) and ``minor_faults`` (pages the thread touched for the first time): the same
work can cost more CPU when its memory must be faulted in again.

Time blocked on a lock, the GIL or I/O is in neither: it is the system's own wait, not
the machine's. Recording costs two small file reads and two ``getrusage`` calls per
stretch and happens only while a :class:`SpanRecorder` is open (the demo opens one per
phase); otherwise a stretch costs a list check.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeviceSpan",
    "SpanRecorder",
    "device_span",
    "process_clock",
    "thread_clock",
    "thread_usage",
]

_SCHEDSTAT = "/proc/thread-self/schedstat"
_TASKS = "/proc/self/task"


def thread_clock() -> tuple[float, float | None]:
    """(CPU seconds, run-queue wait seconds or None) of the calling thread so far."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return time.thread_time(), None


def thread_usage() -> tuple[float, int] | None:
    """(kernel CPU seconds, minor page faults) of the calling thread so far; None where
    the platform has no per-thread usage."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return None
    try:
        usage = resource.getrusage(who)
    except OSError:
        return None
    return usage.ru_stime, usage.ru_minflt


def process_clock() -> tuple[float, float] | None:
    """(CPU seconds, run-queue wait seconds) of this process's live threads so far.

    A simulator worker reads it around each call: its run-queue wait is what other
    threads and processes took from the simulator (a renderer's threads included).
    None where the kernel keeps no schedstat.
    """
    cpu = wait = 0.0
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            cpu += int(fields[0]) / 1e9
            wait += int(fields[1]) / 1e9
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except (OSError, ValueError, IndexError):
            return None
    return cpu, wait


@dataclass(frozen=True)
class DeviceSpan:
    """One stretch of device work on one thread.

    Attributes:
        start / end: Wall-clock times (``time.time()``) of its start and end.
        cpu_s: The thread's CPU seconds inside it.
        wait_s: Its run-queue wait inside it (None: not measurable here).
        sys_s: The kernel's share of ``cpu_s`` (None: not measurable here).
        minor_faults: Pages first touched inside it (None: not measurable here).
    """

    start: float
    end: float
    cpu_s: float
    wait_s: float | None
    sys_s: float | None = None
    minor_faults: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "cpu_s": self.cpu_s,
            "wait_s": self.wait_s,
            "sys_s": self.sys_s,
            "minor_faults": self.minor_faults,
        }


class SpanRecorder:
    """Collects every :class:`DeviceSpan` that ends while it is open (any thread).

    Use as a context manager (or :meth:`start` / :meth:`stop`); ``spans`` holds what
    was recorded, in end order.
    """

    def __init__(self) -> None:
        self.spans: list[DeviceSpan] = []

    def start(self) -> None:
        """Record from now on (idempotent)."""
        with _lock:
            if self not in _recorders:
                _recorders.append(self)

    def stop(self) -> None:
        """Record no more; ``spans`` keeps what was recorded."""
        with _lock:
            if self in _recorders:
                _recorders.remove(self)

    def __enter__(self) -> SpanRecorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_lock = threading.Lock()
_recorders: list[SpanRecorder] = []
_depth = threading.local()


@contextlib.contextmanager
def device_span() -> Iterator[None]:
    """Measure the enclosed device work on this thread for every open recorder.

    Nested spans on one thread count once (the outermost).
    """
    depth = getattr(_depth, "n", 0)
    if depth or not _recorders:
        _depth.n = depth + 1
        try:
            yield
        finally:
            _depth.n = depth
        return
    _depth.n = 1
    start, (cpu0, wait0), usage0 = time.time(), thread_clock(), thread_usage()
    try:
        yield
    finally:
        _depth.n = 0
        cpu1, wait1 = thread_clock()
        usage1 = thread_usage()
        wait = None if wait0 is None or wait1 is None else max(wait1 - wait0, 0.0)
        sys_s = faults = None
        if usage0 is not None and usage1 is not None:
            sys_s, faults = max(usage1[0] - usage0[0], 0.0), max(usage1[1] - usage0[1], 0)
        span = DeviceSpan(start, time.time(), max(cpu1 - cpu0, 0.0), wait, sys_s, faults)
        with _lock:
            for rec in _recorders:
                rec.spans.append(span)
