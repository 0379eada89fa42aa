"""``joynexus spec schema`` and ``joynexus spec check FILE``: workload specs from the shell."""

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
    file: Annotated[Path, typer.Argument(help="A YAML file with one spec or a list of them.")],
) -> None:
    """Validate a spec file; exit 1 and list every problem when it does not validate."""
    from joynexus.errors import SpecError
    from joynexus.spec.workload import load_specs

    console = Console()
    try:
        specs = load_specs(file)
    except SpecError as error:
        Console(stderr=True).print(f"[red]{error.message}[/red]", highlight=False)
        raise typer.Exit(1) from None
    for spec in specs:
        console.print(f"[green]ok[/green] {spec.tenant}: {spec.task.value}", highlight=False)
