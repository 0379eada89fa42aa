"""PaliGemma and π0 as resident architectures.

PaliGemma reads ``[rows · slots, C, S, S]`` images behind one ``<image>`` token per slot in
front of a plain prompt. A π0 checkpoint (``PI0ForConditionalGeneration``) is resident as
its PaliGemma prefix; its extension, :class:`~joynexus.models.archs.paligemma.pi0.
Pi0Checkpoint`, keeps the config and the pretrained action expert ``pi0_expert`` tenants
start from, and the forward returns the prefix KV cache they attend to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from joynexus.models.archs.base import LoadRequest, Resident, ResidentArch
from joynexus.models.archs.hf import hf
from joynexus.models.archs.paligemma.pi0 import PI0_MODEL_TYPE, Pi0Checkpoint
from joynexus.models.canon.canonicalize import PixelLayout, PromptStyle
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.types import BackboneOutput


class PaliGemma(ResidentArch):
    name = "paligemma"
    model_types = ("paligemma",)


class Pi0Resident(Resident):
    """A π0 prefix: each row shows its present cameras only, the processor writes the
    image tokens, and experts read the prefix KV cache (no intermediate layers)."""

    prompt: ClassVar[PromptStyle] = "text"
    pixels: ClassVar[PixelLayout | None] = "present"
    takes_output_layers: ClassVar[bool] = False

    def __init__(self, arch: str, model: torch.nn.Module, processor: Any, **kwargs: Any):
        super().__init__(arch, model, processor, **kwargs)
        if not isinstance(self.extension, Pi0Checkpoint):
            raise TypeError("a π0 resident is built with its Pi0Checkpoint")
        self.checkpoint = self.extension

    def images_per_row(self, feature: VLAFeature) -> int:
        # As many per row as the batch's widest row has cameras; the rest are masked.
        return int(feature.model_inputs["pixel_values"].shape[1])

    def encode(self, feature: VLAFeature, output_layers: Sequence[int]) -> BackboneOutput:
        out = self.checkpoint.encode(feature.model_inputs)
        return BackboneOutput(
            hidden_states=out.hidden_states,
            attention_mask=out.attention_mask,
            prefix_kv=out.prefix_kv,
            images=feature.images,
        )


class Pi0(ResidentArch):
    name = "pi0"
    model_types = (PI0_MODEL_TYPE,)
    resident = Pi0Resident

    def default_size(self, config: Any) -> int:
        return super().default_size(config.vlm_config)

    def load_model(self, request: LoadRequest) -> tuple[torch.nn.Module, object | None]:
        # The whole policy: its expert is the template of tenant experts.
        policy = hf().PI0ForConditionalGeneration.from_pretrained(
            request.path, dtype=request.dtype, local_files_only=request.local_only
        )
        pi0 = Pi0Checkpoint(policy)
        return pi0.vlm, pi0


ARCHES: tuple[ResidentArch, ...] = (PaliGemma(), Pi0())

__all__ = ["ARCHES", "Pi0Resident"]
