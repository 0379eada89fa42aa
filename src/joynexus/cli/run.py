"""``joynexus run SPEC.yaml [SPEC.yaml ...]``: run workloads in the embedded runtime.

Every spec is loaded and checked (shape and capabilities) before anything starts; a
missing SFT dataset whose spec names a recordable env is recorded first. The workloads
then run concurrently to their completion targets with one progress bar per tenant,
and the JSON summary is printed (and written with ``--json``).
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
from joynexus.cli.ray_cmds import RuntimeKind, close_runtime, make_runtime
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
        typer.Option("--run-dir", help="Scheduler database, model cache and default outputs."),
    ] = Path("runs/joynexus-run"),
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
) -> None:
    """Run workloads (rl, sft, eval) concurrently in the embedded or the Ray runtime."""
    from joynexus.spec.workload import load_specs
    from joynexus.workflows.compile import compile_workloads
    from joynexus.workflows.summary import TenantProgress

    try:
        loaded = [s for path in specs for s in load_specs(path)]
        compiled = compile_workloads(loaded)
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    try:
        runtime = make_runtime(runtime_kind, run_dir, address=address, layout=layout)
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    with Progress(
        TextColumn("[bold]{task.fields[tenant]}[/bold] {task.fields[kind]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    ) as progress:
        bars: dict[str, TaskID] = {}
        record_bars: dict[str, TaskID] = {}

        def on_progress(rows: list[TenantProgress]) -> None:
            for row in rows:
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
            summary = asyncio.run(
                runtime.run(
                    compiled,
                    on_progress=on_progress,
                    on_status=lambda msg: progress.console.print(f"[dim]{msg}[/dim]"),
                    on_record_episode=on_record,
                )
            )
        except JoyNexusError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None
        finally:
            close_runtime(runtime)
    doc = summary.to_json()
    console.print_json(json.dumps(doc))
    if json_out is not None:
        summary.write(json_out)
        console.print(f"summary written to {json_out}")
