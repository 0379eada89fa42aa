"""``joynexus bench serving``: both deployments answer, the figures are sane, and no
server the bench started outlives it."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.server.config import DEFAULT_SERVE_MAX_WAIT_MS
from joynexus.utils.affinity import available_cores

psutil = pytest.importorskip("psutil")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.timeout(300)
def test_tiny_run_reports_ratios_and_leaves_no_process(tmp_path: Path) -> None:
    before = _children()
    out = tmp_path / "serving.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "serving",
            "--tenants",
            "2",
            "--clients-per-tenant",
            "1",
            "--duration-s",
            "1",
            "--requests",
            "20",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "throughput_ratio" in result.output
    data = json.loads(out.read_text())
    for key in ("throughput_ratio", "memory_ratio", "memory_ratio_pss", "p99_ratio"):
        assert math.isfinite(data[key]) and data[key] > 0, key
    assert data["ours"]["servers"] == 1 and data["baseline"]["servers"] == 2
    # The shared server may use every usable core; each baseline server gets --threads.
    assert data["config"]["ours_threads"] == len(available_cores())
    assert data["config"]["threads_per_server"] == 1
    assert data["config"]["max_wait_ms"] == DEFAULT_SERVE_MAX_WAIT_MS  # every server's T
    for side in ("ours", "baseline"):
        r = data[side]
        assert r["errors"] == 0 and r["requests"] > 0, r
        assert r["req_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["rss_peak_mb"] > 50 and r["pss_after_mb"] > 0, r
        # Every request was metered through every stage by the server itself.
        st = r["stages"]
        assert st["requests_metered"] >= r["requests"], st
        for stage in ("http_decode", "admission", "queue_wait", "backbone", "head"):
            assert st["per_request"][f"{stage}_ms"] > 0, (side, stage, st)
        assert 0 < st["overhead_ms"] < st["client_mean_ms"], st
        # Then requests that have the server to themselves, metered the same way.
        alone = r["alone"]
        assert alone["requests"] > 0 and alone["requests_metered"] >= alone["requests"], alone
        assert 0 < alone["overhead_ms"] < alone["client_mean_ms"], alone
    # Two backbone copies take more memory than one.
    assert data["memory_ratio"] > 1.2
    assert _children() <= before, "a server the bench started is still running"


def test_servers_are_stopped_on_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the servers start (the slowest phase) leaves none behind."""
    from joynexus.bench import server_procs

    before = _children()
    started: list[int] = []

    def interrupted(servers: list[server_procs.Server], *_: object) -> None:
        started.extend(s.proc.pid for s in servers)
        assert all(s.proc.poll() is None for s in servers)
        raise KeyboardInterrupt

    monkeypatch.setattr(server_procs, "wait_ready", interrupted)
    with (
        pytest.raises(KeyboardInterrupt),
        server_procs.running_servers(tmp_path, ["a", "b"], "tiny:qwen2_5_vl", 1),
    ):
        raise AssertionError("not reached")
    assert len(started) == 2
    assert not any(psutil.pid_exists(pid) for pid in started)
    assert _children() <= before
