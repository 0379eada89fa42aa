"""A ``pi05_expert`` (``pi0_expert``) tenant on a LeRobot π0.5 (π0) checkpoint → a
LeRobot 0.6.1 ``pi05`` (``pi0``) policy directory.

``joynexus models export --format lerobot`` of such a tenant writes what lerobot's
``save_pretrained`` writes for its policy, so that lerobot's ``from_pretrained``
+ ``make_pre_post_processors`` + ``select_action`` compute the tenant's actions:

* ``model.safetensors``: every tensor of the resident checkpoint under the names
  lerobot 0.6.1's ``PI05Policy`` / ``PI0Policy`` saves (``model.paligemma_with_expert.…``,
  ``model.action_in_proj.…``; π0.5's ``model.time_mlp_in.…``, π0's
  ``model.state_proj.…`` and ``model.action_time_mlp_in.…``), the expert and its projections
  replaced by the tenant's, and the shared prefix's weights with the tenant's LoRA (if
  any) merged into copies of them, ``W + scale · B @ A``; each tensor keeps the
  checkpoint's dtype.
* ``config.json`` and the processor pipelines (``policy_preprocessor.json``,
  ``policy_postprocessor.json`` and their normalizer ``state_file``\\ s), the
  checkpoint's own with the tenant's cameras, state/action widths and statistics.
* the tokenizer the processor names: a folder the checkpoint carries travels as that
  relative folder (lerobot resolves it against its working folder: run it from the
  exported folder); an absolute folder is copied in as ``tokenizer/``; a hub id stays.
* ``joynexus.json`` when the checkpoint has one (the sizes of a checkpoint smaller than
  lerobot's variants, which config.json cannot name).

Normalization: the tenant normalizes by ``(x − center) / scale``
(:meth:`NormalizationStats.center_scale`, floors applied). The exported statistics
express that one affine map in every form lerobot's modes read (``mean``/``std``;
``q01``/``q99`` and ``min``/``max`` as ``center ∓ scale``), so the processors' modes
(π0.5: quantiles, π0: mean/std) stay as they are and still normalize the state
(π0.5: before it is discretized into the prompt) exactly as the tenant did. A tenant
without statistics of its own exports the checkpoint's unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from joynexus.errors import InvalidRequestError, SpecError
from joynexus.interop.lerobot import (
    ACTION_KEY,
    IMAGE_PREFIX,
    POSTPROCESSOR,
    PREPROCESSOR,
    STATE_KEY,
    WEIGHTS,
)
from joynexus.models.archs.lerobot_pi.checkpoint import (
    EXPERT_KEYS,
    PREFIX_KEYS,
    LeRobotPiCheckpoint,
    Pi0LeRobotCheckpoint,
    Pi05Checkpoint,
)
from joynexus.models.checkpoints.payload import read_manifest
from joynexus.models.checkpoints.tenant_export import read_tenant_expert
from joynexus.models.lora import peft_deltas
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.tiny import SIDECAR
from joynexus.models.types import describe_base, extension_of

#: The LeRobot π families by their tenants' head type.
LEROBOT_PI_HEADS: dict[str, type[LeRobotPiCheckpoint]] = {
    Pi0LeRobotCheckpoint.HEAD: Pi0LeRobotCheckpoint,
    Pi05Checkpoint.HEAD: Pi05Checkpoint,
}
#: Where a tokenizer from an absolute folder travels inside an export.
LOCAL_TOKENIZER = "tokenizer"
#: lerobot's ``PI05Policy`` keeps its model under this attribute (its saved names).
POLICY_MODEL = "model."
_NORMALIZERS = ("normalizer_processor", "unnormalizer_processor")


def _fail(message: str, field: str = "checkpoint", label: str = "π0.5") -> InvalidRequestError:
    return InvalidRequestError(f"export (LeRobot {label}): {message}", field=field)


def policy_tensors(
    pi: LeRobotPiCheckpoint,
    expert: dict[str, torch.Tensor],
    lora: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under lerobot 0.6.1's saved names, the tenant's
    ``expert`` (by the tenant module's names) in place of the checkpoint's, ``lora``
    (backbone module name → delta) merged into copies of the prefix weights.

    Raises:
        InvalidRequestError: a tenant tensor or LoRA delta has no tensor of its shape
            in the checkpoint.
    """
    label = pi.LABEL
    state = pi.lerobot_names(load_file(str(pi.root / WEIGHTS)))
    for name, value in expert.items():
        if name.startswith("gemma_expert."):
            key = EXPERT_KEYS + name.removeprefix("gemma_expert.")
        elif name.startswith(pi.PROJECTIONS):
            key = name
        else:
            raise _fail(
                f"the tenant's expert holds {name!r}, which {label} has no place for",
                label=label,
            )
        old = state.get(key)
        if old is None or old.shape != value.shape:
            raise _fail(
                f"the tenant's {name!r} {list(value.shape)} has no tensor {key!r} of its "
                f"shape in the {label} checkpoint",
                label=label,
            )
        state[key] = value.detach().to("cpu", old.dtype).contiguous()
    for name, delta in lora.items():
        # The resident names SigLIP without lerobot's ``vision_model.`` level.
        keys = [PREFIX_KEYS + name + ".weight"]
        keys.append(keys[0].replace(".vision_tower.", ".vision_tower.vision_model.", 1))
        found = next((k for k in keys if k in state and state[k].shape == delta.shape), None)
        if found is None:
            raise _fail(
                f"the tenant's LoRA adapts {name!r}, which has no weight of shape "
                f"{list(delta.shape)} in this {label} checkpoint to merge into; refusing to "
                "export a policy that would act otherwise",
                field="lora",
                label=label,
            )
        weight = state[found]
        state[found] = (weight.to(torch.float32) + delta.to(torch.float32)).to(weight.dtype)
    return {POLICY_MODEL + k: v.contiguous() for k, v in state.items()}


def _affine_stats(stats: NormalizationStats) -> dict[str, dict[str, np.ndarray]]:
    """The tenant's normalization per lerobot feature key, in every form lerobot's
    modes read (see the module docstring)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    features: tuple[tuple[Literal["state", "action"], str], ...] = (
        ("action", ACTION_KEY),
        ("state", STATE_KEY),
    )
    for which, key in features:
        if which == "state" and stats.state is None:
            continue
        center, scale = stats.center_scale(which)
        low, high = center - scale, center + scale
        out[key] = {
            "mean": center,
            "std": scale,
            "q01": low,
            "q99": high,
            "min": low,
            "max": high,
        }
    return out


def _write_stats(file: Path, stats: dict[str, dict[str, np.ndarray]]) -> None:
    """Replace the statistics of ``stats``' features in normalizer state ``file``."""
    tensors = load_file(str(file)) if file.is_file() else {}
    for key, fields in stats.items():
        tensors = {k: v for k, v in tensors.items() if not k.startswith(key + ".")}
        for field, values in fields.items():
            tensors[f"{key}.{field}"] = torch.tensor(values, dtype=torch.float32)
    save_file(tensors, str(file))


def _features(
    features: dict[str, Any], widths: dict[str, int], schema: DataSchema | None
) -> dict[str, Any]:
    """``features`` with the tenant's state/action widths and, where ``features`` has
    cameras, the tenant's cameras instead (in its order, of its ``[C, H, W]``)."""
    out = {k: dict(v) for k, v in features.items()}
    for key, width in widths.items():
        if key in out:
            out[key]["shape"] = [width]
    if schema is None or not any(k.startswith(IMAGE_PREFIX) for k in out):
        return out
    cameras = {
        f"{IMAGE_PREFIX}{name}": {"type": "VISUAL", "shape": [cam.channels, cam.height, cam.width]}
        for name, cam in schema.cameras.items()
    }
    return {**cameras, **{k: v for k, v in out.items() if not k.startswith(IMAGE_PREFIX)}}


def _tokenizer(root: Path, out: Path, step: dict[str, Any]) -> None:
    """Bring the tokenizer the step names into ``out``, named relative to it."""
    config = step.get("config", {})
    name = str(config.get("tokenizer_name", ""))
    if not name:
        return
    source = Path(name) if Path(name).is_absolute() else root / name
    if not source.is_dir():
        if Path(name).is_absolute():
            raise _fail(f"the processor's tokenizer folder {name!r} is gone", "tokenizer_name")
        return  # a hub id: lerobot fetches or finds it by that name
    target = LOCAL_TOKENIZER if Path(name).is_absolute() else name
    shutil.copytree(source, out / target, dirs_exist_ok=True)
    config["tokenizer_name"] = target


def _processor(
    root: Path,
    out: Path,
    file_name: str,
    stats: dict[str, dict[str, np.ndarray]] | None,
    widths: dict[str, int],
    schema: DataSchema | None,
) -> None:
    pipeline = json.loads((root / file_name).read_text())
    for step in pipeline.get("steps", []):
        config = step.get("config", {})
        if step.get("registry_name") == "tokenizer_processor":
            _tokenizer(root, out, step)
        state_file = step.get("state_file")
        if state_file:
            shutil.copyfile(root / state_file, out / state_file)
        if step.get("registry_name") in _NORMALIZERS:
            if isinstance(config.get("features"), dict):
                config["features"] = _features(config["features"], widths, schema)
            if stats is not None and state_file:
                _write_stats(out / state_file, stats)
    (out / file_name).write_text(json.dumps(pipeline, indent=2))


def export_pi_expert(
    pi: LeRobotPiCheckpoint,
    expert: dict[str, torch.Tensor],
    normalization: NormalizationStats | None,
    out: str | Path,
    *,
    lora: dict[str, torch.Tensor] | None = None,
    schema: DataSchema | None = None,
) -> Path:
    """Write the resident π0 / π0.5 checkpoint with one tenant's ``expert`` (tensors by
    the tenant module's names), ``normalization`` and merged ``lora`` as a LeRobot
    policy directory of its family that stands alone (no path of this machine inside);
    ``schema`` (the tenant's) gives the cameras.

    Raises:
        InvalidRequestError: ``expert`` or ``lora`` names a tensor the checkpoint has
            not (or of another shape), or the processor's tokenizer folder is gone.
    """
    root, path = pi.root, Path(out)
    path.mkdir(parents=True, exist_ok=True)
    save_file(policy_tensors(pi, expert, lora or {}), str(path / WEIGHTS))
    stats = None if normalization is None else _affine_stats(normalization)
    widths = {k: len(v["mean"]) for k, v in (stats or {}).items()}
    for file_name in (PREPROCESSOR, POSTPROCESSOR):
        _processor(root, path, file_name, stats, widths, schema)
    config = json.loads((root / "config.json").read_text())
    config["input_features"] = _features(config.get("input_features", {}), widths, schema)
    config["output_features"] = _features(config.get("output_features", {}), widths, None)
    config["pretrained_path"] = None
    (path / "config.json").write_text(json.dumps(config, indent=4))
    if (root / SIDECAR).is_file():
        shutil.copyfile(root / SIDECAR, path / SIDECAR)
    return path


def export_lerobot_pi_checkpoint(
    checkpoint: str | Path, out: str | Path, *, base: Any, schema: DataSchema | None = None
) -> Path:
    """Export the ``pi0_expert`` / ``pi05_expert`` tenant checkpoint ``checkpoint``
    into ``out``; ``schema``: the tenant's, for the cameras (else the checkpoint's).

    Raises:
        NotFoundError: no checkpoint there.
        InvalidRequestError: the checkpoint is of neither, or holds a LoRA adapter with a
            layer that cannot be merged.
        SpecError: ``base`` is not a LeRobot checkpoint of the tenant's family.
    """
    head = str(read_manifest(checkpoint).head.get("type"))
    family = LEROBOT_PI_HEADS.get(head, Pi05Checkpoint)
    expert, stats = read_tenant_expert(checkpoint, family.HEAD, f"a LeRobot {family.LABEL} policy")
    pi = extension_of(base, family)
    if pi is None:
        raise SpecError(
            f"export --format lerobot of a {family.HEAD!r} tenant needs a LeRobot "
            f"{family.LABEL} base model (a {family.TYPE} policy directory); the resident "
            f"base model {describe_base(base)}",
            field="base_model.id",
        )
    try:
        lora = peft_deltas(checkpoint)
    except ValueError as error:
        raise _fail(str(error), "lora", label=family.LABEL) from error
    return export_pi_expert(pi, expert, stats, out, lora=lora, schema=schema)
