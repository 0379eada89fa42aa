"""Trackers chosen by a spec's ``tracking`` and by ``--tracking`` write their offline output.

Regression: a spec could not choose a tracker (``tracking`` was refused as unknown),
``joynexus run`` / ``serve`` had no ``--tracking``, ClearML was not supported at all
and the W&B / MLflow packages were not installed by ``make``. Here every tracker is
selected, events flow through a real Metrics Service, and each tracker's offline files
are read back: TensorBoard event files, a W&B offline run, an MLflow file store and a
ClearML offline session — each holding only the tenants that chose it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from joynexus.cli.tracking import trackers_of
from joynexus.errors import SpecError
from joynexus.metrics.events import MetricsService
from joynexus.metrics.tracking import subscribe_trackers, tracker_dir
from joynexus.spec.workload import parse_spec


def test_each_selected_tracker_writes_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # ClearML reads its directories from the environment: restored after the test.
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.delenv("CLEARML_CONFIG_FILE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    svc = MetricsService(prometheus=False)
    sinks = subscribe_trackers(
        svc,
        tmp_path,
        everyone=["clearml"],  # --tracking clearml
        by_tenant={"a": ["tensorboard", "wandb", "mlflow"], "b": ["tensorboard"]},
    )
    assert sorted(sinks) == ["clearml", "mlflow", "tensorboard", "wandb"]
    for version, loss in [(1, 0.9), (2, 0.6)]:
        svc.emit_value("learning", "train.loss", loss, tenant_id="a", step=version)
    svc.emit_value("learning", "train.loss", 2.0, tenant_id="b", step=1)
    svc.drain()
    clearml_session = sinks["clearml"].session_dir
    mlflow = sinks["mlflow"]
    run_a = mlflow.run_ids["a"]
    assert sorted(mlflow.run_ids) == ["a"]  # b chose tensorboard only
    svc.stop()  # closes every sink: files complete

    for tenant, expected in (("a", [(1, 0.9), (2, 0.6)]), ("b", [(1, 2.0)])):
        acc = EventAccumulator(str(tracker_dir(tmp_path, "tensorboard") / tenant))
        acc.Reload()
        got = [(s.step, round(s.value, 6)) for s in acc.Scalars("train.loss")]
        assert got == expected

    wandb_runs = list((tracker_dir(tmp_path, "wandb") / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(wandb_runs) == 1 and wandb_runs[0].stat().st_size > 0  # tenant a only

    history = mlflow.client.get_metric_history(run_a, "train.loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.9), (2, 0.6)]
    assert str(tracker_dir(tmp_path, "mlflow").resolve()) in mlflow.client.tracking_uri

    assert clearml_session is not None
    assert tracker_dir(tmp_path, "clearml") in clearml_session.parents
    lines = (clearml_session / "metrics.jsonl").read_text().splitlines()
    reported = sorted(
        (e["variant"], e["iter"], e["value"])
        for line in lines
        for e in json.loads(line)
        if e.get("metric") == "train.loss"
    )
    assert reported == [("a", 1, 0.9), ("a", 2, 0.6), ("b", 1, 2.0)]  # everyone's
    assert clearml_session.with_suffix(".zip").is_file()  # ready for import


def test_tracking_names_are_checked_in_the_spec_and_the_cli() -> None:
    base = {"tenant": "t", "task": "custom", "base_model": {"id": "tiny:qwen2_5_vl"}}
    base["schema"] = "pusht"
    assert parse_spec(base).tracking == ["tensorboard"]
    assert parse_spec({**base, "tracking": ["clearml", "wandb"]}).tracking == ["clearml", "wandb"]
    with pytest.raises(SpecError, match="tracking"):
        parse_spec({**base, "tracking": ["comet"]})
    assert trackers_of(["MLflow", "mlflow", "tensorboard"]) == ["mlflow", "tensorboard"]
    with pytest.raises(typer.BadParameter, match="clearml"):
        trackers_of(["comet"])
