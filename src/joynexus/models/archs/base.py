"""The resident-architecture contract: what the backbone asks of a loaded VLM.

:class:`~joynexus.models.backbone.ResidentBaseModel` knows no architecture. A
:class:`ResidentArch` (registered by name, :mod:`joynexus.models.archs.registry`) says
which checkpoints it loads and loads one into a :class:`Resident`; the resident says how
the model is fed (its :class:`~joynexus.models.canon.canonicalize.CanonicalSpec` and tensor
canonicalizer), runs the shared forward, and holds the *extension* a policy family may
ask for by type (a π0 checkpoint's expert template, a SmolVLA checkpoint), plus the
normalization a tenant without statistics of its own takes.

The defaults here are a plain ``transformers`` VLM base model (``AutoModel`` with its
``AutoProcessor``); an architecture overrides what differs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.archs.hf import hf, quiet_transformers
from joynexus.models.canon.canonicalize import BatchEncoder, CanonicalSpec, PixelLayout, PromptStyle
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.canon.tensor import TensorCanonicalizer
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.tiny import SIDECAR
from joynexus.models.types import BackboneOutput

DEFAULT_NUM_CAMERA_SLOTS = 2


@dataclass(frozen=True)
class LoadRequest:
    """One load, as the user asked for it.

    Attributes:
        model_id: The id or path the user named.
        path: Where to load from (a local directory or a hub id).
        local_only: Never download (a path, or ``HF_HUB_OFFLINE``).
        device: Where the frozen model runs.
        dtype: Its weights dtype.
        config: The checkpoint's ``transformers`` config (``None`` for a checkpoint an
            architecture claimed by :meth:`ResidentArch.claims`).
        canonical_image_size: Asked-for canonical square side (``None``: the default).
        num_camera_slots: Asked-for camera slots (``None``: the default).
        sidecar: The directory's ``joynexus.json`` (empty when none).
    """

    model_id: str
    path: str
    local_only: bool
    device: torch.device
    dtype: torch.dtype
    config: Any = None
    canonical_image_size: int | None = None
    num_camera_slots: int | None = None
    sidecar: Mapping[str, Any] = field(default_factory=dict)

    def slots(self) -> int:
        """The camera slots asked for, else the sidecar's, else 2.

        Raises:
            InvalidRequestError: fewer than one.
        """
        slots = self.num_camera_slots
        if slots is None:
            slots = int(self.sidecar.get("num_camera_slots") or DEFAULT_NUM_CAMERA_SLOTS)
        if slots < 1:
            raise InvalidRequestError(
                f"num_camera_slots must be >= 1, got {slots}", field="num_camera_slots"
            )
        return slots

    def size(self, default: int) -> int:
        """The canonical image size asked for, else the sidecar's, else ``default``."""
        if self.canonical_image_size is not None:
            return self.canonical_image_size
        return int(self.sidecar.get("canonical_image_size") or default)


def read_sidecar(path: str) -> dict[str, Any]:
    """The ``joynexus.json`` sidecar of model directory ``path`` (preferred canonical
    size and camera slots; empty when it has none)."""
    sidecar = Path(path) / SIDECAR
    if sidecar.is_file():
        data = json.loads(sidecar.read_text())
        if isinstance(data, dict):
            return data
    return {}


class Resident:
    """One loaded architecture: the frozen module, how it is fed and its forward.

    Args:
        arch: The architecture's registered name.
        model: The frozen module (LoRA hooks go on its linear layers).
        processor: The processor (or tokenizer) canonicalization uses.
        canonical_image_size: Side of the canonical camera square.
        num_camera_slots: Camera slots of every row.
        extension: What a policy family may ask of this model by type
            (:meth:`~joynexus.models.backbone.ResidentBaseModel.extension`).
    """

    #: How the instruction becomes the prompt and the images the tower's input.
    prompt: ClassVar[PromptStyle] = "image_tokens"
    pixels: ClassVar[PixelLayout | None] = "images"
    processor_kwargs: ClassVar[tuple[tuple[str, Any], ...]] = ()
    #: Whether the forward may return intermediate layers (a resident that hands
    #: experts its prefix KV cache returns none).
    takes_output_layers: ClassVar[bool] = True
    #: Whether blank camera slots share one pass through the vision tower, and rope
    #: positions are kept per prompt (a resident that does either says so).
    shares_blanks: bool = False
    caches_positions: bool = False

    def __init__(
        self,
        arch: str,
        model: torch.nn.Module,
        processor: Any,
        *,
        canonical_image_size: int,
        num_camera_slots: int,
        extension: object | None = None,
    ) -> None:
        self.arch = arch
        self.model = model
        self.processor = processor
        self.canonical_image_size = canonical_image_size
        self.num_camera_slots = num_camera_slots
        self.extension = extension

    def spec(self) -> CanonicalSpec:
        """The canonical prototype of this model's inputs."""
        return CanonicalSpec(
            self.arch,
            self.num_camera_slots,
            self.canonical_image_size,
            prompt=self.prompt,
            pixels=self.pixels,
            processor_kwargs=self.processor_kwargs,
        )

    def check_canonical_size(self) -> None:
        """Refuse a canonical size the processor would not keep as it is.

        Raises:
            InvalidRequestError: a size this model cannot take.
        """
        if self.canonical_image_size < 1:
            raise InvalidRequestError(
                f"canonical_image_size must be positive, got {self.canonical_image_size}",
                field="canonical_image_size",
            )

    def encoder(self, tensor: bool) -> tuple[BatchEncoder | None, str | None]:
        """The tensor canonicalizer (``tensor``) or ``None`` (the processor path), and
        why the tensor path was asked for and is not used."""
        if not tensor:
            return None, None
        return TensorCanonicalizer.build(self.processor, self.spec())

    def prepare(self, feature: VLAFeature) -> None:
        """Plan what the forward of ``feature`` may skip (from its CPU tables)."""

    def images_per_row(self, feature: VLAFeature) -> int:
        """How many images each row of ``feature`` feeds the vision tower."""
        return self.num_camera_slots

    def encode(self, feature: VLAFeature, output_layers: Sequence[int]) -> BackboneOutput:
        """The frozen forward of ``feature`` (grad mode is the caller's): last hidden
        state, zero at padding, its mask and the chosen layers."""
        return self.forward(feature.model_inputs, feature, output_layers)

    def forward(
        self,
        inputs: Mapping[str, Any],
        feature: VLAFeature,
        output_layers: Sequence[int],
    ) -> BackboneOutput:
        """:meth:`encode` of ``feature`` with the model called on ``inputs`` (its canonical
        inputs, with what a resident computed for the model ahead of the forward)."""
        want_layers = bool(output_layers)
        out = self.model(
            **inputs,
            output_hidden_states=want_layers,
            use_cache=False,
            return_dict=True,
        )
        mask = inputs["attention_mask"]
        pad = ~mask.bool().unsqueeze(-1)
        hidden = out.last_hidden_state.masked_fill(pad, 0.0)
        layers = None
        if want_layers:
            layers = {i: out.hidden_states[i].masked_fill(pad, 0.0) for i in output_layers}
        return BackboneOutput(
            hidden_states=hidden, attention_mask=mask, layers=layers, images=feature.images
        )

    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        """The normalization a tenant of ``schema`` without statistics of its own takes
        (``None``: raw units)."""
        return None


def fitting_statistics(
    stats: NormalizationStats | None, schema: DataSchema
) -> NormalizationStats | None:
    """A checkpoint's processor statistics as a tenant's default, when their state and
    action widths are the schema's (``None`` otherwise: raw units)."""
    if stats is None or stats.state is None:
        return None
    if (stats.state.dim, stats.action.dim) != (schema.state_dim, schema.action_dim):
        return None
    return stats


class ResidentArch:
    """A resident architecture as the registry holds it: which checkpoints it loads,
    and how.

    Subclass per architecture: ``name``, the ``transformers`` ``model_types`` it loads,
    and the :class:`Resident` class it loads into; override :meth:`load_model` (not an
    ``AutoModel``), :meth:`default_size` or :meth:`claims` (a checkpoint that is not a
    ``transformers`` model directory) where the architecture differs.
    """

    name: ClassVar[str]
    #: The ``config.model_type`` values of the checkpoints this architecture loads.
    model_types: ClassVar[tuple[str, ...]] = ()
    resident: ClassVar[type[Resident]] = Resident

    def claims(self, model_id: str, *, local_only: bool) -> str | None:
        """The directory to load ``model_id`` from when it is a checkpoint of this
        architecture that is no ``transformers`` model directory; ``None`` otherwise."""
        return None

    def default_size(self, config: Any) -> int:
        """The canonical image size when neither the caller nor the sidecar sets one:
        the vision tower's input size."""
        image_size = config.vision_config.image_size
        return int(image_size[0] if isinstance(image_size, (list, tuple)) else image_size)

    def load_model(self, request: LoadRequest) -> tuple[torch.nn.Module, object | None]:
        """The frozen module and the extension families may ask for (default: the base
        model class, no LM head: a frozen encoder never decodes)."""
        model: torch.nn.Module = hf().AutoModel.from_pretrained(
            request.path, dtype=request.dtype, local_files_only=request.local_only
        )
        return model, None

    def load_processor(self, request: LoadRequest) -> Any:
        """The processor, padding on the left (a row's tokens never depend on its
        batch-mates)."""
        processor = hf().AutoProcessor.from_pretrained(
            request.path, local_files_only=request.local_only
        )
        processor.tokenizer.padding_side = "left"
        return processor

    def load(self, request: LoadRequest) -> Resident:
        """Load the checkpoint ``request`` names into a :class:`Resident`.

        Raises:
            OSError: the checkpoint is incomplete or unreadable.
            InvalidRequestError: canonical size or camera slots out of range.
        """
        with quiet_transformers():
            model, extension = self.load_model(request)
            processor = self.load_processor(request)
        resident = self.resident(
            self.name,
            model.to(request.device),
            processor,
            canonical_image_size=request.size(self.default_size(request.config)),
            num_camera_slots=request.slots(),
            extension=extension,
        )
        resident.check_canonical_size()
        return resident


__all__ = [
    "DEFAULT_NUM_CAMERA_SLOTS",
    "LoadRequest",
    "Resident",
    "ResidentArch",
    "read_sidecar",
]
