"""The demo's device time on the device's own clock: CPU seconds and interference apart,
and the machine's load beside them (constructed phase records, no timing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from joynexus.api import UsageReport
from joynexus.demo.machine import MachineLoad, core_busy_seconds
from joynexus.demo.phase import Interval, PhaseTrace
from joynexus.demo.readout import interference_line, load_line, print_report
from joynexus.demo.report import build_report, write_report
from joynexus.utils.device_clock import DeviceSpan
from joynexus.workflows.summary import RunSummary, TenantSummary

RL = ("rl-a", "rl-b")


def _steps(
    start: float, n: int, cpu: float, wait: float, gap: float
) -> tuple[list[Interval], list[DeviceSpan], float]:
    """``n`` device steps of ``cpu`` seconds each, each delayed ``wait`` seconds on the
    run queue, ``gap`` seconds apart; returns the busy intervals, spans and end time."""
    busy, spans, t = [], [], start
    for _ in range(n):
        end = t + cpu + wait
        busy.append(Interval("training", t, end))
        spans.append(DeviceSpan(t, end, cpu, wait))
        t = end + gap
    return busy, spans, t - gap


def _trace(
    name: str,
    tenants: list[str],
    *,
    n: int,
    cpu: float,
    wait: float,
    gap: float,
    tmp: Path,
    load: list[float] | None = None,
) -> PhaseTrace:
    busy, spans, end = _steps(0.0, n, cpu, wait, gap)
    return PhaseTrace(
        name=name,
        run_dir=tmp,
        started_at=0.0,
        ended_at=end,
        wall_s=end + 5,
        busy=busy,
        jobs=[],
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={t: [] for t in tenants},
        summary=RunSummary(
            run_dir=str(tmp),
            wall_s=end,
            tenants={t: TenantSummary(task="sft" if t == "sft" else "rl") for t in tenants},
        ),
        matched=dict.fromkeys(tenants, n),
        device_spans=spans,
        machine=MachineLoad(
            start=0.0, end=end, period_s=end, load1=load or [], core_busy_s={0: end, 1: end / 2}
        ),
        device_cores=[0],
    )


def _phases(tmp: Path, wait: float) -> tuple[PhaseTrace, list[PhaseTrace]]:
    """Two RL replays whose device idles 3 s between 1 s steps (simulators), and a
    shared run that fills those gaps; ``wait`` is every step's run-queue delay (a busy
    machine), which lengthens the device-bound shared run far more than the replays."""
    load = [0.5] if wait == 0 else [2.5, 3.0]
    iso = [
        _trace(f"isolated:{t}", [t], n=10, cpu=1.0, wait=wait, gap=3.0, tmp=tmp, load=load)
        for t in RL
    ]
    multi = _trace("multi-tenant", list(RL), n=20, cpu=1.0, wait=wait, gap=0.5, tmp=tmp, load=load)
    return multi, iso


def _build(multi: PhaseTrace, iso: list[PhaseTrace]) -> dict[str, Any]:
    return build_report(
        multi,
        iso,
        profile="fast",
        reason="test",
        knobs={},
        rl_tenants=list(RL),
        sft_tenant="sft",
        eval_tenant="eval",
    )


def _report(tmp: Path, wait: float) -> dict[str, Any]:
    return _build(*_phases(tmp, wait))


def test_the_ratio_is_the_same_on_a_quiet_and_a_busy_machine(tmp_path: Path) -> None:
    quiet, busy = _report(tmp_path, 0.0), _report(tmp_path, 2.0)
    # Quiet: replays 2 x (10 s + 9 x 3 s) = 74 s, shared 20 s + 19 x 0.5 s = 29.5 s.
    assert quiet["device_time_ratio"] == pytest.approx(74 / 29.5, abs=1e-3)
    assert busy["device_time_ratio"] == quiet["device_time_ratio"]
    # On the wall clock the busy machine depresses it: (74 + 40) / (29.5 + 40).
    assert busy["device_time"]["wall"]["ratio"] == pytest.approx(114 / 69.5, abs=1e-3)
    assert quiet["device_time"]["wall"]["ratio"] == quiet["device_time_ratio"]
    assert busy["device_time"]["interference"] == {"multi_tenant_s": 40.0, "isolated_s": 40.0}
    # The bound and efficiency are on the same basis, so they do not move either.
    assert busy["device_time_bound"] == quiet["device_time_bound"]
    assert busy["device_time_bound"]["isolated_device_busy_s"] == 20.0  # CPU, not wall


def test_each_phase_splits_wall_busy_into_cpu_wait_and_blocked(tmp_path: Path) -> None:
    report = _report(tmp_path, 2.0)
    dev = report["multi_tenant"]["device"]
    assert dev["device_wall_busy_s"] == dev["device_spans_wall_s"] == 60.0
    assert dev["device_cpu_s"] == 20.0
    assert dev["run_queue_wait_s"] == 40.0
    assert dev["blocked_s"] == 0.0
    assert dev["interference_s"] == 40.0
    assert dev["device_time_s"] == pytest.approx(69.5 - 40.0)


def test_spans_are_clipped_to_the_window(tmp_path: Path) -> None:
    multi, _ = _phases(tmp_path, 1.0)
    # A span half before the window: half of its CPU and wait count.
    multi.device_spans.append(DeviceSpan(-1.0, 1.0, 0.4, 1.0))
    assert multi.device_cpu_seconds() == pytest.approx(20.0 + 0.2)
    assert multi.device_wait_seconds() == pytest.approx(20.0 + 0.5)


def test_without_run_queue_wait_interference_is_wall_busy_less_cpu(tmp_path: Path) -> None:
    multi, _ = _phases(tmp_path, 1.0)
    multi.device_spans = [DeviceSpan(s.start, s.end, s.cpu_s, None) for s in multi.device_spans]
    assert multi.device_wait_seconds() is None
    assert multi.interference_seconds() == pytest.approx(40.0 - 20.0)


def test_no_spans_falls_back_to_the_wall_clock(tmp_path: Path) -> None:
    multi, iso = _phases(tmp_path, 1.0)
    for tr in (multi, *iso):
        tr.device_spans = []
    report = _build(multi, iso)
    assert report["device_time"]["basis"] == "wall clock (no device span recorded)"
    assert report["device_time_ratio"] == report["device_time"]["wall"]["ratio"]
    assert report["multi_tenant"]["device"]["device_cpu_s"] is None


def test_the_report_records_the_load_of_every_phase(tmp_path: Path) -> None:
    report = _report(tmp_path, 2.0)
    phases = report["machine"]["phases"]
    assert list(phases) == ["multi-tenant", "isolated:rl-a", "isolated:rl-b"]
    multi = phases["multi-tenant"]
    assert multi["load_average_1min"] == {"min": 2.5, "mean": 2.75, "max": 3.0, "samples": 2}
    # Core 0 (the device's) was busy the whole 69.5 s; the device's own CPU was 20 s.
    assert multi["device_cores"] == [0]
    assert multi["device_cores_other_s"] == pytest.approx(49.5)
    line = load_line(report)
    assert "multi-tenant 2.5–3.0 (mean 2.8)" in line and "isolated replays 2.5–3.0" in line
    assert "ran 50 s of other work during the multi-tenant phase" in line
    # No process clock in these made-up phases: nothing said of the host threads.
    assert multi["process"] == {"cpu_s": None, "run_queue_wait_s": None}


def test_the_host_threads_wait_is_the_processs_less_the_devices(tmp_path: Path) -> None:
    multi, iso = _phases(tmp_path, 2.0)
    multi.machine.process_cpu_s, multi.machine.process_wait_s = 30.0, 55.0
    report = _build(multi, iso)
    process = report["machine"]["phases"]["multi-tenant"]["process"]
    # 55 s of the process's threads' wait, 40 s of it the device thread's inside its steps.
    assert process == {"cpu_s": 30.0, "run_queue_wait_s": 55.0, "host_run_queue_wait_s": 15.0}


def test_the_load_probe_reads_this_processs_threads() -> None:
    import asyncio

    from joynexus.demo.machine import LoadProbe
    from joynexus.utils.device_clock import process_clock

    if process_clock() is None:
        pytest.skip("no per-thread schedstat here")

    async def main() -> MachineLoad:
        probe = LoadProbe(interval_s=10.0)
        probe.start()
        total = 0
        for i in range(300_000):  # some CPU of this thread inside the period
            total += i
        return await probe.stop()

    load = asyncio.run(main())
    assert load.process_cpu_s is not None and load.process_cpu_s > 0.0
    assert load.process_wait_s is not None and load.process_wait_s >= 0.0


def test_the_readout_leads_with_the_ratio_then_the_interference_and_load(tmp_path: Path) -> None:
    report = _report(tmp_path, 2.0)
    path = write_report(report, tmp_path / "out")
    head = json.loads(path.read_text())["headline"]
    assert head["interference"] == interference_line(report)
    assert "multi-tenant 40.0 s, isolated replays 40.0 s" in head["interference"]
    assert "on the wall clock, the ratio is 1.64x" in head["interference"]
    console = Console(width=220, record=True)
    print_report(report, console)
    text = " ".join(console.export_text().split())
    order = [
        "device time: the isolated replays needed 2.51x",
        "interference (the device's work ready, its core running something else)",
        "machine load (1-minute load average",
        "(window - interference) x 1 machine",
        "wall clock: window x 1 machine",
    ]
    at = [text.find(s) for s in order]
    assert -1 not in at, [s for s, i in zip(order, at, strict=True) if i < 0]
    assert at == sorted(at)


def test_core_busy_seconds_reads_each_core_of_proc_stat() -> None:
    import os

    tick = os.sysconf("SC_CLK_TCK")
    text = (
        "cpu  9 9 9 9 9 9 9 9 0 0\n"
        f"cpu0 {tick} 0 {tick} 500 7 0 0 0 0 0\n"
        f"cpu1 0 {2 * tick} 0 100 0 0 0 {tick} 0 0\n"
        "intr 1 2 3\n"
    )
    assert core_busy_seconds(text) == {0: 2.0, 1: 3.0}


def _with_simulators(trace: PhaseTrace, *, sim_s: float, sim_wait: float) -> PhaseTrace:
    """``trace`` with every gap between its device steps a simulator call of ``sim_s``
    seconds of its own plus ``sim_wait`` on the run queue (the gaps are respaced)."""
    busy: list[Interval] = []
    spans: list[DeviceSpan] = []
    t = 0.0
    for iv, sp in zip(trace.busy, trace.device_spans, strict=True):
        length = iv.end - iv.start
        busy.append(Interval("training", t, t + length))
        spans.append(DeviceSpan(t, t + length, sp.cpu_s, sp.wait_s))
        t += length
        busy.append(Interval("environment", t, t + sim_s + sim_wait, "rl-a", sim_wait))
        t += sim_s + sim_wait
    trace.busy, trace.device_spans, trace.ended_at = busy, spans, t
    return trace


def test_simulators_slowed_by_other_work_leave_the_ratio_alone(tmp_path: Path) -> None:
    def report(sim_wait: float) -> dict[str, Any]:
        multi, iso = _phases(tmp_path, 0.0)
        iso = [_with_simulators(tr, sim_s=3.0, sim_wait=sim_wait) for tr in iso]
        return _build(multi, iso)

    quiet, busy = report(0.0), report(2.0)
    # The replays' windows grow by 10 calls x 2 s each; the device waited that out.
    assert busy["device_time"]["wall"]["ratio"] > quiet["device_time"]["wall"]["ratio"]
    assert busy["device_time_ratio"] == pytest.approx(quiet["device_time_ratio"], abs=1e-3)
    assert busy["device_time"]["interference"]["isolated_s"] == pytest.approx(40.0)
    dev = busy["isolated"]["replays"][0]["device"]
    assert dev["simulator_wait_s"] == dev["simulator_interference_s"] == pytest.approx(20.0)
    assert dev["device_time_s"] == pytest.approx(40.0)  # 10 s of steps + 10 x 3 s of calls
    # The bound sees the simulators on their own clock too.
    assert busy["device_time_bound"] == quiet["device_time_bound"]


def test_a_simulator_wait_hidden_behind_device_work_is_not_taken_out(tmp_path: Path) -> None:
    multi, _ = _phases(tmp_path, 0.0)
    # Simulator calls that run entirely while the device is busy: the device never
    # waited for them, so their run-queue wait cost the phase nothing.
    multi.busy += [Interval("environment", iv.start, iv.end, "rl-a", 0.5) for iv in multi.busy]
    assert multi.simulator_wait_seconds() == pytest.approx(20 * 0.5)
    assert multi.simulator_interference_seconds() == 0.0
    assert multi.interference_seconds() == multi.device_interference_seconds()


def test_an_unmeasured_simulator_wait_takes_nothing_out(tmp_path: Path) -> None:
    _, iso = _phases(tmp_path, 0.0)
    trace = _with_simulators(iso[0], sim_s=3.0, sim_wait=0.0)
    trace.busy = [Interval(iv.service, iv.start, iv.end, iv.tenant, None) for iv in trace.busy]
    assert trace.simulator_wait_seconds() is None
    assert trace.simulator_interference_seconds() == 0.0


def test_two_device_threads_waiting_at_once_never_take_out_the_devices_own_time(
    tmp_path: Path,
) -> None:
    multi, _ = _phases(tmp_path, 2.0)  # 20 steps of 1 s CPU + 2 s wait, 0.5 s apart
    # An inference thread ready at the same moments as every step, waiting on the same
    # core for the same 2 s: a second thread's wait for the same lost seconds.
    multi.device_spans += [
        DeviceSpan(sp.start, sp.end, 0.0, sp.wait_s) for sp in multi.device_spans
    ]
    assert multi.device_wait_seconds() == pytest.approx(80.0)
    # The window is 69.5 s and the device computed 20 s of it: 49.5 s at most were lost.
    assert multi.interference_seconds() == pytest.approx(69.5 - 20.0)
    assert multi.own_window_s == pytest.approx(multi.device_floor_s()) == pytest.approx(20.0)
    # Over two device cores the same CPU seconds could have run in half the time.
    multi.device_cores = [0, 1]
    assert multi.device_floor_s() == pytest.approx(10.0)
    assert multi.own_window_s == pytest.approx(10.0)
