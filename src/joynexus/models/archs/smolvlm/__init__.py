"""SmolVLM (Idefics3) and LeRobot SmolVLA as resident architectures.

SmolVLM reads ``[rows, slots, C, S, S]`` images (one global view per camera: tiling would
give rows different token counts) through its chat template. A LeRobot SmolVLA
checkpoint is resident as its SmolVLM prefix; its extension,
:class:`~joynexus.models.archs.smolvlm.resident.SmolVLAResident`, is the whole checkpoint
(the template of ``smolvla_expert`` tenants), its own encoder makes the inputs, the
forward returns the shared prefix's KV cache, and a tenant without statistics of its
own takes the checkpoint's processor statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.archs.base import LoadRequest, Resident, ResidentArch, fitting_statistics
from joynexus.models.archs.smolvlm.resident import (
    SMOLVLA_ARCH,
    SmolVLAEncoder,
    SmolVLAResident,
    smolvla_source,
)
from joynexus.models.archs.smolvlm.smolvla import camera_pixels
from joynexus.models.canon.canonicalize import (
    BatchEncoder,
    CanonicalSpec,
    PixelLayout,
    PromptStyle,
)
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput


class SmolVLMResident(Resident):
    prompt: ClassVar[PromptStyle] = "chat"
    pixels: ClassVar[PixelLayout | None] = "slots"
    processor_kwargs: ClassVar[tuple[tuple[str, Any], ...]] = (("do_image_splitting", False),)


class SmolVLM(ResidentArch):
    name = "smolvlm"
    model_types = ("smolvlm", "idefics3")
    resident = SmolVLMResident


class SmolVLAPrefix(Resident):
    """A SmolVLA checkpoint's prefix: its own inputs (pixels, right-padded tokens), the
    tower run once per camera slot over every row, the prefix KV cache handed on."""

    takes_output_layers: ClassVar[bool] = False

    def __init__(self, arch: str, model: torch.nn.Module, processor: Any, **kwargs: Any):
        super().__init__(arch, model, processor, **kwargs)
        if not isinstance(self.extension, SmolVLAResident):
            raise TypeError("a SmolVLA prefix is built with its SmolVLAResident")
        self.checkpoint = self.extension

    def spec(self) -> CanonicalSpec:
        # Cameras are read as lerobot reads them: float frames resized to the checkpoint's
        # square (not the uint8 squares), so a camera of another size sees what it would
        # in lerobot.
        return replace(super().spec(), model_pixels=camera_pixels)

    def encoder(self, tensor: bool) -> tuple[BatchEncoder | None, str | None]:
        # SmolVLA's inputs are its own: one path whatever was asked for.
        return SmolVLAEncoder(self.checkpoint.model), None

    def images_per_row(self, feature: VLAFeature) -> int:
        # The tower runs once per camera slot over every row: one image per row a call.
        return 1

    def encode(self, feature: VLAFeature, output_layers: Sequence[int]) -> BackboneOutput:
        out = self.checkpoint.encode(feature.model_inputs)
        return BackboneOutput(
            hidden_states=out.hidden_states,
            attention_mask=out.attention_mask,
            prefix_kv=out.prefix_kv,
            images=feature.images,
        )

    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        return fitting_statistics(self.checkpoint.normalization(), schema)


class SmolVLA(ResidentArch):
    """A LeRobot ``smolvla`` policy directory (or ``lerobot/smolvla_*`` hub id)."""

    name = SMOLVLA_ARCH
    resident = SmolVLAPrefix

    def claims(self, model_id: str, *, local_only: bool) -> str | None:
        found = smolvla_source(model_id, local_only=local_only)
        return None if found is None else str(found)

    def load(self, request: LoadRequest) -> Resident:
        checkpoint = SmolVLAResident.load(
            Path(request.path), device=request.device, dtype=request.dtype
        )
        if request.canonical_image_size not in (None, checkpoint.image_size):
            raise InvalidRequestError(
                f"canonical_image_size {request.canonical_image_size}: a SmolVLA checkpoint "
                f"sees {checkpoint.image_size}-pixel cameras; leave it unset",
                field="canonical_image_size",
            )
        return SmolVLAPrefix(
            self.name,
            checkpoint.model.core.vlm,
            checkpoint.model.tokenizer,
            canonical_image_size=checkpoint.image_size,
            num_camera_slots=request.num_camera_slots or checkpoint.num_cameras,
            extension=checkpoint,
        )


ARCHES: tuple[ResidentArch, ...] = (SmolVLM(), SmolVLA())

__all__ = ["ARCHES", "SmolVLAPrefix", "SmolVLMResident"]
