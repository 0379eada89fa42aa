"""``joynexus bench forward-split``: every way timed per rows and load, the measured way
reported against the size rule and the better fixed way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.bench.forward_split import WAYS, run_forward_split_bench
from joynexus.cli.main import app
from joynexus.utils.busy import busy_processes


def test_every_way_is_timed_for_each_rows_and_load() -> None:
    result = run_forward_split_bench(size="tiny", rows=[1, 3], busy=[0, 1], rounds=2)
    cells = result["cells"]
    assert [(c["busy"], c["rows"]) for c in cells] == [(0, 1), (0, 3), (1, 1), (1, 3)]
    for c in cells:
        assert set(c["median_ms"]) == set(WAYS)
        assert all(ms > 0 for ms in c["median_ms"].values())
        m = c["median_ms"]
        assert c["measured_over_size"] == m["measured"] / m["size"]
        assert c["measured_over_best"] == m["measured"] / min(m["serial"], m["split"])
        assert 0.0 <= c["measured_split_share"] <= 1.0


def test_busy_processes_spin_and_stop_with_the_block() -> None:
    import multiprocessing

    with busy_processes(2):
        spinning = [p for p in multiprocessing.active_children() if p.is_alive()]
        assert len(spinning) >= 2
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]


@pytest.mark.parametrize("kwargs", [{"rows": []}, {"rows": [0]}, {"rounds": 0}, {"busy": [-1]}])
def test_bad_arguments_are_refused_before_any_model_is_built(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        run_forward_split_bench(size="tiny", **kwargs)  # type: ignore[arg-type]


def test_the_command_writes_its_json_and_refuses_bad_loads(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "split.json"
    args = ["bench", "forward-split", "--size", "tiny", "--rows", "2", "--busy", "0"]
    ok = runner.invoke(app, [*args, "--rounds", "1", "--json", str(out)])
    assert ok.exit_code == 0, ok.output
    assert [c["rows"] for c in json.loads(out.read_text())["cells"]] == [2]
    for bad in ("x", "-1", ""):
        refused = runner.invoke(app, ["bench", "forward-split", "--size", "tiny", "--busy", bad])
        assert refused.exit_code == 2, (bad, refused.output)
        assert "--busy" in refused.output
