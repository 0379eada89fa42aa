"""Threads and asyncio tasks that wait for a training job to become ``ready``.

The scheduler holds its lock while it checks for ready work and while it calls
:meth:`ReadyWaiters.notify`; threads then sleep on a condition of that same lock, and
asyncio tasks on a future that ``notify`` resolves through ``call_soon_threadsafe``,
so a transition made on any thread wakes waiters on any event loop without blocking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class AsyncWaiter:
    """One parked asyncio task; ``future`` resolves when it should look again."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> None:
        # A closed loop raises RuntimeError: nobody is waiting there any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class ReadyWaiters:
    """The waiters of one scheduler. Every method expects the caller to hold ``lock``."""

    def __init__(self, lock: threading.Lock) -> None:
        self._cond = threading.Condition(lock)
        self._threads = 0
        self._tasks: set[AsyncWaiter] = set()

    def notify(self) -> None:
        """Wake every waiter (cheap when there are none: the common, hot case)."""
        if self._threads:
            self._cond.notify_all()
        for waiter in self._tasks:
            waiter.wake()

    def wait(self, seconds: float) -> None:
        """Release the lock and sleep this thread until notified or ``seconds`` pass."""
        self._threads += 1
        try:
            self._cond.wait(seconds)
        finally:
            self._threads -= 1

    def park(self, loop: asyncio.AbstractEventLoop) -> AsyncWaiter:
        """Register a task's waiter; await its future outside the lock, then unpark."""
        waiter = AsyncWaiter(loop)
        self._tasks.add(waiter)
        return waiter

    def unpark(self, waiter: AsyncWaiter) -> None:
        self._tasks.discard(waiter)
