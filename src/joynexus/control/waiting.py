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
import time
from collections.abc import Callable

#: Called with the lock held: whether ready work is there (it may raise, e.g. closed).
Poll = Callable[[], bool]
#: Called with the lock held: seconds until the next lease deadline, or None.
NextDue = Callable[[], float | None]


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
        self.lock = lock
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


def wait_slice(remaining: float, next_due: NextDue) -> float:
    """How long to sleep: ``remaining``, but no later than the next lease deadline."""
    # Expiry is lazy, so a waiter must also wake when the next lease is due: that
    # lease's job may return to ``ready`` without any other call happening.
    if remaining <= 0:
        return 0.0
    due = next_due()
    if due is not None:
        remaining = min(remaining, max(due, 1e-3))
    return remaining


def wait_until(waiters: ReadyWaiters, poll: Poll, next_due: NextDue, timeout_s: float) -> bool:
    """Block this thread until ``poll`` is true (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    with waiters.lock:
        while True:
            if poll():
                return True
            wait = wait_slice(deadline - time.monotonic(), next_due)
            if wait <= 0:
                return False
            waiters.wait(wait)


async def async_wait_until(
    waiters: ReadyWaiters, poll: Poll, next_due: NextDue, timeout_s: float
) -> bool:
    """Like :func:`wait_until`, but parks the task, not the event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    while True:
        with waiters.lock:
            if poll():
                return True
            wait = wait_slice(deadline - loop.time(), next_due)
            if wait <= 0:
                return False
            waiter = waiters.park(loop)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that arrives as the future resolves (the task survives
            # its cancel, and a shutdown waits on it forever).
            async with asyncio.timeout(wait):
                await waiter.future
        except TimeoutError:
            pass  # re-check: a lease may have expired into ``ready`` meanwhile
        finally:
            with waiters.lock:
                waiters.unpark(waiter)
