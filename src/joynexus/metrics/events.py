"""Metric events and the Metrics Service that fans them out (paper §4.1.3, Monitoring).

Runtime services never talk to a tracker themselves: they call
:meth:`MetricsService.emit`, which only appends to a bounded buffer and returns. A
dispatcher (a daemon thread started by :meth:`MetricsService.start`, or an explicit
:meth:`MetricsService.drain`) delivers buffered events to subscribed sinks: the
Prometheus registry every service owns, TensorBoard / W&B / MLflow trackers, per-tenant
JSONL files. A full buffer drops the event and counts it; a sink that raises is counted
and skipped. Neither ever reaches the training or serving hot path.

Three categories, as in the paper: ``control`` (job states, queue depth, in-flight
requests, policy staleness — what the Master reads for admission), ``learning``
(losses, returns, evaluation scores, policy versions — what users see in trackers) and
``system`` (health, latency, weight-sync overhead, utilization — what operators read).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from joynexus.metrics.stages import StageMeter

if TYPE_CHECKING:
    from joynexus.metrics.prometheus import PrometheusSink

__all__ = [
    "CATEGORIES",
    "MetricCategory",
    "MetricEvent",
    "MetricSink",
    "MetricsService",
    "MetricsServiceStats",
]

log = logging.getLogger(__name__)

MetricCategory = Literal["control", "learning", "system"]
CATEGORIES: tuple[MetricCategory, ...] = ("control", "learning", "system")

# Names are dotted paths ("train.loss", "inference.batch_latency_s"); sinks map them to
# their own conventions (Prometheus replaces the dots, TensorBoard uses them as tags).
_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-/]*$"
_LABEL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class MetricEvent(BaseModel):
    """One measurement.

    Attributes:
        category: ``control`` | ``learning`` | ``system``.
        name: Dotted metric name, e.g. ``train.loss``.
        value: The measured value.
        tenant_id: The tenant it belongs to; None for service-wide signals.
        labels: Extra dimensions (e.g. ``{"state": "ready"}``); keys are identifiers.
        step: Learning step (policy version) for learning curves; None otherwise.
        timestamp: Wall-clock seconds since the Unix epoch.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: MetricCategory
    name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN)
    value: float
    tenant_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    step: int | None = None
    timestamp: float = Field(default_factory=time.time)

    @field_validator("labels")
    @classmethod
    def _label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if not re.match(_LABEL_PATTERN, key) or key == "tenant":
                raise ValueError(
                    f"label name {key!r} must be an identifier ([A-Za-z_][A-Za-z0-9_]*) "
                    "and not 'tenant' (use tenant_id)"
                )
        return labels


class MetricSink(Protocol):
    """Something that receives delivered events (in the dispatcher's thread)."""

    def handle(self, events: Sequence[MetricEvent]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class _SinkLike(Protocol):
    def handle(self, events: Sequence[MetricEvent]) -> None: ...


class MetricsServiceStats(BaseModel):
    """Counters of the Metrics Service itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity: int
    buffered: int = Field(description="events waiting for delivery now")
    emitted: int = Field(description="events accepted into the buffer")
    dropped: int = Field(description="events refused because the buffer was full")
    invalid: int = Field(description="emit_value calls whose fields did not validate")
    delivered: int = Field(description="events handed to the sinks")
    sink_errors: int = Field(description="sink calls that raised")


@dataclass
class _Subscription:
    sink: MetricSink
    categories: frozenset[str]
    name: str


class _CallbackSink:
    def __init__(self, fn: Callable[[MetricEvent], None]) -> None:
        self._fn = fn

    def handle(self, events: Sequence[MetricEvent]) -> None:
        for e in events:
            self._fn(e)

    def close(self) -> None:
        return None


_LatestKey = tuple[str, str, str | None, tuple[tuple[str, str], ...]]


class MetricsService:
    """Bounded, non-blocking event bus with sinks (see module docstring).

    Args:
        capacity: Events the buffer holds; beyond it ``emit`` drops and counts.
        prometheus: Build a per-service Prometheus registry sink (default True).
        flush_interval_s: How often the dispatcher thread wakes when idle.
    """

    def __init__(
        self,
        capacity: int = 10_000,
        *,
        prometheus: bool = True,
        flush_interval_s: float = 0.5,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be ≥ 1, got {capacity}")
        self.capacity = capacity
        self._buffer: queue.SimpleQueue[MetricEvent] = queue.SimpleQueue()
        self._size = 0
        self._count_lock = threading.Lock()
        self._emitted = 0
        self._dropped = 0
        self._invalid = 0
        self._delivered = 0
        self._sink_errors = 0
        self._subs: list[_Subscription] = []
        self._subs_lock = threading.Lock()
        self._deliver_lock = threading.Lock()
        self._latest: dict[_LatestKey, MetricEvent] = {}
        self._flush_interval_s = flush_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.prometheus: PrometheusSink | None = None
        # Predict-path stage times: metered on every call, so kept out of the event bus.
        self.stages = StageMeter()
        if prometheus:
            from joynexus.metrics.prometheus import PrometheusSink, StageCollector

            self.prometheus = PrometheusSink(stats=self.stats)
            self.prometheus.registry.register(StageCollector(self.stages))
            self.subscribe(self.prometheus, name="prometheus")

    # --- emit (hot path) -----------------------------------------------------------------

    def emit(self, event: MetricEvent) -> bool:
        """Buffer ``event`` for delivery. Never blocks on sinks and never raises.

        Returns:
            False when the buffer was full and the event was dropped (counted).
        """
        with self._count_lock:
            if self._size >= self.capacity:
                self._dropped += 1
                return False
            self._size += 1
            self._emitted += 1
        self._buffer.put(event)
        return True

    def emit_value(
        self,
        category: MetricCategory,
        name: str,
        value: float,
        *,
        tenant_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        step: int | None = None,
    ) -> bool:
        """Build and :meth:`emit` an event; invalid fields are counted, never raised."""
        try:
            event = MetricEvent(
                category=category,
                name=name,
                value=float(value),
                tenant_id=tenant_id,
                labels=dict(labels or {}),
                step=step,
            )
        except (ValidationError, ValueError, TypeError):
            with self._count_lock:
                self._invalid += 1
            return False
        return self.emit(event)

    # --- sinks ----------------------------------------------------------------------------

    def subscribe(
        self,
        sink: MetricSink | Callable[[MetricEvent], None],
        *,
        categories: Collection[MetricCategory] | None = None,
        name: str | None = None,
    ) -> MetricSink:
        """Deliver events of ``categories`` (default all) to ``sink``.

        A plain callable receives one event at a time (wrapped in a sink, which is
        returned). A sink stays subscribed for the service's lifetime.
        """
        real: MetricSink = sink if isinstance(sink, _SinkLike) else _CallbackSink(sink)
        cats = frozenset(categories if categories is not None else CATEGORIES)
        unknown = cats - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown metric categories {sorted(unknown)}; allowed {CATEGORIES}")
        with self._subs_lock:
            self._subs.append(_Subscription(real, cats, name or type(real).__name__))
        return real

    # --- delivery ------------------------------------------------------------------------

    def drain(self) -> int:
        """Deliver every buffered event now, in the calling thread; returns how many."""
        with self._deliver_lock:
            events: list[MetricEvent] = []
            while True:
                try:
                    events.append(self._buffer.get_nowait())
                except queue.Empty:
                    break
            if not events:
                return 0
            with self._count_lock:
                self._size -= len(events)
            for e in events:
                self._latest[_latest_key(e)] = e
            with self._subs_lock:
                subs = list(self._subs)
            for sub in subs:
                chosen = [e for e in events if e.category in sub.categories]
                if not chosen:
                    continue
                try:
                    sub.sink.handle(chosen)
                except Exception:
                    with self._count_lock:
                        self._sink_errors += 1
                    log.exception("metrics sink %s failed; its events were skipped", sub.name)
            with self._count_lock:
                self._delivered += len(events)
            return len(events)

    def start(self) -> None:
        """Start the background dispatcher thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="metrics-dispatch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self.drain()

    def stop(self) -> None:
        """Stop the dispatcher, deliver what is buffered, and close every sink."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()
            self._thread = None
        self.drain()
        with self._subs_lock:
            subs = list(self._subs)
        for sub in subs:
            try:
                sub.sink.close()
            except Exception:
                log.exception("closing metrics sink %s failed", sub.name)

    def __enter__(self) -> MetricsService:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- queries -------------------------------------------------------------------------

    def stats(self) -> MetricsServiceStats:
        with self._count_lock:
            return MetricsServiceStats(
                capacity=self.capacity,
                buffered=self._size,
                emitted=self._emitted,
                dropped=self._dropped,
                invalid=self._invalid,
                delivered=self._delivered,
                sink_errors=self._sink_errors,
            )

    def latest(
        self,
        name: str,
        *,
        category: MetricCategory | None = None,
        tenant_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> MetricEvent | None:
        """The last delivered event with this name, tenant and labels (any category
        unless one is given) — e.g. the Master reading a control signal."""
        want = tuple(sorted((labels or {}).items()))
        with self._deliver_lock:
            for cat in (category,) if category is not None else CATEGORIES:
                e = self._latest.get((cat, name, tenant_id, want))
                if e is not None:
                    return e
        return None

    def render_latest(self) -> bytes:
        """Prometheus text exposition of this service's registry (for ``/metrics``).

        Raises:
            RuntimeError: the service was built with ``prometheus=False``.
        """
        if self.prometheus is None:
            raise RuntimeError("this MetricsService was built with prometheus=False")
        return self.prometheus.render_latest()


def _latest_key(e: MetricEvent) -> _LatestKey:
    return (e.category, e.name, e.tenant_id, tuple(sorted(e.labels.items())))
