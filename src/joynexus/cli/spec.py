"""``joynexus spec schema`` and ``joynexus spec check FILE``: workload specs from the shell.

``spec check`` runs the checks ``joynexus run`` runs before it starts
(:func:`joynexus.workflows.compile.compile_workloads`), accepts the ``custom``
workloads a server takes (``joynexus submit``), and asks whether the base model can be
loaded here without the network (:func:`joynexus.models.availability.check_base_model`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import app

spec_app = typer.Typer(help="Workload specs: print their JSON Schema, validate a file.")
app.add_typer(spec_app, name="spec")


@spec_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of workload specs."""
    from joynexus.spec.workload import spec_json_schema  # pulls in the model layer

    typer.echo(json.dumps(spec_json_schema(), indent=2, sort_keys=True))


@spec_app.command("check")
def check(
    files: Annotated[
        list[Path], typer.Argument(help="YAML file(s), each with one spec or a list of them.")
    ],
) -> None:
    """Validate spec files as ``joynexus run`` does before it starts (shape, then env
    kinds, simulator assets, datasets, evaluation targets, a base model this machine
    holds); exit 1 and say what is wrong when they do not validate."""
    from rich.markup import escape

    from joynexus.errors import JoyNexusError
    from joynexus.models.availability import check_base_model
    from joynexus.spec.workload import TaskKind, load_specs
    from joynexus.workflows.compile import compile_workloads

    console = Console()
    try:
        specs = [s for path in files for s in load_specs(path)]
        # The checks `joynexus run` runs; a `custom` workload is valid too (for a server).
        compiled = compile_workloads(specs, allow_custom=True)
        check_base_model(compiled.base_model.id)  # offline: the cache, never the hub
    except JoyNexusError as error:
        Console(stderr=True).print(
            f"[red]error:[/red] {escape(str(error))}", highlight=False, emoji=False
        )
        raise typer.Exit(1) from None
    for w in compiled.workloads:
        note = " (its dataset will be recorded first)" if w.needs_recording else ""
        if w.spec.task is TaskKind.CUSTOM:
            note = (
                " (valid; custom workloads are submitted to a server with `joynexus submit`, "
                "not run by `joynexus run`)"
            )
        console.print(f"[green]ok[/green] {w.tenant_id}: {w.task.value}{note}", highlight=False)
