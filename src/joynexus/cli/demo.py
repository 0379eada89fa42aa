"""``joynexus demo``: the §5.1 mixture on an in-process Master vs the isolated baseline."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import app
from joynexus.errors import JoyNexusError

console = Console()


@app.command()
def demo(
    minutes: Annotated[
        float,
        typer.Option(
            "--minutes",
            min=0.1,
            help="Budget of the whole demo; completion targets scale with it. Under 8 "
            "minutes the faster simulators replace LIBERO and ManiSkill3.",
        ),
    ] = 10.0,
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (report.json, plots, runs).")
    ] = Path("runs/demo"),
    profile: Annotated[
        str | None,
        typer.Option("--envs", help="Force the simulators: paper | fast | test."),
    ] = None,
    rl_updates: Annotated[
        int | None, typer.Option("--rl-updates", min=1, help="Override RL updates per tenant.")
    ] = None,
    sft_jobs: Annotated[
        int | None, typer.Option("--sft-jobs", min=1, help="Override the SFT jobs.")
    ] = None,
) -> None:
    """Run 3 RL + 1 SFT tenants + an evaluation on one resident backbone, then replay
    the same matched work one tenant at a time, and compare (paper §5.1)."""
    from joynexus.demo.mixture import PROFILES
    from joynexus.demo.runner import run_demo

    if profile is not None and profile not in PROFILES:
        console.print(f"[red]error:[/red] --envs must be one of {list(PROFILES)}, got {profile!r}")
        raise typer.Exit(2)
    console.print(
        "[bold]joynexus demo[/bold]: multi-tenant run on an in-process Master "
        f"(tiny backbone), then the isolated baseline; budget {minutes:g} min"
    )
    try:
        asyncio.run(
            run_demo(
                out,
                minutes=minutes,
                profile=profile,  # checked against PROFILES above
                rl_updates=rl_updates,
                sft_jobs=sft_jobs,
                console=console,
            )
        )
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
