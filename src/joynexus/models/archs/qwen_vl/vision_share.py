"""The Qwen-VL vision tower, without work it repeats.

Three savings, each exact up to float rounding (the same products, summed in another
order), or exact:

* **One blank per forward.** A row whose tenant shows fewer cameras than the backbone has
  slots fills the others with the blank canonical image, and every blank gives the same
  vision features unless a tenant's LoRA adapts the tower. A group batch of n one-camera
  rows on a two-slot backbone would encode n identical blanks; :meth:`VisionShare.
  image_features` encodes one and hands its features to every blank slot. That is about
  half of the tower, and the tower is about half of a small backbone's forward. A
  single-policy server answering one row at a time has nothing to share, so this is a
  saving of group batching.
* **The patch embedding as one matrix product.** Qwen-VL embeds patches with a
  ``Conv3d`` whose kernel equals its stride, which is a linear map of each flattened
  patch; oneDNN's 3-D convolution is several times slower on CPU than the product.
* **The grid's layout, once per grid.** The tower derives its rotary positions, attention
  segments and (Qwen2.5-VL) window order from the images' grids in Python on every
  forward; canonical images share one grid, so :class:`VisionShare` computes them once,
  with the tower's own functions, and passes them in the names the tower accepts them
  precomputed under (exact).
* **Equal attention segments as one batched call.** Without flash attention the tower
  attends segment by segment (an image, or a window of one) in a Python loop: one
  attention call per segment and layer. Canonical images cut into segments of one
  length, so the segments are the batch of ONE call instead (the same products per
  segment); segments of different lengths keep the loop.

How they reach the model: the image features go into the forward through its own
``mm_encoder_outputs`` argument (the model then does not run the tower itself), and the
patch embedding and the tower's attention modules become subclasses of their own classes
(:func:`install`) whose ``forward`` falls back on the class's own for anything else.
Nothing of ``transformers`` is assigned over.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import torch
from transformers import vision_utils
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from joynexus.models.lora import active_rows

#: A blank plan: the images the tower encodes (indices into the flattened row-major
#: ``[rows, slots]`` images) and, per image, which of those it takes its features from.
BlankPlan = tuple[list[int], list[int]]
_MAX_LAYOUTS = 64


class VisionShare:
    """The image features of a Qwen-VL base model's batches, blanks encoded once and the
    grid's layout computed once (build with :func:`install`)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._visual = model.visual
        self._layouts: dict[bytes, dict[str, torch.Tensor]] = {}

    def _layout(self, grid: torch.Tensor) -> dict[str, torch.Tensor]:
        key = grid.cpu().numpy().tobytes()
        found = self._layouts.get(key)
        if found is None:
            found = _tower_layout(self._visual, grid)
            if len(self._layouts) >= _MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[key] = found
        return found

    def image_features(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, plan: BlankPlan | None
    ) -> Any:
        """What ``get_image_features`` returns for these images (``pooler_output``: one
        tensor per image; Qwen3-VL's ``deepstack_features`` alike), each blank of
        ``plan`` encoded once unless a row's LoRA adapts the tower."""
        images = int(image_grid_thw.shape[0])
        if (
            plan is None
            or _rows_adapt_the_tower()
            or len(plan[1]) != images
            or pixel_values.shape[0] % images
        ):
            return self._model.get_image_features(
                pixel_values, image_grid_thw, return_dict=True, **self._layout(image_grid_thw)
            )
        keep, source = plan
        per = pixel_values.shape[0] // images  # canonical images: one patch count
        index = torch.tensor(keep, device=pixel_values.device)
        kept = pixel_values.view(images, per, -1).index_select(0, index).flatten(0, 1)
        grid = image_grid_thw.index_select(0, index.to(image_grid_thw.device))
        out = self._model.get_image_features(kept, grid, return_dict=True, **self._layout(grid))
        out.pooler_output = tuple(out.pooler_output[j] for j in source)
        deepstack = getattr(out, "deepstack_features", None)
        if deepstack is not None:  # Qwen3-VL: the same images' features at earlier layers
            out.deepstack_features = [tuple(f[j] for j in source) for f in deepstack]
        return out


def install(model: torch.nn.Module) -> VisionShare | None:
    """Give a Qwen-VL base ``model`` these savings; ``None`` (nothing changed) for a
    layout this module does not know."""
    visual: Any = getattr(model, "visual", None)
    if visual is None or not callable(getattr(model, "get_image_features", None)):
        return None
    embed = getattr(visual, "patch_embed", None)
    proj = getattr(embed, "proj", None)
    if isinstance(proj, torch.nn.Conv3d) and tuple(proj.kernel_size) == tuple(proj.stride):
        embed.__class__ = _subclass(type(embed), "Matmul", {"forward": _patch_embed_forward})
    for block in getattr(visual, "blocks", ()):
        attn = getattr(block, "attn", None)
        tower = None if attn is None else _attention_helpers(attn)
        if attn is not None and tower is not None:
            own = type(attn)
            forward = _segment_attention(own.forward, tower)
            attn.__class__ = _subclass(own, "SegmentBatched", {"forward": forward})
    return VisionShare(model)


_SUBCLASSES: dict[tuple[type, str], type] = {}


def _subclass(base: type, prefix: str, members: dict[str, Any]) -> type:
    """``base`` with ``members`` overridden, its own class kept as ``own`` (one class per
    base and prefix; a module already of such a class keeps it)."""
    if base in _SUBCLASSES.values():
        return base
    found = _SUBCLASSES.get((base, prefix))
    if found is None:
        found = type(f"{prefix}{base.__name__}", (base,), {"own": base, **members})
        _SUBCLASSES[(base, prefix)] = found
    return found


def _rows_adapt_the_tower() -> bool:
    """Whether the forward in progress has a LoRA adapter on the vision tower (then each
    row's blank goes through its own adapter and is not shared)."""
    rows = active_rows()
    return rows is not None and bool(rows.image_segments)


def blank_plan(camera_mask: torch.Tensor) -> BlankPlan | None:
    """For ``bool [rows, slots]`` on the CPU (True: a present camera), the images to
    encode and each image's source among them, or ``None`` when fewer than two slots are
    blank."""
    present = camera_mask.numpy().reshape(-1).tolist()  # numpy's walk: no torch op
    if len(present) - sum(present) < 2:
        return None
    keep: list[int] = []
    source: list[int] = []
    blank = -1
    for i, shown in enumerate(present):
        if shown:
            source.append(len(keep))
            keep.append(i)
        else:
            if blank < 0:
                blank = len(keep)
                keep.append(i)
            source.append(blank)
    return keep, source


def _tower_layout(visual: Any, grid: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the tower derives from its images' grids alone (rotary positions, attention
    segments, Qwen2.5-VL's window order), by the functions it would call itself, in the
    names it accepts them precomputed under."""
    merge = int(visual.spatial_merge_size)
    out = {
        "position_ids": vision_utils.get_vision_position_ids(grid, merge),
        "cu_seqlens": vision_utils.get_vision_cu_seqlens(grid),
    }
    if hasattr(visual, "window_size") and hasattr(visual, "patch_size"):
        window_index, cu_window_seqlens = vision_utils.get_vision_window_index(
            grid,
            spatial_merge_size=merge,
            window_size=int(visual.window_size),
            patch_size=int(visual.patch_size),
        )
        out["window_index"] = window_index.to(grid.device)
        out["cu_window_seqlens"] = cu_window_seqlens
    return out


def _attention_helpers(attn: Any) -> Any | None:
    """The module defining ``attn`` when it is a Qwen-VL vision attention whose module
    has the helpers the batched forward calls (the tower's own rotary, eager attention
    and flash check); else ``None``."""
    module = sys.modules.get(type(attn).__module__)
    helpers = ("apply_rotary_pos_emb_vision", "eager_attention_forward")
    if (
        module is None
        or not all(hasattr(attn, n) for n in ("qkv", "proj", "num_heads", "scaling", "config"))
        or not all(callable(getattr(module, n, None)) for n in helpers)
        or not callable(getattr(module, "is_flash_attention_requested", None))
    ):
        return None
    return module


def _segment_attention(own: Callable[..., torch.Tensor], tower: Any) -> Callable[..., torch.Tensor]:
    """A vision attention forward that runs equal-length segments as one batch and
    leaves anything else (flash attention's varlen kernel, unequal segments) to
    ``own``, the class's own forward; ``tower`` is the module defining it."""

    def forward(
        self: Any,
        hidden_states: torch.Tensor,
        cu_seqlens: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        max_seqlen: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if position_embeddings is None or tower.is_flash_attention_requested(self.config):
            return own(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        bounds = cu_seqlens.tolist()  # the per-segment loop reads these lengths too
        lengths = {b - a for a, b in itertools.pairwise(bounds)}
        total = int(hidden_states.shape[0])
        # One length, and the segments tile the sequence from its first token to its last.
        if len(lengths) != 1 or 0 in lengths or bounds[0] != 0 or bounds[-1] != total:
            return own(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        (length,) = lengths
        heads = int(self.num_heads)
        # [tokens, 3, heads, head_dim] → q, k, v of [tokens, heads, head_dim], q and k rotated.
        q, k, v = self.qkv(hidden_states).reshape(total, 3, heads, -1).unbind(1)
        cos, sin = position_embeddings
        q, k = tower.apply_rotary_pos_emb_vision(q, k, cos, sin)
        # Token t of segment s is row s·length + t: [segments, heads, length, head_dim].
        segments = total // length

        def batched(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(segments, length, heads, -1).transpose(1, 2)

        attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, tower.eager_attention_forward
        )
        out, _ = attend(
            self,
            batched(q),
            batched(k),
            batched(v),
            attention_mask=None,
            scaling=self.scaling,
            dropout=float(getattr(self, "attention_dropout", 0.0)) if self.training else 0.0,
            is_causal=False,
            **kwargs,
        )
        # The interface answers [segments, length, heads, head_dim]: rows in token order.
        projected: torch.Tensor = self.proj(out.reshape(total, -1))
        return projected

    return forward


def _patch_embed_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    # The Conv3d's kernel covers exactly one patch (kernel == stride), so its output is
    # the product of each flattened (C, T, P, P) patch with the flattened kernel.
    proj = self.proj
    weight = proj.weight
    flat = hidden_states.reshape(-1, weight[0].numel()).to(weight.dtype)
    out: torch.Tensor = flat @ weight.reshape(weight.shape[0], -1).t()
    if proj.bias is not None:
        out = out + proj.bias
    return out.view(-1, int(self.embed_dim))


__all__ = ["BlankPlan", "VisionShare", "blank_plan", "install"]
