"""The measurement window and busy-time accounting of a phase trace."""

from __future__ import annotations

from pathlib import Path

from joynexus.api import UsageReport
from joynexus.demo.phase import (
    Interval,
    JobRecord,
    PhaseTrace,
    _window_end,
    window_busy_seconds,
    window_union_seconds,
)
from joynexus.demo.readout import verdict
from joynexus.demo.report import device_time_bound
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


def test_overlapping_device_intervals_count_once() -> None:
    ivs = [
        Interval("training", 0.0, 2.0),
        Interval("inference", 1.0, 3.0),  # overlaps the step by 1 s
        Interval("environment", 0.0, 10.0),  # not the device
        Interval("inference", 8.0, 12.0),  # clipped at the window's end
    ]
    assert window_union_seconds(ivs, ("training", "inference"), 0.0, 10.0) == 5.0


def _replay(tmp_path: Path, name: str, window: float, busy: list[Interval]) -> PhaseTrace:
    return PhaseTrace(
        name=name,
        run_dir=tmp_path,
        started_at=0.0,
        ended_at=window,
        wall_s=window,
        busy=busy,
        jobs=[],
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={},
        summary=RunSummary(run_dir=str(tmp_path), wall_s=window, tenants={}),
        matched={name: 1},
    )


def test_the_bound_is_the_windows_over_the_busiest_resource(tmp_path: Path) -> None:
    # An RL replay whose simulator keeps the device idle most of the time, and an SFT
    # replay that keeps the device busy: 100 s of windows, 50 s of device, 45 s of sims.
    rl = _replay(
        tmp_path,
        "rl",
        60.0,
        [Interval("inference", 0.0, 10.0), Interval("environment", 10.0, 55.0)],
    )
    sft = _replay(tmp_path, "sft", 40.0, [Interval("training", 0.0, 40.0)])
    out = device_time_bound([rl, sft], ratio=1.5)
    assert out["bound"] == 2.0
    assert out["limited_by"] == "device"
    assert out["isolated_device_busy_s"] == 50.0 and out["isolated_simulator_busy_s"] == 45.0
    assert out["efficiency"] == 0.5  # half of the possible gain (1.5 - 1) / (2 - 1)
    # A run that reaches the bound is fully efficient; one slower than the replays is not.
    assert device_time_bound([rl, sft], ratio=2.0)["efficiency"] == 1.0
    assert device_time_bound([rl, sft], ratio=0.8)["efficiency"] == -0.2
    # A replay set that is all device leaves nothing to gain: no efficiency to state.
    busy = _replay(tmp_path, "sft", 40.0, [Interval("training", 0.0, 40.0)])
    assert device_time_bound([busy], ratio=1.0) == {
        "bound": 1.0,
        "efficiency": None,
        "isolated_window_s": 40.0,
        "isolated_device_busy_s": 40.0,
        "isolated_simulator_busy_s": 0.0,
        "limited_by": "device",
    }


def test_the_verdict_states_the_bound_and_the_efficiency() -> None:
    report = {
        "device_time_ratio": 1.5,
        "device_time_bound": {"bound": 2.0, "efficiency": 0.5, "limited_by": "device"},
    }
    line = verdict(report)
    assert "bound for these replays is 2.00x" in line and "efficiency 0.50" in line
