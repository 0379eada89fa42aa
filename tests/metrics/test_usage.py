"""Usage metering: row-share attribution, counts, thread safety, persistence, CLI."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from joynexus.api import UsageReport
from joynexus.cli.main import app
from joynexus.errors import InvalidRequestError
from joynexus.metrics.usage import UsageMeter, split_by_rows
from joynexus.utils.clock import FakeClock


def test_a_grouped_batch_is_split_by_row_share() -> None:
    meter = UsageMeter()
    meter.record_inference({"A": 3, "B": 1}, 2.0)
    report = meter.snapshot()
    assert report.tenants["A"].device_seconds["inference"] == 1.5
    assert report.tenants["B"].device_seconds["inference"] == 0.5
    assert report.tenants["A"].inference_samples == 3
    assert report.tenants["B"].inference_samples == 1
    total = sum(t.device_seconds["inference"] for t in report.tenants.values())
    assert total == report.service_seconds["inference"] == 2.0


@given(
    rows=st.dictionaries(
        st.sampled_from("abcdefgh"), st.integers(min_value=1, max_value=1000), min_size=1
    ),
    seconds=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
)
def test_attributed_parts_add_up_to_the_measured_total(
    rows: dict[str, int], seconds: float
) -> None:
    parts = split_by_rows(rows, seconds)
    assert set(parts) == set(rows)
    assert sum(parts.values()) == pytest.approx(seconds, rel=1e-12, abs=1e-12)
    assert all(p >= -1e-9 for p in parts.values())
    total = sum(rows.values())
    for tid, n in rows.items():
        assert parts[tid] == pytest.approx(seconds * n / total, rel=1e-9, abs=1e-9)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="at least one row"):
        split_by_rows({"a": 0}, 1.0)
    with pytest.raises(InvalidRequestError, match="seconds"):
        split_by_rows({"a": 1}, -1.0)
    with pytest.raises(InvalidRequestError, match="unknown service"):
        UsageMeter().record_shared("gpu", {"a": 1}, 1.0)  # type: ignore[arg-type]


def test_training_environment_and_request_counts() -> None:
    meter = UsageMeter()
    # A grouped step: 4 rows of A and 4 of B share a 1.0 s forward; own work 0.25 / 0.5 s.
    meter.record_training({"A": 4, "B": 4}, 1.0, {"A": 0.25, "B": 0.5})
    # Forward-only work (actor forward) is device time but no samples trained.
    meter.record_training({"A": 2}, 0.0, {"A": 0.1}, count_samples=False)
    meter.record_env("B", steps=8, seconds=0.3)
    meter.record_env("B", steps=0, seconds=0.2)  # a reset
    meter.record_request("A")
    meter.record_request("A", 2)
    a, b = meter.tenant("A"), meter.tenant("B")
    assert a.device_seconds["training"] == pytest.approx(0.5 + 0.25 + 0.1)
    assert b.device_seconds["training"] == pytest.approx(0.5 + 0.5)
    assert (a.samples_trained, b.samples_trained) == (4, 4)
    assert b.device_seconds["environment"] == pytest.approx(0.5) and b.env_steps == 8
    assert a.requests == 3 and b.requests == 0
    report = meter.snapshot()
    for service, measured in report.service_seconds.items():
        attributed = sum(t.device_seconds[service] for t in report.tenants.values())
        assert attributed == pytest.approx(measured)
    assert meter.tenant("nobody").total_device_seconds == 0.0


def test_concurrent_recording_is_exact() -> None:
    meter = UsageMeter()

    def worker(tid: str) -> None:
        for _ in range(500):
            meter.record_inference({tid: 1, "shared": 1}, 0.5)
            meter.record_request(tid)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = meter.snapshot()
    assert report.tenants["shared"].inference_samples == 2000
    assert all(report.tenants[f"t{i}"].requests == 500 for i in range(4))
    assert report.service_seconds["inference"] == pytest.approx(1000.0)
    assert report.tenants["shared"].device_seconds["inference"] == pytest.approx(500.0)


def test_persisted_periodically_resumed_and_shown_by_the_cli(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "usage.json"
    meter = UsageMeter(path, persist_interval_s=10.0, clock=clock)
    meter.record_inference({"A": 3, "B": 1}, 2.0)
    assert not path.exists()  # the interval has not passed
    clock.advance(10.0)
    meter.record_request("A")
    assert UsageReport.load(path).tenants["A"].requests == 1
    meter.record_env("B", 4, 1.0)  # inside the interval again: not written
    assert UsageReport.load(path).tenants["B"].env_steps == 0
    meter.save()
    saved = UsageReport.load(path)
    assert saved.tenants["A"].requests == 1 and saved.tenants["B"].env_steps == 4

    # A restarted server continues from the file.
    again = UsageMeter(path, clock=clock, resume=True)
    again.record_inference({"A": 1}, 1.0)
    a = again.tenant("A")
    assert a.device_seconds["inference"] == pytest.approx(2.5) and a.requests == 1
    assert again.snapshot().started_at == saved.started_at
    again.save()

    out = tmp_path / "report.json"
    result = CliRunner().invoke(
        app, ["usage", "--run-dir", str(tmp_path), "--json", str(out)], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "A" in result.output and "2.500" in result.output
    assert json.loads(out.read_text())["tenants"]["B"]["env_steps"] == 4
    missing = CliRunner().invoke(app, ["usage", "--run-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "usage.json" in missing.output


def test_reported_usage_is_durable_so_a_restart_never_reports_less(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "usage.json"
    meter = UsageMeter(path, clock=clock, persist_interval_s=3600.0)
    meter.record_device("training", "alice", 2.5)
    shown = meter.report().tenants["alice"].device_seconds["training"]
    # A kill -9 right after the report: nothing else was saved (interval not reached).
    again = UsageMeter(path, clock=clock, resume=True)
    assert again.snapshot().tenants["alice"].device_seconds["training"] >= shown == 2.5


def test_usage_shown_is_usage_persisted(tmp_path: Path) -> None:
    """What ``report()`` shows is exactly what is on disk, even when work is recorded
    while it runs: a server killed right after answering never resumes with less."""
    meter = UsageMeter(tmp_path / "usage.json", persist_interval_s=3600)
    meter.record_env("alice", 1, 0.5)
    snapshot = meter.snapshot

    def snapshot_then_more_work() -> UsageReport:
        out = snapshot()
        meter.record_env("alice", 1, 0.5)  # a simulator step finishing right then
        return out

    meter.snapshot = snapshot_then_more_work  # type: ignore[method-assign]
    shown = meter.report().tenants["alice"]
    # SIGKILL now; the restarted server resumes from the file.
    resumed = UsageMeter(tmp_path / "usage.json", resume=True).tenant("alice")
    assert resumed.env_steps >= shown.env_steps, (shown, resumed)
    assert resumed.device_seconds == shown.device_seconds
