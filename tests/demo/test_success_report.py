"""The demo shows learning: each trainable tenant's success rate before and after its
training, with Wilson 95 % intervals, in report.json, in a table beside the utilization
tables and in a plot. The mixture declares the measurement on evaluation seeds that
never meet the demonstration seeds; the isolated replays measure it (outside their
windows) and the multi-tenant run does not (there it delayed the tenants' starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from joynexus.algorithms.intervals import wilson_interval
from joynexus.api import UsageReport
from joynexus.cli.main import app
from joynexus.demo.baseline import isolated_specs
from joynexus.demo.mixture import SFT_SUCCESS_EPISODES, SUCCESS_EPISODES, build_mixture
from joynexus.demo.phase import Interval, JobRecord, PhaseTrace
from joynexus.demo.plots import plot_report, success_bars
from joynexus.demo.readout import format_success, report_tables, success_reading
from joynexus.demo.report import HOW_TO_READ, build_report
from joynexus.envs.seeds import EVAL_SEED_BASE, demo_seeds, eval_seeds, shared_seeds
from joynexus.errors import SpecError
from joynexus.spec.workload import TaskKind
from joynexus.workflows.summary import RunSummary, TenantSummary

matplotlib.use("Agg")

SEED = EVAL_SEED_BASE


def _measured(task: str, before: int | None, after: int | None, n: int = 10) -> TenantSummary:
    """A tenant's summary with ``before`` / ``after`` successes out of ``n`` episodes."""
    s = TenantSummary(task=task, jobs_completed=2, final_version=2)
    if before is not None:
        s.success_rate_initial = before / n
        s.success_rate_ci95_initial = wilson_interval(before, n)
    if after is not None:
        s.success_rate_final = after / n
        s.success_rate_ci95 = wilson_interval(after, n)
    if before is not None or after is not None:
        s.eval_episodes, s.eval_first_seed = n, SEED
    return s


def _trace(name: str, tenants: dict[str, TenantSummary], tmp_path: Path) -> PhaseTrace:
    jobs = [
        JobRecord(t, s.task, "completed", 1.0, 5.0)
        for t, s in tenants.items()
        for _ in range(s.jobs_completed)
    ]
    return PhaseTrace(
        name=name,
        run_dir=tmp_path,
        started_at=1.0,
        ended_at=5.0,
        wall_s=8.0,
        busy=[Interval("training", 1.0, 3.0), Interval("inference", 1.0, 2.0)],
        jobs=jobs,
        usage=UsageReport(started_at=0, generated_at=0, tenants={}, service_seconds={}),
        records={t: [] for t in tenants},
        summary=RunSummary(run_dir=str(tmp_path), wall_s=8.0, tenants=dict(tenants)),
        matched={t: s.jobs_completed for t, s in tenants.items()},
    )


def _traces(
    tmp_path: Path, replayed: dict[str, TenantSummary]
) -> tuple[PhaseTrace, list[PhaseTrace]]:
    """A multi-tenant trace that measured nothing, and one isolated replay per tenant
    with ``replayed``'s summary (its success rates)."""
    plain = {
        t: TenantSummary(task=s.task, jobs_completed=s.jobs_completed) for t, s in replayed.items()
    }
    multi = _trace("multi-tenant", plain, tmp_path)
    isolated = [_trace(f"isolated:{t}", {t: s}, tmp_path) for t, s in replayed.items()]
    return multi, isolated


def _report(multi: PhaseTrace, isolated: list[PhaseTrace]) -> dict[str, Any]:
    rl = [t for t, s in multi.summary.tenants.items() if s.task == "rl"]
    return build_report(
        multi,
        isolated,
        profile="test",
        reason="test",
        knobs={},
        rl_tenants=rl,
        sft_tenant="sft-demos",
        eval_tenant="eval-sft",
    )


def _mixed(tmp_path: Path) -> dict[str, Any]:
    # rl-a learned (0/10 → 4/10), rl-b was not measured, the SFT tenant 2/10 → 9/10.
    tenants = {
        "rl-a": _measured("rl", 0, 4),
        "rl-b": TenantSummary(task="rl", jobs_completed=2, final_version=2),
        "sft-demos": _measured("sft", 2, 9),
    }
    return _report(*_traces(tmp_path, tenants))


def _text(tables: list[Table]) -> str:
    console = Console(width=200, record=True)
    for table in tables:
        console.print(table)
    return console.export_text()


def test_the_report_gives_each_tenants_success_rate_before_and_after(tmp_path: Path) -> None:
    report = _mixed(tmp_path)
    assert report["success_rates"]["measured_in"].startswith("isolated replays")
    rows = report["success_rates"]["tenants"]
    assert rows["rl-a"] == {
        "task": "rl",
        "updates": 2,
        "success_rate_initial": 0.0,
        "success_rate_final": 0.4,
        "success_rate_ci95_initial": [0.0, 0.2775],
        "success_rate_ci95_final": [0.1682, 0.6873],
        "eval_episodes": 10,
        "eval_first_seed": SEED,
        "success_errors": [],
        "reading": "higher, not told apart: the intervals overlap",
    }
    assert rows["sft-demos"]["success_rate_initial"] == 0.2
    assert rows["sft-demos"]["success_rate_final"] == 0.9
    low, high = rows["sft-demos"]["success_rate_ci95_final"]
    assert low < 0.9 < high < 1.0
    # Not measured: the fields are there, empty.
    assert rows["rl-b"]["success_rate_final"] is None
    assert rows["rl-b"]["eval_episodes"] is None
    # The same fields in each replay's row; none in the multi-tenant run's rows.
    (replay,) = [r for r in report["isolated"]["replays"] if r["tenant"] == "rl-a"]
    assert replay["tenant_row"]["success_rate_final"] == 0.4
    assert replay["tenant_row"]["success_rate_ci95_final"] == [0.1682, 0.6873]
    assert "success_rate_final" not in report["multi_tenant"]["tenants"]["rl-a"]
    assert "Wilson 95 % interval" in HOW_TO_READ["success_rate"]


def test_the_success_table_reads_before_arrow_after_with_intervals(tmp_path: Path) -> None:
    tables = report_tables(_mixed(tmp_path))
    title = "Success rate before → after training (isolated replays, matched updates)"
    # Second, right after device time: what each tenant learned comes before utilization.
    assert tables[1].title == title
    text = _text(tables)
    (row,) = [ln for ln in text.splitlines() if "rl-a" in ln and "→" in ln and "%" in ln]
    assert "0 % [0, 28] → 40 % [17, 69] (10 episodes)" in row
    assert row.split("│")[3].strip() == "2"  # the updates between the two measurements
    (sft,) = [ln for ln in text.splitlines() if "sft-demos" in ln and "%" in ln]
    assert "20 % [6, 51] → 90 % [60, 98] (10 episodes)" in sft
    # A tenant that was not measured gets no row in it.
    assert len(tables[1].rows) == 2
    flat = " ".join(text.split())
    assert f"seeds {SEED}…{SEED + 9}" in flat
    assert "never the demonstration seeds" in flat
    assert "[low, high] is the Wilson 95 % interval" in flat


def test_a_failed_measurement_says_so_in_its_row(tmp_path: Path) -> None:
    broken = _measured("rl", 1, None)
    broken.errors = ["success_eval final: the simulator worker died [exit 1]"]
    multi, isolated = _traces(tmp_path, {"rl-a": broken})
    row = _report(multi, isolated)["success_rates"]["tenants"]["rl-a"]
    assert row["success_errors"] == ["success_eval final: the simulator worker died [exit 1]"]
    assert format_success(row) == "10 % [2, 40] → – (10 episodes)"
    assert "the simulator worker died [exit 1]" in _text(report_tables(_report(multi, isolated)))


def test_without_measurements_no_success_table_and_no_plot(tmp_path: Path) -> None:
    tenants = {"rl-a": TenantSummary(task="rl", jobs_completed=1)}
    multi, isolated = _traces(tmp_path, tenants)
    report = _report(multi, isolated)
    assert len(report_tables(report)) == 3
    paths = plot_report(report, multi, isolated, tmp_path / "out")
    assert [p.name for p in paths] == [
        "utilization.png",
        "device_time.png",
        "device_idle.png",
        "curves.png",
    ]
    assert not (tmp_path / "out" / "success.png").exists()


def test_the_success_plot_is_written_with_interval_error_bars(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    tenants = {"rl-a": _measured("rl", 0, 4), "sft-demos": _measured("sft", 2, 9)}
    multi, isolated = _traces(tmp_path, tenants)
    report = _report(multi, isolated)
    paths = plot_report(report, multi, isolated, tmp_path / "out")
    assert paths[-1] == tmp_path / "out" / "success.png"
    assert paths[-1].stat().st_size > 1000

    fig, ax = plt.subplots()
    try:
        before, after = success_bars(ax, report["success_rates"]["tenants"])
        assert [b.get_height() for b in before.patches] == [0.0, 0.2]
        assert [b.get_height() for b in after.patches] == [0.4, 0.9]
        # Each error bar spans the Wilson interval of its rate.
        segments = after.errorbar.lines[2][0].get_segments()
        spans = [(round(s[0][1], 4), round(s[1][1], 4)) for s in segments]
        assert spans == [(0.1682, 0.6873), tuple(round(x, 4) for x in wilson_interval(9, 10))]
        labels = [t.get_text() for t in ax.legend().get_texts()]
        assert labels == ["before training", "after training"]
    finally:
        plt.close(fig)


def test_the_mixture_measures_trainable_tenants_on_seeds_apart_from_the_demos(
    tmp_path: Path,
) -> None:
    m = build_mixture(tmp_path, minutes=3, profile="fast", success_episodes=7)
    assert m.success_episodes == 7
    trainable = [s for s in m.specs if s.task in (TaskKind.RL, TaskKind.SFT)]
    assert len(trainable) == 4
    for spec in trainable:
        assert spec.success_eval is not None, spec.tenant
        assert (spec.success_eval.episodes, spec.success_eval.seed) == (7, EVAL_SEED_BASE)
        if spec.dataset is not None:  # the SFT demonstrations are recorded on their own seeds
            demos = demo_seeds(spec.seed, spec.dataset.record_episodes)
            assert not len(shared_seeds(demos, eval_seeds(EVAL_SEED_BASE, 7)))
    (ev,) = [s for s in m.specs if s.task is TaskKind.EVAL]
    assert ev.success_eval is None
    # The default, and 0 to leave it out.
    default = build_mixture(tmp_path, minutes=3, profile="fast")
    assert default.specs[0].success_eval is not None
    assert default.specs[0].success_eval.episodes == SUCCESS_EPISODES["fast"]
    assert default.success_episodes == SUCCESS_EPISODES["fast"] > 0
    paper = build_mixture(tmp_path, minutes=10, profile="paper")
    episodes = {s.tenant: s.success_eval.episodes for s in paper.training_specs if s.success_eval}
    assert episodes == {t: SUCCESS_EPISODES["paper"] for t in paper.rl_tenants} | {
        paper.sft_tenant: SFT_SUCCESS_EPISODES["paper"]
    }
    # The SFT tenant, whose rise this budget can tell apart, gets enough episodes to.
    assert SFT_SUCCESS_EPISODES["paper"] >= 30 and paper.sft_success_episodes == 30
    off = build_mixture(tmp_path, minutes=3, profile="fast", success_episodes=0)
    assert all(s.success_eval is None for s in off.specs)
    with pytest.raises(SpecError, match="success_episodes"):
        build_mixture(tmp_path, minutes=3, profile="fast", success_episodes=-1)


def test_the_replays_measure_success_and_the_multi_tenant_run_does_not(tmp_path: Path) -> None:
    m = build_mixture(tmp_path / "mt", minutes=2, profile="test", success_episodes=4)
    matched = {t: 1 for t in (*m.rl_tenants, m.sft_tenant)}
    specs = isolated_specs(m.training_specs, matched, tmp_path / "iso")
    assert len(specs) == 4
    assert all(s.success_eval is not None and s.success_eval.episodes == 4 for s in specs)
    multi = m.multi_tenant_specs
    assert [s.tenant for s in multi] == [s.tenant for s in m.specs]
    assert all(s.success_eval is None for s in multi)
    # Nothing else differs.
    assert [s.model_copy(update={"success_eval": None}) for s in m.specs] == multi


def test_the_cli_passes_success_episodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import joynexus.demo.runner as runner

    seen: list[dict[str, Any]] = []

    async def fake_run_demo(out: Path, **kwargs: Any) -> None:
        seen.append(kwargs)

    monkeypatch.setattr(runner, "run_demo", fake_run_demo)
    args = ["demo", "--envs", "test", "--device-cores", "none", "--out", str(tmp_path)]
    # None: the profile's default (build_mixture); 0 turns the measurement off.
    for extra, expected in (([], None), (["--success-episodes", "0"], 0)):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        assert seen[-1]["success_episodes"] == expected
    result = CliRunner().invoke(app, [*args, "--success-episodes", "-1"])
    assert result.exit_code != 0


def test_each_row_says_plainly_what_it_shows(tmp_path: Path) -> None:
    report = _mixed(tmp_path)
    rows = report["success_rates"]["tenants"]
    # 0 % [0, 28] -> 40 % [17, 69]: higher, but this many episodes cannot tell.
    assert rows["rl-a"]["reading"] == "higher, not told apart: the intervals overlap"
    # 20 % [6, 51] -> 90 % [60, 98]: the intervals are apart.
    assert rows["sft-demos"]["reading"] == "rose: the intervals do not overlap"
    flat = " ".join(_text(report_tables(report)).split())
    assert "what it shows" in flat and "rose: the intervals do not overlap" in flat
    fell = {
        "success_rate_initial": 0.9,
        "success_rate_final": 0.1,
        "success_rate_ci95_initial": [0.6, 0.98],
        "success_rate_ci95_final": [0.02, 0.4],
    }
    assert success_reading(fell) == "fell: the intervals do not overlap"
    assert success_reading({"success_rate_ci95_initial": None}) == "not measured"


def test_a_tenant_that_never_succeeds_is_read_as_no_learning() -> None:
    never = {
        "success_rate_initial": 0.0,
        "success_rate_final": 0.0,
        "success_rate_ci95_initial": [0.0, 0.39],
        "success_rate_ci95_final": [0.0, 0.39],
    }
    assert success_reading(never) == (
        "never succeeded, before or after: no learning shown at this budget"
    )
