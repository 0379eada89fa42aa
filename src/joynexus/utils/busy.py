"""Processes that keep cores busy, for benchmarks that measure beside a loaded machine.

Its own module, importing nothing heavy: a spawned child imports the module of its
target, and a benchmark's module would bring torch along for each spinning process.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["busy_processes"]

#: A spinning process stops by itself after this long, even if its parent died.
SPIN_LIMIT_S = 1800.0


def _spin(stop: Any, limit_s: float) -> None:
    """Keep a core busy until ``stop`` is set or ``limit_s`` has passed."""
    deadline = time.monotonic() + limit_s
    x = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(10_000):
            x += 1


@contextmanager
def busy_processes(count: int, limit_s: float = SPIN_LIMIT_S) -> Iterator[None]:
    """``count`` processes spinning on the CPU for the duration of the block."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop, limit_s), daemon=True) for _ in range(count)]
    for proc in procs:
        proc.start()
    try:
        time.sleep(0.5 if procs else 0.0)  # let them reach their loop
        yield
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
