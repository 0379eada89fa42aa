"""``joynexus run SPEC.yaml [SPEC.yaml ...]``: run workloads to completion on a Master.

Every spec is loaded and checked (shape and capabilities) before anything starts; a
missing SFT dataset whose spec names a recordable env is recorded first. An in-process
Master Service (:mod:`joynexus.master.run`) then runs the workloads concurrently to
their completion targets with one progress bar per tenant, and the JSON summary is
printed (and written with ``--json``).

The run directory holds all of a run's state (job history, workload records,
checkpoints): running the same specs again on it resumes what was interrupted and
reports what had finished; ``--fresh`` starts both over.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from joynexus.cli.app import app
from joynexus.cli.cores import DEVICE_CORES_HELP, core_plan_or_exit
from joynexus.cli.ray_cmds import RuntimeKind, make_placement
from joynexus.cli.tracking import Tracking, trackers_of
from joynexus.errors import JoyNexusError

console = Console()


@app.command("run")
def run(
    specs: Annotated[list[Path], typer.Argument(help="Workload spec YAML file(s).")],
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the run summary JSON here.")
    ] = None,
    run_dir: Annotated[
        Path,
        typer.Option(
            "--run-dir",
            help="All of the run's state: job history, workload records, checkpoints "
            "(outputs/<tenant>), metrics, model cache. Rerunning on it resumes.",
        ),
    ] = Path("runs/joynexus-run"),
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh", help="Delete the run directory's job history and checkpoints first."
        ),
    ] = False,
    runtime_kind: Annotated[
        RuntimeKind,
        typer.Option("--runtime", help="embedded (one process) or ray (services as actors)."),
    ] = RuntimeKind.embedded,
    address: Annotated[
        str | None, typer.Option("--address", help="--runtime ray: cluster ('auto').")
    ] = None,
    layout: Annotated[
        str, typer.Option("--layout", help="--runtime ray: actor-inference-env GPUs.")
    ] = "2-2-4",
    engines: Annotated[
        int, typer.Option("--engines", min=1, help="Rollout engines (inference replicas).")
    ] = 1,
    placement_strategy: Annotated[
        str,
        typer.Option(
            "--placement-strategy",
            help="--runtime ray: how the roles spread over nodes (PACK, SPREAD, "
            "STRICT_SPREAD, STRICT_PACK).",
        ),
    ] = "PACK",
    role_resources: Annotated[
        str | None,
        typer.Option(
            "--role-resources",
            help="--runtime ray: pin roles to nodes advertising a custom resource, "
            "e.g. 'actor=trainer,inference=rollout,environment=sim'.",
        ),
    ] = None,
    training_ranks: Annotated[
        int,
        typer.Option(
            "--training-ranks",
            min=1,
            help="--runtime ray: data-parallel ranks of the training role (at most one "
            "per actor GPU of the layout).",
        ),
    ] = 1,
    device_cores: Annotated[
        str, typer.Option("--device-cores", help=DEVICE_CORES_HELP + " Default: none.")
    ] = "none",
    tracking: Tracking = None,
) -> None:
    """Run workloads (rl, sft, eval) concurrently to completion on an in-process Master."""
    from joynexus.master.run import run_workloads
    from joynexus.models.availability import check_base_model
    from joynexus.runtime.hosting import RuntimeConfig
    from joynexus.services.environment import EnvironmentServiceConfig
    from joynexus.utils.affinity import pin_device
    from joynexus.utils.rundir_lock import RunDirLock
    from joynexus.workflows.compile import check_spec_files
    from joynexus.workflows.summary import TenantProgress

    trackers = trackers_of(tracking)
    plan = core_plan_or_exit(device_cores, console)
    if plan.pinned and RuntimeKind(runtime_kind) is not RuntimeKind.embedded:
        console.print(
            "[red]error:[/red] --device-cores pins this process and its simulator workers; "
            "it works with --runtime embedded only"
        )
        raise typer.Exit(2)
    try:
        compiled = check_spec_files(specs)  # the checks `joynexus spec check` runs
        # Offline with no cached copy, the hub client would retry for half a minute.
        check_base_model(compiled.base_model.id, require_local=False)
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    config = (
        RuntimeConfig(env=EnvironmentServiceConfig(worker_cores=plan.worker_cores))
        if plan.pinned
        else None
    )

    try:
        placement = make_placement(
            runtime_kind,
            address=address,
            layout=layout,
            engines=engines,
            strategy=placement_strategy,
            role_resources=role_resources,
            training_ranks=training_ranks,
        )
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    plain = not console.is_terminal  # a file or a pipe: a line per change, no live bars
    with Progress(
        TextColumn("[bold]{task.fields[tenant]}[/bold] {task.fields[kind]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=plain,
    ) as progress:
        bars: dict[str, TaskID] = {}
        record_bars: dict[str, TaskID] = {}

        shown: dict[str, tuple[int, bool]] = {}

        def on_progress(rows: list[TenantProgress]) -> None:
            for row in rows:
                if plain and shown.get(row.tenant) != (row.completed, row.done):
                    shown[row.tenant] = (row.completed, row.done)
                    version = "" if row.version is None else f" version {row.version}"
                    end = " done" if row.done else ""
                    console.print(
                        f"{row.tenant} {row.task}: {row.completed}/{row.target}{version}{end}",
                        highlight=False,
                    )
                info = f"version {row.version}" if row.version is not None else "eval runs"
                if row.done:
                    info += " [green]done[/green]"
                if row.tenant not in bars:
                    bars[row.tenant] = progress.add_task(
                        "", total=row.target, tenant=row.tenant, kind=row.task, info=info
                    )
                progress.update(bars[row.tenant], completed=row.completed, info=info)

        def on_record(tenant: str, ep: int, length: int, success: bool) -> None:
            spec = compiled.by_tenant()[tenant].spec
            assert spec.dataset is not None
            if tenant not in record_bars:
                record_bars[tenant] = progress.add_task(
                    "",
                    total=spec.dataset.record_episodes,
                    tenant=tenant,
                    kind="recording",
                    info="",
                )
            progress.update(record_bars[tenant], completed=ep + 1, info=f"last: {length} frames")

        try:
            # One process per run directory: a second one exits here naming the holder.
            with RunDirLock(run_dir), pin_device(plan):
                summary = asyncio.run(
                    run_workloads(
                        compiled,
                        run_dir,
                        fresh=fresh,
                        config=config,
                        placement=placement,
                        on_progress=on_progress,
                        on_status=lambda msg: progress.console.print(f"[dim]{msg}[/dim]"),
                        on_record_episode=on_record,
                        tracking=trackers,
                    )
                )
        except JoyNexusError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None
    doc = summary.to_json()
    console.print_json(json.dumps(doc))
    if json_out is not None:
        summary.write(json_out)
        console.print(f"summary written to {json_out}")
    failed = [t for t, s in summary.tenants.items() if s.state != "completed"]
    if failed:
        for t in failed:
            why = summary.tenants[t].errors[0] if summary.tenants[t].errors else "no reason given"
            console.print(f"[red]{t}: workload {summary.tenants[t].state}:[/red] {why}")
        raise typer.Exit(1)
