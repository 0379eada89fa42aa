"""``joynexus bench serving --tenants 1,2``: the scaling sweep's report, and its options."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.bench.serving import baseline_computed, baseline_fit
from joynexus.bench.tenant_scaling import fit_slope
from joynexus.cli.main import app

psutil = pytest.importorskip("psutil")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.timeout(300)
def test_two_point_sweep_reports_every_field(tmp_path: Path) -> None:
    before = _children()
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    result = CliRunner().invoke(
        app,
        [
            "bench", "serving", "--tenants", "1,2", "--duration-s", "0.5", "--requests", "5",
            "--json", str(out), "--plot", str(png),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "memory per added tenant" in result.output
    data = json.loads(out.read_text())
    assert data["config"]["scenario"] == "tenant-scaling"
    assert data["config"]["tenants"] == [1, 2]
    assert data["config"]["clients_per_tenant"] == 1
    assert [p["tenants"] for p in data["ours"]] == [1, 2]
    for side in ("ours", "baseline"):
        for p in data[side]:
            assert p["errors"] == 0 and p["requests"] > 0, p
            assert p["req_per_s"] > 0 and 0 < p["p50_ms"] <= p["p99_ms"], p
            assert p["rss_peak_mb"] > 50 and p["rss_after_open_mb"] > 50, p
    assert all(p["servers"] == 1 for p in data["ours"])
    assert [(p["servers"], p["computed"]) for p in data["baseline"]] == [(1, False), (2, False)]
    s = data["summary"]
    assert s["backbone_weights_mb"] > 0
    # Memory is read with no load between the tenants added, after a warm-up.
    assert [p["tenants"] for p in data["memory"]] == [1, 2]
    assert all(p["rss_idle_mb"] > 50 for p in data["memory"])
    idle = [p["rss_idle_mb"] for p in data["memory"]]
    assert s["mb_per_added_tenant"] == pytest.approx(idle[1] - idle[0])
    assert math.isfinite(s["mb_per_added_tenant_fit_peak"])
    assert s["per_tenant_fraction_of_backbone"] == pytest.approx(
        s["mb_per_added_tenant"] / s["backbone_weights_mb"]
    )
    # Two servers hold two backbones: more memory than one server for two tenants.
    assert s["memory_ratio_by_tenants"]["2"] > 1.2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _children() <= before, "a server the bench started is still running"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serving", "--tenants", "1,x"], "comma-separated positive integers"),
        (["serving", "--tenants", "1,2", "--scenario", "noisy-neighbour"], "scaling sweep"),
        (["serving", "--size", "real", "--arch", "paligemma"], "--size real builds"),
        (["group-batching", "--size", "real", "--arch", "pi0"], "--size real builds"),
        (["group-batching", "--breakdown", "8"], "TENANTS,BATCH"),
        (["group-batching", "--size", "huge"], "tiny, small"),
    ],
)
def test_bad_options_say_what_to_fix(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_baseline_fit_and_computed_memory() -> None:
    assert baseline_fit(8, 1500.0, None) == 8
    assert baseline_fit(8, 1500.0, 7000.0) == 4
    assert baseline_fit(8, 9000.0, 7000.0) == 1  # at least one server is measured
    base = {"servers": 2, "rss_peak_mb": 3000.0, "pss_after_mb": 2000.0}
    out = baseline_computed(base, 8)
    assert out["computed"] is True
    assert out["rss_peak_mb_all_tenants"] == 12000.0
    assert out["pss_after_mb_all_tenants"] == 8000.0
    assert baseline_computed(base, 2)["computed"] is False


def test_fit_slope() -> None:
    assert fit_slope([1, 2, 4, 8], [100, 101, 103, 107]) == pytest.approx(1.0)
    assert math.isnan(fit_slope([4], [1.0]))
