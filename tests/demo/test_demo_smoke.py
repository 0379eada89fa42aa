"""A whole demo at test scale through the CLI: report keys, plots, matched work."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from joynexus.api import UsageReport
from joynexus.cli.main import app


def test_demo_cli_writes_report_plots_and_matches_work(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cores_before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--envs",
            "test",
            "--minutes",
            "1",
            "--rl-updates",
            "2",
            "--sft-jobs",
            "2",
            "--success-episodes",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    # The console wraps long lines where the numbers' widths put the break: match text
    # with the line breaks folded into spaces.
    flat = " ".join(result.output.split())
    assert "environments: test — chosen with --envs test: " in flat
    # Not a terminal: plain progress lines per phase, and the verdict says which way is good.
    assert "phase multi-tenant: started" in flat
    assert "phase isolated:rl-reach0: started" in flat
    assert "(above 1 is better)" in flat or "(ratio " in flat
    report = json.loads((out / "report.json").read_text())
    assert report["how_to_read"]["device_time_ratio"].startswith("isolated / multi-tenant")
    assert report["env_choice_reason"].startswith("chosen with --envs test: ")
    assert report["env_unavailable"] == {}
    # --device-cores auto by default: the pinning applied is printed and recorded, and
    # this process gets its cores back afterwards.
    pinning = report["core_pinning"]
    assert pinning["mode"] == "auto"
    assert "core pinning: " in flat
    if pinning["pinned"]:
        assert pinning["device_affinity"] == pinning["device_cores"]
        assert pinning["host_affinity"] == sorted(cores_before or [])
        assert not set(pinning["device_cores"]) & set(pinning["worker_cores"])
        assert "simulator workers on cores" in flat
    if cores_before is not None:
        assert os.sched_getaffinity(0) == cores_before
    for phase in ("multi_tenant", "isolated"):
        for key in ("training_utilization", "inference_utilization"):
            value = report[phase][key]
            assert isinstance(value, float) and 0.0 < value <= 1.0, (phase, key, value)
    assert report["device_time_ratio"] > 0
    # Device time on the device's own clock: its thread's CPU seconds were recorded in
    # every phase, the interference apart, the machine's load beside them.
    for row in (report["multi_tenant"], *report["isolated"]["replays"]):
        dev = row["device"]
        assert dev["device_spans"] > 0 and dev["device_cpu_s"] > 0, row["name"]
        assert dev["interference_s"] >= 0 and dev["device_time_s"] <= row["window_s"]
    assert report["device_time"]["wall"]["ratio"] > 0
    load = report["machine"]["phases"]["multi-tenant"]["load_average_1min"]
    assert load["samples"] >= 1 and load["min"] <= load["max"]
    assert "interference (the device's work ready" in flat and "machine load" in flat
    # The multi-tenant window taken apart on a real run: busy + idle by cause = window.
    idle = report["device_idle"]
    assert idle["device_busy_s"] > 0
    assert abs(idle["device_busy_s"] + idle["idle_s"] - idle["window_s"]) < 0.05
    assert abs(sum(idle["idle_by_cause_s"].values()) - idle["idle_s"]) < 0.05
    assert "of idle device (" in flat
    plots = ("utilization.png", "device_time.png", "device_idle.png", "curves.png", "success.png")
    for name in plots:
        assert (out / name).stat().st_size > 1000
        assert name in report["plots"]

    # Each trainable tenant's success rate, measured before and after its training in
    # its isolated replay, with its Wilson interval; the multi-tenant run measures none.
    assert report["success_episodes"] == 1
    rates = report["success_rates"]["tenants"]
    assert set(rates) == set(report["multi_tenant"]["tenants"])
    for tenant, row in rates.items():
        assert row["eval_episodes"] == 1, (tenant, row)
        assert row["updates"] == report["matched_updates"][tenant]
        assert row["success_errors"] == []
        for phase in ("initial", "final"):
            rate, (low, high) = row[f"success_rate_{phase}"], row[f"success_rate_ci95_{phase}"]
            assert rate in (0.0, 1.0)
            assert (low, high) == ((0.0, 0.7935) if rate == 0.0 else (0.2065, 1.0))
    assert "Success rate before → after training (isolated replays" in flat
    assert "(1 episode)" in flat

    # Matched work: every isolated replay counts exactly the updates its tenant
    # completed in the multi-tenant run, and each tenant was replayed alone.
    matched = report["matched_updates"]
    assert set(matched) == {"rl-reach0", "rl-reach1", "rl-reach2", "sft-demos"}
    assert all(n >= 2 for n in matched.values())
    replays = report["isolated"]["replays"]
    assert [r["tenant"] for r in replays] == ["rl-reach0", "rl-reach1", "rl-reach2", "sft-demos"]
    for r in replays:
        row = r["tenant_row"]
        assert row["updates_matched"] == matched[r["tenant"]]
        assert row["updates_in_window"] == matched[r["tenant"]]
        assert row["jobs_completed"] >= matched[r["tenant"]]
        assert set(r["usage_service_seconds"]) >= {"training", "inference"}
    for tenant, row in report["multi_tenant"]["tenants"].items():
        assert row["updates_in_window"] == matched[tenant]
    # The wall ratio is of the unrounded windows; the report's windows carry 0.0005 s of
    # rounding each, and the ratio 0.0005 of its own, so that is all they may differ by.
    iso_w, mt_w = report["isolated"]["window_s"], report["multi_tenant"]["window_s"]
    ratio = iso_w / mt_w
    slack = ratio * (0.0005 / iso_w + 0.0005 / mt_w) + 0.0005
    assert abs(report["device_time"]["wall"]["ratio"] - ratio) <= slack * 1.01, (ratio, slack)
    # The headline ratio is of the device times (window less interference; 0.005 s of
    # rounding each in the report).
    iso_d, mt_d = report["device_time"]["isolated_s"], report["device_time"]["multi_tenant_s"]
    slack = (iso_d / mt_d) * (0.005 / iso_d + 0.005 / mt_d) + 0.0005
    assert abs(report["device_time_ratio"] - iso_d / mt_d) <= slack * 1.01
    assert mt_d <= mt_w + 0.01 and iso_d <= iso_w + 0.01

    # The plane metered every service into usage.json (the utilization's source), and
    # the Metrics Service's events went to the run directory.
    usage = UsageReport.load(out / "multi" / "usage.json")
    assert usage.service_seconds["training"] > 0
    assert usage.service_seconds["inference"] > 0
    assert usage.tenants["rl-reach0"].env_steps > 0
    assert (out / "multi" / "metrics" / "rl-reach0" / "metrics.jsonl").is_file()
    # The Master wrote each workload's records under the run directory's outputs.
    (wl,) = (out / "multi" / "outputs" / "rl-reach0" / "workloads").iterdir()
    kinds = {json.loads(line)["kind"] for line in (wl / "metrics.jsonl").read_text().splitlines()}
    assert {"train", "rollout", "lifecycle"} <= kinds

    # Each replay ran alone in its own run directory: its usage and its checkpoints
    # are its tenant's only, nothing of the multi-tenant run.
    for r in replays:
        tenant = r["tenant"]
        run_dir = out / "isolated" / tenant
        assert set(UsageReport.load(run_dir / "usage.json").tenants) == {tenant}
        assert [d.name for d in (run_dir / "outputs").iterdir()] == [tenant]
