"""Clocks: the real one, and a fake one so tests never sleep.

Every component that reasons about time (lease expiry, batching timeouts, idle
reaping) takes a :class:`Clock` instead of calling :func:`time.monotonic` directly.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Source of time for schedulers and batchers."""

    def now(self) -> float:
        """Seconds on a monotonic timeline (only differences are meaningful)."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch, for timestamps shown to people."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance`.

    ``sleep`` parks the task on a timer heap; ``advance`` moves time forward and
    wakes every sleeper whose deadline has passed, in deadline order.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start
        self._epoch_offset = 1_700_000_000.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._epoch_offset + self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake due sleepers (synchronously)."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)

    @property
    def pending_sleepers(self) -> int:
        """How many tasks are parked in :meth:`sleep` (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._timers if not f.done())
