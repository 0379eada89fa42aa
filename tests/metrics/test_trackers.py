"""Tracker sinks: TensorBoard event files read back; W&B offline and MLflow if installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from joynexus.metrics.events import MetricEvent, MetricsService
from joynexus.metrics.jsonl import TenantJsonlSink


def read_jsonl(path: Path) -> list[MetricEvent]:
    """Every line of a metrics JSONL file, each a whole event."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [MetricEvent.model_validate_json(line) for line in lines if line.strip()]


def emit_curves(svc: MetricsService) -> None:
    for version, loss in [(1, 0.9), (2, 0.6), (3, 0.4)]:
        svc.emit_value("learning", "train.loss", loss, tenant_id="a", step=version)
    svc.emit_value("learning", "train.loss", 2.0, tenant_id="b", step=1)
    svc.emit_value("learning", "eval.success_rate", 0.5, tenant_id="a", labels={"task": "push"})
    svc.emit_value("learning", "eval.success_rate", 0.75, tenant_id="a", labels={"task": "push"})
    svc.emit_value("system", "inference.batch_latency_s", 0.01)  # not a learning signal
    svc.drain()


def test_tensorboard_event_files_round_trip(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from joynexus.metrics.trackers import TensorBoardSink

    svc = MetricsService(prometheus=False)
    sink = TensorBoardSink(tmp_path / "tb")
    svc.subscribe(sink)
    emit_curves(svc)
    svc.stop()

    a = EventAccumulator(str(sink.run_dir("a")))
    a.Reload()
    assert sorted(a.Tags()["scalars"]) == ["eval.success_rate/task:push", "train.loss"]
    loss = a.Scalars("train.loss")
    assert [(s.step, round(s.value, 6)) for s in loss] == [(1, 0.9), (2, 0.6), (3, 0.4)]
    # Events without a step count up per tag.
    evals = a.Scalars("eval.success_rate/task:push")
    assert [(s.step, s.value) for s in evals] == [(0, 0.5), (1, 0.75)]
    b = EventAccumulator(str(sink.run_dir("b")))
    b.Reload()
    assert [(s.step, s.value) for s in b.Scalars("train.loss")] == [(1, 2.0)]
    # System events are not learning curves: no service-wide run was written.
    assert not sink.run_dir(None).exists()


def test_jsonl_sink_writes_each_tenants_output_dir(tmp_path: Path) -> None:
    svc = MetricsService(prometheus=False)
    sink = TenantJsonlSink(lambda tid: tmp_path / "out" / tid, service_path=tmp_path / "svc.jsonl")
    svc.subscribe(sink)
    emit_curves(svc)
    svc.emit_value("control", "policy_staleness", 2, tenant_id="b")
    svc.drain()
    a = read_jsonl(sink.path_of("a"))
    assert [(e.name, e.value, e.step) for e in a] == [
        ("train.loss", 0.9, 1),
        ("train.loss", 0.6, 2),
        ("train.loss", 0.4, 3),
        ("eval.success_rate", 0.5, None),
        ("eval.success_rate", 0.75, None),
    ]
    assert all(e.tenant_id == "a" for e in a)
    b = read_jsonl(tmp_path / "out" / "b" / "metrics.jsonl")
    assert [e.name for e in b] == ["train.loss", "policy_staleness"]
    assert [e.name for e in read_jsonl(tmp_path / "svc.jsonl")] == ["inference.batch_latency_s"]
    svc.stop()
    # A later service (a restarted server) appends to the same files.
    again = MetricsService(prometheus=False)
    again.subscribe(TenantJsonlSink(lambda tid: tmp_path / "out" / tid))
    again.emit_value("learning", "train.loss", 0.3, tenant_id="a", step=4)
    again.drain()
    again.stop()
    assert [e.step for e in read_jsonl(sink.path_of("a"))] == [1, 2, 3, None, None, 4]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_runs_per_tenant(tmp_path: Path) -> None:
    from joynexus.metrics.trackers import WandbSink

    svc = MetricsService(prometheus=False)
    sink = WandbSink("joynexus-test", tmp_path)
    svc.subscribe(sink)
    emit_curves(svc)
    assert sorted(sink.runs) == ["a", "b"]
    assert sink.runs["a"].summary["train.loss"] == pytest.approx(0.4)
    assert sink.runs["a"].summary["eval.success_rate/task:push"] == pytest.approx(0.75)
    assert sink.runs["b"].summary["train.loss"] == pytest.approx(2.0)
    svc.stop()
    # One offline run file per tenant, ready for ``wandb sync``.
    run_files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2 and all(f.stat().st_size > 0 for f in run_files)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed")
def test_mlflow_file_store_runs_per_tenant(tmp_path: Path) -> None:
    from joynexus.metrics.trackers import MLflowSink

    svc = MetricsService(prometheus=False)
    sink = MLflowSink(tmp_path / "mlruns", experiment="jn-test")
    svc.subscribe(sink)
    emit_curves(svc)
    history = sink.client.get_metric_history(sink.run_ids["a"], "train.loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.9), (2, 0.6), (3, 0.4)]
    run_b = sink.run_ids["b"]
    svc.stop()
    assert sink.client.get_run(run_b).info.status == "FINISHED"
    assert sink.client.get_run(run_b).data.tags["tenant_id"] == "b"
