"""The measurement window and busy-time accounting of a phase trace."""

from __future__ import annotations

from pathlib import Path

from joynexus.api import UsageReport
from joynexus.demo.phase import Interval, JobRecord, PhaseTrace, _window_end, window_busy_seconds
from joynexus.workflows.summary import RunSummary


def _job(tenant: str, finished: float | None, state: str = "completed") -> JobRecord:
    return JobRecord(tenant, "rl", state, None if finished is None else finished - 1, finished)


def test_busy_seconds_are_clipped_to_the_window() -> None:
    ivs = [
        Interval("training", 0.0, 2.0),  # half inside
        Interval("training", 3.0, 4.0),  # inside
        Interval("training", 9.0, 12.0),  # outside
        Interval("inference", 1.0, 5.0),
    ]
    assert window_busy_seconds(ivs, "training", 1.0, 5.0) == 2.0
    assert window_busy_seconds(ivs, "inference", 1.0, 5.0) == 4.0
    assert window_busy_seconds(ivs, "environment", 1.0, 5.0) == 0.0


def test_window_ends_at_the_last_matched_completion() -> None:
    jobs = [
        _job("a", 3.0),
        _job("a", 5.0),
        _job("a", 9.0),  # beyond a's matched two
        _job("b", 7.0),
        _job("b", None, "dropped"),
    ]
    assert _window_end(jobs, {"a": 2, "b": 1}) == 7.0
    assert _window_end(jobs, {"a": 3}) == 9.0
    assert _window_end(jobs, {"b": 2}) is None  # a dropped job is no update


def test_trace_counts_only_updates_inside_the_window(tmp_path: Path) -> None:
    trace = PhaseTrace(
        name="isolated:a",
        run_dir=tmp_path,
        started_at=1.0,
        ended_at=5.0,
        wall_s=10.0,
        busy=[Interval("training", 2.0, 3.0), Interval("inference", 0.0, 3.0)],
        jobs=[_job("a", 3.0), _job("a", 5.0), _job("a", 6.0)],
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={},
        summary=RunSummary(run_dir=str(tmp_path), wall_s=10.0, tenants={}),
        matched={"a": 2},
    )
    assert trace.updates_in_window("a") == 2
    assert trace.window_s == 4.0
    assert trace.utilization("training") == 0.25
    assert trace.utilization("inference") == 0.5
