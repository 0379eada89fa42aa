"""Commands of the model layer: ``models make-tiny``, ``models export``, ``models export-pi0``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from joynexus.cli.app import app

console = Console()

models_app = typer.Typer(help="Backbone models: build tiny offline models.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("make-tiny")
def make_tiny_command(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the model into.")],
    arch: Annotated[
        str | None,
        typer.Option("--arch", help="qwen2_5_vl | qwen3_vl | paligemma | smolvlm | pi0"),
    ] = None,
    family: Annotated[
        str | None,
        typer.Option(
            "--family",
            help="A LeRobot policy instead of a VLM: smolvla (built by the real lerobot "
            "classes in the LeRobot venv), pi0 | pi05 (by lerobot 0.6.1's classes in the "
            "reference environment), saved in LeRobot's layout",
        ),
    ] = None,
    size: Annotated[
        str,
        typer.Option(
            "--size",
            help="tiny (~1M params, tests) | small (~20M, benchmarks) | 3b (~3.4B, GPU "
            "benchmarks); with --family pi0|pi05: tiny | real (lerobot's unmodified "
            "gemma_300m policy, ~1.9B params, 7.8 GB)",
        ),
    ] = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Weight-initialisation seed.")] = 0,
    camera_slots: Annotated[
        int, typer.Option("--camera-slots", help="Camera slots of the canonical input.")
    ] = 2,
) -> None:
    """Build a randomly initialised model of a real VLM architecture, or (``--family``) a
    LeRobot policy, offline, and save it."""
    from joynexus.models.tiny import ARCHES, SIDECAR, SIZES, make_tiny

    if (arch is None) == (family is None):
        raise typer.BadParameter("give exactly one of --arch and --family", param_hint="--arch")
    if family is not None:
        _make_tiny_lerobot(family, out, seed=seed, size=size)
        return
    if arch not in ARCHES:
        raise typer.BadParameter(f"must be one of {', '.join(ARCHES)}", param_hint="--arch")
    if size not in SIZES:
        raise typer.BadParameter(f"must be one of {', '.join(SIZES)}", param_hint="--size")
    if camera_slots < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--camera-slots")
    path = make_tiny(arch, out, size=size, seed=seed, num_camera_slots=camera_slots)
    info = json.loads((path / SIDECAR).read_text())
    console.print(
        f"wrote {arch} ({size}, {info['num_parameters']:,} parameters, "
        f"canonical {info['canonical_image_size']} px, {camera_slots} camera slots) to {path}"
    )


def _make_tiny_lerobot(family: str, out: Path, *, seed: int, size: str = "tiny") -> None:
    from joynexus.errors import JoyNexusError
    from joynexus.interop.lerobot import TINY_FAMILIES, make_tiny_lerobot, read_lerobot_checkpoint
    from joynexus.interop.tiny_pi import TINY_PI_FAMILIES, make_tiny_pi

    if family not in (*TINY_FAMILIES, *TINY_PI_FAMILIES):
        raise typer.BadParameter(
            f"must be one of {', '.join((*TINY_FAMILIES, *TINY_PI_FAMILIES))}",
            param_hint="--family",
        )
    if size != "tiny" and not (size == "real" and family in TINY_PI_FAMILIES):
        raise typer.BadParameter(
            f"--family {family} is built at --size tiny"
            + (" or real" if family in TINY_PI_FAMILIES else ""),
            param_hint="--size",
        )
    try:
        if family in TINY_PI_FAMILIES:
            # lerobot 0.6.1 (Python 3.13) runs in the reference environment only; a
            # real-size build takes minutes (one model in memory, 7.8 GB in fp32).
            timeout = 3000.0 if size == "real" else 900.0
            built = make_tiny_pi(family, out, seed=seed, size=size, timeout=timeout)
            ckpt = read_lerobot_checkpoint(built)
        else:
            ckpt = make_tiny_lerobot(family, out, seed=seed)
    except JoyNexusError as error:
        # One line, whatever the terminal's width: what failed and how to fix it.
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    console.print(
        f"wrote a LeRobot {ckpt.type} policy (chunk {ckpt.chunk_size}, state "
        f"{ckpt.state_dim}/{ckpt.max_state_dim}, action {ckpt.action_dim}/"
        f"{ckpt.max_action_dim}, cameras {ckpt.cameras}) to {ckpt.path}",
        highlight=False,
    )


@models_app.command("export-pi0")
def export_pi0_command(
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint", help="A pi0_expert tenant checkpoint (outputs/<tenant>/step_<n>)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the policy into.")],
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model",
            help="The π0 base model it trained on (default: the one its manifest names).",
        ),
    ] = None,
) -> None:
    """Export a tenant's π0 expert with the resident prefix as a complete
    PI0ForConditionalGeneration directory (plain transformers loads it); the same as
    ``models export --format pi0``."""
    path = _export("pi0", checkpoint, out, base_model)
    console.print(f"wrote a PI0ForConditionalGeneration policy to {path}")


@models_app.command("export")
def export_command(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the policy into.")],
    export_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="lerobot (a smolvla_expert, or a pi0_expert / pi05_expert tenant on a "
            "LeRobot π checkpoint) | pi0",
        ),
    ] = "lerobot",
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="A tenant checkpoint (outputs/<tenant>/step_<n>)."),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="The tenant (workload), with --version.")
    ] = None,
    version: Annotated[
        int | None,
        typer.Option("--version", help="Its checkpoint step (default: the latest)."),
    ] = None,
    outputs: Annotated[
        Path, typer.Option("--outputs", help="The run's output directory (with --tenant).")
    ] = Path("outputs"),
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model", help="The base model it trained on (default: its manifest's)."
        ),
    ] = None,
) -> None:
    """Export a tenant's trained policy with the resident prefix as a standalone policy:
    ``--format lerobot`` writes a LeRobot SmolVLA, π0 or π0.5 directory (lerobot's
    from_pretrained loads it), ``--format pi0`` a PI0ForConditionalGeneration directory."""
    from joynexus.models.checkpoints.payload import checkpoint_dir, find_latest_checkpoint

    if export_format not in EXPORT_FORMATS:
        raise typer.BadParameter(
            f"must be one of {', '.join(EXPORT_FORMATS)}", param_hint="--format"
        )
    if (checkpoint is None) == (tenant is None):
        raise typer.BadParameter("give --checkpoint, or --tenant", param_hint="--checkpoint")
    if tenant is not None:
        found = (
            checkpoint_dir(outputs, tenant, version)
            if version is not None
            else find_latest_checkpoint(outputs, tenant)
        )
        if found is None or not found.is_dir():
            raise typer.BadParameter(
                f"no checkpoint of tenant {tenant!r} in {outputs}", param_hint="--tenant"
            )
        checkpoint = found
    assert checkpoint is not None
    path = _export(export_format, checkpoint, out, base_model)
    files = ", ".join(sorted(p.name for p in path.iterdir()))
    console.print(f"wrote a {export_format} policy to {path}: {files}")


EXPORT_FORMATS = ("lerobot", "pi0")


def _export(export_format: str, checkpoint: Path, out: Path, base_model: str | None) -> Path:
    """Load the base model a tenant checkpoint trained on and export the tenant."""
    import tempfile

    from joynexus.errors import JoyNexusError
    from joynexus.models.checkpoints.lerobot_export import export_lerobot_checkpoint
    from joynexus.models.checkpoints.payload import read_manifest
    from joynexus.models.checkpoints.pi0_export import export_pi0_checkpoint
    from joynexus.runtime.plane import load_base_model
    from joynexus.spec.workload import BaseModelSpec

    exporters = {"lerobot": export_lerobot_checkpoint, "pi0": export_pi0_checkpoint}
    try:
        manifest = read_manifest(checkpoint)
        model_id = base_model or manifest.base_model_id
        if export_format == "lerobot" and manifest.data_schema is None:
            console.print(
                "note: this checkpoint predates recorded tenant schemas; the exported "
                "image features are the base checkpoint's, not the tenant's cameras",
                highlight=False,
            )
        # A checkpoint names a tiny model by its spec id (tiny:pi0, tiny:smolvla): it is
        # rebuilt from its fixed seed in a scratch directory, and exported while that
        # still exists (a LeRobot export copies the checkpoint's config and processors).
        with tempfile.TemporaryDirectory() as cache:
            base = load_base_model(BaseModelSpec(id=model_id), Path(cache))
            return exporters[export_format](checkpoint, out, base=base)
    except JoyNexusError as error:
        raise typer.BadParameter(str(error), param_hint="--checkpoint") from None
