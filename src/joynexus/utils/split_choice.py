"""Whether a CPU forward splits its ops over torch's intra-op threads, chosen by measurement.

Splitting a forward's ops over two threads pays while the second core is free (a small
Qwen-VL, 4 rows: 61-66 against 73-76 ms on a quiet 2-core CPU) and costs far more than it
gains while that core is busy: every op's second share waits for the core to come back
(the same small backbone at 16 rows, beside other work: 303 against 67 ms a row). What
the other cores are doing is the machine's, not the server's, and it changes while the
server runs, so no fixed size threshold is right for both.

:class:`SplitChooser` keeps, per size of work (powers of two of the multiply-accumulates
of one token-wise projection), a running cost per unit of work of each way, and runs the
cheaper one. The size rule decides until a bucket has measured both ways; after that the
worse way runs again once the better one has run ``explore_every`` times the ratio of
their costs, so re-measuring costs about 1/``explore_every`` of the time and a change of
load is still seen. It holds no lock: the Inference Queue runs one batch at a time, and
a race between two engines' threads would only blur a running cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SplitChooser"]


@dataclass
class _Bucket:
    cost: dict[bool, float] = field(default_factory=dict)
    since: int = 0  # forwards the better way ran since the worse one was last measured


class SplitChooser:
    """Choose serial or split for each forward from the recent costs of each way.

    Args:
        explore_every: Measure the way that looks worse again after the better one
            ran this many times the ratio of their costs (0: never, once both ways
            were measured).
        smoothing: Weight of the newest measurement in a way's running cost.
    """

    def __init__(self, *, explore_every: int = 16, smoothing: float = 0.3) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.explore_every = explore_every
        self.smoothing = smoothing
        self._buckets: dict[int, _Bucket] = {}

    def choose(self, work: int, rule: bool) -> bool:
        """Whether the forward of ``work`` multiply-accumulates per projection splits;
        ``rule`` is the size rule's answer, taken until both ways are measured."""
        bucket = self._buckets.setdefault(max(work, 1).bit_length(), _Bucket())
        other = not rule
        if rule not in bucket.cost:
            return rule
        if other not in bucket.cost:
            return other
        best = bucket.cost[True] < bucket.cost[False]
        # Measure the worse way again once the better one has run `explore_every` times
        # its cost ratio: however much worse it is, re-measuring costs at most about
        # 1/explore_every of the time (a split forward beside a busy core can take a
        # hundred times the serial one).
        ratio = bucket.cost[not best] / max(bucket.cost[best], 1e-12)
        if self.explore_every and bucket.since >= self.explore_every * ratio:
            bucket.since = 0
            return not best
        bucket.since += 1
        return best

    def record(self, work: int, split: bool, seconds: float) -> None:
        """Count a forward of ``work`` that ran ``split`` (or serial) in ``seconds``."""
        bucket = self._buckets.setdefault(max(work, 1).bit_length(), _Bucket())
        cost = seconds / max(work, 1)
        before = bucket.cost.get(split)
        bucket.cost[split] = cost if before is None else before + self.smoothing * (cost - before)

    def costs(self) -> dict[int, dict[str, float]]:
        """Seconds per unit of work of each way measured, per bucket (for reports)."""
        return {
            size: {("split" if way else "serial"): c for way, c in b.cost.items()}
            for size, b in sorted(self._buckets.items())
        }
