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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch

from joynexus.interop.lerobot import ACTION_KEY, STATE_KEY
from joynexus.models.normalization import NormalizationStats
from joynexus.models.policies.smolvla_expert.module import lerobot_names
from joynexus.models.policies.smolvla_expert.resident import SmolVLAResident, smolvla_of
from joynexus.models.policies.tenant_export import read_tenant_expert
from joynexus.models.smolvla import export_smolvla

LEROBOT_FORMAT = "lerobot"


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
) -> Path:
    """Write the resident prefix plus one tenant's ``expert`` (tensors by the tenant
    module's names) and normalization as a LeRobot SmolVLA directory.

    Raises:
        InvalidRequestError: ``expert`` holds a tensor the checkpoint has not (or of
            another shape).
    """
    stats = None if normalization is None else lerobot_stats(normalization)
    path = export_smolvla(resident.model, out, stats=stats, tensors=lerobot_names(expert))
    if stats is not None:
        config_file = path / "config.json"
        config = json.loads(config_file.read_text())
        for group, key in (("input_features", STATE_KEY), ("output_features", ACTION_KEY)):
            if key in stats and key in config.get(group, {}):
                config[group][key]["shape"] = [len(stats[key]["mean"])]
        config_file.write_text(json.dumps(config, indent=4))
    return path


def export_lerobot_checkpoint(checkpoint: str | Path, out: str | Path, *, base: Any) -> Path:
    """Export the ``smolvla_expert`` tenant checkpoint ``checkpoint`` into ``out``.

    Raises:
        NotFoundError: no checkpoint there.
        InvalidRequestError: the checkpoint is not of a ``smolvla_expert``.
        SpecError: ``base`` is not a SmolVLA base model.
    """
    expert, stats = read_tenant_expert(checkpoint, "smolvla_expert", "a LeRobot SmolVLA policy")
    resident = smolvla_of(base, what="export --format lerobot")
    return export_smolvla_expert(resident, expert, stats, out)
