"""The multi-tenant window taken apart: stretch and idle by cause (issue 26, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.api import UsageReport
from joynexus.demo.idle import IDLE_CAUSES, device_idle, idle_timeline
from joynexus.demo.phase import Interval, JobRecord, PhaseTrace
from joynexus.workflows.summary import RunSummary


def _trace(
    tmp_path: Path, window: float, busy: list[Interval], jobs: list[JobRecord] | None = None
) -> PhaseTrace:
    return PhaseTrace(
        name="t",
        run_dir=tmp_path,
        started_at=100.0,
        ended_at=100.0 + window,
        wall_s=window,
        busy=busy,
        jobs=jobs or [],
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={},
        summary=RunSummary(run_dir=str(tmp_path), wall_s=window, tenants={}),
        matched={"a": 1},
    )


def _multi(tmp_path: Path) -> PhaseTrace:
    # 20 s window from t=100: device busy 100-104 (training) and 110-113 (inference,
    # overlapping a training step 111-112: counted once); a job leased 104-106 with no
    # step (host work); a simulator 105-109 (1 s of it under the leased job); nothing at
    # 113-120 but a simulator from 118 past the window's end.
    return _trace(
        tmp_path,
        20.0,
        [
            Interval("training", 100.0, 104.0),
            Interval("inference", 110.0, 113.0),
            Interval("training", 111.0, 112.0),
            Interval("environment", 105.0, 109.0, tenant="rl"),
            Interval("environment", 118.0, 125.0, tenant="rl"),
        ],
        [JobRecord("sft", "sft", "completed", 104.0, 106.0)],
    )


def test_idle_is_split_by_cause_and_adds_up_to_the_window(tmp_path: Path) -> None:
    iso = _trace(tmp_path, 9.0, [Interval("training", 100.0, 105.0)])
    out = device_idle(_multi(tmp_path), [iso])
    assert out["device_busy_s"] == pytest.approx(7.0)
    assert out["idle_by_cause_s"] == {
        "host_work_of_a_leased_job": pytest.approx(2.0),
        "waiting_for_simulators": pytest.approx(3.0 + 2.0),  # 106-109 and 118-120
        "nothing_measured": pytest.approx(1.0 + 5.0),  # 109-110 and 113-118
    }
    assert out["device_busy_s"] + out["idle_s"] == pytest.approx(out["window_s"])
    # The same work kept the device busy 7 s against the replay's 5 s.
    assert out["isolated_device_busy_s"] == 5.0 and out["stretch_s"] == pytest.approx(2.0)
    assert out["largest_part"] == "nothing_measured"
    assert out["busy_by_service_s"]["training"] == {"multi_tenant": 5.0, "isolated": 5.0}


def test_a_device_busy_the_whole_window_has_no_idle(tmp_path: Path) -> None:
    trace = _trace(tmp_path, 10.0, [Interval("training", 90.0, 120.0)])
    out = device_idle(trace, [trace])
    assert out["idle_s"] == 0.0 and out["stretch_s"] == 0.0


def test_the_timeline_bins_cover_each_bin_once(tmp_path: Path) -> None:
    tl = idle_timeline(_multi(tmp_path), bins=4)  # 5 s bins
    assert tl["t"] == [2.5, 7.5, 12.5, 17.5]
    for k in range(4):
        assert sum(tl[key][k] for key in ("busy", *IDLE_CAUSES)) == pytest.approx(1.0)
    assert tl["busy"][0] == pytest.approx(0.8)  # 100-104 of 100-105
    assert tl["host_work_of_a_leased_job"][0] == pytest.approx(0.2)
    assert tl["nothing_measured"][3] == pytest.approx(0.6)  # 115-118 of 115-120


def test_training_grouping_reads_rows_per_step_and_the_device_cost_of_a_row(
    tmp_path: Path,
) -> None:
    from joynexus.utils.device_clock import DeviceSpan

    multi = _multi(tmp_path)
    # Two steps of 8 rows inside the window and one after it (not counted); the device
    # computed 4 s in the window (a span half outside counts half).
    multi.step_rows = [(101.0, 8.0), (111.5, 8.0), (130.0, 64.0)]
    multi.device_spans = [DeviceSpan(100.0, 103.0, 3.0, 0.0), DeviceSpan(118.0, 122.0, 2.0, 0.0)]
    alone = _trace(tmp_path, 9.0, [Interval("training", 100.0, 105.0)])
    alone.name = "isolated:sft"
    alone.step_rows = [(101.0 + i, 2.0) for i in range(4)]
    alone.device_spans = [DeviceSpan(100.0, 105.0, 6.0, 0.0)]
    grouping = device_idle(multi, [alone])["training_grouping"]
    assert grouping["multi_tenant"] == {
        "steps": 2.0,
        "rows": 16.0,
        "rows_per_step": 8.0,
        "device_cpu_ms_per_row": 250.0,  # 4 s over 16 rows
        # These spans carry no per-thread usage: not measured.
        "device_sys_share": None,
        "device_minor_faults_per_row": None,
    }
    # Alone the same tenant stepped 2 rows at a time and paid 750 ms a row.
    assert grouping["isolated:sft"]["rows_per_step"] == 2.0
    assert grouping["isolated:sft"]["device_cpu_ms_per_row"] == 750.0
    # A phase with no device spans or no steps says so instead of dividing by zero.
    bare = _trace(tmp_path, 5.0, [])
    assert bare.training_grouping() == {
        "steps": 0.0,
        "rows": 0.0,
        "rows_per_step": None,
        "device_cpu_ms_per_row": None,
        "device_sys_share": None,
        "device_minor_faults_per_row": None,
    }


def test_training_grouping_reads_the_kernel_share_and_the_faults_per_row(
    tmp_path: Path,
) -> None:
    from joynexus.utils.device_clock import DeviceSpan

    trace = _trace(tmp_path, 10.0, [Interval("training", 100.0, 105.0)])
    trace.step_rows = [(101.0, 50.0), (102.0, 50.0)]
    trace.device_spans = [
        DeviceSpan(100.0, 101.0, 2.0, 0.0, sys_s=0.5, minor_faults=300),
        DeviceSpan(101.0, 102.0, 2.0, 0.0, sys_s=0.5, minor_faults=100),
    ]
    got = trace.training_grouping()
    assert got["device_sys_share"] == 0.25  # 1 s of the kernel's in 4 s of CPU
    assert got["device_minor_faults_per_row"] == 4.0  # 400 faults over 100 rows
    # One span without the usage (a platform that has none): not measured, not zero.
    trace.device_spans.append(DeviceSpan(102.0, 103.0, 1.0, 0.0))
    got = trace.training_grouping()
    assert got["device_sys_share"] is None and got["device_minor_faults_per_row"] is None
