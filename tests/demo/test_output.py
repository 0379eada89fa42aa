"""The demo's output: plain progress off a terminal, uncut tables, ratios that say which
way is good, and a device-time plot whose multi-tenant bar looks like no single tenant.

Regressions: with output to a file the demo printed nothing for minutes (live bars),
its tables were cut at 80 columns, its report never said whether a ratio above or
below 1 is good, and the multi-tenant bar had the colour of the third isolated tenant.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import matplotlib
import pytest
from matplotlib.colors import to_rgba
from rich.console import Console

from joynexus.api import UsageReport
from joynexus.cli.demo import PLAIN_WIDTH, demo_console
from joynexus.demo.phase import Interval, JobRecord, PhaseTrace
from joynexus.demo.plots import MULTI_TENANT_COLOR, device_time_bars
from joynexus.demo.readout import print_report, report_tables, verdict
from joynexus.demo.report import HOW_TO_READ, build_report
from joynexus.demo.runner import PlainProgress, _Bars, _reporter
from joynexus.workflows.summary import RunSummary, TenantProgress

matplotlib.use("Agg")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plain(every_s: float = 30.0) -> tuple[PlainProgress, io.StringIO, _Clock]:
    buf, clock = io.StringIO(), _Clock()
    console = Console(file=buf, width=PLAIN_WIDTH)
    return PlainProgress(console, every_s=every_s, clock=clock), buf, clock


def _row(tenant: str, done: int, *, task: str = "rl", finished: bool = False) -> TenantProgress:
    version = done if task != "eval" else None
    return TenantProgress(
        tenant=tenant, task=task, completed=done, target=4, version=version, done=finished
    )


def test_off_a_terminal_progress_is_plain_lines() -> None:
    assert isinstance(_reporter(Console(file=io.StringIO())).__enter__(), PlainProgress)
    with _reporter(Console(file=io.StringIO(), force_terminal=True)) as bars:
        assert isinstance(bars, _Bars)


def test_plain_progress_prints_each_phase_ends_and_a_line_every_period() -> None:
    plain, buf, clock = _plain(every_s=30.0)
    plain.start_phase("multi-tenant")
    plain.set_record_total("sft", 10)
    plain.on_record("sft", 0, 74, True)
    plain.status("running")
    plain.on_progress([_row("a", 0), _row("ev", 0, task="eval")])
    clock.now += 5
    plain.on_progress([_row("a", 1), _row("ev", 0, task="eval")])  # too soon: nothing
    clock.now += 5
    plain.on_progress([_row("a", 4, finished=True), _row("ev", 0, task="eval")])
    clock.now += 30
    plain.on_progress([_row("a", 4, finished=True), _row("ev", 1, task="eval")])
    plain.start_phase("isolated:a")
    lines = buf.getvalue().splitlines()
    assert lines == [
        "[00:00] phase multi-tenant: started",
        "[00:00] recording demos for sft: episode 1/10, 74 frames, success",
        "[00:00] multi-tenant: running",
        "[00:00] multi-tenant: a 0/4 v0, ev 0/4 eval runs",
        "[00:10] multi-tenant: a 4/4 v4 done",  # a tenant's end, at once
        "[00:40] multi-tenant: a 4/4 v4 done, ev 1/4 eval runs",
        "[00:40] phase isolated:a: started",
    ]


def test_the_demo_console_is_wide_off_a_terminal() -> None:
    console = demo_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal
    assert console.width >= PLAIN_WIDTH


def _trace(name: str, tenants: list[str], window: float, tmp_path: Path) -> PhaseTrace:
    jobs = [JobRecord(t, "rl", "completed", 1.0, 1.0 + window) for t in tenants]
    busy = [Interval("training", 1.0, 1.0 + window / 2), Interval("inference", 1.0, 2.0)]
    return PhaseTrace(
        name=name,
        run_dir=tmp_path,
        started_at=1.0,
        ended_at=1.0 + window,
        wall_s=window + 3,
        busy=busy,
        jobs=jobs,
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={},
        summary=RunSummary(run_dir=str(tmp_path), wall_s=window, tenants={}),
        matched={t: 1 for t in tenants},
    )


def _report(
    tmp_path: Path,
    multi_window: float,
    tenants: tuple[str, ...] = ("rl-libero", "rl-pickcube", "rl-pushcube"),
    predict_stages: dict[str, tuple[float, int]] | None = None,
) -> dict[str, object]:
    multi = _trace("multi-tenant", list(tenants), multi_window, tmp_path)
    multi.predict_stages = predict_stages or {}
    isolated = [_trace(f"isolated:{t}", [t], 10.0, tmp_path) for t in tenants]
    return build_report(
        multi,
        isolated,
        profile="paper",
        reason="test",
        knobs={},
        rl_tenants=list(tenants),
        sft_tenant="sft-demos",
        eval_tenant="eval-sft",
    )


def test_tables_are_not_cut_and_say_which_way_is_good(tmp_path: Path) -> None:
    report = _report(tmp_path, multi_window=15.0)
    buf = io.StringIO()
    console = Console(file=buf, width=PLAIN_WIDTH)
    for table in report_tables(report):
        console.print(table)
    text = buf.getvalue()
    lines = text.splitlines()
    assert any("Isolated single-tenant (mean of RL replays)" in ln for ln in lines)
    assert any("isolated / multi-tenant" in ln and "accounting" in ln for ln in lines)
    assert any("MT time to matched (s)" in ln and "return first→last (MT)" in ln for ln in lines)
    assert "…" not in text  # nothing truncated
    flat = " ".join(text.split())
    assert "isolated / multi-tenant above 1x: the multi-tenant run needed less device" in flat
    console = Console(width=PLAIN_WIDTH, record=True)
    print_report(report, console)
    flat = " ".join(console.export_text().split())
    # An isolated service busy half its window is not "mostly waiting": the ratio stands.
    assert "training: multi-tenant 50.0% vs isolated RL replays 50.0% (multi-tenant / " in flat


def test_the_report_says_which_way_each_ratio_is_good(tmp_path: Path) -> None:
    better = _report(tmp_path, multi_window=15.0)  # 30 s isolated vs 15 s shared
    assert better["device_time_ratio"] == 2.0
    assert better["how_to_read"] == HOW_TO_READ
    assert "above 1 means the multi-tenant run needed less device time" in str(
        HOW_TO_READ["device_time_ratio"]
    )
    assert verdict(better).startswith(
        "device time: the isolated replays needed 2.00x the multi-tenant run's device time "
        "for the same matched work: sharing saved device time (above 1 is better); this "
        "machine's bound for these replays is "
    )
    worse = _report(tmp_path, multi_window=60.0)
    assert worse["device_time_ratio"] == 0.5
    assert "needed 2.00x the isolated replays' device time" in verdict(worse)
    assert "below 1 is worse" in verdict(worse)


@pytest.mark.parametrize("n_tenants", [3, 4, 12])
def test_the_multi_tenant_bar_has_no_tenants_colour(n_tenants: int) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        tenants = [(f"t{i}", 1.0) for i in range(n_tenants)]
        multi, stacked = device_time_bars(ax, 5.0, tenants)
        multi_color = multi.patches[0].get_facecolor()
        assert multi_color == to_rgba(MULTI_TENANT_COLOR)
        tenant_colors = [bars.patches[0].get_facecolor() for bars in stacked]
        assert multi_color not in tenant_colors
        # Neighbouring tenants are told apart too (the palette repeats only after 9).
        assert all(a != b for a, b in itertools.pairwise(tenant_colors))
        labels = [t.get_text() for t in ax.legend().get_texts()]
        assert labels[0] == "multi-tenant: all tenants, one run"
        assert labels[1:] == [f"isolated: t{i}" for i in range(n_tenants)]
    finally:
        plt.close(fig)


def test_the_report_gives_what_sharing_the_backbone_cost_inference(tmp_path: Path) -> None:
    stages = {
        "lock_wait": (0.5, 10),
        "canonicalize": (0.2, 10),
        "backbone": (1.5, 10),
        "head": (0.3, 10),
    }
    report = _report(tmp_path, 20.0, ("rl-a",), stages)
    lock = report["multi_tenant"]["inference_lock_wait"]  # type: ignore[index]
    assert lock == {
        "batches": 10,
        "wait_s": 0.5,
        "ms_per_batch": 50.0,
        "fraction_of_device_s": 0.25,
    }
    console = Console(width=200, record=True)
    print_report(report, console)
    assert "waited 50.0 ms each" in console.export_text()
