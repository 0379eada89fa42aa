"""``joynexus bench robots --front-procs``: the real openpi robots against a served JoyNexus
whose frames are decoded in its front processes, beside the in-process sides."""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.bench.robots import openpi_python, run_robots_bench

psutil = pytest.importorskip("psutil")


@pytest.mark.timeout(600)
def test_front_procs_add_a_served_side_decoded_in_its_fronts(tmp_path: Path) -> None:
    python = openpi_python()
    assert python.exists(), f"no openpi client venv at {python} (make install builds it)"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = run_robots_bench(
        robots=2, tenants=2, requests=3, warmup=1, image_size=16, front_procs=[0, 1]
    )
    for n in (0, 1):
        side = out[f"joynexus-fronts-{n}"]
        assert side["front_procs"] == n
        assert side["requests"] == 2 * 3  # warmup decisions are not timed
        assert side["actions"] == side["requests"] * 8
        assert side["mean_batch_size"] >= 1.0
        ratios = out["by_front_procs"][str(n)]
        assert ratios["actions_per_s_ratio"] > 0 and ratios["p99_ratio"] > 0
    # Where each served side decoded its frames: in the model process without fronts,
    # only in the front with one (warmup frames count too).
    zero, one = out["joynexus-fronts-0"]["stage_s"], out["joynexus-fronts-1"]["stage_s"]
    assert zero.get("openpi_decode", 0) > 0 and not zero.get("openpi_decode_front")
    assert one.get("openpi_decode_front", 0) > 0 and not one.get("openpi_decode")
    # The served processes (model and fronts) are gone.
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
