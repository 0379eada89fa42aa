"""Bounded live histories behind the dashboard: learning curves and service utilization.

:class:`DashboardFeed` is a Metrics Service sink for ``learning`` events (losses,
returns, evaluation scores per tenant, ``step`` = policy version) and a sampler of the
:class:`~joynexus.metrics.usage.UsageMeter`: each :meth:`DashboardFeed.sample_usage`
turns the growth of every tenant's device-seconds since the previous sample into busy
seconds of the current time bucket. Both histories are bounded, so a server that runs
for weeks holds the same memory as one that ran for minutes:

* a curve keeps at most ``max_points`` points; when full it keeps every other point
  and from then on records every second event (then every fourth, ...), so the whole
  run stays visible at a coarser resolution instead of only its recent tail; the
  latest point is always kept;
* the utilization timeline is a ring of the last ``max_buckets`` buckets.

Thread-safe: the Metrics Service delivers from its dispatcher thread while the server
reads from its event loop. Imports no torch.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from joynexus.api import SERVICES, UsageReport
from joynexus.metrics.events import MetricEvent

__all__ = [
    "CURVE_NAMES",
    "CurvePoint",
    "DashboardFeed",
    "UtilizationBucket",
    "UtilizationTimeline",
]

#: Learning signals the dashboard plots, one chart per tenant and name.
CURVE_NAMES: tuple[str, ...] = (
    "train.loss",
    "rollout.mean_return",
    "rollout.success_rate",
    "eval.mean_return",
    "eval.success_rate",
)


class CurvePoint(BaseModel):
    """One point of a learning curve."""

    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(description="policy version the value belongs to")
    value: float
    t: float = Field(description="wall seconds of the event")


class UtilizationBucket(BaseModel):
    """Busy device-seconds of each shared service within one time bucket."""

    model_config = ConfigDict(extra="forbid")

    start: float = Field(description="wall seconds where the bucket begins")
    seconds: dict[str, float] = Field(description="service -> busy device-seconds")


class UtilizationTimeline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bucket_s: float
    services: list[str]
    buckets: list[UtilizationBucket]


@dataclass
class _Series:
    max_points: int
    points: list[CurvePoint] = field(default_factory=list)
    stride: int = 1
    seen: int = 0
    last: CurvePoint | None = None

    def add(self, point: CurvePoint) -> None:
        self.last = point
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return
        self.points.append(point)
        if len(self.points) > self.max_points:
            self.points = self.points[::2]
            self.stride *= 2

    def view(self) -> list[CurvePoint]:
        if self.last is None or (self.points and self.points[-1] is self.last):
            return list(self.points)
        return [*self.points, self.last]


_Bucket = dict[str, dict[str, float]]  # tenant -> service -> seconds


class DashboardFeed:
    """Learning curves and a utilization timeline, bounded (see module docstring).

    Args:
        max_points: Points kept per curve (≥ 2).
        bucket_s: Width of a utilization bucket in seconds.
        max_buckets: Buckets kept (the timeline spans ``bucket_s * max_buckets``).
        curve_names: Learning event names recorded as curves.
    """

    def __init__(
        self,
        *,
        max_points: int = 500,
        bucket_s: float = 5.0,
        max_buckets: int = 120,
        curve_names: Sequence[str] = CURVE_NAMES,
    ) -> None:
        if max_points < 2:
            raise ValueError(f"max_points must be ≥ 2, got {max_points}")
        if not bucket_s > 0 or not math.isfinite(bucket_s):
            raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s}")
        if max_buckets < 1:
            raise ValueError(f"max_buckets must be ≥ 1, got {max_buckets}")
        self.max_points = max_points
        self.bucket_s = float(bucket_s)
        self.max_buckets = max_buckets
        self.curve_names = frozenset(curve_names)
        self._lock = threading.Lock()
        self._curves: dict[str, dict[str, _Series]] = {}
        self._buckets: OrderedDict[float, _Bucket] = OrderedDict()
        self._last_usage: dict[str, dict[str, float]] | None = None

    # --- metric sink ---------------------------------------------------------------------

    def handle(self, events: Sequence[MetricEvent]) -> None:
        """Record the tenant learning events among ``events`` (others are ignored)."""
        with self._lock:
            for e in events:
                if e.category != "learning" or e.tenant_id is None:
                    continue
                if e.name not in self.curve_names or not math.isfinite(e.value):
                    continue
                tenant = self._curves.setdefault(e.tenant_id, {})
                series = tenant.get(e.name)
                if series is None:
                    series = tenant[e.name] = _Series(self.max_points)
                series.add(CurvePoint(step=e.step, value=e.value, t=e.timestamp))

    def close(self) -> None:
        return None

    def curves(self, tenant_id: str) -> dict[str, list[CurvePoint]]:
        """The tenant's curves by event name (empty for a tenant with none)."""
        with self._lock:
            return {name: s.view() for name, s in sorted(self._curves.get(tenant_id, {}).items())}

    # --- utilization ---------------------------------------------------------------------

    def sample_usage(self, report: UsageReport) -> None:
        """Add the device-seconds each tenant gained since the last sample to the bucket
        of ``report.generated_at``. The first sample only sets the baseline (a resumed
        meter's totals are history, not current load)."""
        current = {tid: dict(u.device_seconds) for tid, u in report.tenants.items()}
        start = math.floor(report.generated_at / self.bucket_s) * self.bucket_s
        with self._lock:
            previous, self._last_usage = self._last_usage, current
            if previous is None:
                return
            bucket = self._bucket(start)
            for tid, services in current.items():
                before = previous.get(tid, {})
                for service, seconds in services.items():
                    delta = seconds - before.get(service, 0.0)
                    if delta > 0:
                        row = bucket.setdefault(tid, {})
                        row[service] = row.get(service, 0.0) + delta

    def _bucket(self, start: float) -> _Bucket:
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = {}
            # A clock that stepped back must not reorder the ring: sort once on insert.
            if len(self._buckets) > 1 and next(reversed(self._buckets)) != max(self._buckets):
                self._buckets = OrderedDict(sorted(self._buckets.items()))
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        return bucket

    def utilization(self, tenant_id: str | None = None) -> UtilizationTimeline:
        """Busy seconds per bucket and service: all tenants (None) or one tenant's own."""
        with self._lock:
            buckets: list[UtilizationBucket] = []
            for start, rows in self._buckets.items():
                seconds: dict[str, float] = dict.fromkeys(SERVICES, 0.0)
                for tid, services in rows.items():
                    if tenant_id is not None and tid != tenant_id:
                        continue
                    for service, s in services.items():
                        seconds[service] = seconds.get(service, 0.0) + s
                buckets.append(UtilizationBucket(start=start, seconds=seconds))
        return UtilizationTimeline(bucket_s=self.bucket_s, services=list(SERVICES), buckets=buckets)
