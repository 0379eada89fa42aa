"""Prometheus exposition of events, Metrics Service counters and usage."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from joynexus.metrics.events import MetricsService
from joynexus.metrics.prometheus import UsageCollector
from joynexus.metrics.usage import UsageMeter


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_series_follow_the_events() -> None:
    svc = MetricsService()
    svc.emit_value("learning", "train.loss", 0.9, tenant_id="a", step=1)
    svc.emit_value("learning", "train.loss", 0.5, tenant_id="a", step=2)
    svc.emit_value("learning", "train.loss", 0.7, tenant_id="b", step=1)
    svc.emit_value("control", "scheduler.jobs", 2, tenant_id="a", labels={"state": "ready"})
    svc.emit_value("control", "training_queue.bytes", 64)
    svc.emit_value("system", "inference.batch_latency_s", 0.004)
    svc.emit_value("system", "inference.batch_latency_s", 0.2)
    svc.emit_value("system", "inference.batch_size", 6)
    svc.emit_value("system", "health.restarts_total", 1, labels={"role": "inference"})
    svc.emit_value("system", "health.restarts_total", 2, labels={"role": "inference"})
    svc.drain()
    got = samples(svc.render_latest())

    # Gauges keep the last value, per tenant.
    assert got[("joynexus_learning_train_loss", (("tenant", "a"),))] == 0.5
    assert got[("joynexus_learning_train_loss", (("tenant", "b"),))] == 0.7
    assert got[("joynexus_control_scheduler_jobs", (("state", "ready"), ("tenant", "a")))] == 2
    # Service-wide signals carry no tenant label at all.
    assert got[("joynexus_control_training_queue_bytes", ())] == 64
    # Durations are histograms.
    lat = "joynexus_system_inference_batch_latency_s"
    assert got[(f"{lat}_count", ())] == 2
    assert abs(got[(f"{lat}_sum", ())] - 0.204) < 1e-9
    assert got[(f"{lat}_bucket", (("le", "0.005"),))] == 1
    assert got[(f"{lat}_bucket", (("le", "+Inf"),))] == 2
    assert got[("joynexus_system_inference_batch_size_bucket", (("le", "8.0"),))]
    # _total names are counters of increments.
    key = ("joynexus_system_health_restarts_total", (("role", "inference"),))
    assert got[key] == 3
    # The service's own counters.
    assert got[("joynexus_metrics_events_delivered_total", ())] == 10
    assert got[("joynexus_metrics_events_dropped_total", ())] == 0


def test_label_names_are_fixed_by_the_first_event() -> None:
    svc = MetricsService()
    svc.emit_value("control", "scheduler.refusals", 1, labels={"reason": "max_in_flight"})
    svc.emit_value("control", "scheduler.refusals", 1, labels={"other": "x"})
    svc.emit_value("control", "scheduler.refusals", 4)  # a missing label is ""
    svc.drain()
    got = samples(svc.render_latest())
    name = "joynexus_control_scheduler_refusals"
    assert got[(name, (("reason", "max_in_flight"),))] == 1
    assert got[(name, (("reason", ""),))] == 4
    assert svc.prometheus is not None and svc.prometheus.rejected == 1


def test_each_service_has_its_own_registry() -> None:
    one, two = MetricsService(), MetricsService()
    one.emit_value("learning", "train.loss", 1.0, tenant_id="a")
    two.emit_value("learning", "train.loss", 2.0, tenant_id="a")
    one.drain()
    two.drain()
    assert samples(one.render_latest())[("joynexus_learning_train_loss", (("tenant", "a"),))] == 1
    assert samples(two.render_latest())[("joynexus_learning_train_loss", (("tenant", "a"),))] == 2


def test_usage_collector_exposes_the_meter_at_scrape_time() -> None:
    svc = MetricsService()
    meter = UsageMeter()
    assert svc.prometheus is not None
    svc.prometheus.registry.register(UsageCollector(meter))
    meter.record_inference({"a": 3, "b": 1}, 2.0)
    meter.record_request("a")
    got = samples(svc.render_latest())
    dev = "joynexus_usage_device_seconds_total"
    assert got[(dev, (("service", "inference"), ("tenant", "a")))] == 1.5
    assert got[(dev, (("service", "inference"), ("tenant", "b")))] == 0.5
    assert got[("joynexus_usage_requests_total", (("tenant", "a"),))] == 1
    assert got[("joynexus_usage_inference_samples_total", (("tenant", "b"),))] == 1
    meter.record_request("a")
    assert samples(svc.render_latest())[("joynexus_usage_requests_total", (("tenant", "a"),))] == 2


def test_no_family_mixes_per_tenant_series_with_a_service_wide_total() -> None:
    """Per-tenant rows next to a ``tenant=""`` total double-counted every sum."""
    svc = MetricsService()
    svc.emit_value("control", "scheduler.jobs", 2, tenant_id="a", labels={"state": "ready"})
    svc.emit_value("control", "scheduler.jobs", 1, tenant_id="b", labels={"state": "ready"})
    svc.emit_value("control", "scheduler.jobs", 3, labels={"state": "ready"})  # a total: refused
    svc.emit_value("control", "inference_queue.depth", 4)
    svc.emit_value("control", "inference_queue.depth", 9, tenant_id="a")  # per tenant: refused
    svc.drain()
    text = svc.render_latest()
    assert b'tenant=""' not in text
    got = samples(text)
    jobs = [v for (n, _), v in got.items() if n == "joynexus_control_scheduler_jobs"]
    assert sum(jobs) == 3  # a + b, each counted once
    assert got[("joynexus_control_inference_queue_depth", ())] == 4
    assert svc.prometheus is not None and svc.prometheus.rejected == 2
