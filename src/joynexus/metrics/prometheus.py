"""Prometheus exposition of metric events (one ``CollectorRegistry`` per Metrics Service).

Each event name becomes one metric family ``joynexus_<category>_<name>`` (dots, dashes
and slashes become underscores) with the event's own label names, fixed by the first
event of that name. A family is either **per tenant** or **service-wide**, also fixed
by its first event:

* per tenant (the first event has a tenant): a ``tenant`` label on every series;
* service-wide (no tenant): no ``tenant`` label at all.

An event of the other kind is refused (counted in :attr:`PrometheusSink.rejected`):
one family never holds per-tenant series next to a service-wide total, so summing a
family over its ``tenant`` label never counts anything twice. A service-wide total of
a per-tenant signal is a Prometheus query (``sum by (state)
(joynexus_control_scheduler_jobs)``), or, where it must be exposed, an event of its own
name. The family's type follows from the name:

* ``..._total``: a counter; each event's value is an increment.
* system ``..._s`` (durations) and the names in :data:`HISTOGRAM_BUCKETS`: a histogram
  of observed values.
* anything else: a gauge holding the last value (losses, queue depth, staleness).

:class:`UsageCollector` exposes a :class:`~joynexus.metrics.usage.UsageMeter` as
``joynexus_usage_*`` counters read at scrape time (the plane registers it).

Imports point one way inside :mod:`joynexus.metrics`: the Metrics Service
(:mod:`~joynexus.metrics.events`) builds its :class:`PrometheusSink`, so this module
does not import the service's module; it reads events and the service's counters
through the structural types :class:`EventLike` and :class:`EventCounters`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from joynexus.metrics.stages import StageMeter
    from joynexus.metrics.usage import UsageMeter

__all__ = [
    "CONTENT_TYPE_LATEST",
    "HISTOGRAM_BUCKETS",
    "EventCounters",
    "EventLike",
    "PrometheusSink",
    "StageCollector",
    "UsageCollector",
    "metric_kind",
    "prometheus_name",
]

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

MetricKind = Literal["gauge", "counter", "histogram"]

_POW2 = tuple(float(2**i) for i in range(11))
#: Histograms that are not durations, with their buckets.
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "inference.batch_size": _POW2,
    "inference.batch_tenants": _POW2,
    "training.step_rows": _POW2,
}
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_log = logging.getLogger(__name__)


class EventLike(Protocol):
    """What the sink reads of a :class:`~joynexus.metrics.events.MetricEvent`."""

    @property
    def category(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def tenant_id(self) -> str | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


class EventCounters(Protocol):
    """What the sink exposes of :class:`~joynexus.metrics.events.MetricsServiceStats`."""

    @property
    def buffered(self) -> int: ...
    @property
    def emitted(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def invalid(self) -> int: ...
    @property
    def delivered(self) -> int: ...
    @property
    def sink_errors(self) -> int: ...


def metric_kind(event: EventLike) -> MetricKind:
    """How an event's name is exposed (see module docstring)."""
    if event.name.endswith("_total"):
        return "counter"
    if event.name in HISTOGRAM_BUCKETS or (
        event.category == "system" and event.name.endswith("_s")
    ):
        return "histogram"
    return "gauge"


def prometheus_name(event: EventLike, namespace: str = "joynexus") -> str:
    base = _INVALID.sub("_", f"{namespace}_{event.category}_{event.name}")
    # prometheus-client appends _total to counters itself.
    return base.removesuffix("_total")


_Family = Counter | Gauge | Histogram
#: A family, whether it is per tenant (a ``tenant`` label first), its own label names.
_Entry = tuple[_Family, bool, tuple[str, ...]]


class PrometheusSink:
    """Turns events into metrics of its own registry (see module docstring).

    Args:
        registry: The registry to fill (default: a new one; never the global one, so
            several services in one process do not collide).
        namespace: Prefix of every metric name.
        stats: The owning Metrics Service's ``stats`` method, exposed as
            ``<namespace>_metrics_events_*``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "joynexus",
        stats: Callable[[], EventCounters] | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.namespace = namespace
        self._families: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.rejected = 0
        if stats is not None:
            self.registry.register(_StatsCollector(stats, namespace))

    def handle(self, events: Sequence[EventLike]) -> None:
        with self._lock:
            for e in events:
                self._observe(e)

    def close(self) -> None:
        return None

    def render_latest(self) -> bytes:
        """The registry in the Prometheus text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)

    def _observe(self, e: EventLike) -> None:
        name = prometheus_name(e, self.namespace)
        entry = self._families.get(name)
        if entry is None:
            entry = self._create(name, e)
            if entry is None:
                return
        family, per_tenant, own = entry
        extra = set(e.labels) - set(own)
        if extra or per_tenant != bool(e.tenant_id):
            # Label names, and per tenant or not, are fixed by the family's first event.
            self.rejected += 1
            if name not in self._warned:
                self._warned.add(name)
                _log.warning(
                    "metric %s: event refused (labels %s, tenant %r do not fit the family's "
                    "labels %s)",
                    name,
                    sorted(e.labels),
                    e.tenant_id,
                    [*(["tenant"] if per_tenant else []), *own],
                )
            return
        values = [*([e.tenant_id or ""] if per_tenant else []), *(e.labels.get(k, "") for k in own)]
        child = family.labels(*values) if values else family
        if isinstance(child, Counter):
            if e.value >= 0:
                child.inc(e.value)
            else:
                self.rejected += 1
        elif isinstance(child, Histogram):
            child.observe(e.value)
        else:
            child.set(e.value)

    def _create(self, name: str, e: EventLike) -> _Entry | None:
        per_tenant = bool(e.tenant_id)
        own = tuple(sorted(e.labels))
        label_names = (*(("tenant",) if per_tenant else ()), *own)
        doc = f"{e.category} signal {e.name}"
        kind = metric_kind(e)
        family: _Family
        try:
            if kind == "counter":
                family = Counter(name, doc, label_names, registry=self.registry)
            elif kind == "histogram":
                buckets = HISTOGRAM_BUCKETS.get(e.name, _DURATION_BUCKETS)
                family = Histogram(name, doc, label_names, registry=self.registry, buckets=buckets)
            else:
                family = Gauge(name, doc, label_names, registry=self.registry)
        except ValueError:
            # Name collision with another family (e.g. "a.b" vs "a_b").
            self.rejected += 1
            return None
        entry = (family, per_tenant, own)
        self._families[name] = entry
        return entry


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], EventCounters], namespace: str) -> None:
        self._stats = stats
        self._ns = namespace

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for field in ("emitted", "dropped", "invalid", "delivered", "sink_errors"):
            yield CounterMetricFamily(
                f"{self._ns}_metrics_events_{field}",
                f"Metrics Service events {field.replace('_', ' ')}",
                value=float(getattr(s, field)),
            )
        yield GaugeMetricFamily(
            f"{self._ns}_metrics_events_buffered",
            "Metrics Service events waiting for delivery",
            value=float(s.buffered),
        )


class UsageCollector(Collector):
    """Exposes a usage meter at scrape time: ``<ns>_usage_device_seconds_total{tenant,
    service}``, ``<ns>_usage_requests_total{tenant}``, ``..._samples_trained_total``,
    ``..._inference_samples_total``, ``..._env_steps_total``.

    Register with ``sink.registry.register(UsageCollector(meter))``.
    """

    def __init__(self, meter: UsageMeter, namespace: str = "joynexus") -> None:
        self._meter = meter
        self._ns = namespace

    def collect(self) -> Iterator[Metric]:
        report = self._meter.snapshot()
        device = CounterMetricFamily(
            f"{self._ns}_usage_device_seconds",
            "Device-seconds attributed to each tenant on each shared service",
            labels=["tenant", "service"],
        )
        counts: Mapping[str, CounterMetricFamily] = {
            name: CounterMetricFamily(
                f"{self._ns}_usage_{name}",
                f"Per-tenant {name.replace('_', ' ')}",
                labels=["tenant"],
            )
            for name in ("requests", "inference_samples", "samples_trained", "env_steps")
        }
        for tid, usage in sorted(report.tenants.items()):
            for service, seconds in sorted(usage.device_seconds.items()):
                device.add_metric([tid, service], seconds)
            for name, family in counts.items():
                family.add_metric([tid], float(getattr(usage, name)))
        yield device
        yield from counts.values()


class StageCollector(Collector):
    """Exposes a :class:`StageMeter` at scrape time as
    ``<ns>_predict_stage_seconds_total{stage}`` and ``<ns>_predict_stage_events_total{stage}``.
    """

    def __init__(self, meter: StageMeter, namespace: str = "joynexus") -> None:
        self._meter = meter
        self._ns = namespace

    def collect(self) -> Iterator[Metric]:
        seconds = CounterMetricFamily(
            f"{self._ns}_predict_stage_seconds",
            "Seconds spent in each stage of predict calls (see joynexus.metrics.stages)",
            labels=["stage"],
        )
        events = CounterMetricFamily(
            f"{self._ns}_predict_stage_events",
            "Requests (per-request stages) or batches (per-batch stages) metered per stage",
            labels=["stage"],
        )
        for stage, (total, count) in sorted(self._meter.snapshot().items()):
            seconds.add_metric([stage], total)
            events.add_metric([stage], float(count))
        yield seconds
        yield events
