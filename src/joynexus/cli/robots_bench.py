"""``joynexus bench robots``: openpi robot clients, JoyNexus vs a one-at-a-time server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from joynexus.cli.app import bench_app

console = Console()


@bench_app.command("robots")
def bench_robots(
    robots: Annotated[int, typer.Option(min=1, max=256, help="Concurrent robot clients.")] = 8,
    tenants: Annotated[int, typer.Option(min=1, max=64, help="Tenants the robots use.")] = 4,
    requests: Annotated[
        int, typer.Option(min=1, max=100_000, help="Timed decisions per robot and side.")
    ] = 30,
    image_size: Annotated[
        int, typer.Option("--image-size", min=8, max=1024, help="Side of both camera images.")
    ] = 224,
    model: Annotated[str, typer.Option(help="Resident base model.")] = "tiny:qwen2_5_vl",
    client_python: Annotated[
        Path | None,
        typer.Option(
            "--client-python",
            help="Python of a venv holding openpi-client (default: .venv-openpi, which "
            "make install builds).",
        ),
    ] = None,
    front_procs: Annotated[
        list[int] | None,
        typer.Option(
            "--front-procs",
            min=0,
            max=64,
            help="Also run a `joynexus serve --front-procs N --openpi-port` process per "
            "value (repeat the option for several), its frames decoded in N front processes.",
        ),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")] = None,
) -> None:
    """N robots on the real openpi_client against JoyNexus's openpi endpoint (group-batched
    across robots and tenants) and against openpi's one-request-at-a-time server model
    (the same policies behind one sequential loop, started by the bench)."""
    import json

    from joynexus.bench.robots import print_report, run_robots_bench

    try:
        result = run_robots_bench(
            robots=robots,
            tenants=tenants,
            requests=requests,
            image_size=image_size,
            model=model,
            client_python=client_python,
            front_procs=sorted(set(front_procs or [])),
        )
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    print_report(result, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")
