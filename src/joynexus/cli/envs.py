"""Commands of the Environment Service: ``env-server`` and ``bench envs``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import app, bench_app
from joynexus.errors import JoyNexusError

console = Console()


@app.command("env-server")
def env_server(
    env: Annotated[
        str,
        typer.Option(
            "--env", help="A JoyNexus env kind (pusht, metaworld, ...) or any gymnasium env id."
        ),
    ],
    task: Annotated[
        str | None, typer.Option("--task", help="Task within the kind (e.g. reach-v3).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8765,
    image_size: Annotated[
        int | None, typer.Option("--image-size", min=1, help="Square camera images of this side.")
    ] = None,
    fast_render: Annotated[
        bool, typer.Option("--fast-render/--full-render", help="Cheap rendering where supported.")
    ] = True,
    max_episode_steps: Annotated[int | None, typer.Option("--max-episode-steps", min=1)] = None,
    imports: Annotated[
        list[str] | None,
        typer.Option("--import", help="Module to import first (registers gymnasium ids)."),
    ] = None,
) -> None:
    """Serve a simulator over HTTP so a JoyNexus Environment Service can use it remotely."""
    import importlib

    from joynexus.envs.env_server import env_server_spec, serve_env

    try:
        for module in imports or []:
            importlib.import_module(module)
        spec = env_server_spec(
            env,
            task=task,
            image_size=image_size,
            fast_render=fast_render,
            max_episode_steps=max_episode_steps,
        )
        if imports and spec.kind == "gym":
            spec = spec.model_copy(update={"options": {"imports": list(imports)}})
        from joynexus.envs.registry import env_schema

        schema = env_schema(spec)  # fail fast, before binding the port
    except (JoyNexusError, ImportError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(
        f"serving {spec.kind}{'/' + spec.task if spec.task else ''} "
        f"(cameras {schema.camera_names}, state {schema.state_dim}, action {schema.action_dim}) "
        f"on http://{host}:{port}"
    )
    serve_env(spec, host=host, port=port)


@bench_app.command("envs")
def bench_envs(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON here.")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per row.")] = 50,
    num_envs: Annotated[
        int, typer.Option("--num-envs", min=2, help="Sub-envs in vectorized rows.")
    ] = 4,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer rows and steps.")] = False,
) -> None:
    """Steps/s per adapter: single vs vectorized, fast rendering on/off."""
    from joynexus.bench.envs import print_table, run_envs_bench

    results = run_envs_bench(
        steps=steps,
        num_envs=num_envs,
        quick=quick,
        progress=lambda label: console.print(f"[dim]running {label}[/dim]"),
    )
    print_table(results, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")


@bench_app.command("libero-tasks")
def bench_libero_tasks(
    suites: Annotated[
        list[str] | None,
        typer.Option("--suite", help="A LIBERO suite (repeatable; default: all five)."),
    ] = None,
    image_size: Annotated[int, typer.Option("--image-size", min=8)] = 64,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per task.")] = 5,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Only the first N tasks of each suite.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON here.")
    ] = None,
) -> None:
    """Every task of LIBERO's suites: build from BDDL, reset to init state 0, step."""
    from joynexus.bench.libero_tasks import check_libero_tasks
    from joynexus.envs.libero import SUITE_MAX_STEPS

    def show(row: dict[str, object]) -> None:
        what = f"{row['suite']}/{row['index']}"
        if row["ok"]:
            console.print(
                f"{what}: build {row['build_s']} s, reset {row['reset_s']} s, "
                f"{row['steps_per_s']} steps/s"
            )
        else:
            console.print(f"[red]{what}: {row['error']}[/red]")

    try:
        results = check_libero_tasks(
            suites or list(SUITE_MAX_STEPS),
            image_size=image_size,
            steps=steps,
            limit=limit,
            progress=show,
        )
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from exc
    for suite, row in results["suites"].items():
        console.print(f"{suite}: {row['ok']}/{row['tasks']} tasks ok, {row['steps_per_s']} steps/s")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, sort_keys=True))
    failed = sum(r["tasks"] - r["ok"] for r in results["suites"].values())
    if failed:
        raise typer.Exit(1)
