"""A reentrant lock that lets latency-bound work cut in line, for the resident backbone.

The Training and Inference Model Services of one process take turns on the backbone
under one lock. With a plain ``RLock`` a predict batch that arrives while a grouped
training step runs waits for the whole step, and a trainer that releases and at once
re-acquires can go first again (``RLock`` is not fair). :class:`PriorityRLock` bounds
that wait:

* a **priority** acquirer (:meth:`PriorityRLock.priority`, a predict batch) goes before
  every ordinary one waiting at the same time, so training and serving alternate instead
  of the trainer taking the lock back;
* the holder of an ordinary acquisition calls :meth:`PriorityRLock.yield_to_priority`
  between the phases of its work (a training step: after its backbone forward, after its
  losses, after its backward); when priority acquirers wait, it lets exactly those run,
  then resumes. So a predict waits at most one phase, not one step.

Yielding is safe for a training step because what runs in between touches nothing the
step holds: inference reads the frozen backbone under ``no_grad`` and its own serving
copies of the heads, never the training slots' parameters, gradients or optimizers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PriorityRLock"]


class PriorityRLock:
    """A reentrant lock with priority acquirers and cooperative yields (see module doc).

    ``with lock:`` is an ordinary acquisition; ``with lock.priority():`` a priority one.
    Re-entry by the holding thread is always immediate, whichever kind.

    Args:
        max_bypass: Priority acquisitions in a row that may pass an ordinary acquirer
            already waiting; then the ordinary one goes first (a steady stream of
            predicts must not starve training).
        prioritize: False makes it a plain reentrant lock (every acquirer ordinary,
            no yields): the baseline ``joynexus bench backbone-lock`` compares against.
    """

    def __init__(self, max_bypass: int = 8, *, prioritize: bool = True) -> None:
        self.max_bypass = max(1, max_bypass)
        self.prioritize = prioritize
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._priority_waiting = 0
        self._ordinary_waiting = 0
        self._priority_grants = 0
        self._bypassed = 0
        # Grants after which the holder that yielded takes the lock back before any new
        # priority acquirer (None: nobody is yielding).
        self._yield_target: int | None = None

    # --- acquisition -------------------------------------------------------------------

    def acquire(self, *, priority: bool = False) -> None:
        """Block until this thread holds the lock (re-entry: at once)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            if priority and self.prioritize:
                self._priority_waiting += 1
                try:
                    while self._owner is not None or self._priority_blocked():
                        self._cond.wait()
                finally:
                    self._priority_waiting -= 1
                self._priority_grants += 1
                if self._ordinary_waiting:
                    self._bypassed += 1
            else:
                self._ordinary_waiting += 1
                try:
                    while self._owner is not None or self._ordinary_blocked():
                        self._cond.wait()
                finally:
                    self._ordinary_waiting -= 1
                self._bypassed = 0
            self._owner, self._depth = me, 1

    def _priority_blocked(self) -> bool:
        if self._yield_target is not None:
            # The holder that yielded takes the lock back once the acquirers it yielded
            # to have had their turn.
            return self._priority_grants >= self._yield_target
        return self._ordinary_waiting > 0 and self._bypassed >= self.max_bypass

    def _ordinary_blocked(self) -> bool:
        if self._yield_target is not None:
            return True  # nothing ordinary slips into the middle of a yielded step
        return self._priority_waiting > 0 and self._bypassed < self.max_bypass

    def release(self) -> None:
        """Undo one acquisition by this thread.

        Raises:
            RuntimeError: this thread does not hold the lock.
        """
        with self._cond:
            self._check_owner()
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> PriorityRLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextmanager
    def priority(self) -> Iterator[PriorityRLock]:
        """Hold the lock as a priority acquirer for the ``with`` block."""
        self.acquire(priority=True)
        try:
            yield self
        finally:
            self.release()

    # --- cooperation -------------------------------------------------------------------

    def yield_to_priority(self) -> bool:
        """Let the priority acquirers waiting now run, then take the lock back.

        Only a holder at depth one yields (a nested holder's outer code did not agree to
        let anybody in). Acquirers that arrive while it waits do not extend the wait past
        the ones it yielded to, so the holder cannot be starved, and no ordinary acquirer
        gets in meanwhile, so a yielded step is never interleaved with another step.

        Returns:
            Whether it yielded.

        Raises:
            RuntimeError: this thread does not hold the lock.
        """
        with self._cond:
            self._check_owner()
            if self._depth != 1 or self._priority_waiting == 0 or not self.prioritize:
                return False
            self._yield_target = self._priority_grants + self._priority_waiting
            self._owner, self._depth = None, 0
            self._cond.notify_all()
            try:
                while self._owner is not None or self._priority_grants < self._yield_target:
                    self._cond.wait()
            finally:
                self._yield_target = None
                self._cond.notify_all()
            self._owner, self._depth = threading.get_ident(), 1
            return True

    @property
    def priority_waiting(self) -> int:
        """Priority acquirers blocked right now (for metrics and tests)."""
        with self._cond:
            return self._priority_waiting

    def held_by_me(self) -> bool:
        """Whether the calling thread holds the lock."""
        with self._cond:
            return self._owner == threading.get_ident()

    def _check_owner(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("PriorityRLock released or yielded by a thread it is not held by")
