"""The tables of ``joynexus bench serving`` (:mod:`joynexus.bench.serving`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from joynexus.metrics.stages import PREDICT_STAGES

#: The shared server's throughput target against one server per tenant, by model size.
THROUGHPUT_TARGETS = {"tiny": 2.0, "small": 1.3}

__all__ = [
    "NOISY_NEIGHBOUR_TARGET",
    "print_noisy_neighbour_report",
    "print_report",
    "print_scaling_report",
]

#: The victim's p99 under a flood within the flooder's quota, at most this many times its
#: quiet p99 (issue 43).
NOISY_NEIGHBOUR_TARGET = 3.0


def print_report(result: dict[str, Any], console: Console) -> None:
    runs = result.get("by_canonicalizer")
    if runs is None:
        _print_run(result, console)
        return
    for kind, run in runs.items():
        console.print(f"[bold]canonicalizer: {kind}[/bold]")
        _print_run({"config": result["config"], **run}, console)
    summary = Table(
        "canonicalizer",
        "ours req/s",
        "baseline req/s",
        "throughput_ratio",
        "p99_ratio",
        "memory_ratio",
        "ours canonicalize ms/req",
        "ours overhead ms/req",
        title="side by side (one session)",
    )
    for kind, run in runs.items():
        per_request = run["ours"]["stages"]["per_request"]
        summary.add_row(
            kind,
            f"{run['ours']['req_per_s']:.1f}",
            f"{run['baseline']['req_per_s']:.1f}",
            f"{run['throughput_ratio']:.2f}",
            f"{run['p99_ratio']:.2f}",
            f"{run['memory_ratio']:.2f}",
            f"{per_request['canonicalize_ms']:.2f}",
            f"{run['ours']['stages']['overhead_ms']:.2f}",
        )
    console.print(summary)


def _print_run(result: dict[str, Any], console: Console) -> None:
    cfg = result["config"]
    table = Table(
        "side",
        "srv",
        "reqs",
        "errors",
        "req/s",
        "p50 ms",
        "p99 ms",
        "RSS MB",
        "PSS MB",
        title=(
            f"serving: {cfg['tenants']} tenants x {cfg['clients_per_tenant']} clients, "
            f"{cfg['size']} model, {cfg['duration_s']:g} s per side"
        ),
    )
    for side in ("ours", "baseline"):
        r = result[side]
        table.add_row(
            side,
            str(r["servers"]),
            str(r["requests"]),
            str(r["errors"]),
            f"{r['req_per_s']:.1f}",
            f"{r['p50_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
            f"{r['rss_peak_mb']:.0f}",
            f"{r['pss_after_mb']:.0f}",
        )
    console.print(table)
    stages = Table(
        "side",
        "batches",
        "rows/b",
        "ten/b",
        "mean ms",
        "dev ms",
        "other ms",
        "busy",
        title="where a request's time goes (device: its batch's canonicalize + backbone + "
        "heads; other: HTTP, queue and lock wait, client)",
    )
    for side in ("ours", "baseline"):
        st = result[side]["stages"]
        stages.add_row(
            side,
            str(st["batches"]),
            f"{st['mean_batch_rows']:.2f}",
            f"{st['mean_batch_tenants']:.2f}",
            f"{st['client_mean_ms']:.1f}",
            f"{st['device_ms_per_batch']:.1f}",
            f"{st['other_ms']:.1f}",
            f"{st['device_busy_fraction']:.0%}",
        )
    console.print(stages)
    breakdown = Table(
        "stage",
        "ours ms/request",
        "baseline ms/request",
        title="where a request's time goes, by stage (per-batch stages: the batch's time "
        "divided by the requests it answered)",
    )
    rows = [(stage, f"{stage}_ms") for stage in PREDICT_STAGES]
    for label, key in rows:
        breakdown.add_row(
            label,
            *(f"{result[side]['stages']['per_request'][key]:.2f}" for side in ("ours", "baseline")),
        )
    breakdown.add_row(
        "overhead (decode + admission + canonicalize + encode)",
        *(f"{result[side]['stages']['overhead_ms']:.2f}" for side in ("ours", "baseline")),
    )
    if all(result[side].get("alone") for side in ("ours", "baseline")):
        breakdown.add_row(
            f"overhead of a request alone ({result['ours']['alone']['requests']} one at a "
            "time, after the load)",
            *(f"{result[side]['alone']['overhead_ms']:.2f}" for side in ("ours", "baseline")),
        )
    console.print(breakdown)
    variants = result.get("by_front_procs")
    if variants:
        table = Table(
            "front procs",
            "ours req/s",
            "p99 ms",
            "RSS MB",
            "throughput_ratio",
            "p99_ratio",
            "memory_ratio",
            "overhead ms/req",
            title="ours per --front-procs (one baseline run)",
        )
        for n, v in variants.items():
            table.add_row(
                n,
                f"{v['ours']['req_per_s']:.1f}",
                f"{v['ours']['p99_ms']:.1f}",
                f"{v['ours']['rss_peak_mb']:.0f}",
                f"{v['throughput_ratio']:.2f}",
                f"{v['p99_ratio']:.2f}",
                f"{v['memory_ratio']:.2f}",
                f"{v['ours']['stages']['overhead_ms']:.2f}",
            )
        console.print(table)
    console.print(
        f"ours: {result['ours'].get('front_procs', 0)} front process(es); load average "
        f"{cfg.get('load_avg_1m_at_start')} at start, {cfg.get('load_avg_1m_at_end')} at end"
    )
    base = result["baseline"]
    if base.get("computed"):
        console.print(
            f"[yellow]baseline memory computed[/yellow]: {base['servers']} of "
            f"{base['tenants']} single-policy servers fit the memory budget and ran "
            f"({base['rss_peak_mb_per_server']:.0f} MiB each); one per tenant would take "
            f"{base['rss_peak_mb_all_tenants']:.0f} MiB. Its req/s is the measured servers'."
        )
    console.print(
        f"throughput_ratio {result['throughput_ratio']:.2f} "
        f"(target >= {THROUGHPUT_TARGETS.get(str(cfg.get('size')), 2.0):g}), "
        f"memory_ratio {result['memory_ratio']:.2f} (target >= 4; "
        f"PSS {result['memory_ratio_pss']:.2f}), "
        f"p99_ratio {result['p99_ratio']:.2f} (target <= 1)"
    )


def print_noisy_neighbour_report(result: dict[str, Any], console: Console) -> None:
    """The tables of the noisy-neighbour scenario (:mod:`joynexus.bench.noisy_neighbour`)."""
    cfg, quiet = result["config"], result["quiet"]
    table = Table(
        "phase",
        "victim reqs",
        "victim p50 ms",
        "victim p99 ms",
        "p99 / quiet p99",
        "flooder req/s",
        "flooder rows/s",
        "flooder statuses",
        title=f"noisy neighbour: {cfg['size']} model, {cfg['duration_s']:g} s per phase",
    )
    table.add_row(
        "quiet",
        str(quiet["requests"]),
        f"{quiet['p50_ms']:.1f}",
        f"{quiet['p99_ms']:.1f}",
        "1.00",
        "-",
        "-",
        "-",
    )
    for f in result["floods"]:
        v, fl = f["victim"], f["flooder"]
        table.add_row(
            f"flood {f['flood_clients']} x {f['flood_rows']} rows",
            str(v["requests"]),
            f"{v['p50_ms']:.1f}",
            f"{v['p99_ms']:.1f}",
            f"{f['p99_vs_quiet']:.2f}",
            f"{fl['req_per_s']:.1f}",
            f"{fl['rows_per_s']:.0f}",
            str(fl["statuses"]),
        )
    console.print(table)
    worst = max((f["p99_vs_quiet"] for f in result["floods"]), default=float("nan"))
    console.print(
        f"victim p99 under a flood: {worst:.2f} x its quiet p99 "
        f"(target <= {NOISY_NEIGHBOUR_TARGET:g})"
    )
    g = result.get("get_data")
    if g:
        statuses = ", ".join(
            f"{c['status']}" + (f" {c['reason'] or c['code']}" if c.get("code") else "")
            for c in g["calls"]
        )
        console.print(
            f"get_data: {g['concurrency']} calls at once, each a {g['request_body_bytes']} B "
            f"request for {g['stored_mib']:.0f} MiB of tensors: {statuses}; largest answer "
            f"{g['answer_mib_max']:.0f} MiB; server RSS {g['rss_before_mb']:.0f} -> "
            f"{g['rss_peak_mb']:.0f} MB (+{g['rss_growth_mb']:.0f})"
        )


def print_scaling_report(result: dict[str, Any], console: Console) -> None:
    """The tenant-scaling sweep (:mod:`joynexus.bench.tenant_scaling`): one row per
    tenant count, ours beside the baseline (measured or computed), then the summary."""
    cfg, summary = result["config"], result["summary"]
    base = {p["tenants"]: p for p in result["baseline"]}
    table = Table(
        "tenants",
        "req/s",
        "p50 ms",
        "p99 ms",
        "rows/batch",
        "RSS MB",
        "baseline req/s",
        "baseline p99 ms",
        "baseline RSS MB",
        title=(
            f"tenant scaling: {cfg['arch']} {cfg['size']}, {cfg['clients_per_tenant']} "
            f"client(s) per tenant, {cfg['duration_s']:g} s per point"
        ),
    )
    for p in result["ours"]:
        b = base.get(p["tenants"])
        measured = b is not None and not b.get("computed")
        table.add_row(
            str(p["tenants"]),
            f"{p['req_per_s']:.1f}",
            f"{p['p50_ms']:.1f}",
            f"{p['p99_ms']:.1f}",
            f"{p['mean_batch_rows']:.2f}",
            f"{p['rss_peak_mb']:.0f}",
            f"{b['req_per_s']:.1f}" if measured and b else "-",
            f"{b['p99_ms']:.1f}" if measured and b else "-",
            "-" if b is None else f"{b['rss_peak_mb']:.0f}" + ("" if measured else " (computed)"),
        )
    console.print(table)
    frac = summary.get("per_tenant_fraction_of_backbone")
    console.print(
        f"memory per added tenant: {summary['mb_per_added_tenant']:.2f} MiB (fit of the idle "
        f"server's RSS; {summary['mb_per_added_tenant_endpoints']:.2f} from the endpoints) = "
        + (f"{frac:.2%}" if frac is not None else "-")
        + f" of the {summary['backbone_weights_mb']:.0f} MiB backbone "
        f"(target <= {summary['per_tenant_target']:.0%} at small); peak RSS under load "
        f"grows {summary['mb_per_added_tenant_fit_peak']:.2f} MiB per tenant (larger batches)"
    )
    if "throughput_64_over_8" in summary:
        console.print(
            f"throughput at 64 tenants / at 8: {summary['throughput_64_over_8']:.2f} "
            f"(target >= {summary['throughput_target']:.0%})"
        )
    console.print(
        f"load average {cfg['load_avg_1m_at_start']:.2f} at start, "
        f"{cfg['load_avg_1m_at_end']:.2f} at end, {cfg['cpu_count']} CPUs"
    )
