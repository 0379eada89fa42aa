"""Metrics Service: bounded non-blocking emit, delivery to sinks, failure isolation."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from joynexus.metrics.events import MetricEvent, MetricsService


class Collect:
    def __init__(self) -> None:
        self.events: list[MetricEvent] = []
        self.closed = False

    def handle(self, events: Sequence[MetricEvent]) -> None:
        self.events.extend(events)

    def close(self) -> None:
        self.closed = True


class Broken:
    def handle(self, events: Sequence[MetricEvent]) -> None:
        raise RuntimeError("tracker is down")

    def close(self) -> None:
        raise RuntimeError("still down")


def ev(name: str = "train.loss", value: float = 1.0, tenant: str | None = "a") -> MetricEvent:
    return MetricEvent(category="learning", name=name, value=value, tenant_id=tenant)


def test_a_full_buffer_drops_and_counts_instead_of_blocking() -> None:
    svc = MetricsService(capacity=4, prometheus=False)
    sink = Collect()
    svc.subscribe(sink)
    # No dispatcher is running, so nothing drains: the 5th..10th emit must return at
    # once with False rather than wait for room.
    accepted = [svc.emit(ev(value=float(i))) for i in range(10)]
    assert accepted == [True] * 4 + [False] * 6
    stats = svc.stats()
    assert (stats.emitted, stats.dropped, stats.buffered) == (4, 6, 4)
    assert svc.drain() == 4
    assert [e.value for e in sink.events] == [0.0, 1.0, 2.0, 3.0]
    assert svc.emit(ev(value=99.0)) is True  # room again after delivery
    assert svc.stats().delivered == 4


def test_concurrent_emitters_never_lose_count() -> None:
    svc = MetricsService(capacity=500, prometheus=False)
    barrier = threading.Barrier(4)
    results: list[list[bool]] = []

    def emitter() -> None:
        barrier.wait()
        results.append([svc.emit(ev()) for _ in range(300)])

    threads = [threading.Thread(target=emitter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = svc.stats()
    assert sum(sum(r) for r in results) == stats.emitted == 500
    assert stats.dropped == 4 * 300 - 500


def test_invalid_fields_are_counted_not_raised() -> None:
    svc = MetricsService(prometheus=False)
    assert svc.emit_value("learning", "bad name with spaces", 1.0) is False
    assert svc.emit_value("learning", "x", 1.0, labels={"tenant": "a"}) is False
    assert svc.emit_value("nonsense", "x", 1.0) is False  # type: ignore[arg-type]
    assert svc.stats().invalid == 3
    with pytest.raises(ValidationError):
        MetricEvent(category="system", name="x", value=1.0, labels={"9bad": "v"})


def test_a_failing_sink_is_isolated_and_counted() -> None:
    svc = MetricsService(prometheus=False)
    good = Collect()
    svc.subscribe(Broken())
    svc.subscribe(good)
    svc.emit(ev())
    svc.emit(ev())
    assert svc.drain() == 2
    assert len(good.events) == 2
    assert svc.stats().sink_errors == 1
    svc.stop()  # closing the broken sink must not raise either
    assert good.closed


def test_sinks_receive_only_their_categories_and_callables_work() -> None:
    svc = MetricsService(prometheus=False)
    learning = Collect()
    control: list[MetricEvent] = []
    svc.subscribe(learning, categories=["learning"])
    svc.subscribe(control.append, categories=["control"])
    svc.emit_value("learning", "train.loss", 0.5, tenant_id="a", step=3)
    svc.emit_value("control", "inference_queue.depth", 7)
    svc.emit_value("system", "inference.batch_latency_s", 0.01)
    svc.drain()
    assert [e.name for e in learning.events] == ["train.loss"]
    assert learning.events[0].step == 3
    assert [(e.name, e.value) for e in control] == [("inference_queue.depth", 7.0)]
    with pytest.raises(ValueError, match="unknown metric categories"):
        svc.subscribe(Collect(), categories=["bogus"])  # type: ignore[list-item]


def test_latest_value_per_name_tenant_and_labels() -> None:
    svc = MetricsService(prometheus=False)
    svc.emit_value("control", "policy_staleness", 1, tenant_id="a")
    svc.emit_value("control", "policy_staleness", 4, tenant_id="a")
    svc.emit_value("control", "policy_staleness", 2, tenant_id="b")
    svc.emit_value("control", "scheduler.jobs", 5, labels={"state": "ready"})
    assert svc.latest("policy_staleness", tenant_id="a") is None  # not delivered yet
    svc.drain()
    a = svc.latest("policy_staleness", tenant_id="a")
    assert a is not None and a.value == 4.0
    b = svc.latest("policy_staleness", tenant_id="b", category="control")
    assert b is not None and b.value == 2.0
    jobs = svc.latest("scheduler.jobs", labels={"state": "ready"})
    assert jobs is not None and jobs.value == 5.0
    assert svc.latest("scheduler.jobs", labels={"state": "leased"}) is None


def test_background_dispatcher_delivers_everything_by_stop() -> None:
    sink = Collect()
    with MetricsService(prometheus=False, flush_interval_s=0.01) as svc:
        svc.subscribe(sink)
        for i in range(50):
            svc.emit(ev(value=float(i)))
    # stop() joins the dispatcher, drains what is left and closes the sinks.
    assert [e.value for e in sink.events] == [float(i) for i in range(50)]
    assert sink.closed
    assert svc.stats().buffered == 0
