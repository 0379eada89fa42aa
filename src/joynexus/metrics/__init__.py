"""The Metrics Service and usage metering (paper §4.1.3 Monitoring, §6 pricing).

* :mod:`joynexus.metrics.events` — :class:`MetricEvent` and the non-blocking
  :class:`MetricsService` bus with its sinks.
* :mod:`joynexus.metrics.prometheus` — a per-service Prometheus registry (``/metrics``).
* :mod:`joynexus.metrics.trackers` — TensorBoard, W&B (offline) and MLflow sinks for
  learning signals (imported on use: they pull in their tracker libraries).
* :mod:`joynexus.metrics.jsonl` — per-tenant ``metrics.jsonl`` in the output directory.
* :mod:`joynexus.metrics.usage` — :class:`UsageMeter`: per-tenant device-seconds and counts
  (its report types, ``UsageReport`` and ``TenantUsage``, are in :mod:`joynexus.api`).
* :mod:`joynexus.metrics.control` — :class:`ControlSampler`: control signals on poll.
* :mod:`joynexus.metrics.hooks` — what the runtime services report.
"""

from joynexus.metrics.events import MetricEvent, MetricsService, MetricsServiceStats
from joynexus.metrics.usage import UsageMeter

__all__ = [
    "MetricEvent",
    "MetricsService",
    "MetricsServiceStats",
    "UsageMeter",
]
