"""LeRobot π0 and π0.5 checkpoints as resident architectures (``base_model.id``: a
LeRobot ``pi0`` or ``pi05`` policy directory; architectures ``lerobot_pi0``,
``lerobot_pi05``).

The resident part is the checkpoint's PaliGemma prefix, loaded once per server and
frozen (:class:`~joynexus.models.archs.lerobot_pi.checkpoint.LeRobotPiCheckpoint`); its
extension is the checkpoint itself, which ``pi0_expert`` / ``pi05_expert`` tenants ask
for to copy the expert from. The canonical inputs are the cameras in [-1, 1] with their
mask and the instruction's bytes; the forward writes each row's prompt (π0.5: from its
instruction and its *normalized* state — the tenant's units: the Inference Model
Service and the training batches hand the backbone normalized state; π0: the
instruction alone), tokenizes it, and runs the prefix over every tenant's rows at once.
A tenant without statistics of its own takes the checkpoint's (π0.5: quantiles, π0:
mean/std, as lerobot's processors normalize).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from joynexus.errors import InvalidRequestError
from joynexus.interop.lerobot import hub_family
from joynexus.models.archs.base import LoadRequest, Resident, ResidentArch, fitting_statistics
from joynexus.models.archs.lerobot_pi.checkpoint import (
    PI0_TYPE,
    PI05_TYPE,
    LeRobotPiCheckpoint,
    Pi0LeRobotCheckpoint,
    Pi05Checkpoint,
)
from joynexus.models.canon.canonicalize import BatchEncoder
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

PI05_ARCH = "lerobot_pi05"
PI0_ARCH = "lerobot_pi0"


class LeRobotPiEncoder:
    """Canonical π inputs: cameras scaled to [-1, 1] (SigLIP's range, as lerobot's
    ``_preprocess_images``), their mask, and each instruction's UTF-8 bytes (π0.5's
    prompt needs the state too, so prompts are written at the forward)."""

    def encode(
        self,
        images: torch.Tensor,
        camera_mask: torch.Tensor,
        texts: Sequence[str],
        device: torch.device,
    ) -> dict[str, torch.Tensor]:
        raw = [t.encode("utf-8") for t in texts]
        width = max(1, max(len(r) for r in raw))
        table = torch.zeros((len(raw), width), dtype=torch.uint8)
        for i, r in enumerate(raw):
            table[i, : len(r)] = torch.frombuffer(bytearray(r), dtype=torch.uint8)
        return {
            "pixel_values": images.to(device).float() / 255.0 * 2.0 - 1.0,
            "camera_mask": camera_mask.to(device),
            "instruction_bytes": table,
            "instruction_length": torch.tensor([len(r) for r in raw], dtype=torch.long),
        }


def _instructions(inputs: dict[str, torch.Tensor]) -> list[str]:
    table, lengths = inputs["instruction_bytes"], inputs["instruction_length"]
    return [
        bytes(table[i, : int(n)].tolist()).decode("utf-8") for i, n in enumerate(lengths.tolist())
    ]


class LeRobotPiPrefix(Resident):
    """A π0 / π0.5 checkpoint's prefix: its own inputs, the prompts written (π0.5: with
    each row's state) at the forward, the prefix KV cache handed to the tenants' experts."""

    takes_output_layers: ClassVar[bool] = False

    def __init__(self, arch: str, model: torch.nn.Module, processor: Any, **kwargs: Any):
        super().__init__(arch, model, processor, **kwargs)
        if not isinstance(self.extension, LeRobotPiCheckpoint):
            raise TypeError("a LeRobot π prefix is built with its LeRobotPiCheckpoint")
        self.checkpoint = self.extension

    def encoder(self, tensor: bool) -> tuple[BatchEncoder | None, str | None]:
        # π's inputs are its own: one path whatever was asked for.
        return LeRobotPiEncoder(), None

    def images_per_row(self, feature: VLAFeature) -> int:
        return self.num_camera_slots

    def prompts(self, feature: VLAFeature) -> list[str]:
        """Each row's prompt: its instruction and (π0.5) its own state dims."""
        state = feature.state.detach().cpu().double().numpy()
        own = feature.state_mask.detach().cpu().numpy()
        return [
            self.checkpoint.prompt(text, state[i][own[i]])
            for i, text in enumerate(_instructions(feature.model_inputs))
        ]

    def prepare(self, feature: VLAFeature) -> None:
        # Prompts are written and tokenized here, from the CPU tables, before the
        # backbone's lock is taken.
        pixels = feature.model_inputs["pixel_values"]
        feature.model_inputs.update(self.checkpoint.tokenize(self.prompts(feature), pixels.device))

    def encode(self, feature: VLAFeature, output_layers: Sequence[int]) -> BackboneOutput:
        inputs = feature.model_inputs
        if "input_ids" not in inputs:
            self.prepare(feature)
        out = self.checkpoint.encode(
            inputs["pixel_values"], inputs["camera_mask"], inputs["input_ids"], inputs["lang_mask"]
        )
        return BackboneOutput(
            hidden_states=out.hidden_states,
            attention_mask=out.attention_mask,
            prefix_kv=out.prefix_kv,
            images=feature.images,
        )

    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        return fitting_statistics(self.checkpoint.normalization(), schema)


class LeRobotPi(ResidentArch):
    """A LeRobot π policy directory of one family (``checkpoint``'s ``TYPE``)."""

    resident = LeRobotPiPrefix
    checkpoint: ClassVar[type[LeRobotPiCheckpoint]] = Pi05Checkpoint

    def claims(self, model_id: str, *, local_only: bool) -> str | None:
        path = Path(model_id).expanduser()
        if path.is_dir():
            return str(path) if self.checkpoint.claims(path) else None
        if hub_family(model_id) != self.checkpoint.TYPE:
            return None
        # ``lerobot/pi05_*``: fetched once into the hub cache (its tokenizer, PaliGemma's,
        # comes from the hub cache too).
        from huggingface_hub import snapshot_download

        return str(snapshot_download(model_id, local_files_only=local_only))

    def load(self, request: LoadRequest) -> Resident:
        checkpoint = self.checkpoint(Path(request.path), device=request.device, dtype=request.dtype)
        if request.canonical_image_size not in (None, checkpoint.image_size):
            raise InvalidRequestError(
                f"canonical_image_size {request.canonical_image_size}: this "
                f"{checkpoint.LABEL} checkpoint sees {checkpoint.image_size}-pixel cameras; "
                "leave it unset",
                field="canonical_image_size",
            )
        return LeRobotPiPrefix(
            self.name,
            checkpoint.vlm,
            checkpoint.tokenizer,
            canonical_image_size=checkpoint.image_size,
            num_camera_slots=request.num_camera_slots or checkpoint.num_cameras,
            extension=checkpoint,
        )


class LeRobotPi05(LeRobotPi):
    """A LeRobot ``pi05`` policy directory."""

    name = PI05_ARCH
    checkpoint = Pi05Checkpoint


class LeRobotPi0(LeRobotPi):
    """A LeRobot ``pi0`` policy directory (transformers' π0 is ``paligemma``'s ``pi0``)."""

    name = PI0_ARCH
    checkpoint = Pi0LeRobotCheckpoint


ARCHES: tuple[ResidentArch, ...] = (LeRobotPi0(), LeRobotPi05())

__all__ = [
    "ARCHES",
    "PI0_ARCH",
    "PI0_TYPE",
    "PI05_ARCH",
    "PI05_TYPE",
    "LeRobotPi",
    "LeRobotPi0",
    "LeRobotPi05",
    "LeRobotPiEncoder",
    "LeRobotPiPrefix",
]
