"""Dataset commands: ``joynexus data record``, ``data import`` and ``data info``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from joynexus.cli.app import app
from joynexus.errors import DatasetError, JoyNexusError

console = Console()

data_app = typer.Typer(
    help="LeRobot-format datasets: record or import demonstrations, inspect datasets.",
    no_args_is_help=True,
)
app.add_typer(data_app, name="data")


@data_app.command("record")
def record(
    env: Annotated[str, typer.Option("--env", help="Env kind, e.g. pusht or metaworld.")],
    out: Annotated[Path, typer.Option("--out", help="Dataset directory to create.")],
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Episodes to record.")] = 10,
    policy: Annotated[str, typer.Option("--policy", help="Expert: only 'scripted'.")] = "scripted",
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="Task within the env (MetaWorld: reach-v3; ManiSkill: PickCube-v1; "
            "LIBERO: libero_spatial/0).",
        ),
    ] = None,
    image_size: Annotated[
        int | None, typer.Option("--image-size", min=8, help="Square camera size in pixels.")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Steps per episode at most.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Episode k resets with seed + k.")] = 0,
    videos: Annotated[
        bool, typer.Option("--videos/--images", help="Cameras as mp4 videos or PNG images.")
    ] = True,
    repo_id: Annotated[
        str | None, typer.Option("--repo-id", help="Dataset id written to info.json.")
    ] = None,
    allow_failures: Annotated[
        bool,
        typer.Option(
            "--allow-failures",
            help="Keep the recording even when the expert succeeded in no episode "
            "(implies --keep-failures).",
        ),
    ] = False,
    keep_failures: Annotated[
        bool,
        typer.Option(
            "--keep-failures",
            help="Also write the episodes in which the expert failed (default: only "
            "successful demonstrations).",
        ),
    ] = False,
) -> None:
    """Record scripted expert demonstrations into a LeRobot v3.0 dataset.

    Writes the episodes in which the expert succeeded (all of them with
    ``--keep-failures``; episode k always resets with seed + k) and prints the expert's
    success rate. Exits 1 and writes nothing when the expert succeeded in none of the
    episodes (demonstrations that never succeed teach nothing), unless
    ``--allow-failures``. ManiSkill records in the experts' end-effector control mode
    (pd_ee_delta_pos); LIBERO's expert handles tasks whose goal puts one object on
    another (libero_spatial, and libero_goal's "put the bowl on the plate" and the like).
    """

    from joynexus.data.record import record_episodes, refuse_failed_expert
    from joynexus.envs.base import EnvSpec

    def report(ep: int, length: int, success: bool) -> None:
        mark = "[green]success[/green]" if success else "[yellow]no success[/yellow]"
        console.print(f"episode {ep}: {length} frames, {mark}")

    try:
        options: dict[str, object] = {}
        if env == "maniskill":  # its experts steer the end effector's position
            from joynexus.data.maniskill_expert import EXPERT_CONTROL_MODE

            options["control_mode"] = EXPERT_CONTROL_MODE
        spec = EnvSpec(kind=env, task=task, image_size=image_size, options=options)
        summary = record_episodes(
            spec,
            out,
            episodes=episodes,
            policy=policy,
            seed=seed,
            max_steps=max_steps,
            use_videos=videos,
            repo_id=repo_id,
            on_episode=report,
            keep_failures=keep_failures or allow_failures,
        )
    except DatasetError as exc:  # no episode succeeded: nothing was written
        console.print(f"[red]error:[/red] {exc.message}; or pass --allow-failures")
        raise typer.Exit(code=1) from None
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(code=2) from exc
    rate = (
        f"expert success rate {summary.success_rate:.0%} "
        f"({summary.successes}/{summary.episodes} episodes)"
    )
    if not allow_failures:
        try:
            refuse_failed_expert(summary, policy)
        except JoyNexusError as exc:
            console.print(f"[red]error:[/red] {exc.message} ({rate}); or pass --allow-failures")
            raise typer.Exit(code=1) from None
    console.print(f"wrote {summary.root}: {summary.kept} episodes, {summary.frames} frames; {rate}")
    if summary.successes == 0:
        console.print(
            "[yellow]warning:[/yellow] the expert never succeeded: these episodes are "
            "failures, not expert demonstrations"
        )


@data_app.command("info")
def info(root: Annotated[Path, typer.Argument(help="Dataset directory.")]) -> None:
    """Validate a LeRobot dataset (v3.0 or v2.x) and print its summary."""
    from joynexus.data.reader import LeRobotDataset

    try:
        ds = LeRobotDataset(root)
    except JoyNexusError as exc:
        console.print(f"[red]invalid dataset:[/red] {exc.message}")
        raise typer.Exit(code=2) from exc
    meta = ds.meta
    console.print(
        f"{root}: LeRobot {meta.version}, {ds.num_episodes} episodes, {len(ds)} frames, "
        f"{meta.fps:g} fps, {len(meta.tasks)} tasks, robot_type={meta.info.robot_type}"
    )
    table = Table("feature", "dtype", "shape")
    for key, feat in meta.features.items():
        table.add_row(key, feat.dtype, str(list(feat.shape)))
    console.print(table)


@data_app.command("import")
def import_dataset(
    path: Annotated[Path, typer.Argument(help="A file or folder of demonstrations.")],
    source: Annotated[
        str, typer.Option("--from", help="Their format: only 'libero-hdf5' (LIBERO's demo files).")
    ],
    out: Annotated[Path, typer.Option("--out", help="LeRobot v3.0 dataset directory to create.")],
    image_size: Annotated[
        int | None, typer.Option("--image-size", min=8, help="Resize cameras to this square.")
    ] = None,
    videos: Annotated[
        bool, typer.Option("--videos/--images", help="Cameras as mp4 videos or PNG images.")
    ] = True,
    repo_id: Annotated[
        str | None, typer.Option("--repo-id", help="Dataset id written to info.json.")
    ] = None,
) -> None:
    """Convert demonstrations recorded elsewhere into a LeRobot v3.0 dataset.

    ``--from libero-hdf5``: LIBERO's official ``*_demo.hdf5`` files (one file, or a
    suite's folder); frames come out as the LIBERO env serves them (cameras rotated by
    180°, state 8, actions 7), so a tenant trains on them and is evaluated in LIBERO.
    """
    if source != "libero-hdf5":
        console.print(f"[red]error:[/red] unknown --from {source!r}; known: libero-hdf5")
        raise typer.Exit(code=2)
    from joynexus.data.libero_hdf5 import import_libero_hdf5

    try:
        summary = import_libero_hdf5(
            path,
            out,
            image_size=image_size,
            use_videos=videos,
            repo_id=repo_id,
            on_episode=lambda task, k, n: console.print(f"{task}: demo {k}, {n} frames"),
        )
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(code=2) from exc
    console.print(
        f"wrote {summary.root}: {summary.episodes} episodes, {summary.frames} frames, "
        f"{len(summary.tasks)} tasks from {summary.files} files"
    )
