"""``joynexus usage``: per-tenant usage a run's meter persisted (``<run_dir>/usage.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from joynexus.cli.app import app
from joynexus.metrics.usage import SERVICES, USAGE_FILE, UsageReport

console = Console()


@app.command()
def usage(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="The run directory holding usage.json.")
    ],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON here.")
    ] = None,
) -> None:
    """Per-tenant device-seconds on each shared service, requests, samples and env steps."""
    path = run_dir / USAGE_FILE
    if not path.is_file():
        console.print(
            f"[red]no {USAGE_FILE} in {run_dir}[/red]: the run's usage meter writes it "
            "while the run is metered (UsageMeter(path=<run_dir>/usage.json))"
        )
        raise typer.Exit(code=1)
    report = UsageReport.load(path)
    table = Table(title=f"usage of {run_dir}")
    table.add_column("tenant")
    for service in SERVICES:
        table.add_column(f"{service} s", justify="right")
    for name in ("total s", "requests", "inference samples", "samples trained", "env steps"):
        table.add_column(name, justify="right")
    for tid, u in report.tenants.items():
        table.add_row(
            tid,
            *(f"{u.device_seconds.get(s, 0.0):.3f}" for s in SERVICES),
            f"{u.total_device_seconds:.3f}",
            str(u.requests),
            str(u.inference_samples),
            str(u.samples_trained),
            str(u.env_steps),
        )
    table.add_row(
        "[bold]measured[/bold]",
        *(f"{report.service_seconds.get(s, 0.0):.3f}" for s in SERVICES),
        f"{sum(report.service_seconds.values()):.3f}",
        "",
        "",
        "",
        "",
    )
    console.print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")
