"""``joynexus bench backbone-lock``: both sides run the mixture and report its cost."""

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from joynexus.cli.main import app


def test_both_sides_run_and_only_the_shared_backbone_waits(tmp_path: Path) -> None:
    out = tmp_path / "lock.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "backbone-lock",
            "--clients",
            "2",
            "--batch",
            "4",
            "--duration-s",
            "1.5",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "copy / shared" in result.output
    data = json.loads(out.read_text())
    for side in ("shared", "shared-plain", "copy"):
        r = data[side]
        assert r["predicts"] > 0 and r["train_steps"] > 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
    # A copy is one more backbone; its batches never wait for the training lock.
    assert math.isclose(data["memory_ratio"], 2.0, rel_tol=1e-6)
    assert data["copy"]["lock_wait_ms_per_batch"] < 1.0
    assert data["shared"]["lock_wait_ms_per_batch"] > data["copy"]["lock_wait_ms_per_batch"]
    for key in ("predict_throughput_ratio", "p99_ratio", "train_throughput_ratio"):
        assert math.isfinite(data[key]) and data[key] > 0, key
        assert math.isfinite(data["priority"][key]) and data["priority"][key] > 0, key
    assert "shared / shared-plain" in result.output
