"""The resident base model: one frozen VLM backbone shared by every tenant.

:class:`ResidentBaseModel` loads a VLM checkpoint through the resident architecture
registered for it (:mod:`joynexus.models.archs`: its folder says how the model loads, is
fed and runs), freezes it, canonicalizes tenants' observation batches into a
:class:`~joynexus.models.canon.feature.VLAFeature` and runs the shared forward (``encode``).
Tenants never hold a copy: they get the features and split them by the slice table
(paper §3.1, §4.3).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from joynexus.errors import InvalidRequestError, ModelNotFoundError
from joynexus.models.archs import registry
from joynexus.models.archs.base import LoadRequest, Resident, read_sidecar
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.canonicalize import BatchEncoder, canonicalize
from joynexus.models.canon.feature import VLAFeature
from joynexus.models.canon.tensor import moved_to
from joynexus.models.lora import LoRAHost
from joynexus.models.normalization import NormalizationStats
from joynexus.models.schema import DataSchema, prefix_key, schema_signature
from joynexus.models.types import BackboneOutput
from joynexus.utils.intra_op import serial_intra_op
from joynexus.utils.split_choice import SplitChooser

#: How canonical inputs are made: ``tensor`` (default) lays out every image of a batch
#: with tensor ops on the model's device and caches prompt ids; ``processor`` runs the
#: Hugging Face processor per image on CPU (the reference the tensor path equals).
Canonicalizer = Literal["tensor", "processor"]
CANONICALIZERS: tuple[Canonicalizer, ...] = ("tensor", "processor")
#: How a CPU forward decides to split its ops over threads (:meth:`ResidentBaseModel.
#: use_forward_split`): by the measured cost of each way, or by the size rule alone.
ForwardSplit = Literal["measured", "size"]
FORWARD_SPLITS: tuple[ForwardSplit, ...] = ("measured", "size")
#: The way a new backbone starts with. The test suite pins ``size``, so that which
#: threads a test's forward runs on (and so the last bits of its result) never follow
#: the machine's load; the tests of the measured choice ask for it.
DEFAULT_FORWARD_SPLIT: ForwardSplit = "measured"
#: Canonical pixels (rows × camera slots × size²) up to which a CPU canonicalization
#: runs its ops in the calling thread alone: waking torch's sleeping intra-op threads for
#: each op costs more than the work of a few images (RESULTS §8.1.4: one row of two
#: 112² slots 1.40 → 0.67 ms serial; 8 such rows 1.64 ms parallel, 2.07 ms serial).
SERIAL_CANONICALIZE_PIXELS = 4 * 112 * 112
#: Tokens × hidden² (the multiply-accumulates of one token-wise projection of the batch)
#: below which a CPU forward gains nothing from splitting each op over torch's intra-op
#: threads. Measured on a quiet 2-core CPU, 2 threads against 1: the tiny Qwen-VL
#: (hidden 128) at 8 rows (3.7 M) 5.3 against 5.5 ms; the small one (hidden 512) at 1 row
#: (13.6 M) 30.1 against 30.2 ms, at 4 rows 61-66 against 73-76 ms. In a server the
#: second thread's share of each op waits for a core the front processes use, and the
#: sleeping threads wake for every op of a lone request: one small row answered alone
#: took 45-49 ms in one thread against 52-53 ms in two.
SERIAL_FORWARD_MACS = 1 << 24
_log = logging.getLogger(__name__)
E = TypeVar("E")


def _one_of(name: str, value: str, choices: Sequence[str]) -> None:
    """Raise :class:`InvalidRequestError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise InvalidRequestError(
            f"{name} must be one of {list(choices)}, got {value!r}", field=name
        )


def _looks_like_path(model_id_or_path: str) -> bool:
    return (
        os.path.isabs(model_id_or_path)
        or model_id_or_path.startswith((".", "~"))
        or os.path.exists(model_id_or_path)
        or model_id_or_path.count("/") > 1
    )


class ResidentBaseModel:
    """A frozen, eval-mode VLM backbone with its processor and canonical input spec.

    Build it with :meth:`from_pretrained`. The wrapped module never requires grad;
    :meth:`encode` builds an autograd graph only when asked (``grad=True``), and then
    only tenant LoRA adapters can receive gradients. ``lora`` is the
    :class:`~joynexus.models.lora.LoRAHost` of the linear layers LoRA may adapt.

    What differs between architectures is the :class:`~joynexus.models.archs.base.
    Resident` it holds (:mod:`joynexus.models.archs`); a policy family that needs more
    of the resident model than its features asks for its typed :meth:`extension`.
    """

    def __init__(
        self,
        *,
        model_id: str,
        resident: Resident,
        device: torch.device,
        dtype: torch.dtype,
        output_layers: Sequence[int] | None = None,
        source: str | None = None,
        canonicalizer: Canonicalizer = "tensor",
    ) -> None:
        #: What checkpoints and schema signatures name the backbone by.
        self.model_id = model_id
        #: The directory or hub id it was loaded from (a tiny model's materialized copy).
        self.source = source or model_id
        self.resident = resident
        self.arch = resident.arch
        self.model = model = resident.model
        self.processor = resident.processor
        self.device = device
        self.dtype = dtype
        self.canonical_image_size = resident.canonical_image_size
        self.num_camera_slots = resident.num_camera_slots
        self.output_layers: tuple[int, ...] = tuple(output_layers or ())
        config: Any = model.config
        text_config = config.get_text_config()
        self.hidden_size = int(text_config.hidden_size)
        self.num_layers = int(text_config.num_hidden_layers)
        for layer in self.output_layers:
            if not -(self.num_layers + 1) <= layer <= self.num_layers:
                raise InvalidRequestError(
                    f"output_layers: layer {layer} is out of range for a backbone with "
                    f"{self.num_layers} layers (allowed {-(self.num_layers + 1)}.."
                    f"{self.num_layers}; 0 is the embedding output)",
                    field="output_layers",
                )
        if self.output_layers and not resident.takes_output_layers:
            raise InvalidRequestError(
                f"output_layers: a {self.arch} base model hands its experts the prefix KV "
                "cache, not intermediate layers; leave output_layers empty",
                field="output_layers",
            )
        self._spec = resident.spec()
        self._tensor: BatchEncoder | None = None
        self._signatures: dict[tuple[int, ...], str] = {}
        #: Why the tensor path was asked for but is not used (its load-time check).
        self.canonicalizer_fallback: str | None = None
        self.use_canonicalizer(canonicalizer)
        self._split: SplitChooser | None = None
        self.forward_split: ForwardSplit = DEFAULT_FORWARD_SPLIT
        self.use_forward_split(DEFAULT_FORWARD_SPLIT)
        model.requires_grad_(False)
        model.eval()
        # The LoRA hooks go on once, here: installing them later could race a forward
        # running in another thread. Without a published row assignment they are no-ops.
        self.lora = LoRAHost(model)
        #: Whether blank camera slots share one pass through the vision tower, and
        #: whether rope positions are kept per prompt row (the resident's savings).
        self.shares_blanks = resident.shares_blanks
        self.caches_positions = resident.caches_positions

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str,
        *,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        canonical_image_size: int | None = None,
        output_layers: Sequence[int] | None = None,
        num_camera_slots: int | None = None,
        identity: str | None = None,
        canonicalizer: Canonicalizer = "tensor",
    ) -> ResidentBaseModel:
        """Load a backbone and its processor the way a user names it.

        The registered resident architecture (:mod:`joynexus.models.archs.registry`)
        that claims the checkpoint, or loads its ``transformers`` model type, loads it.

        Args:
            model_id_or_path: A hub id (downloaded normally unless ``HF_HUB_OFFLINE`` is
                set) or a local directory (never downloaded).
            device: Torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
            dtype: Weights dtype; default fp32 on CPU and bf16 on CUDA.
            canonical_image_size: Side of the square every camera is resized-with-pad
                to. Default: the model directory's ``joynexus.json`` if present, else
                the architecture's (224 for Qwen backbones, the vision tower's input
                size otherwise).
            output_layers: Intermediate decoder layers to return next to the last
                hidden state (0 = embeddings, negative indices count from the end).
            num_camera_slots: Camera slots of the canonical input. Default: the
                sidecar's value, else 2.
            identity: The id checkpoints and schema signatures know the backbone by
                (default ``model_id_or_path``). A model built where the spec says
                (``tiny:<arch>`` materialized into a run directory) is the spec's id,
                so a checkpoint trained in one run directory loads in another.
            canonicalizer: ``tensor`` (default) or ``processor``
                (:meth:`use_canonicalizer`).

        Raises:
            ModelNotFoundError: The id/path cannot be resolved (naming it).
            InvalidRequestError: Unsupported architecture or canonical size.
        """
        # Typed Any: AutoConfig takes per-architecture keyword arguments.
        hf: Any = importlib.import_module("transformers")
        is_path = _looks_like_path(model_id_or_path)
        path = os.path.expanduser(model_id_or_path) if is_path else model_id_or_path
        if is_path and not Path(path).is_dir():
            raise ModelNotFoundError(
                f"base model path {model_id_or_path!r} does not exist or is not a directory",
                model=model_id_or_path,
            )
        local_only = is_path or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        torch_device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if torch_device.type == "cuda" else torch.float32
        request = LoadRequest(
            model_id=model_id_or_path,
            path=path,
            local_only=local_only,
            device=torch_device,
            dtype=dtype,
            canonical_image_size=canonical_image_size,
            num_camera_slots=num_camera_slots,
        )
        claimed = registry.claiming(path, local_only=local_only)
        if claimed is not None:
            arch, source = claimed
            request = replace(request, path=source)
        else:
            try:
                config = hf.AutoConfig.from_pretrained(path, local_files_only=local_only)
            except (OSError, ValueError) as exc:
                raise ModelNotFoundError(
                    f"base model {model_id_or_path!r} could not be found"
                    + (" locally (offline mode)" if local_only else "")
                    + f": {exc}",
                    model=model_id_or_path,
                ) from exc
            found = registry.arch_for_model_type(str(config.model_type))
            if found is None:
                raise InvalidRequestError(
                    f"base model {model_id_or_path!r} has architecture {config.model_type!r}; "
                    f"supported: {registry.model_types()}",
                    model=model_id_or_path,
                )
            arch = found
            sidecar = read_sidecar(path) if is_path else {}
            request = replace(request, config=config, sidecar=sidecar)
        try:
            resident = arch.load(request)
        except OSError as exc:
            raise ModelNotFoundError(
                f"base model {model_id_or_path!r} is incomplete or unreadable: {exc}",
                model=model_id_or_path,
            ) from exc
        return cls(
            model_id=identity or model_id_or_path,
            source=model_id_or_path,
            resident=resident,
            device=torch_device,
            dtype=dtype,
            output_layers=output_layers,
            canonicalizer=canonicalizer,
        )

    def extension(self, kind: type[E]) -> E | None:
        """The resident architecture's extension if it is a ``kind`` (what a policy
        family asks of the resident model beyond its features), else ``None``."""
        found = self.resident.extension
        return found if isinstance(found, kind) else None

    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        """The normalization a tenant of ``schema`` without statistics of its own takes
        on this backbone (a pretrained checkpoint's processor statistics; ``None``: raw
        units)."""
        return self.resident.default_normalization(schema)

    @property
    def canonicalizer(self) -> Canonicalizer:
        """The path canonical inputs are made by now (``tensor`` or ``processor``)."""
        return "tensor" if self._tensor is not None else "processor"

    def use_canonicalizer(self, kind: Canonicalizer) -> Canonicalizer:
        """Choose how canonical inputs are made; returns the path in use.

        ``tensor`` builds a :class:`~joynexus.models.canon.tensor.TensorCanonicalizer`
        and checks it equal to the processor on random canonical images; a processor it
        does not reproduce keeps the ``processor`` path (``canonicalizer_fallback`` says
        why, and a warning is logged). Both give the same inputs; ``processor`` stays
        selectable as the reference.

        Raises:
            InvalidRequestError: An unknown ``kind``.
        """
        _one_of("canonicalizer", kind, CANONICALIZERS)
        self._tensor, why = self.resident.encoder(kind == "tensor")
        self.canonicalizer_fallback = why
        if why is not None:
            _log.warning("%s: canonicalizing with the processor: %s", self.model_id, why)
        return self.canonicalizer

    # -- identity ---------------------------------------------------------------

    def prefix_key(self) -> str:
        """Compatibility key of this backbone's shared prefix (group-batching key)."""
        return prefix_key(
            base_model_id=self.model_id,
            num_camera_slots=self.num_camera_slots,
            canonical_image_size=self.canonical_image_size,
        )

    def signature_for(self, schema: DataSchema) -> str:
        """The schema signature of ``schema`` served on this backbone."""
        # Every canonicalization asks, and hashing the canonical JSON costs a tenth of a
        # one-row canonicalization; the signature reads only these fields.
        key = (len(schema.cameras), schema.state_dim, schema.action_dim, schema.action_chunk)
        hit = self._signatures.get(key)
        if hit is None:
            hit = schema_signature(
                schema,
                base_model_id=self.model_id,
                canonical_image_size=self.canonical_image_size,
            )
            self._signatures[key] = hit
        return hit

    def parameter_bytes(self) -> int:
        """Bytes held by the backbone's parameters (shared once by all tenants)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    # -- forward ----------------------------------------------------------------

    def canonicalize(
        self,
        groups: Sequence[tuple[str, DataSchema, ObservationBatch]],
        *,
        validated: bool = False,
    ) -> VLAFeature:
        """Validate and canonicalize ``(tenant_id, schema, batch)`` groups into one
        left-padded :class:`VLAFeature` on this backbone's device.

        ``validated=True`` skips the schema check of batches the caller already checked.

        Raises:
            SchemaMismatchError: A batch does not match its schema, or a schema has
                more cameras than this backbone's camera slots.
            InvalidRequestError: No groups, or a tenant appears twice.
        """
        signatures = [self.signature_for(schema) for _, schema, _ in groups]
        rows = sum(batch.batch_size for _, _, batch in groups)
        size = self._spec.canonical_image_size
        pixels = rows * self._spec.num_camera_slots * size * size
        # No matrix products here: MKL's threads are left as they are (one call less).
        serial = self.device.type == "cpu" and pixels <= SERIAL_CANONICALIZE_PIXELS
        with serial_intra_op(serial, blas=False):
            feature = canonicalize(
                self.processor,
                self._spec,
                groups,
                signatures=signatures,
                validated=validated,
                encoder=self._tensor,
                device=self.device,
            )
        feature.model_inputs = {k: self._placed(v) for k, v in feature.model_inputs.items()}
        self.resident.prepare(feature)
        feature.state = self._placed(feature.state)
        feature.state_mask = self._placed(feature.state_mask)
        feature.camera_mask = self._placed(feature.camera_mask)
        return feature

    def _placed(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` on this backbone's device, floats in its dtype. A tensor already
        there is returned as it is, without a call into torch (a one-row predict makes a
        dozen of these, each a dispatch)."""
        if value.is_floating_point() and value.dtype != self.dtype:
            value = value.to(self.dtype)
        return moved_to(value, self.device)

    def forward_work(self, feature: VLAFeature) -> int | None:
        """Multiply-accumulates of one token-wise projection of ``feature``'s forward
        (tokens × hidden²), the size the CPU split rule reads; None off the CPU."""
        if self.device.type != "cpu":
            return None
        ids = feature.model_inputs.get("input_ids")
        tokens = feature.batch_size if ids is None else int(ids.numel())
        return tokens * self.hidden_size**2

    def use_forward_split(self, kind: ForwardSplit, chooser: SplitChooser | None = None) -> None:
        """How a CPU forward decides to split its ops over torch's intra-op threads:
        ``measured`` (:data:`DEFAULT_FORWARD_SPLIT`) runs the way recent forwards of its
        size found cheaper (:class:`~joynexus.utils.split_choice.SplitChooser`, which
        follows the load of the machine); ``size`` splits at :data:`SERIAL_FORWARD_MACS`
        and above.
        ``chooser`` carries ``measured``'s measurements over (default: a new one).

        Raises:
            InvalidRequestError: An unknown ``kind``.
        """
        _one_of("forward_split", kind, FORWARD_SPLITS)
        self.forward_split = kind
        self._split = (chooser or SplitChooser()) if kind == "measured" else None

    def forward_splits(self, feature: VLAFeature) -> bool:
        """Whether the forward of ``feature`` splits its ops over torch's intra-op
        threads: always off the CPU; on the CPU as :meth:`use_forward_split` chose.
        Report how long it took with :meth:`forward_took`."""
        work = self.forward_work(feature)
        if work is None:
            return True
        rule = work >= SERIAL_FORWARD_MACS
        return rule if self._split is None else self._split.choose(work, rule)

    def forward_took(self, feature: VLAFeature, split: bool, seconds: float) -> None:
        """Count a forward of ``feature`` that ran ``split`` (or serial) in ``seconds``
        (what the ``measured`` split chooses by)."""
        work = self.forward_work(feature)
        if work is not None and self._split is not None:
            self._split.record(work, split, seconds)

    def images_per_row(self, feature: VLAFeature) -> list[int]:
        """How many images each row of ``feature`` feeds the vision tower, in row order
        (LoRA on the vision tower maps images back to rows with this): every camera
        slot by default, absent cameras as blank images; a resident architecture that
        feeds its tower otherwise says how many."""
        return [self.resident.images_per_row(feature)] * feature.batch_size

    def encode(self, feature: VLAFeature, *, grad: bool = False) -> BackboneOutput:
        """The shared frozen forward: last hidden state (+ chosen layers) and mask
        (and, on a base that hands experts its prefix, the prefix KV cache).

        Padded positions of the returned hidden states are zero. With ``grad=True`` the
        forward records autograd (base weights stay frozen: only adapters published
        with :func:`~joynexus.models.lora.lora_rows` get gradients).
        """
        with torch.set_grad_enabled(grad):
            return self.resident.encode(feature, self.output_layers)
