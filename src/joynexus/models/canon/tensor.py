"""Canonicalization as batched tensor operations (the default predict and training path).

The backbone's Hugging Face processor is the reference of what a canonical input is, but
it works image by image in Python: a few milliseconds per request, all of them holding
the GIL (and, on an accelerator, leaving the device idle). Once every camera has been
resized-with-pad to the canonical square (``resize_with_pad``), the processor's remaining
image work is fixed per architecture — rescale, normalize, and lay the pixels out as the
vision tower reads them — so :class:`TensorCanonicalizer` does it for every image of a
group in one call, on the model's device:

* Qwen2.5-VL / Qwen3-VL: ``patch × patch`` patches in ``merge × merge`` groups, each
  repeated over the temporal patch, flattened to ``[images · grid_h · grid_w, C·T·P·P]``
  with ``image_grid_thw`` of ``[1, grid_h, grid_w]`` per image;
* PaliGemma (SigLIP): ``[rows · slots, C, S, S]``;
* SmolVLM / Idefics3: ``[rows, slots, C, S, S]`` and an all-ones ``pixel_attention_mask``;
* π0: ``[rows, max present cameras, C, S, S]``, absent cameras zero, and the boolean
  ``pixel_attention_mask`` of present cameras.

Text never changes between requests of a policy, so each prompt's token ids (and the
other per-token outputs: ``attention_mask``, ``token_type_ids``, ``mm_token_type_ids``)
are produced once per (instruction, cameras shown) by the processor itself, cached, and
left-padded per batch. Whether a loaded processor's image steps really reduce to the
above (no resize of the canonical square, the usual fused rescale-and-normalize) is
checked when the canonicalizer is built, against the processor, on random images; a
backbone whose processor does something else keeps the processor path
(:meth:`TensorCanonicalizer.build` returns why).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from joynexus.models.canon.canonicalize import CanonicalSpec, processor_inputs

_MAX_PROMPTS = 1024
#: A prompt's per-token inputs by name (``input_ids``, ``attention_mask``, ...).
_Tokens = dict[str, torch.Tensor]
#: Largest |tensor − processor| the load-time check accepts (the ops are the same, so
#: in practice the two agree exactly).
EQUAL_ATOL = 1e-6


class TensorCanonicalizer:
    """Pixel layout and cached prompt ids of one backbone (build with :meth:`build`)."""

    def __init__(self, processor: Any, spec: CanonicalSpec) -> None:
        self.processor = processor
        self.spec = spec
        ip = processor.image_processor
        self._rescale = bool(getattr(ip, "do_rescale", False))
        self._normalize = bool(getattr(ip, "do_normalize", False))
        factor = float(getattr(ip, "rescale_factor", 1 / 255))
        mean = torch.tensor(list(getattr(ip, "image_mean", (0.0, 0.0, 0.0))), dtype=torch.float32)
        std = torch.tensor(list(getattr(ip, "image_std", (1.0, 1.0, 1.0))), dtype=torch.float32)
        if self._rescale and self._normalize:
            # One subtract and one divide on the 0–255 values: the processor's fused form,
            # so both give the same float32 bits.
            mean, std = mean * (1.0 / factor), std * (1.0 / factor)
        self._factor = factor
        self._mean = mean.view(1, -1, 1, 1)
        self._std = std.view(1, -1, 1, 1)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        if spec.pixels == "patches":
            self._patch = int(ip.patch_size)
            self._merge = int(ip.merge_size)
            self._temporal = int(ip.temporal_patch_size)
        self._pad_id = int(processor.tokenizer.pad_token_id or 0)
        # Per cached prompt: its per-token rows, and the same as a one-row batch (most
        # serving batches of a lone policy), so neither is rebuilt per request.
        self._prompts: dict[tuple[str, int], tuple[_Tokens, _Tokens]] = {}
        # Qwen's ``image_grid_thw`` per image count: canonical images share one grid.
        self._grids: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()

    @classmethod
    def build(
        cls, processor: Any, spec: CanonicalSpec
    ) -> tuple[TensorCanonicalizer | None, str | None]:
        """A canonicalizer checked equal to ``processor`` on random canonical images, or
        ``(None, why)`` when this processor does something the tensor path does not."""
        if spec.pixels is None:
            return None, f"no tensor layout for architecture {spec.arch!r}"
        try:
            tensor = cls(processor, spec)
            gen = torch.Generator().manual_seed(0)
            size, slots = spec.canonical_image_size, spec.num_camera_slots
            images = torch.randint(0, 256, (2, slots, 3, size, size), generator=gen)
            images = images.to(torch.uint8)
            camera_mask = torch.ones((2, slots), dtype=torch.bool)
            camera_mask[1, 1:] = False  # a row with one camera (``present`` drops the others)
            texts = ["pick up the red block", ""]
            ref = processor_inputs(processor, spec, images, camera_mask, texts)
            got = tensor.encode(images, camera_mask, texts, torch.device("cpu"))
            why = mismatch(ref, got)
        except Exception as exc:  # any failure keeps the reference path
            return None, f"the tensor path failed its check: {type(exc).__name__}: {exc}"
        return (None, why) if why else (tensor, None)

    # -- images -------------------------------------------------------------------

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        stats = self._on.get(device)
        if stats is None:
            stats = (self._mean.to(device), self._std.to(device))
            self._on[device] = stats
        return stats

    def _values(self, images: torch.Tensor) -> torch.Tensor:
        """``uint8 [n, C, S, S]`` → rescaled and normalized ``float32`` (same op order as
        the processor's fused step)."""
        if self._normalize:
            mean, std = self._stats(images.device)
            if not self._rescale:
                return (images.to(torch.float32) - mean) / std
            # uint8 minus float32 is float32: the conversion rides in the subtraction
            # (the same values as converting first, one pass over the pixels fewer).
            return torch.sub(images, mean).div_(std)
        if self._rescale:
            return images * self._factor
        return images.to(torch.float32)

    def _qwen_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Contiguous ``[..., C, h, w]`` images (``n`` in all) → ``[n · gh · gw, C·T·P·P]``."""
        c, h, w = (int(v) for v in x.shape[-3:])
        n = x.numel() // (c * h * w)
        p, m, t = self._patch, self._merge, self._temporal
        gh, gw = h // p, w // p
        # [n, C, gh/m, m, P, gw/m, m, P] read as [n, gh/m, gw/m, m, m, C, T, P, P]: merge
        # groups of patches stay contiguous (the merger reads them as one token); each
        # patch is repeated over the temporal axis (stride 0: a still image is a
        # one-frame video). One strided view, then one copy.
        view = x.as_strided(
            (n, gh // m, gw // m, m, m, c, t, p, p),
            (c * h * w, m * p * w, m * p, p * w, p, h * w, 0, w, 1),
        )
        return view.reshape(n * gh * gw, c * t * p * p)

    def pixels(self, images: torch.Tensor, camera_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The image inputs of ``uint8 [B, slots, 3, S, S]`` canonical images (on the
        device they are on); ``camera_mask`` marks present cameras (the ``present``
        layout drops the rest)."""
        b, slots, c, h, w = (int(v) for v in images.shape)
        layout = self.spec.pixels
        if layout == "present":
            # Present cameras fill each row's first slots; the processor pads every row
            # to the most cameras any row has, with zero images.
            present = camera_mask.sum(dim=1)
            shown = max(1, int(present.max()))
            keep = camera_mask[:, :shown].to(images.device)
            values = self._values(images[:, :shown].reshape(b * shown, c, h, w))
            values = values.view(b, shown, c, h, w) * keep.view(b, shown, 1, 1, 1)
            return {"pixel_values": values, "pixel_attention_mask": keep.clone()}
        # Every image in one call; the layouts below read the [B, slots, C, S, S] block
        # as the images' sequence (one contiguous tensor either way).
        flat = self._values(images)
        if layout == "patches":
            return {
                "pixel_values": self._qwen_patches(flat),
                "image_grid_thw": self._grid(b * slots, h, w),
            }
        if layout == "slots":
            mask = torch.ones((b, slots, h, w), dtype=torch.int64, device=images.device)
            return {"pixel_values": flat, "pixel_attention_mask": mask}
        return {"pixel_values": flat.view(b * slots, c, h, w)}

    def _grid(self, images: int, h: int, w: int) -> torch.Tensor:
        """``[images, 3]`` rows of ``[1, h/patch, w/patch]`` (cached; the forward only
        reads it)."""
        grid = self._grids.get(images)
        if grid is None:
            p = self._patch
            grid = torch.tensor([[1, h // p, w // p]] * images, dtype=torch.long)
            if len(self._grids) >= _MAX_PROMPTS:
                self._grids.clear()
            self._grids[images] = grid
        return grid

    # -- text ---------------------------------------------------------------------

    def _prompt_row(self, text: str, cameras: int) -> tuple[_Tokens, _Tokens]:
        """One row's per-token outputs for ``text`` with ``cameras`` images, and the
        same as a one-row batch (cached)."""
        key = (text, cameras)
        with self._lock:
            hit = self._prompts.get(key)
        if hit is not None:
            return hit
        spec, size = self.spec, self.spec.canonical_image_size
        # The text outputs do not depend on pixel values, only on how many images a row
        # shows; blank canonical images stand in for the row's cameras.
        images = torch.zeros((1, spec.num_camera_slots, 3, size, size), dtype=torch.uint8)
        mask = torch.zeros((1, spec.num_camera_slots), dtype=torch.bool)
        mask[0, :cameras] = True
        out = processor_inputs(self.processor, spec, images, mask, [text])
        ids = out["input_ids"]
        batch = {k: v for k, v in out.items() if v.dim() == 2 and v.shape == ids.shape}
        entry = ({k: v[0] for k, v in batch.items()}, batch)
        with self._lock:
            if len(self._prompts) >= _MAX_PROMPTS:
                self._prompts.clear()
            self._prompts[key] = entry
        return entry

    def text(self, texts: Sequence[str], camera_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Left-padded per-token inputs of ``texts`` (CPU; one row per text)."""
        present = self.spec.pixels == "present"
        counts = camera_mask.sum(dim=1).tolist() if present else None
        slots = self.spec.num_camera_slots
        cached = [
            self._prompt_row(t, int(counts[i]) if counts is not None else slots)
            for i, t in enumerate(texts)
        ]
        if len(cached) == 1:  # the prompt's own one-row batch (the forward only reads it)
            return cached[0][1]
        rows = [entry[0] for entry in cached]
        widths = [int(r["input_ids"].shape[0]) for r in rows]
        width = max(widths)
        if min(widths) == width:  # one prompt length (a policy's one instruction): no pad
            return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
        out: dict[str, torch.Tensor] = {}
        for key, first in rows[0].items():
            fill = self._pad_id if key == "input_ids" else 0
            out[key] = torch.full((len(rows), width), fill, dtype=first.dtype)
        for i, r in enumerate(rows):
            n = int(r["input_ids"].shape[0])
            for key, value in r.items():
                out[key][i, width - n :] = value
        return out

    def encode(
        self,
        images: torch.Tensor,
        camera_mask: torch.Tensor,
        texts: Sequence[str],
        device: torch.device,
    ) -> dict[str, torch.Tensor]:
        """Every model input of a batch: images uploaded once as ``uint8`` (a quarter of
        the float bytes) and laid out on ``device``; text from the prompt cache."""
        inputs = {k: moved_to(v, device) for k, v in self.text(texts, camera_mask).items()}
        inputs.update(self.pixels(moved_to(images, device), camera_mask))
        return inputs


def moved_to(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``value`` on ``device``; one already there without a call into torch."""
    return value if value.device == device else value.to(device)


def mismatch(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> str | None:
    """Why two sets of model inputs differ (keys, shapes, dtypes, values beyond
    :data:`EQUAL_ATOL`), or ``None`` when they are equal."""
    if set(ref) != set(got):
        return f"keys differ: processor {sorted(ref)}, tensor {sorted(got)}"
    for key, want in ref.items():
        have, want = got[key].cpu(), want.cpu()
        if have.shape != want.shape or have.dtype != want.dtype:
            return (
                f"{key}: processor {want.dtype}{list(want.shape)}, "
                f"tensor {have.dtype}{list(have.shape)}"
            )
        if want.is_floating_point():
            diff = float((have.double() - want.double()).abs().max()) if want.numel() else 0.0
            if diff > EQUAL_ATOL:
                return f"{key}: max |difference| {diff:.3g} > {EQUAL_ATOL:g}"
        elif not torch.equal(have, want):
            return f"{key}: values differ"
    return None


def max_abs_difference(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> float:
    """Largest |difference| over the floating inputs of two equal-shaped sets."""
    worst = 0.0
    for key, want in ref.items():
        if want.is_floating_point() and want.numel():
            diff = got[key].cpu().double() - want.cpu().double()
            worst = max(worst, float(diff.abs().max()))
    return worst


__all__ = ["EQUAL_ATOL", "TensorCanonicalizer", "max_abs_difference", "mismatch", "moved_to"]
