"""The demo report leads with what it shows, and its plots read at a glance.

Regressions: the printed report began with utilization and a "Relative improvement
68.04x" that was mostly the isolated RL replays waiting on their simulators; a note
suggested a ``serve`` flag the demo does not take; ``utilization.png`` ran the replays'
names together ("rl-pushcubesft-demos"), the legend of ``device_time.png`` covered a
bar and ``device_idle.png`` drew stretch as plain busy time.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from matplotlib.text import Text
from rich.console import Console

from joynexus.algorithms.intervals import wilson_interval
from joynexus.api import UsageReport
from joynexus.demo.idle import split_stretch
from joynexus.demo.phase import Interval, JobRecord, PhaseTrace
from joynexus.demo.plots import (
    IDLE_STYLE,
    device_idle_figure,
    device_time_figure,
    utilization_figure,
)
from joynexus.demo.readout import print_report
from joynexus.demo.report import build_report, write_report
from joynexus.workflows.summary import RunSummary, TenantSummary

matplotlib.use("Agg")

RL = ("rl-libero", "rl-pickcube", "rl-pushcube")


def _summary(task: str, before: int, after: int, n: int = 10) -> TenantSummary:
    s = TenantSummary(task=task, jobs_completed=2, final_version=2)
    s.success_rate_initial, s.success_rate_ci95_initial = before / n, wilson_interval(before, n)
    s.success_rate_final, s.success_rate_ci95 = after / n, wilson_interval(after, n)
    s.eval_episodes, s.eval_first_seed = n, 1_000_000
    return s


def _trace(
    name: str, tenants: dict[str, TenantSummary], window: float, busy: list[Interval], tmp: Path
) -> PhaseTrace:
    return PhaseTrace(
        name=name,
        run_dir=tmp,
        started_at=0.0,
        ended_at=window,
        wall_s=window + 5,
        busy=busy,
        jobs=[
            JobRecord(t, s.task, "completed", 0.0, window) for t, s in tenants.items() for _ in "ab"
        ],
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={t: [] for t in tenants},
        summary=RunSummary(run_dir=str(tmp), wall_s=window, tenants=dict(tenants)),
        matched={t: 2 for t in tenants},
    )


def _phases(tmp: Path) -> tuple[PhaseTrace, list[PhaseTrace]]:
    """The shape of a real run: RL replays that mostly wait on their simulators (two of
    them short, side by side), an SFT replay that keeps the device busy, and a shared
    run whose device work took longer than the replays' (stretch)."""
    tenants = {t: _summary("rl", 0, 0, n=2) for t in RL} | {"sft-demos": _summary("sft", 2, 9)}
    windows = {"rl-libero": 40.0, "rl-pickcube": 3.0, "rl-pushcube": 3.0, "sft-demos": 60.0}
    isolated = []
    for t, w in windows.items():
        if t.startswith("rl"):
            busy = [
                Interval("training", 0.0, 0.02 * w),
                Interval("inference", 0.02 * w, 0.05 * w),
                Interval("environment", 0.05 * w, 0.95 * w, tenant=t),
            ]
        else:
            busy = [Interval("training", 0.0, 0.9 * w)]
        isolated.append(_trace(f"isolated:{t}", {t: tenants[t]}, w, busy, tmp))
    shared = {t: TenantSummary(task=s.task, jobs_completed=2) for t, s in tenants.items()}
    busy = [
        Interval("training", 0.0, 50.0),
        Interval("inference", 50.0, 55.0),
        Interval("environment", 55.0, 70.0, tenant="rl-libero"),
    ]
    return _trace("multi-tenant", shared, 70.0, busy, tmp), isolated


def _report(tmp: Path) -> dict[str, Any]:
    multi, isolated = _phases(tmp)
    return build_report(
        multi,
        isolated,
        profile="paper",
        reason="test",
        knobs={},
        rl_tenants=list(RL),
        sft_tenant="sft-demos",
        eval_tenant="eval-sft",
    )


def _printed(report: dict[str, Any]) -> str:
    console = Console(width=200, record=True)
    print_report(report, console)
    return " ".join(console.export_text().split())


def test_the_printed_report_leads_with_device_time_then_learning_then_utilization(
    tmp_path: Path,
) -> None:
    text = _printed(_report(tmp_path))
    order = [
        "1. Device time",
        "device time: the isolated replays needed 1.51x the multi-tenant run's device time",
        "bound for these replays is",
        "efficiency",
        "2. What each tenant learned",
        "Success rate before → after training",
        "20 % [6, 51] → 90 % [60, 98] (10 episodes)",
        "3. Utilization",
        "Model-service utilization",
    ]
    at = [text.find(s) for s in order]
    assert -1 not in at, [s for s, i in zip(order, at, strict=True) if i < 0]
    assert at == sorted(at)


def test_a_ratio_over_mostly_waiting_is_shown_as_the_two_utilizations(tmp_path: Path) -> None:
    report = _report(tmp_path)
    text = _printed(report)
    assert "improvement" not in text.lower()
    assert "--inference-backbone" not in text
    # The isolated RL replays' training was busy 2 % of their windows, multi-tenant 71 %.
    training = report["utilization"]["services"]["training"]
    assert training["isolated_rl_mean"] == 0.02
    assert training["ratio"] is None
    assert "multi-tenant 71.4% vs isolated RL replays 2.0%" in training["reading"]
    assert "idled 98.0% of the replays' windows" in training["reading"]
    assert "(their simulators stepped 90.0% of them)" in training["reading"]
    assert training["reading"] in text
    assert "improvement" not in report and "improvement" not in report["how_to_read"]


def test_report_json_leads_with_the_headline_in_reading_order(tmp_path: Path) -> None:
    report = _report(tmp_path)
    path = write_report(report, tmp_path / "out")
    keys = list(json.loads(path.read_text()))
    assert keys[:4] == ["headline", "device_time_ratio", "device_time_bound", "device_time"]
    assert keys.index("success_rates") < keys.index("utilization") < keys.index("multi_tenant")
    head = report["headline"]
    assert list(head) == ["device_time", "interference", "machine_load", "learning", "utilization"]
    assert "bound for these replays is" in head["device_time"]
    assert head["learning"]["sft-demos"] == (
        "20 % [6, 51] → 90 % [60, 98] (10 episodes): rose: the intervals do not overlap"
    )
    assert head["learning"]["rl-libero"].endswith("no learning shown at this budget")


def test_a_mostly_busy_isolated_service_keeps_its_ratio() -> None:
    from joynexus.demo.readout import utilization_reading

    ratio, reading = utilization_reading("training", 0.9, 0.6, 0.1)
    assert ratio == pytest.approx(1.5)
    assert "1.50x" in reading


def _hidden_ticks(fig: Any) -> set[int]:
    """Tick labels outside their axis's view: matplotlib keeps them but draws none."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for loc, label in zip(
                axis.get_majorticklocs(), axis.get_majorticklabels(), strict=False
            ):
                if not lo - 1e-9 <= loc <= hi + 1e-9:
                    hidden.add(id(label))
    return hidden


def _texts(fig: Any) -> list[tuple[str, Any]]:
    """Every text the figure draws, with its box on the canvas."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = _hidden_ticks(fig)
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in hidden
    ]


def _assert_no_text_overlaps(fig: Any) -> None:
    texts = _texts(fig)
    clashes = [(a, b) for (a, ba), (b, bb) in itertools.combinations(texts, 2) if ba.overlaps(bb)]
    assert not clashes
    page = fig.bbox
    outside = [
        t
        for t, box in texts
        if box.x0 < page.x0 - 1
        or box.x1 > page.x1 + 1
        or box.y0 < page.y0 - 1
        or box.y1 > page.y1 + 1
    ]
    assert not outside  # nothing cut off at the figure's edges


def _assert_legends_off_the_data(fig: Any) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
        assert legend.get_window_extent(renderer).x1 <= fig.bbox.x1


def test_utilization_names_short_neighbouring_replays_apart(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    multi, isolated = _phases(tmp_path)
    fig = utilization_figure(multi, isolated)
    try:
        names = {t for t, _ in _texts(fig)}
        assert set(RL) | {"sft-demos"} <= names
        _assert_no_text_overlaps(fig)
        _assert_legends_off_the_data(fig)
        labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert [f"isolated: {t}" for t in (*RL, "sft-demos")] == [
            x for x in labels if x.startswith("isolated")
        ]
    finally:
        plt.close(fig)


def test_device_time_legend_is_beside_the_bars(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    multi, isolated = _phases(tmp_path)
    fig = device_time_figure(_report(tmp_path), multi, isolated)
    try:
        _assert_no_text_overlaps(fig)
        _assert_legends_off_the_data(fig)
        title = fig.axes[0].get_title()
        assert "isolated / multi-tenant = 1.514x" in title and "efficiency" in title
    finally:
        plt.close(fig)


def test_device_idle_draws_stretch_apart_from_busy(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    report = _report(tmp_path)
    idle = report["device_idle"]
    # 55 s busy shared against 0.05 x (40 + 3 + 3) + 54 = 56.3 s alone: no stretch here;
    # make the replays' device work shorter to get some.
    assert idle["device_busy_s"] == 55.0
    fig = device_idle_figure(
        report | {"device_idle": idle | {"isolated_device_busy_s": 44.0}}, _phases(tmp_path)[0]
    )
    try:
        _assert_no_text_overlaps(fig)
        _assert_legends_off_the_data(fig)
        legend = fig.axes[0].get_legend()
        entries = dict(
            zip((t.get_text() for t in legend.get_texts()), legend.legend_handles, strict=True)
        )
        work, stretch = entries[IDLE_STYLE["work"][2]], entries[IDLE_STYLE["stretch"][2]]
        assert work.get_facecolor() != stretch.get_facecolor()
        assert stretch.get_hatch() and not work.get_hatch()
    finally:
        plt.close(fig)


def test_stretch_is_split_from_the_busy_bins_in_proportion() -> None:
    busy = [1.0, 0.5, 0.0, 1.0]  # 2.5 bins busy, 10 s bins: 25 s
    work, stretch = split_stretch(busy, device_busy_s=25.0, isolated_device_busy_s=20.0)
    assert sum(stretch) * 10 == pytest.approx(5.0)
    assert sum(work) * 10 == pytest.approx(20.0)
    assert [w + s for w, s in zip(work, stretch, strict=True)] == pytest.approx(busy)
    # Shared work that took less device time than alone draws no stretch.
    work, stretch = split_stretch(busy, device_busy_s=25.0, isolated_device_busy_s=30.0)
    assert work == busy and stretch == [0.0] * 4
