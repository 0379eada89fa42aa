"""A LeRobot SmolVLA checkpoint as the resident base model: its prefix, once per server.

The resident part is the checkpoint's vision-language prefix — SmolVLM's vision tower,
connector and truncated text layers — frozen. :meth:`SmolVLAResident.encode` runs it once
over every tenant's rows and hands the tenants the per-layer keys and values of the
*shared* prefix (cameras, then language) in
:attr:`~joynexus.models.types.BackboneOutput.prefix_kv`.

SmolVLA also puts a projected *state* token at the end of its prefix, and the projection
(``state_proj``) is a tenant's. The prefix stays shared because no image or language
token attends to the state token (it opens its own attention block): their keys and
values do not depend on any tenant. Each tenant's expert extends the shared cache by
its own state token through the frozen layers
(:meth:`~joynexus.models.archs.smolvlm.smolvla.SmolVLA.with_state`), which is exactly the cache
lerobot computes for the whole prefix in one pass.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from joynexus.errors import SpecError
from joynexus.interop.lerobot import (
    ACTION_KEY,
    STATE_KEY,
    LeRobotCheckpoint,
    SchemaDims,
    hub_family,
    is_lerobot_dir,
    read_lerobot_checkpoint,
    schema_problems,
)
from joynexus.models.archs.smolvlm.smolvla import SmolVLA
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

SMOLVLA_ARCH = "smolvla"
#: SmolVLA's training times: ``Beta(1.5, 1)·0.999 + 0.001`` (fixed in its design, not
#: in its config).
TIME_BETA_ALPHA = 1.5
TIME_SCALE = 0.999
TIME_OFFSET = 0.001


def smolvla_source(model_id: str, *, local_only: bool) -> Path | None:
    """The directory of a SmolVLA checkpoint ``model_id`` names (a local LeRobot
    directory, or a ``lerobot/smolvla_*`` hub id fetched once into the hub cache),
    ``None`` for anything else.

    Raises:
        SpecError: a LeRobot policy of another family (not hosted).
    """
    path = Path(os.path.expanduser(model_id))
    if path.is_dir():
        if not is_lerobot_dir(path):
            return None
        kind = read_lerobot_checkpoint(path).type
    else:
        family = hub_family(model_id)
        if family is None:
            return None
        kind = family
    if kind != SMOLVLA_ARCH:
        raise SpecError(
            f"base model {model_id!r} is a LeRobot {kind!r} policy; JoyNexus hosts LeRobot "
            f"{SMOLVLA_ARCH!r} checkpoints as a resident prefix (docs/BACKBONES.md)",
            field="base_model.id",
        )
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_id, local_files_only=local_only))


class SmolVLAEncoder:
    """Canonical SmolVLA inputs: the canonical cameras in [0, 1] with their mask, and
    the tokenized instructions (right-padded, as SmolVLA trains)."""

    def __init__(self, model: SmolVLA):
        self.model = model

    def encode(
        self,
        images: torch.Tensor,
        camera_mask: torch.Tensor,
        instructions: Sequence[str],
        device: torch.device,
    ) -> dict[str, torch.Tensor]:
        ids, lang = self.model.tokenize(list(instructions), device)
        # Float frames are the canonicalizer's lerobot reading (camera_pixels); uint8
        # ones the squares (a caller without it).
        pixels = images.to(device).float()
        return {
            "pixel_values": pixels if images.is_floating_point() else pixels / 255.0,
            "camera_mask": camera_mask.to(device),
            "input_ids": ids,
            "attention_mask": lang.long(),
        }


class SmolVLAResident:
    """A loaded SmolVLA checkpoint, frozen: the shared prefix and the template of every
    tenant's expert (``model.model.state_proj``, ``model.core.lm_expert`` ...)."""

    def __init__(self, model: SmolVLA):
        model.requires_grad_(False)
        self.model = model.eval()

    @classmethod
    def load(cls, path: Path, *, device: torch.device, dtype: torch.dtype) -> SmolVLAResident:
        model = SmolVLA.from_lerobot(path)
        return cls(model.to(device=device, dtype=dtype))

    @property
    def ckpt(self) -> LeRobotCheckpoint:
        return self.model.ckpt

    @property
    def image_size(self) -> int:
        height, width = self.model.image_size
        return max(height, width)

    @property
    def num_cameras(self) -> int:
        return max(1, len(self.ckpt.cameras))

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.state_proj.weight.dtype

    def encode(self, inputs: dict[str, torch.Tensor]) -> BackboneOutput:
        """The shared prefix over every row: the last layer's hidden states (zero at
        padding), validity and per-layer keys/values ``[B, P, kv_heads, head_dim]``."""
        pixels = inputs["pixel_values"]
        images = [self.model.prepare_image(pixels[:, i]) for i in range(pixels.shape[1])]
        embs, pad = self.model.embed_shared(
            images, inputs["input_ids"], inputs["attention_mask"].bool(), inputs["camera_mask"]
        )
        cache, hidden = self.model.shared_forward(embs, pad)
        hidden = hidden.masked_fill(~pad[..., None], 0.0)
        return BackboneOutput(
            hidden_states=hidden, attention_mask=pad.long(), prefix_kv=tuple(cache)
        )

    def normalization(self) -> NormalizationStats | None:
        """The checkpoint's own statistics (its preprocessor's normalizer), as a
        tenant's mean/std normalization (quantiles stand in from min/max when the
        checkpoint has no q01/q99); ``None`` when it has no mean/std of both the state
        and the action."""
        for key in (STATE_KEY, ACTION_KEY):
            if not {"mean", "std"} <= set(self.ckpt.stats.get(key, {})):
                return None

        def pick(key: str) -> FeatureNormStats:
            stats: dict[str, Any] = self.ckpt.stats[key]
            return FeatureNormStats(
                mean=stats["mean"],
                std=stats["std"],
                q01=stats.get("q01", stats.get("min", stats["mean"])),
                q99=stats.get("q99", stats.get("max", stats["mean"])),
            )

        return NormalizationStats(mode="mean_std", state=pick(STATE_KEY), action=pick(ACTION_KEY))

    def check_dims(self, name: str, *, state_dim: int, action_dim: int, action_chunk: int) -> None:
        """Raise unless a tenant of these dims fits the checkpoint's expert.

        Raises:
            SpecError: naming each offending schema field and the checkpoint's limit.
        """
        dims = SchemaDims(state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk)
        problems = schema_problems(self.ckpt, dims)
        if problems:
            raise SpecError(
                f"a 'smolvla_expert' for schema {name!r} does not fit this SmolVLA "
                "checkpoint:\n" + "\n".join(f"  {f}: {m}" for f, m in problems),
                fields=[f for f, _ in problems],
                problems=dict(problems),
            )

    def check_schema(self, schema: DataSchema) -> None:
        """:meth:`check_dims` of ``schema``."""
        self.check_dims(
            schema.name,
            state_dim=schema.state_dim,
            action_dim=schema.action_dim,
            action_chunk=schema.action_chunk,
        )
