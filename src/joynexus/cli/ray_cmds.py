"""Runtime choice for ``joynexus run`` (``--runtime embedded|ray``) and
``joynexus scale rollout N``.

There is no long-running server to send a scaling request to yet, so ``scale rollout``
acts on a runtime in this process: it runs the given workloads and, once they are
running, scales the rollout-engine pool to N (serialized, rolled back on failure),
printing the pool before and after.
"""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from joynexus.cli.app import app
from joynexus.errors import JoyNexusError

console = Console()

scale_app = typer.Typer(help="Elastic scaling of resident services.", no_args_is_help=True)
app.add_typer(scale_app, name="scale")


class RuntimeKind(StrEnum):
    embedded = "embedded"
    ray = "ray"


def make_runtime(
    kind: RuntimeKind | str,
    run_dir: Path,
    *,
    address: str | None = None,
    layout: str = "2-2-4",
    engines: int = 1,
) -> Any:
    """The runtime ``joynexus run`` / ``scale`` use: embedded (engine pool + health) or Ray.

    Raises:
        SpecError: an unknown layout.
        ServiceUnavailableError: ``ray`` was asked for but is not installed.
    """
    from joynexus.errors import ServiceUnavailableError

    if RuntimeKind(kind) is RuntimeKind.embedded:
        from joynexus.runtime.managed import ManagedRuntime

        return ManagedRuntime(run_dir, engines=engines)
    try:
        from joynexus.runtime.ray_runtime import RayRuntime
    except ImportError as exc:  # pragma: no cover - ray is an optional extra
        raise ServiceUnavailableError(
            "--runtime ray needs the 'ray' extra: pip install 'joynexus[ray]'"
        ) from exc
    return RayRuntime(run_dir, address=address, layout=layout, engines=engines)


def close_runtime(runtime: Any) -> None:
    close = getattr(runtime, "close", None)
    if close is not None:
        close()


@scale_app.command("rollout")
def scale_rollout(
    engines: Annotated[int, typer.Argument(help="Rollout engines to scale the pool to.")],
    specs: Annotated[list[Path], typer.Argument(help="Workload spec YAML file(s) to run.")],
    runtime: Annotated[RuntimeKind, typer.Option("--runtime")] = RuntimeKind.embedded,
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster ('auto'); default: local.")
    ] = None,
    layout: Annotated[str, typer.Option("--layout", help="Ray layout, e.g. 2-2-4.")] = "2-2-4",
    run_dir: Annotated[Path, typer.Option("--run-dir")] = Path("runs/joynexus-scale"),
) -> None:
    """Run workloads and scale the rollout-engine pool to ENGINES while they run."""
    from joynexus.spec.workload import load_specs
    from joynexus.workflows.compile import compile_workloads

    try:
        compiled = compile_workloads([s for path in specs for s in load_specs(path)])
        rt = make_runtime(runtime, run_dir, address=address, layout=layout)
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    async def main() -> Any:
        run = asyncio.create_task(rt.run(compiled))
        while rt.inference is None and not run.done():  # wait until the pool serves
            await asyncio.sleep(0.1)
        if not run.done():
            before = [s.model_dump() for s in rt.pool.status()]
            try:
                size = await rt.scale_rollout(engines)
                console.print(f"rollout pool: {len(before)} → {size} engine(s)")
            except JoyNexusError as exc:
                console.print(f"[red]scaling failed (rolled back):[/red] {exc}")
            console.print_json(json.dumps([s.model_dump() for s in rt.pool.status()]))
        return await run

    try:
        summary = asyncio.run(main())
    except JoyNexusError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    finally:
        close_runtime(rt)
    console.print_json(json.dumps(summary.to_json()))
