"""Qwen2.5-VL and Qwen3-VL as resident architectures.

Both read their cameras as flattened patches with one grid per image, write the prompt
through the chat template, and take a canonical size only where the processor keeps it
as it is (a multiple of patch × merge within its pixel bounds). Their vision tower skips
repeated work (:mod:`~joynexus.models.archs.qwen_vl.vision_share`) and their rope
positions are kept per prompt (:mod:`~joynexus.models.archs.qwen_vl.positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.archs.base import Resident, ResidentArch
from joynexus.models.archs.qwen_vl import vision_share
from joynexus.models.archs.qwen_vl.positions import RopePositions
from joynexus.models.canon.canonicalize import PixelLayout, PromptStyle
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.types import BackboneOutput

# StarVLA-style Qwen backbones see 224-px cameras; it is a multiple of 28 and of 32.
DEFAULT_SIZE = 224


class QwenVLResident(Resident):
    """A loaded Qwen-VL base model with its vision and rope savings installed."""

    prompt: ClassVar[PromptStyle] = "chat"
    pixels: ClassVar[PixelLayout | None] = "patches"

    def __init__(self, arch: str, model: torch.nn.Module, processor: Any, **kwargs: Any):
        super().__init__(arch, model, processor, **kwargs)
        self.vision = vision_share.install(model)
        self.positions = RopePositions.of(model)
        self.shares_blanks = self.vision is not None
        self.caches_positions = self.positions is not None

    def check_canonical_size(self) -> None:
        super().check_canonical_size()
        size = self.canonical_image_size
        ip = self.processor.image_processor
        factor = int(ip.patch_size) * int(ip.merge_size)
        lo, hi = int(ip.size["shortest_edge"]), int(ip.size["longest_edge"])
        if size % factor or not lo <= size * size <= hi:
            raise InvalidRequestError(
                f"canonical_image_size {size} does not fit {self.arch}: it must be a "
                f"multiple of {factor} (patch × merge) with size² in [{lo}, {hi}] "
                "pixels, so the processor keeps it unchanged",
                field="canonical_image_size",
            )

    def prepare(self, feature: VLAFeature) -> None:
        if self.vision is not None:
            # Planned here, from the CPU mask: no device-to-host copy in the forward.
            feature.blank_plan = vision_share.blank_plan(feature.camera_mask)

    def encode(self, feature: VLAFeature, output_layers: Sequence[int]) -> BackboneOutput:
        # What the model would compute first, computed here and handed in through the
        # forward's own arguments (``position_ids``, ``mm_encoder_outputs``).
        inputs: dict[str, Any] = dict(feature.model_inputs)
        if self.positions is not None and (found := self.positions(inputs)) is not None:
            inputs["position_ids"] = found
        pixels, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
        if self.vision is not None and pixels is not None and grid is not None:
            del inputs["pixel_values"]
            image = self.vision.image_features(pixels, grid, feature.blank_plan)
            inputs["mm_encoder_outputs"] = {"image": image}
        return self.forward(inputs, feature, output_layers)


class QwenVLArch(ResidentArch):
    resident = QwenVLResident

    def default_size(self, config: Any) -> int:
        return DEFAULT_SIZE


class Qwen25VL(QwenVLArch):
    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)


class Qwen3VL(QwenVLArch):
    name = "qwen3_vl"
    model_types = ("qwen3_vl",)


ARCHES: tuple[ResidentArch, ...] = (Qwen25VL(), Qwen3VL())

__all__ = ["ARCHES", "QwenVLResident"]
