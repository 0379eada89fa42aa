from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.sim.experiment import run_experiment, summarize
from joynexus.sim.scenario import Scenario, scenario_to_yaml
from tests.sim.conftest import small


@pytest.fixture(scope="module")
def experiment_summary() -> tuple[object, dict[str, object]]:
    exp = run_experiment(small())
    return exp, summarize(exp)


def test_isolated_replay_runs_the_matched_updates_per_tenant(
    experiment_summary: tuple[object, dict[str, object]],
) -> None:
    exp, _ = experiment_summary
    window = exp.scenario.window_s  # type: ignore[attr-defined]
    multi = exp.multi  # type: ignore[attr-defined]
    for trace in exp.traces:  # type: ignore[attr-defined]
        in_window = [u for u in multi.updates if u.tenant_id == trace.tenant_id]
        expected = sum(1 for u in in_window if u.leased_at < window)
        assert trace.updates == expected > 0
        assert trace.result is not None
        assert len(trace.result.updates) == expected
        assert {u.tenant_id for u in trace.result.updates} == {trace.tenant_id}
        assert trace.result.violations == []


def test_summary_has_the_documented_keys(
    experiment_summary: tuple[object, dict[str, object]],
) -> None:
    _, s = experiment_summary
    for side in ("multi_tenant", "isolated"):
        part = s[side]
        assert isinstance(part, dict)
        for key in ("training_utilization", "inference_utilization", "gpu_time_s"):
            assert isinstance(part[key], float)
        assert 0.0 < part["training_utilization"] <= 1.0
        assert 0.0 < part["inference_utilization"] <= 1.0
    assert isinstance(s["device_time_ratio"], float) and s["device_time_ratio"] > 0
    assert s["scenario"]["name"] == "small"  # type: ignore[index]
    assert {t["tenant_id"] for t in s["tenants"]} == {  # type: ignore[attr-defined]
        "libero",
        "maniskill-1",
        "maniskill-2",
        "sft",
    }
    ratio = s["isolated"]["gpu_time_s"] / s["multi_tenant"]["gpu_time_s"]  # type: ignore[index]
    assert s["device_time_ratio"] == pytest.approx(ratio)
    timeline = s["timeline"]["multi_tenant"]  # type: ignore[index]
    assert timeline["training"] and all(0.0 <= x <= 1.0 for x in timeline["training"])
    json.dumps(s)  # serialisable as is


def _write(tmp_path: Path, sc: Scenario) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(scenario_to_yaml(sc))
    return path


def test_cli_simulate_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "out" / "sim.json"
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", str(_write(tmp_path, small())), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "Table 1" in result.output and "Figure 9" in result.output
    assert "paper" in result.output
    data = json.loads(out.read_text())
    for key in ("training_utilization", "inference_utilization"):
        assert key in data["multi_tenant"] and key in data["isolated"]
    assert "device_time_ratio" in data


def test_cli_overrides_scale_and_window(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--scenario",
            str(_write(tmp_path, small())),
            "--scale",
            "2",
            "--window-minutes",
            "3",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["scenario"]["scale"] == 2
    assert data["multi_tenant"]["gpus"] == 16
    assert len(data["tenants"]) == 8


def test_cli_reports_a_bad_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(bad)])
    assert result.exit_code == 2
    assert "invalid scenario" in result.output


def test_cli_simulate_defaults_to_the_paper_scenario(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["simulate", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["scenario"]["name"] == "paper-5.1"


def test_ablations_change_one_knob_and_report_rows() -> None:
    from joynexus.sim.ablation import VARIANTS, run_ablations, variant_scenario

    base = small(window_s=300.0)
    by_name = {v.name: v for v in VARIANTS}
    assert variant_scenario(base, by_name["fifo-actor"]).scheduler.rl_priority == 0
    assert variant_scenario(base, by_name["no-sft-backfill"]).sft_tenants == []
    rows = run_ablations(base, (by_name["base"], by_name["no-sft-backfill"]))
    assert [r["variant"] for r in rows] == ["base", "no-sft-backfill"]
    # Without the SFT tenant only RL updates remain.
    assert rows[1]["matched_updates"] == rows[1]["rl_updates"]
    assert rows[0]["matched_updates"] > rows[0]["rl_updates"]
