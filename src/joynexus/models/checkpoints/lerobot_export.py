"""A ``smolvla_expert`` tenant → a LeRobot SmolVLA policy directory.

``joynexus models export --format lerobot`` reads one tenant checkpoint
(``outputs/<tenant>/step_<n>``), puts its expert and projections next to the resident
SmolVLA prefix and writes what LeRobot's ``save_pretrained`` writes: ``config.json``
(``type: smolvla``), ``model.safetensors`` under LeRobot's key names, and the processor
pipelines with their normalization state files. The real ``lerobot`` loads it with
``from_pretrained`` and its ``select_action`` computes the tenant's actions.

Normalization: a tenant that trained with its own statistics (its dataset's,
``NormalizationStats``) exports those — they win over the checkpoint's, because they
are the units its expert learned in; a tenant without its own statistics exports the
checkpoint's processor statistics unchanged. The state/action feature sizes in
``config.json`` follow the tenant's statistics (a narrower schema than the checkpoint's
is zero-padded by LeRobot as by JoyNexus).

LoRA: a tenant that trained a LoRA adapter (``lora:`` — language layers, vision tower,
connector) exports it merged, ``W + scale * B @ A``, into the exported copies of the
prefix weights it adapts; the resident model is never touched. LeRobot has no adapters,
so a layer that cannot be merged refuses the export (naming it) rather than exporting a
policy that acts otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import torch

from joynexus.errors import InvalidRequestError
from joynexus.interop.lerobot import ACTION_KEY, IMAGE_PREFIX, STATE_KEY
from joynexus.models.archs.smolvlm.resident import SmolVLAResident
from joynexus.models.archs.smolvlm.smolvla import export_smolvla
from joynexus.models.checkpoints.lerobot_pi_export import (
    LEROBOT_PI_HEADS,
    export_lerobot_pi_checkpoint,
)
from joynexus.models.checkpoints.payload import read_manifest
from joynexus.models.checkpoints.tenant_export import read_tenant_expert
from joynexus.models.lora import peft_deltas
from joynexus.models.normalization import NormalizationStats
from joynexus.models.policies.smolvla_expert.config import smolvla_of
from joynexus.models.policies.smolvla_expert.module import lerobot_names
from joynexus.models.schema import DataSchema

LEROBOT_FORMAT = "lerobot"
#: Where a local VLM's configuration and tokenizer travel inside an export.
LOCAL_VLM = "vlm"


def lerobot_stats(stats: NormalizationStats) -> dict[str, dict[str, list[float]]]:
    """A tenant's normalization as LeRobot mean/std statistics: LeRobot computes
    ``(x − mean) / std``, so any affine normalization (mean/std or quantiles) is its
    center and scale (floored as the tenant's own, see NormalizationStats)."""
    out: dict[str, dict[str, list[float]]] = {}
    features: tuple[tuple[Literal["state", "action"], str], ...] = (
        ("action", ACTION_KEY),
        ("state", STATE_KEY),
    )
    for which, key in features:
        if which == "state" and stats.state is None:
            continue
        center, scale = stats.center_scale(which)
        out[key] = {"mean": center.tolist(), "std": scale.tolist()}
    return out


def export_smolvla_expert(
    resident: SmolVLAResident,
    expert: dict[str, torch.Tensor],
    normalization: NormalizationStats | None,
    out: str | Path,
    *,
    lora: dict[str, torch.Tensor] | None = None,
    schema: DataSchema | None = None,
) -> Path:
    """Write the resident prefix plus one tenant's ``expert`` (tensors by the tenant
    module's names) and normalization as a LeRobot SmolVLA directory; ``lora`` (the
    tenant's adapter as :func:`~joynexus.models.lora.peft_deltas`) merged into the
    prefix weights it adapts; ``schema`` (the tenant's) gives the image features.
    The directory stands alone (:func:`stand_alone`).

    Raises:
        InvalidRequestError: ``expert`` holds a tensor the checkpoint has not (or of
            another shape), or ``lora`` adapts a layer that cannot be merged.
    """
    stats = None if normalization is None else lerobot_stats(normalization)
    tensors = {**merged_lora(resident, lora or {}), **lerobot_names(expert)}
    path = export_smolvla(resident.model, out, stats=stats, tensors=tensors)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    for group, key in (("input_features", STATE_KEY), ("output_features", ACTION_KEY)):
        if stats is not None and key in stats and key in config.get(group, {}):
            config[group][key]["shape"] = [len(stats[key]["mean"])]
    if schema is not None:
        config["input_features"] = tenant_image_features(config["input_features"], schema)
    config_file.write_text(json.dumps(config, indent=4))
    stand_alone(path)
    return path


def tenant_image_features(features: dict[str, Any], schema: DataSchema) -> dict[str, Any]:
    """The checkpoint's ``input_features`` with its cameras replaced by the tenant's,
    in the tenant's order (the order JoyNexus fills the camera slots in) and of the
    tenant's shapes ``[C, H, W]``: what the tenant's robot sends lerobot."""
    cameras = {
        f"{IMAGE_PREFIX}{name}": {"type": "VISUAL", "shape": [cam.channels, cam.height, cam.width]}
        for name, cam in schema.cameras.items()
    }
    rest = {k: v for k, v in features.items() if not k.startswith(IMAGE_PREFIX)}
    return {**cameras, **rest}


def stand_alone(path: Path) -> None:
    """Leave no path of this machine in the exported directory ``path``.

    lerobot's SmolVLA reads its VLM's configuration and tokenizer from
    ``vlm_model_name`` (the policy weights hold the VLM's weights). A hub id stays as
    it is; a local VLM folder travels with the export as ``vlm/`` and is named by that
    relative path, which lerobot resolves against its working folder (run it from the
    exported folder). Every JSON file that named the old path names the new one.
    """
    root = path.resolve()
    config = json.loads((path / "config.json").read_text())
    old = str(config.get("vlm_model_name", ""))
    if not old or not Path(old).is_absolute():
        return
    vlm = Path(old).resolve()
    if not vlm.is_dir():
        raise InvalidRequestError(
            f"export: the checkpoint's VLM folder {old!r} is gone; the exported policy "
            "would name a path of this machine",
            field="vlm_model_name",
        )
    if not vlm.is_relative_to(root):
        shutil.copytree(vlm, root / LOCAL_VLM, dirs_exist_ok=True)
        vlm = root / LOCAL_VLM
    new = vlm.relative_to(root).as_posix()
    for file in path.glob("*.json"):
        data = json.loads(file.read_text())
        file.write_text(json.dumps(_renamed(data, old, new), indent=4))


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON data) with every string equal to ``old`` (or a resolved form of
    it) replaced by ``new``."""
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    if isinstance(value, str) and value.startswith("/") and Path(value) == Path(old):
        return new
    return value


def merged_lora(
    resident: SmolVLAResident, deltas: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """New copies of the prefix weights a tenant's LoRA adapts, ``W + delta``, under
    the checkpoint's names. ``deltas`` are keyed by the backbone's module names (the
    resident VLM's, as the LoRA hooks name them).

    Raises:
        InvalidRequestError: a delta names a layer without a weight of its shape here.
    """
    vlm = resident.model.core.vlm
    prefix = next(n for n, m in resident.model.named_modules() if m is vlm)
    state = resident.model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, delta in deltas.items():
        key = f"{prefix}.{name}.weight"
        weight = state.get(key)
        if weight is None or weight.shape != delta.shape:
            raise InvalidRequestError(
                f"export: the tenant's LoRA adapts {name!r}, which has no weight {key!r} of "
                f"shape {list(delta.shape)} in this SmolVLA checkpoint to merge into; "
                "refusing to export a policy that would act otherwise",
                field="lora",
            )
        # In fp32, then the checkpoint's dtype: a copy, the resident stays as it is.
        out[key] = (weight.detach().to("cpu", torch.float32) + delta).to(weight.dtype)
    return out


def export_lerobot_checkpoint(
    checkpoint: str | Path, out: str | Path, *, base: Any, schema: DataSchema | None = None
) -> Path:
    """Export the ``smolvla_expert`` tenant checkpoint ``checkpoint`` into ``out``
    (a ``pi0_expert`` / ``pi05_expert`` one: :func:`export_lerobot_pi_checkpoint`);
    ``schema``: the tenant's,
    for the image features (default: the one its manifest records; a checkpoint written
    before manifests recorded it keeps the base checkpoint's image features).

    Raises:
        NotFoundError: no checkpoint there.
        InvalidRequestError: the checkpoint is not of a ``smolvla_expert``, or holds
            a LoRA adapter with a layer that cannot be merged.
        SpecError: ``base`` is not a SmolVLA base model.
    """
    manifest = read_manifest(checkpoint)
    schema = schema or manifest.data_schema
    if manifest.head.get("type") in LEROBOT_PI_HEADS:  # π0 / π0.5: their own module
        return export_lerobot_pi_checkpoint(checkpoint, out, base=base, schema=schema)
    expert, stats = read_tenant_expert(checkpoint, "smolvla_expert", "a LeRobot SmolVLA policy")
    resident = smolvla_of(base, what="export --format lerobot")
    try:
        lora = peft_deltas(checkpoint)
    except ValueError as error:
        raise InvalidRequestError(f"export: {error}", field="lora") from error
    return export_smolvla_expert(resident, expert, stats, out, lora=lora, schema=schema)
