"""`bench group-batching`: JSON shape and grouped == serial features (no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.bench.group_batching import run_group_batching
from joynexus.cli.main import app
from joynexus.models.tiny import make_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny("qwen2_5_vl", tmp_path_factory.mktemp("bench-qwen"), size="tiny")


def test_smallest_grid_json_shape(model_dir: Path) -> None:
    result = run_group_batching(
        tenants=[2],
        batches=[1],
        repeats=1,
        warmup=0,
        breakdown=(2, 1),
        threads=1,
        model_dir=model_dir,
    )
    json.dumps(result)  # JSON-ready
    assert set(result) >= {"config", "grid", "breakdown", "max_abs_diff"}
    (cell,) = result["grid"]
    assert set(cell) >= {"tenants", "batch", "serial_s", "grouped_s", "speedup"}
    assert (cell["tenants"], cell["batch"]) == (2, 1)
    assert cell["serial_s"] > 0 and cell["grouped_s"] > 0
    assert cell["speedup"] == pytest.approx(cell["serial_s"] / cell["grouped_s"])
    assert result["max_abs_diff"] <= 1e-5
    # The cell's roofline: the serial pass's counted FLOPs at the device's measured peak.
    roof = cell["roofline"]
    assert roof["flops"] > 0 and roof["peak_gemm_gflops_per_s"] > 0
    assert roof["peak_gemm_gflops_per_s"] == result["config"]["peak_gemm_gflops_per_s"]
    assert roof["speedup_ceiling"] == pytest.approx(
        roof["peak_gemm_gflops_per_s"] / roof["serial_gflops_per_s"]
    )
    assert roof["grouped_gflops_per_s"] == pytest.approx(roof["flops"] / cell["grouped_s"] / 1e9)
    bd = result["breakdown"]
    assert set(bd["action_module_forward_s"]) == {"oft", "flow_matching"}
    assert bd["base_forward_serial_s"] > 0 and bd["base_forward_grouped_s"] > 0
    assert result["config"]["dtype"] == "float32" and result["config"]["threads"] == 1
    # Memory is read off the process (RSS), beside the parameters' own storage.
    mem = result["memory"]
    assert mem["rss_before_load_mb"] > 0 and 0 < mem["rss_after_load_mb"] <= mem["rss_peak_mb"]
    assert mem["parameter_storage_mb"] == pytest.approx(
        result["config"]["base_parameters"] * 4 / 2**20
    )


def test_cli_writes_json_and_rejects_bad_lists(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "gb.json"
    args = ["bench", "group-batching", "--tenants", "2", "--batch", "1", "--repeats", "1"]
    args += ["--warmup", "0", "--breakdown", "2,1", "--threads", "1"]
    args += ["--model-dir", str(model_dir), "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "speedup" in result.output
    data = json.loads(out.read_text())
    assert data["grid"][0]["tenants"] == 2 and data["max_abs_diff"] <= 1e-5

    bad = CliRunner().invoke(app, ["bench", "group-batching", "--tenants", "two"])
    assert bad.exit_code == 2
    assert "--tenants" in bad.output


def test_figure12_cli_writes_curves(tmp_path: Path) -> None:
    out = tmp_path / "f12.png"
    result = CliRunner().invoke(
        app, ["bench", "figure12", "--out", str(out), "--steps", "3", "--head", "oft"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.with_suffix(".json").read_text())
    assert out.stat().st_size > 0
    assert set(doc["curves"]) == {"libero-a", "libero-b", "calvin-a", "calvin-b"}
    assert all(len(c["grouped"]) == 3 for c in doc["curves"].values())
    assert doc["max_relative_loss_difference"] <= 1e-4
