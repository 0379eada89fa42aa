"""Tenant LoRA adapters on the shared frozen backbone, applied per row of a mixed batch.

A tenant's action module may carry a low-rank adapter (``action_module.lora``) on the
language model's linear layers, and optionally on the vision tower's (``vision``) and on
the vision-to-language projection (``vision_projection``). The base weights are never
copied: the resident backbone's targetable ``nn.Linear`` modules get one forward hook
each (installed once, by :class:`LoRAHost`), and during one backbone forward the
executor publishes which rows belong to which adapter (:func:`lora_rows`). Each hook
then adds, segment by segment, the low-rank delta ``scale * (x[rows] @ A.T) @ B.T`` of
that segment's adapter to the base output; rows without an adapter keep the base output.

The vision tower does not see samples but images: every sample brings its camera
images (all camera slots, or only its present cameras on a π0 prefix), and each
architecture lays them out with a fixed number of leading rows per image (SigLIP /
SmolVLM: one row per image; Qwen-VL: its patches, packed). Canonicalization makes every
image the same size, so a vision layer's leading dimension is ``images × k`` for one
``k``: the assignment carries each adapter's image range (:attr:`LoRARows.image_segments`)
and the hook scales it by ``k``. A tenant's images therefore only ever meet its own
adapter.

The segment loop is a plain-torch segmented gather-matmul (as Punica's SGMV does), so
it runs on CPU and CUDA; it has the :data:`SegmentedLoRAKernel` signature a fused
kernel would take its place with.

Adapters are exported in PEFT format (:func:`save_peft_adapter`):
``adapter_model.safetensors`` + ``adapter_config.json``, loadable with
``peft.PeftModel.from_pretrained(base, path)``; :func:`peft_deltas` reads one back as
the weight deltas a merge adds (``W + scale * B @ A``), e.g. into an exported policy.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from safetensors.torch import load_file, save_file
from torch import nn

LANGUAGE_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Linear layers of the language model a LoRA adapter may target (attention + MLP)."""

# A decoder layer's attention / MLP projection, for every supported architecture
# (Qwen2.5-VL, Qwen3-VL, PaliGemma: ``language_model``; SmolVLM: ``text_model``).
_LM_LINEAR = re.compile(
    r"^(?:.*\.)?(?:language_model|text_model)\.layers\.\d+\.(?:self_attn|mlp)\.([A-Za-z0-9_]+)$"
)

# The vision encoder's attention / MLP projections: SigLIP (PaliGemma, π0), SmolVLM's
# Idefics3 tower (``...encoder.layers.N``) and Qwen-VL's packed tower (``visual.blocks.N``).
_VISION_LINEAR = re.compile(
    r"^(?:.*\.)?(?:vision_model|vision_tower|visual)\.(?:.*\.)?(?:encoder\.layers|blocks)"
    r"\.\d+\.(?:self_attn|attn|mlp)\.[A-Za-z0-9_]+$"
)
# The vision-to-language projection (connector): SmolVLM's modality projection,
# PaliGemma's projector, Qwen2.5-VL's patch merger, Qwen3-VL's merger and deepstack mergers.
_PROJECTION_LINEAR = re.compile(
    r"^(?:.*\.)?(?:connector\.modality_projection\.proj|multi_modal_projector\.linear"
    r"|visual\.(?:merger|deepstack_merger_list\.\d+)\.(?:mlp\.\d+|linear_fc\d+))$"
)
VISION_FAMILIES: tuple[str, ...] = (
    "smolvlm",
    "smolvla",
    "paligemma",
    "pi0",
    "qwen2_5_vl",
    "qwen3_vl",
)
"""Backbone families whose vision tower and projection a LoRA adapter may target."""

PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_CONFIG_FILE = "adapter_config.json"


class LoRAConfig(BaseModel):
    """``action_module.lora``: a tenant-private low-rank adapter on the backbone.

    Dropout is applied to the adapter input in training only and draws from torch's
    global RNG (not the tenant's generator); grouped and serial training agree exactly
    only with ``dropout: 0`` (the default).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=8, ge=1, le=1024)
    alpha: float = Field(default=16.0, gt=0, le=1e6)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    targets: tuple[str, ...] = Field(
        default=LANGUAGE_TARGETS,
        min_length=1,
        description=f"Language-model linear layers to adapt; any of {list(LANGUAGE_TARGETS)}.",
    )
    vision: bool = Field(
        default=False,
        description="Also adapt every attention and MLP linear layer of the vision tower "
        f"(families {list(VISION_FAMILIES)}); each tenant's images go through its own adapter.",
    )
    vision_projection: bool = Field(
        default=False,
        description="Also adapt the vision-to-language projection (connector / patch "
        "merger): a trainable, tenant-private correction of how image features enter the "
        "language model, at the adapter's rank.",
    )

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in value if t not in LANGUAGE_TARGETS]
        if unknown:
            raise ValueError(
                f"unknown LoRA target(s) {unknown}; valid targets: {list(LANGUAGE_TARGETS)}"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"LoRA targets repeat a name: {list(value)}")
        return value

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _key(module_name: str) -> str:
    return module_name.replace(".", "-")


def lora_target_modules(model: nn.Module, targets: Sequence[str]) -> dict[str, nn.Linear]:
    """The language model's linear layers of ``model`` whose last name is in ``targets``."""
    wanted = set(targets)
    out: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            match = _LM_LINEAR.match(name)
            if match and match.group(1) in wanted:
                out[name] = module
    return out


def vision_target_modules(model: nn.Module, *, projection: bool) -> dict[str, nn.Linear]:
    """The vision tower's linear layers of ``model`` (``projection=False``) or those of
    its vision-to-language projection (``projection=True``)."""
    pattern = _PROJECTION_LINEAR if projection else _VISION_LINEAR
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and pattern.match(name)
    }


class LoRAAdapter(nn.Module):
    """One tenant's low-rank matrices: ``A [rank, in]`` and ``B [out, rank]`` per layer.

    ``B`` starts at zero (PEFT's default), so a fresh adapter leaves the base unchanged.

    Args:
        config: Rank, alpha, dropout and targets.
        shapes: Backbone module name → ``(in_features, out_features)``.
    """

    def __init__(self, config: LoRAConfig, shapes: Mapping[str, tuple[int, int]]):
        super().__init__()
        if not shapes:
            raise ValueError("a LoRA adapter needs at least one target module")
        self.config = config
        self.scaling = config.scaling
        #: The adapter reaches into the vision tower or its projection (rows = images).
        self.sees_images = config.vision or config.vision_projection
        self.module_names: tuple[str, ...] = tuple(shapes)
        self._keys = {name: _key(name) for name in shapes}
        self.A = nn.ParameterDict()
        self.B = nn.ParameterDict()
        for name, (fan_in, fan_out) in shapes.items():
            a = torch.empty(config.rank, fan_in)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            self.A[_key(name)] = nn.Parameter(a)
            self.B[_key(name)] = nn.Parameter(torch.zeros(fan_out, config.rank))
        # The ParameterDicts' own storage (the same dicts for the module's lifetime).
        self._a = self.A._parameters
        self._b = self.B._parameters

    def pair(self, module_name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(A, B)`` of ``module_name``, or None when this adapter does not target it."""
        # Called by every hooked layer for every segment of every forward: a dict lookup
        # of the key and the ParameterDicts' own storage, not ParameterDict's attribute
        # protocol (which showed up in profiles of a grouped training step). Read each
        # time, so parameters replaced by ``.to()`` or a state load are always current.
        key = self._keys.get(module_name)
        if key is None:
            return None
        a, b = self._a[key], self._b[key]
        assert a is not None and b is not None
        return a, b

    def peft_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter under PEFT's saved names (``base_model.model.<m>.lora_A.weight``)."""
        out: dict[str, torch.Tensor] = {}
        for name in self.module_names:
            a, b = self.A[_key(name)], self.B[_key(name)]
            out[f"base_model.model.{name}.lora_A.weight"] = a.detach().to("cpu").contiguous()
            out[f"base_model.model.{name}.lora_B.weight"] = b.detach().to("cpu").contiguous()
        return out


# --- the segmented kernel -----------------------------------------------------------


@dataclass(frozen=True)
class LoRASegment:
    """Rows ``[start, stop)`` of the batch go through ``adapter``."""

    start: int
    stop: int
    adapter: LoRAAdapter


@dataclass(frozen=True)
class KernelSegment:
    """One segment as the kernel sees it: rows, matrices, scale, dropout."""

    start: int
    stop: int
    a: torch.Tensor
    b: torch.Tensor
    scaling: float
    dropout: float


class SegmentedLoRAKernel(Protocol):
    """``(x, base_out, segments, training) -> out``: base_out plus each segment's delta.

    ``segments`` are sorted, disjoint row ranges; rows outside every segment keep
    ``base_out``. The result must not modify ``base_out`` in place (autograd).
    """

    def __call__(
        self,
        x: torch.Tensor,
        base_out: torch.Tensor,
        segments: Sequence[KernelSegment],
        training: bool,
    ) -> torch.Tensor: ...


def sgmv_torch(
    x: torch.Tensor,
    base_out: torch.Tensor,
    segments: Sequence[KernelSegment],
    training: bool,
) -> torch.Tensor:
    """The plain-torch segmented gather-matmul (CPU and CUDA).

    When the segments tile every row in equal sizes with one rank, dtype and dropout
    (the common case of a grouped step), the deltas are two batched matmuls over the
    stacked adapters; otherwise one pair of matmuls per segment. Either way the scale
    rides on the rank-sized intermediate (or the matmul's ``alpha``) and the second
    matmul adds into the base output in the same op (``baddbmm`` / ``addmm``): no
    output-sized temporaries, which in a training step are also saved for backward.
    """
    if _uniform(x, segments):
        return _batched_delta(x, base_out, segments, training)
    parts: list[torch.Tensor] = []
    row = 0
    for seg in segments:
        if seg.start > row:
            parts.append(base_out[row : seg.start])
        xs = x[seg.start : seg.stop].to(seg.a.dtype)
        if training and seg.dropout > 0:
            xs = F.dropout(xs, seg.dropout, training=True)
        parts.append(_add_low_rank(base_out[seg.start : seg.stop], xs, seg))
        row = seg.stop
    if row < int(base_out.shape[0]):
        parts.append(base_out[row:])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _add_low_rank(base: torch.Tensor, xs: torch.Tensor, seg: KernelSegment) -> torch.Tensor:
    """``base + scaling * (xs @ A.T) @ B.T`` for one segment's rows."""
    xa = xs.reshape(-1, xs.shape[-1]) @ seg.a.t()
    if base.dtype != xa.dtype:
        delta = (xa @ seg.b.t()) * seg.scaling
        return base + delta.reshape(base.shape).to(base.dtype)
    flat = torch.addmm(base.reshape(-1, base.shape[-1]), xa, seg.b.t(), alpha=seg.scaling)
    return flat.reshape(base.shape)


def _uniform(x: torch.Tensor, segments: Sequence[KernelSegment]) -> bool:
    if len(segments) < 2 or x.dim() < 2:
        return False
    first = segments[0]
    size = first.stop - first.start
    row = 0
    for seg in segments:
        if (
            seg.start != row
            or seg.stop - seg.start != size
            or seg.a.shape != first.a.shape
            or seg.b.shape != first.b.shape
            or seg.a.dtype != first.a.dtype
            or seg.dropout != first.dropout
        ):
            return False
        row = seg.stop
    return row == int(x.shape[0])


def _batched_delta(
    x: torch.Tensor,
    base_out: torch.Tensor,
    segments: Sequence[KernelSegment],
    training: bool,
) -> torch.Tensor:
    first = segments[0]
    n = len(segments)
    a = torch.stack([seg.a for seg in segments])  # [S, r, in]
    b = torch.stack([seg.b for seg in segments])  # [S, out, r]
    xs = x.to(first.a.dtype).reshape(n, -1, x.shape[-1])  # [S, rows/S * ..., in]
    if training and first.dropout > 0:
        xs = F.dropout(xs, first.dropout, training=True)
    xa = torch.bmm(xs, a.transpose(1, 2))  # [S, m, r]: rank-sized, cheap to scale
    alpha = first.scaling
    if any(seg.scaling != alpha for seg in segments):
        scales = torch.tensor([seg.scaling for seg in segments], dtype=xa.dtype)
        xa = xa * scales.to(xa.device).view(n, 1, 1)
        alpha = 1.0
    if base_out.dtype != xa.dtype:
        delta = torch.bmm(xa, b.transpose(1, 2)) * alpha
        return base_out + delta.reshape(base_out.shape).to(base_out.dtype)
    base3 = base_out.reshape(n, -1, base_out.shape[-1])
    return torch.baddbmm(base3, xa, b.transpose(1, 2), alpha=alpha).reshape(base_out.shape)


# --- per-forward row assignment -----------------------------------------------------


@dataclass(frozen=True)
class LoRARows:
    """Which rows of the current backbone forward go through which adapter.

    ``segments`` are in samples (the language model's rows). ``images`` and
    ``image_segments`` are the same assignment in images, for the vision tower: build
    them with :meth:`with_images` from the images each sample brings.
    """

    rows: int
    segments: tuple[LoRASegment, ...]
    training: bool = False
    images: int = 0
    image_segments: tuple[LoRASegment, ...] = ()

    def with_images(self, images_per_row: Sequence[int]) -> LoRARows:
        """This assignment plus its image ranges (adapters that adapt vision only).

        Raises:
            ValueError: ``images_per_row`` does not have one entry per row.
        """
        if len(images_per_row) != self.rows:
            raise ValueError(
                f"LoRA: {len(images_per_row)} image counts for a batch of {self.rows} rows"
            )
        starts = [0]
        for count in images_per_row:
            starts.append(starts[-1] + int(count))
        image_segments = tuple(
            LoRASegment(starts[seg.start], starts[seg.stop], seg.adapter)
            for seg in self.segments
            if seg.adapter.sees_images and starts[seg.stop] > starts[seg.start]
        )
        return LoRARows(self.rows, self.segments, self.training, starts[-1], image_segments)


_ACTIVE: ContextVar[LoRARows | None] = ContextVar("joynexus_lora_rows", default=None)


@contextmanager
def lora_rows(assignment: LoRARows | None) -> Iterator[None]:
    """Publish ``assignment`` to the LoRA hooks for the duration of one forward.

    A context variable: each thread (and task) sees only its own assignment.
    """
    token = _ACTIVE.set(assignment)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_rows() -> LoRARows | None:
    """The row assignment published for the forward in progress in this thread/task."""
    return _ACTIVE.get()


class LoRAHost:
    """Forward hooks on a backbone's targetable linear layers (installed once).

    With no assignment published (:func:`lora_rows`) the hooks return the base output
    unchanged, so tenants without adapters see exactly the frozen backbone.
    """

    def __init__(self, model: nn.Module):
        self.modules = lora_target_modules(model, LANGUAGE_TARGETS)
        self.vision_modules = vision_target_modules(model, projection=False)
        self.projection_modules = vision_target_modules(model, projection=True)
        for name, module in self.modules.items():
            module.register_forward_hook(functools.partial(self._hook, name, False))
        for name, module in {**self.vision_modules, **self.projection_modules}.items():
            module.register_forward_hook(functools.partial(self._hook, name, True))

    def shapes(
        self, targets: Sequence[str], *, vision: bool = False, projection: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Module name → ``(in_features, out_features)`` of the language layers
        ``targets`` name, plus the vision tower's (``vision``) and the projection's
        (``projection``) layers."""
        wanted = set(targets)
        chosen = {n: m for n, m in self.modules.items() if n.rsplit(".", 1)[-1] in wanted}
        if vision:
            chosen.update(self.vision_modules)
        if projection:
            chosen.update(self.projection_modules)
        return {name: (m.in_features, m.out_features) for name, m in chosen.items()}

    @staticmethod
    def _hook(name: str, images: bool, module: nn.Module, args: Any, output: torch.Tensor) -> Any:
        assignment = _ACTIVE.get()
        if assignment is None:
            return None
        x = args[0]
        rows = int(x.shape[0])
        if images:
            if not assignment.image_segments:
                return None
            # Every image has the same size, so it owns ``per`` consecutive leading rows
            # here (1 per image, or its patches in a packed tower).
            if assignment.images <= 0 or rows % assignment.images:
                raise RuntimeError(
                    f"LoRA: vision layer {name} got {rows} rows for {assignment.images} "
                    "images; this architecture does not keep images separate"
                )
            per = rows // assignment.images
            owned = [(s.start * per, s.stop * per, s.adapter) for s in assignment.image_segments]
        else:
            if not assignment.segments:
                return None
            if rows != assignment.rows:
                raise RuntimeError(
                    f"LoRA: layer {name} got {rows} rows, the batch has "
                    f"{assignment.rows}; this architecture does not keep rows separate"
                )
            owned = [(s.start, s.stop, s.adapter) for s in assignment.segments]
        segments: list[KernelSegment] = []
        for start, stop, adapter in owned:
            pair = adapter.pair(name)
            if pair is not None:
                segments.append(
                    KernelSegment(
                        start, stop, pair[0], pair[1], adapter.scaling, adapter.config.dropout
                    )
                )
        if not segments:
            return None
        return sgmv_torch(x, output, segments, assignment.training)


def peft_config(adapter: LoRAAdapter) -> dict[str, Any]:
    """``adapter_config.json`` for ``adapter`` (PEFT LoRA, exact module names)."""
    cfg = adapter.config
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": None,
        "inference_mode": True,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(adapter.module_names),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
    }


def save_peft_adapter(adapter: LoRAAdapter, directory: str | Path) -> Path:
    """Write ``adapter_model.safetensors`` + ``adapter_config.json`` into ``directory``."""
    return write_peft_adapter(adapter.peft_state_dict(), peft_config(adapter), directory)


def write_peft_adapter(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], directory: str | Path
) -> Path:
    """Write an adapter already in PEFT form (:meth:`LoRAAdapter.peft_state_dict`,
    :func:`peft_config`): a checkpoint snapshots them under the backbone lock and
    writes them after releasing it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(tensors), str(out / PEFT_WEIGHTS_FILE))
    (out / PEFT_CONFIG_FILE).write_text(json.dumps(dict(config), indent=2) + "\n")
    return out


def peft_deltas(directory: str | Path) -> dict[str, torch.Tensor]:
    """The adapter saved in ``directory`` (:func:`write_peft_adapter`) as weight deltas:
    backbone module name → ``scale * B @ A`` ``[out, in]`` in fp32, ready to merge into
    a copy of that layer's weight. Empty when ``directory`` holds no adapter.

    Raises:
        ValueError: the adapter is not a plain LoRA this module wrote (DoRA, rsLoRA,
            fan-in-fan-out, a layer without both matrices).
    """
    root = Path(directory)
    if not (root / PEFT_CONFIG_FILE).is_file():
        return {}
    config = json.loads((root / PEFT_CONFIG_FILE).read_text())
    odd = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out") if config.get(k)]
    if config.get("peft_type") != "LORA" or odd:
        raise ValueError(f"{root}: not a plain LoRA adapter ({odd or config.get('peft_type')})")
    scale = float(config["lora_alpha"]) / int(config["r"])
    tensors = load_file(str(root / PEFT_WEIGHTS_FILE))
    out: dict[str, torch.Tensor] = {}
    for key in tensors:
        if key.endswith(".lora_A.weight"):
            name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = tensors.get(f"base_model.model.{name}.lora_B.weight")
            if b is None:
                raise ValueError(f"{root}: LoRA layer {name!r} has A but no B")
            out[name] = scale * (b.float() @ tensors[key].float())
    return out
