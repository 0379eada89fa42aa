"""The trace simulator's command: ``simulate`` (``demo`` lives in :mod:`joynexus.cli.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import app
from joynexus.errors import JoyNexusError

console = Console()

ScenarioOpt = Annotated[
    str,
    typer.Option(
        "--scenario",
        help="A preset (paper-5.1, scale-64) or a scenario YAML file.",
    ),
]
JsonOpt = Annotated[
    Path | None, typer.Option("--json", help="Also write the results as JSON here.")
]
ScaleOpt = Annotated[
    int | None,
    typer.Option("--scale", min=1, help="Override the number of nodes (8 GPUs each in 5.1)."),
]
AblationsOpt = Annotated[
    bool,
    typer.Option(
        "--ablations",
        help="Also rerun the experiment with one scheduling knob changed at a time.",
    ),
]
WindowOpt = Annotated[
    float | None,
    typer.Option("--window-minutes", min=0.1, help="Override the matched window."),
]


def _run(
    scenario: str,
    json_path: Path | None,
    scale: int | None,
    window: float | None,
    ablations: bool = False,
) -> None:
    from joynexus.sim.ablation import ablation_table, run_ablations
    from joynexus.sim.experiment import run_experiment, summarize
    from joynexus.sim.report import print_report, write_json
    from joynexus.sim.scenario import load_scenario, scenario_from_dict

    try:
        sc = load_scenario(scenario)
        update: dict[str, object] = {}
        if scale is not None:
            update["scale"] = scale
        if window is not None:
            update["window_s"] = window * 60.0
        if update:
            sc = scenario_from_dict(sc.model_dump(mode="json") | update, origin="--scale/--window")
        with console.status("simulating…") as status:
            exp = run_experiment(sc, progress=lambda msg: status.update(f"simulating: {msg}"))
            summary = summarize(exp)
            if ablations:
                summary["ablations"] = run_ablations(
                    sc, progress=lambda msg: status.update(f"simulating: {msg}")
                )
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(code=2) from None
    print_report(summary, console)
    if ablations:
        console.print(ablation_table(summary["ablations"]))
    if json_path is not None:
        write_json(summary, json_path)
        console.print(f"wrote {json_path}")


@app.command()
def simulate(
    scenario: ScenarioOpt = "paper-5.1",
    json_path: JsonOpt = None,
    scale: ScaleOpt = None,
    window_minutes: WindowOpt = None,
    ablations: AblationsOpt = False,
) -> None:
    """Trace-driven simulation of multi-tenant vs isolated execution (paper §5.1).

    Drives the real Training Scheduler with simulated service durations and prints
    Table 1 (utilization), Figure 9 (GPU time) and per-tenant matched work.
    """
    _run(scenario, json_path, scale, window_minutes, ablations)
