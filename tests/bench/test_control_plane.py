import json
from pathlib import Path

from typer.testing import CliRunner

from joynexus.bench.control_plane import run_control_plane_bench
from joynexus.cli.main import app

REQUIRED = {
    "scheduler": {"memory_transitions_per_s", "durable_transitions_per_s"},
    "training_queue": {"put_mb_per_s", "get_mb_per_s"},
    "inference_queue": {"overhead_us_per_request"},
}


def test_quick_bench_reports_every_required_key() -> None:
    results = run_control_plane_bench(quick=True)
    for group, keys in REQUIRED.items():
        assert keys <= set(results[group]), group
        for key in keys:
            assert results[group][key] > 0, f"{group}.{key}"


def test_cli_prints_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "cp.json"
    result = CliRunner().invoke(app, ["bench", "control-plane", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "scheduler.memory_transitions_per_s" in result.output
    data = json.loads(out.read_text())
    assert set(REQUIRED) <= set(data)


def test_version_command() -> None:
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.output.startswith("joynexus ")
