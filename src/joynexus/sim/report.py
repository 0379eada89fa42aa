"""Rendering of an experiment summary: rich tables (Table 1, Figure 9, tenants), JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def table1(summary: dict[str, Any]) -> Table:
    """Table 1: utilization of the shared Training / Inference Model Service GPUs."""
    iso, mt, rel = summary["isolated"], summary["multi_tenant"], summary["relative_improvement"]
    ref = summary["paper_reference"]
    t = Table(title="Table 1 — model-service GPU utilization (simulated)")
    t.add_column("Execution")
    t.add_column("Training", justify="right")
    t.add_column("Inference", justify="right")
    t.add_column("paper: Training", justify="right", style="dim")
    t.add_column("paper: Inference", justify="right", style="dim")
    t.add_row(
        f"Isolated (mean of {iso['rl_traces']} RL traces)",
        _pct(iso["training_utilization"]),
        _pct(iso["inference_utilization"]),
        _pct(ref["isolated_training_utilization"]),
        _pct(ref["isolated_inference_utilization"]),
    )
    t.add_row(
        "Multi-tenant (JoyNexus)",
        _pct(mt["training_utilization"]),
        _pct(mt["inference_utilization"]),
        _pct(ref["multi_tenant_training_utilization"]),
        _pct(ref["multi_tenant_inference_utilization"]),
    )
    t.add_row(
        "Relative improvement",
        _ratio(rel["training"]),
        _ratio(rel["inference"]),
        _ratio(ref["multi_tenant_training_utilization"] / ref["isolated_training_utilization"]),
        _ratio(ref["multi_tenant_inference_utilization"] / ref["isolated_inference_utilization"]),
    )
    return t


def figure9(summary: dict[str, Any]) -> Table:
    """Figure 9: aggregate GPU time for the same matched work."""
    iso, mt, ref = summary["isolated"], summary["multi_tenant"], summary["paper_reference"]
    t = Table(title="Figure 9 — aggregate GPU time, matched work (simulated)")
    t.add_column("Execution")
    t.add_column("GPUs", justify="right")
    t.add_column("wall time", justify="right")
    t.add_column("GPU-hours", justify="right")
    t.add_row(
        "Isolated 1-1-2 traces, one after another",
        str(iso["gpus_per_trace"]),
        f"{iso['total_duration_s'] / 60:.1f} min",
        f"{iso['gpu_time_s'] / 3600:.2f}"
        f"  (RL {iso['rl_gpu_time_s'] / 3600:.2f} + SFT {iso['sft_gpu_time_s'] / 3600:.2f})",
    )
    t.add_row(
        "Multi-tenant (JoyNexus)",
        str(mt["gpus"]),
        f"{mt['makespan_s'] / 60:.1f} min",
        f"{mt['gpu_time_s'] / 3600:.2f}",
    )
    t.add_row(
        "Isolated ÷ multi-tenant",
        "",
        "",
        f"{_ratio(summary['device_time_ratio'])}  "
        f"(−{100 * summary['device_time_reduction']:.1f}% GPU time)",
    )
    t.add_row(
        "[dim]paper[/dim]",
        "",
        "",
        f"[dim]{_ratio(ref['device_time_ratio'])}  "
        f"(−{100 * ref['device_time_reduction']:.1f}% GPU time)[/dim]",
    )
    return t


def tenant_table(summary: dict[str, Any], limit: int = 12) -> Table:
    """Per-tenant matched work and durations (the first ``limit`` tenants)."""
    tenants = summary["tenants"]
    title = "Per-tenant matched work"
    if len(tenants) > limit:
        title += f" (first {limit} of {len(tenants)})"
    t = Table(title=title)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("tenant", "left"),
        ("kind", "left"),
        ("updates", "right"),
        ("samples", "right"),
        ("multi-tenant: last update", "right"),
        ("isolated: duration", "right"),
        ("drops (multi / iso)", "right"),
        ("policy version", "right"),
    )
    for name, justify in columns:
        t.add_column(name, justify=justify)
    for row in tenants[:limit]:
        t.add_row(
            row["tenant_id"],
            row["kind"],
            str(row["matched_updates"]),
            f"{row['matched_samples']:,}",
            f"{row['multi_tenant_last_update_s'] / 60:.1f} min",
            f"{row['isolated_duration_s'] / 60:.1f} min",
            f"{row['multi_tenant_drops']} / {row['isolated_drops']}",
            str(row["final_policy_version"]),
        )
    return t


def print_report(summary: dict[str, Any], console: Console) -> None:
    """Print the scenario line, Table 1, Figure 9 and the tenant table."""
    sc, mt = summary["scenario"], summary["multi_tenant"]
    console.print(
        f"[bold]scenario {sc['name']}[/bold]: {sc['description']}\n"
        f"matched window {sc['window_s'] / 60:.0f} min; {mt['matched_updates']} matched "
        f"updates; {mt['inference_batches']:,} inference batches "
        f"(mean {mt['mean_inference_batch_samples']:.0f} samples); "
        f"peak active rollouts {mt['max_active_rollouts']} "
        f"(≤ {mt['max_active_rollouts_per_tenant']} per tenant); "
        f"RL drops {mt['drops']}"
    )
    console.print(table1(summary))
    console.print(figure9(summary))
    console.print(tenant_table(summary))
    console.print(
        "[dim]Durations are the scenario's assumptions (see the scenario file); the paper's "
        "figures are its measured results, shown for reference only. "
        f"Simulated in {summary['runtime_s']:.1f} s.[/dim]"
    )


def write_json(summary: dict[str, Any], path: Path) -> None:
    """Write ``summary`` as indented JSON, creating the parent directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, sort_keys=True))
