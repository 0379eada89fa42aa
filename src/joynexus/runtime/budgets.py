"""Recovery budgets: restarts allowed per key (a role, a tenant, a workload) over a
sliding time window (paper §4.1.3).

A budget counted over the whole life of the process only shrinks: a server that
survived three crashes last week would escalate on the next one. And a budget shared
by every tenant lets one tenant's crashing simulator spend it for all of them. So each
key has its own count of the restarts charged in the last ``window_s`` seconds; a
charge older than that no longer counts, and the budget refills as the window slides.
"""

from __future__ import annotations

from collections import deque

from joynexus.errors import InvalidRequestError
from joynexus.utils.clock import Clock

__all__ = ["DEFAULT_WINDOW_S", "RecoveryBudget"]

#: Default window of a recovery budget (seconds).
DEFAULT_WINDOW_S = 600.0


class RecoveryBudget:
    """``limit`` restarts per key within any ``window_s`` seconds.

    Args:
        limit: Restarts a key may be charged within one window (0: none).
        window_s: Width of the sliding window (None: the whole life of the budget).
        clock: Time source (tests pass a ``FakeClock``).

    Raises:
        InvalidRequestError: a negative limit or a window that is not positive.
    """

    def __init__(self, limit: int, window_s: float | None, clock: Clock) -> None:
        if limit < 0:
            raise InvalidRequestError(f"a recovery budget cannot be negative (got {limit})")
        if window_s is not None and window_s <= 0:
            raise InvalidRequestError(f"a budget window must be positive (got {window_s})")
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._charges: dict[str, deque[float]] = {}

    def _recent(self, key: str) -> deque[float]:
        charges = self._charges.setdefault(key, deque())
        if self.window_s is not None:
            horizon = self.clock.now() - self.window_s
            while charges and charges[0] <= horizon:
                charges.popleft()
        return charges

    def used(self, key: str = "") -> int:
        """Restarts charged to ``key`` within the window."""
        return len(self._recent(key))

    def spent(self, key: str = "") -> bool:
        """Whether ``key`` may not restart again now."""
        return self.used(key) >= self.limit

    def charge(self, key: str = "") -> bool:
        """Charge one restart to ``key`` if its budget allows; False (nothing charged)
        when it is spent."""
        recent = self._recent(key)
        if len(recent) >= self.limit:
            return False
        recent.append(self.clock.now())
        return True

    def forget(self, key: str) -> None:
        """Drop ``key``'s charges (it was rebuilt from scratch, or it is gone)."""
        self._charges.pop(key, None)

    def describe(self) -> str:
        """The budget in words, for failure messages."""
        per = "in total" if self.window_s is None else f"per {self.window_s:g} s"
        return f"{self.limit} restarts {per}"
