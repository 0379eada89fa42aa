"""``joynexus bench group-batching`` and ``bench serving``, with ``--size real`` (random
weights at a published checkpoint's configuration, :mod:`joynexus.bench.real_models`)
and ``bench serving --tenants 1,2,4,...`` (the tenant-scaling sweep).

Registered after :mod:`joynexus.cli.models_bench` (``cli.main`` imports it later), so
these definitions are the commands' ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import bench_app
from joynexus.cli.models_bench import (
    JsonOption,
    _check_model_options,
    _int_list,
    _progress,
    _write_json,
)

console = Console()

REAL = "real"
PI05 = "pi05"
ModelSizeOption = Annotated[
    str,
    typer.Option(
        "--size",
        help="tiny | small | real (random weights at a published configuration: --arch "
        "smolvla is lerobot/smolvla_base's VLM prefix, qwen2_5_vl a Qwen2.5-VL-3B-wide "
        "model cut to a few hundred M parameters)",
    ),
]


def check_real_arch(arch: str) -> None:
    """``--size real`` takes the architectures :mod:`joynexus.bench.real_models` builds."""
    from joynexus.bench.real_models import REAL_ARCHES

    if arch not in REAL_ARCHES:
        raise typer.BadParameter(
            f"--size real builds {', '.join(REAL_ARCHES)}; got {arch!r}", param_hint="--arch"
        )


def check_pi05_reference(model_dir: Path | None) -> None:
    """``--arch pi05`` builds its checkpoint with lerobot 0.6.1 in the reference
    environment (unless ``--model-dir`` names one already built): refuse in one line,
    saying how to build it, when that environment cannot run here."""
    from joynexus.interop.reference import reference_problem

    problem = None if model_dir is not None else reference_problem()
    if problem is not None:
        raise typer.BadParameter(
            f"pi05 builds its checkpoint with lerobot: {problem}", param_hint="--arch"
        )


def parse_breakdown(value: str) -> tuple[int, int] | None:
    """``--breakdown``: ``TENANTS,BATCH``, or ``none`` for no breakdown table."""
    if value.strip().lower() == "none":
        return None
    bd = _int_list(value, "--breakdown")
    if len(bd) != 2:
        raise typer.BadParameter(
            "expected TENANTS,BATCH, e.g. 8,4, or none", param_hint="--breakdown"
        )
    return bd[0], bd[1]


@bench_app.command("group-batching")
def bench_group_batching(
    arch: Annotated[
        str,
        typer.Option(
            "--arch",
            help="qwen2_5_vl | qwen3_vl | paligemma | smolvlm | pi0 | smolvla (tiny: a "
            "LeRobot SmolVLA checkpoint built by the real lerobot; real: its VLM prefix) | "
            "pi05 (a LeRobot π0.5 built by lerobot 0.6.1 in the reference environment: "
            "tiny, or real: its smallest variant, gemma_300m, ~1.9 B parameters, needs "
            "~16 GiB free; pi05_expert tenants)",
        ),
    ] = "qwen2_5_vl",
    size: ModelSizeOption = "tiny",
    tenants: Annotated[
        str | None, typer.Option("--tenants", help="Tenant counts (default 2,4,6,8; real: 8).")
    ] = None,
    batch: Annotated[
        str | None, typer.Option("--batch", help="Local batch sizes (default 1,2,4,8; real: 1).")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (fp32) | cuda (bf16)")] = "cpu",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs (median).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 2,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch intra-op threads.")
    ] = None,
    breakdown: Annotated[
        str | None,
        typer.Option(
            "--breakdown",
            help="TENANTS,BATCH of the breakdown table, or none (default 8,4; real: none).",
        ),
    ] = None,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model-dir", help="Use this saved model instead of building one."),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Shared-forward throughput, serial vs grouped: speedup grid, forward breakdown and
    measured memory."""
    from joynexus.bench.group_batching import print_report, run_group_batching

    real = size == REAL
    if arch == PI05:
        # lerobot builds it, tiny or at its smallest real variant.
        _check_model_options("paligemma", "tiny", device)
        if size not in ("tiny", REAL):
            raise typer.BadParameter("pi05 is built at --size tiny or real", param_hint="--size")
        check_pi05_reference(model_dir)
    elif real:
        check_real_arch(arch)
        _check_model_options("qwen2_5_vl", "tiny", device)
    elif arch == "smolvla":
        # A tiny LeRobot SmolVLA checkpoint, built by the real lerobot in its venv.
        _check_model_options("smolvlm", size, device)
        if size != "tiny":
            raise typer.BadParameter("smolvla is built at --size tiny or real", param_hint="--size")
    else:
        _check_model_options(arch, size, device)
    result = run_group_batching(
        arch=arch,
        size=size,
        tenants=_int_list(tenants or ("8" if real else "2,4,6,8"), "--tenants"),
        batches=_int_list(batch or ("1" if real else "1,2,4,8"), "--batch"),
        device=device,
        repeats=repeats,
        warmup=warmup,
        breakdown=parse_breakdown(breakdown or ("none" if real else "8,4")),
        threads=threads,
        model_dir=model_dir,
        progress=lambda line: console.print(f"[dim]measuring {line}[/dim]"),
    )
    print_report(result, console)
    _write_json(result, json_path)


@bench_app.command("serving")
def bench_serving(
    tenants: Annotated[
        str,
        typer.Option(
            "--tenants",
            help="Tenants; several (1,2,4,8,16,32,64) run the tenant-scaling sweep on one "
            "shared server, against one server per tenant while they fit --memory-budget-mb.",
        ),
    ] = "8",
    clients_per_tenant: Annotated[
        int | None,
        typer.Option(
            "--clients-per-tenant",
            min=1,
            help="Closed-loop clients each (default 2; the scaling sweep: 1).",
        ),
    ] = None,
    duration_s: Annotated[
        float, typer.Option("--duration-s", min=0.1, help="Timed load per deployment / point.")
    ] = 20.0,
    requests: Annotated[
        int | None,
        typer.Option("--requests", min=1, help="Stop each client after this many requests."),
    ] = None,
    size: ModelSizeOption = "tiny",
    arch: Annotated[
        str,
        typer.Option("--arch", help="The backbone (real: smolvla | qwen2_5_vl)."),
    ] = "qwen2_5_vl",
    threads: Annotated[
        int,
        typer.Option("--threads", min=1, help="OMP threads of every baseline server process."),
    ] = 1,
    ours_threads: Annotated[
        int | None,
        typer.Option(
            "--ours-threads",
            min=1,
            help="OMP threads of the shared server (default: the usable cores; it may use "
            "every core, the baseline's servers share the same ones).",
        ),
    ] = None,
    canonicalizer: Annotated[
        list[str] | None,
        typer.Option(
            "--canonicalizer",
            help="Every server's --canonicalizer: tensor (default) or processor. Repeat "
            "it (--canonicalizer processor --canonicalizer tensor) to run both "
            "deployments once per value, in that order, side by side in one run.",
        ),
    ] = None,
    front_procs: Annotated[
        list[int] | None,
        typer.Option(
            "--front-procs",
            min=0,
            help="Ours' --front-procs (default: serve's, usable cores - 1). Repeat it "
            "(--front-procs 0 --front-procs 1) to run ours once per value against one "
            "baseline run; the baseline's servers always run with 0.",
        ),
    ] = None,
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="paired: one shared server vs one server per tenant (default); "
            "noisy-neighbour: on one shared server, a victim's one-row predicts alone and "
            "beside another tenant's flood of large predicts (its p99 beside its quiet "
            "p99), then concurrent get_data reads (server memory). --duration-s is each "
            "phase's; --size, --ours-threads and the first --front-procs apply.",
        ),
    ] = "paired",
    tenant_batch_rows: Annotated[
        int | None,
        typer.Option(
            "--tenant-batch-rows",
            min=1,
            help="noisy-neighbour: the server's --tenant-batch-rows, C (default: serve's).",
        ),
    ] = None,
    memory_budget_mb: Annotated[
        float | None,
        typer.Option(
            "--memory-budget-mb",
            min=1,
            help="The baseline starts only the servers that fit in this (the rest of its "
            "memory is computed and flagged). Default: no cap (real: 7000; the scaling "
            "sweep: 6000).",
        ),
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option("--baseline/--no-baseline", help="Scaling sweep: also one server per tenant."),
    ] = True,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Scaling sweep: write its PNG here."),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """One shared server vs one single-policy server per tenant: req/s, p99, RSS; with
    several --tenants, how they grow with tenants (or, with --scenario noisy-neighbour,
    one tenant's flood against another's requests)."""
    counts = _int_list(tenants, "--tenants")
    if size == REAL:
        check_real_arch(arch)
    else:
        _check_model_options(arch, size, "cpu")
    if scenario not in ("paired", "noisy-neighbour"):
        raise typer.BadParameter(
            f"{scenario!r}: expected paired or noisy-neighbour", param_hint="--scenario"
        )
    if len(counts) > 1:
        if scenario != "paired":
            raise typer.BadParameter(
                "several --tenants run the scaling sweep (paired scenario only)",
                param_hint="--scenario",
            )
        _scaling(
            counts,
            size,
            arch,
            clients_per_tenant or 1,
            duration_s,
            requests,
            threads,
            ours_threads,
            memory_budget_mb,
            baseline,
            plot,
            json_path,
        )
        return
    if scenario == "noisy-neighbour":
        from joynexus.bench.noisy_neighbour import run_noisy_neighbour_bench
        from joynexus.bench.serving_report import print_noisy_neighbour_report

        noisy = run_noisy_neighbour_bench(
            duration_s=duration_s,
            size=size,
            ours_threads=ours_threads,
            front_procs=front_procs[0] if front_procs else None,
            tenant_batch_rows=tenant_batch_rows,
            progress=_progress,
        )
        print_noisy_neighbour_report(noisy, console)
        _write_json(noisy, json_path)
        return
    kinds = canonicalizer or ["tensor"]
    for kind in kinds:
        if kind not in ("tensor", "processor"):
            raise typer.BadParameter(
                f"{kind!r}: expected tensor or processor", param_hint="--canonicalizer"
            )
    if len(set(kinds)) != len(kinds):
        raise typer.BadParameter("each value at most once", param_hint="--canonicalizer")
    from joynexus.bench.serving import print_report, run_serving_bench

    result = run_serving_bench(
        tenants=counts[0],
        clients_per_tenant=clients_per_tenant or 2,
        duration_s=duration_s,
        requests=requests,
        size=size,
        arch=arch,
        threads=threads,
        ours_threads=ours_threads,
        canonicalizers=kinds,
        front_procs=front_procs,
        memory_budget_mb=memory_budget_mb,
        progress=_progress,
    )
    print_report(result, console)
    _write_json(result, json_path)


def _scaling(
    counts: list[int],
    size: str,
    arch: str,
    clients: int,
    duration_s: float,
    requests: int | None,
    threads: int,
    ours_threads: int | None,
    budget_mb: float | None,
    baseline: bool,
    plot: Path | None,
    json_path: Path | None,
) -> None:
    from joynexus.bench.serving_report import print_scaling_report
    from joynexus.bench.tenant_scaling import DEFAULT_BUDGET_MB, run_tenant_scaling, write_plot

    result = run_tenant_scaling(
        tenants=counts,
        size=size,
        arch=arch,
        clients_per_tenant=clients,
        duration_s=duration_s,
        requests=requests,
        threads=threads,
        ours_threads=ours_threads,
        memory_budget_mb=budget_mb or DEFAULT_BUDGET_MB,
        baseline=baseline,
        progress=_progress,
    )
    print_scaling_report(result, console)
    if plot is not None:
        console.print(f"wrote {write_plot(result, plot)}")
    _write_json(result, json_path)
