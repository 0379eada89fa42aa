"""Commands of the control plane: ``version`` and ``bench control-plane``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus import __version__
from joynexus.cli.app import app, bench_app

console = Console()


@app.command()
def version() -> None:
    """Print the installed JoyNexus version."""
    console.print(f"joynexus {__version__}")


@bench_app.command("control-plane")
def bench_control_plane(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON here.")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer iterations (for smoke tests).")
    ] = False,
) -> None:
    """Scheduler transitions/s, Training Queue MB/s, Inference Queue overhead per request."""
    from joynexus.bench.control_plane import print_table, run_control_plane_bench

    results = run_control_plane_bench(quick=quick, progress=True)
    print_table(results, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")
