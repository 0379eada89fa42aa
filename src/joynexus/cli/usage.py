"""``joynexus usage``: per-tenant usage from a running server or a run directory.

Two sources:

* ``--url`` / ``--api-key`` (or ``JOYNEXUS_URL`` / ``JOYNEXUS_API_KEY``): the live
  meter of a running server through ``GET /v1/usage`` — a tenant key shows its own
  usage, an admin key every tenant's (``--tenant`` narrows it);
* ``--run-dir``: the report a run's meter persisted (``<run_dir>/usage.json``), also
  readable after the server stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from joynexus.api import SERVICES, UsageReport
from joynexus.cli.app import app
from joynexus.metrics.usage import USAGE_FILE

console = Console()


def usage_table(report: UsageReport, title: str) -> Table:
    """The report as a table: one row per tenant plus the measured service totals."""
    table = Table(title=title)
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
    return table


def _from_run_dir(run_dir: Path) -> UsageReport:
    path = run_dir / USAGE_FILE
    if not path.is_file():
        console.print(
            f"[red]no {USAGE_FILE} in {run_dir}[/red]: the run's usage meter writes it "
            "while the run is metered (UsageMeter(path=<run_dir>/usage.json))"
        )
        raise typer.Exit(code=1)
    return UsageReport.load(path)


def _from_server(url: str | None, api_key: str | None, tenant: str | None) -> UsageReport:
    from joynexus.client import APIError, Client

    try:
        with Client(url, api_key) as client:
            return client.usage(tenant)
    except APIError as exc:  # no server at the URL included (ServerUnreachableError)
        console.print(
            f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True, emoji=False
        )
        raise typer.Exit(code=1) from None


@app.command()
def usage(
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="Read <run-dir>/usage.json instead of asking a server."),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", envvar="JOYNEXUS_URL", help="Server URL.")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", "--key", envvar="JOYNEXUS_API_KEY", help="API key."),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant (admin keys).")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON here.")
    ] = None,
) -> None:
    """Per-tenant device-seconds on each shared service, requests, samples and env steps."""
    if run_dir is not None:
        report = _from_run_dir(run_dir)
        if tenant is not None:
            report = report.model_copy(
                update={"tenants": {t: u for t, u in report.tenants.items() if t == tenant}}
            )
        title = f"usage of {run_dir}"
    else:
        report = _from_server(url, api_key, tenant)
        title = f"usage at {url or 'the server'}"
    console.print(usage_table(report, title))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")
