"""``joynexus demo``: the §5.1 mixture on an in-process Master vs the isolated baseline.

Off a terminal (output to a file or a pipe) the console is wide
(:data:`PLAIN_WIDTH` columns), so the report's tables are not cut at 80 columns, and
progress comes as plain lines (:class:`joynexus.demo.runner.PlainProgress`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from joynexus.cli.app import app
from joynexus.cli.cores import DEVICE_CORES_HELP, core_plan_or_exit
from joynexus.errors import JoyNexusError

#: Console width when stdout is not a terminal (rich would use 80).
PLAIN_WIDTH = 200


def demo_console() -> Console:
    """A console for the demo: the terminal's width, or :data:`PLAIN_WIDTH` off one."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(PLAIN_WIDTH, console.width))
    return console


@app.command()
def demo(
    minutes: Annotated[
        float,
        typer.Option(
            "--minutes",
            min=0.1,
            help="Budget of the whole demo; completion targets scale with it. Under 8 "
            "minutes (or when LIBERO or ManiSkill3 cannot run here) the faster "
            "simulators replace LIBERO and ManiSkill3.",
        ),
    ] = 10.0,
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (report.json, plots, runs).")
    ] = Path("runs/demo"),
    profile: Annotated[
        str | None,
        typer.Option(
            "--envs",
            help="Force the simulators: paper | fast | test (stops at once, saying what to "
            "install or set, when they cannot run here).",
        ),
    ] = None,
    rl_updates: Annotated[
        int | None, typer.Option("--rl-updates", min=1, help="Override RL updates per tenant.")
    ] = None,
    sft_jobs: Annotated[
        int | None, typer.Option("--sft-jobs", min=1, help="Override the SFT jobs.")
    ] = None,
    success_episodes: Annotated[
        int | None,
        typer.Option(
            "--success-episodes",
            min=0,
            help="Episodes of each RL and SFT tenant's success-rate measurement, before "
            "and after its training in its isolated replay (0: not measured). Default: "
            "2 per RL tenant with the paper's simulators, 6 with the fast ones (each "
            "episode adds about 50 s and 10 s to the demo), and 40 for the SFT tenant "
            "(MetaWorld, about 4 s per episode measured twice).",
        ),
    ] = None,
    device_cores: Annotated[
        str,
        typer.Option(
            "--device-cores",
            help=DEVICE_CORES_HELP + " Default: auto (recorded in report.json).",
        ),
    ] = "auto",
) -> None:
    """Run 3 RL + 1 SFT tenants + an evaluation on one resident backbone, then replay
    the same matched work one tenant at a time, and compare (paper §5.1)."""
    from joynexus.demo.mixture import PROFILES
    from joynexus.demo.runner import run_demo

    console = demo_console()
    if profile is not None and profile not in PROFILES:
        console.print(f"[red]error:[/red] --envs must be one of {list(PROFILES)}, got {profile!r}")
        raise typer.Exit(2)
    console.print(
        "[bold]joynexus demo[/bold]: multi-tenant run on an in-process Master "
        f"(tiny backbone), then the isolated baseline; budget {minutes:g} min"
    )
    plan = core_plan_or_exit(device_cores, console)
    try:
        asyncio.run(
            run_demo(
                out,
                minutes=minutes,
                profile=profile,  # checked against PROFILES above
                rl_updates=rl_updates,
                sft_jobs=sft_jobs,
                console=console,
                core_plan=plan,
                success_episodes=success_episodes,
            )
        )
    except JoyNexusError as exc:
        # One line, never wrapped: what to install or set.
        console.print(
            f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True, emoji=False
        )
        raise typer.Exit(1) from None
