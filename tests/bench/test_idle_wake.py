"""``joynexus bench idle-wake``: both stages timed back to back and after each pause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.bench.idle_wake import run_idle_wake_bench
from joynexus.cli.main import app


def test_every_stage_is_timed_back_to_back_and_after_each_pause() -> None:
    result = run_idle_wake_bench(size="tiny", pauses_ms=[3, 1, 3], repeats=2)
    assert result["pauses_ms"] == [0.0, 1.0, 3.0]  # back to back added, duplicates dropped
    for stage in ("decode", "canonicalize"):
        assert set(result["median_ms"][stage]) == {"0", "1", "3"}
        assert all(ms > 0 for ms in result["median_ms"][stage].values())
        ratios = result["ratio_to_back_to_back"][stage]
        assert ratios["0"] == 1.0
        assert ratios["3"] == result["median_ms"][stage]["3"] / result["median_ms"][stage]["0"]


@pytest.mark.parametrize("kwargs", [{"pauses_ms": [-1.0]}, {"repeats": 0}])
def test_bad_arguments_are_refused_before_any_model_is_built(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        run_idle_wake_bench(size="tiny", **kwargs)  # type: ignore[arg-type]


def test_the_command_writes_its_json_and_refuses_bad_pauses(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "idle.json"
    args = ["bench", "idle-wake", "--size", "tiny", "--pauses-ms", "2", "--repeats", "1"]
    ok = runner.invoke(app, [*args, "--json", str(out)])
    assert ok.exit_code == 0, ok.output
    assert set(json.loads(out.read_text())["median_ms"]["canonicalize"]) == {"0", "2"}
    for bad in ("1,x", "-5", "nan"):
        refused = runner.invoke(app, ["bench", "idle-wake", "--size", "tiny", "--pauses-ms", bad])
        assert refused.exit_code == 2, (bad, refused.output)
        assert "--pauses-ms" in refused.output
