"""Canonicalization: many tenants' observation batches → one backbone input.

Each tenant's samples are mapped onto the backbone's canonical prototype — a fixed number
of camera slots, every image resized-with-pad to one square size, the instruction through
the backbone's own processor/chat template — and then concatenated. Every row is built
by the same per-sample rules whatever else is in the batch, and text is LEFT-padded, so
a row's real tokens (and hence its features) do not depend on its batch-mates.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from joynexus.errors import InvalidRequestError, SchemaMismatchError
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import SliceEntry, VLAFeature
from joynexus.models.schema import DataSchema


class BatchEncoder(Protocol):
    """What :func:`canonicalize` asks of a tensor canonicalizer
    (:class:`joynexus.models.canon.tensor.TensorCanonicalizer`, which imports this module)."""

    def encode(
        self,
        images: torch.Tensor,
        camera_mask: torch.Tensor,
        texts: Sequence[str],
        device: torch.device,
    ) -> dict[str, torch.Tensor]: ...


#: How a prompt is written: ``chat`` through the processor's chat template (images where
#: the template says; ``image_tokens`` when the processor has no template),
#: ``image_tokens``: one image token per slot in front of the instruction (PaliGemma),
#: ``text``: the instruction alone (the processor puts the images' tokens in itself).
PromptStyle = Literal["chat", "image_tokens", "text"]
#: How the vision tower reads the canonical images: ``patches`` (Qwen-VL's flattened
#: patches with a grid per image), ``images`` (``[rows · slots, C, S, S]``), ``slots``
#: (``[rows, slots, C, S, S]`` with an all-ones pixel mask), ``present`` (each row's
#: present cameras only, padded to the widest row, with their mask).
PixelLayout = Literal["patches", "images", "slots", "present"]
# Processor outputs that are training labels, never backbone inputs.
_DROP_KEYS = frozenset({"labels"})


def _interpolate_aa(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)


# ``F.interpolate``'s antialiased bilinear mode is this one aten op. Its Python argument
# checks cost a lone request more than the uint8 kernel itself (cold, after a forward),
# so the op is called directly where this torch has it (tests hold the two equal).
_ATEN_AA: Callable[..., torch.Tensor] | None = getattr(
    torch._C._nn, "_upsample_bilinear2d_aa", None
)


def _aten_aa(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    assert _ATEN_AA is not None  # chosen below only where this torch has the op
    return _ATEN_AA(x, list(size), False, None)


_resize_aa = _interpolate_aa if _ATEN_AA is None else _aten_aa


def resize_with_pad(
    images: np.ndarray, size: int, *, into: torch.Tensor | None = None
) -> torch.Tensor:
    """Resize ``uint8 [N, H, W, C]`` images into ``size × size`` keeping aspect ratio.

    The longer side becomes ``size``; the shorter side is centred and padded with black.
    Grey (1–2 channel) images are replicated to RGB, an alpha channel is dropped.

    Args:
        images: The camera frames.
        size: The canonical square's side.
        into: An all-zero ``uint8 [N, 3, size, size]`` tensor (a view of the batch's
            image tensor) to write the result into instead of a new one: the padding is
            already there, so only the image's own pixels are written.

    Returns:
        ``uint8 [N, 3, size, size]`` (``into`` when given).
    """
    # NHWC as an NCHW view (numpy's transpose: no torch op), channels-last in memory.
    x = torch.from_numpy(np.ascontiguousarray(images).transpose(0, 3, 1, 2))
    c = int(x.shape[1])
    if c != 3:
        x = x[:, :1].expand(-1, 3, -1, -1) if c < 3 else x[:, :3]
        x = x.contiguous(memory_format=torch.channels_last)
    n, _, h, w = (int(v) for v in x.shape)
    scale = size / max(h, w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    if (new_h, new_w) != (h, w):
        # torch's uint8 kernel (the one torchvision resizes uint8 images with), on the
        # channels-last layout the images arrive in: 4-8x faster than resizing them as
        # floats (the float result, rounded, differs by at most 1 of 255).
        x = _resize_aa(x, (new_h, new_w))
    out = torch.zeros((n, 3, size, size), dtype=torch.uint8) if into is None else into
    if new_h == new_w == size:  # a square camera fills the square: no padding to skip
        return out.copy_(x)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    out[:, :, top : top + new_h, left : left + new_w] = x
    return out


@dataclass(frozen=True)
class CanonicalSpec:
    """What the backbone's canonical input looks like (fixed per resident model).

    Attributes:
        arch: The resident architecture's name (messages only).
        num_camera_slots: Camera slots of every row.
        canonical_image_size: Side of the square every camera is resized-with-pad to.
        prompt: How the instruction becomes the prompt (:data:`PromptStyle`).
        pixels: The vision tower's image layout (:data:`PixelLayout`); ``None``: the
            tensor canonicalizer has no layout for it (the processor path only).
        processor_kwargs: Extra keyword arguments of the processor call.
    """

    arch: str
    num_camera_slots: int
    canonical_image_size: int
    prompt: PromptStyle = "image_tokens"
    pixels: PixelLayout | None = "images"
    processor_kwargs: tuple[tuple[str, Any], ...] = ()
    #: A model that reads its cameras otherwise than as the uint8 squares (a LeRobot
    #: policy that resizes float frames its own way): ``(uint8 [N, H, W, C] frames,
    #: size) → float32 [N, 3, size, size]`` in [0, 1], what the encoder gets in place of
    #: the squares (the feature's ``images`` stay the squares). ``None``: the squares.
    model_pixels: Callable[[np.ndarray, int], torch.Tensor] | None = None


# Prompts by processor: the chat template is pure in (spec, instruction), and a policy's
# requests repeat one instruction, so each prompt is rendered once (bounded per processor).
_PROMPTS: weakref.WeakKeyDictionary[Any, dict[tuple[CanonicalSpec, str], str]] = (
    weakref.WeakKeyDictionary()
)
_PROMPTS_LOCK = threading.Lock()
_MAX_PROMPTS = 1024


def _cached_prompt(processor: Any, spec: CanonicalSpec, instruction: str) -> str:
    key = (spec, instruction)
    try:
        with _PROMPTS_LOCK:
            cache = _PROMPTS.setdefault(processor, {})
            hit = cache.get(key)
    except TypeError:  # a processor that cannot be weakly referenced: no cache
        return _prompt(processor, spec, instruction)
    if hit is not None:
        return hit
    text = _prompt(processor, spec, instruction)
    with _PROMPTS_LOCK:
        if len(cache) >= _MAX_PROMPTS:
            cache.clear()
        cache[key] = text
    return text


def _prompt(processor: Any, spec: CanonicalSpec, instruction: str) -> str:
    if spec.prompt == "text":
        # The processor puts each present camera's image tokens and BOS in front itself.
        return instruction
    if spec.prompt == "chat" and getattr(processor, "chat_template", None):
        content: list[dict[str, str]] = [{"type": "image"}] * spec.num_camera_slots
        content = [*content, {"type": "text", "text": instruction}]
        messages = [{"role": "user", "content": content}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(text)
    # PaliGemma: the processor adds BOS after the image tokens and a trailing newline.
    return str(processor.image_token) * spec.num_camera_slots + instruction


def canonicalize(
    processor: Any,
    spec: CanonicalSpec,
    groups: Sequence[tuple[str, DataSchema, ObservationBatch]],
    *,
    signatures: Sequence[str],
    validated: bool = False,
    encoder: BatchEncoder | None = None,
    device: torch.device | None = None,
) -> VLAFeature:
    """Build one :class:`VLAFeature` from ``(tenant_id, schema, batch)`` groups.

    Args:
        processor: The backbone's own ``transformers`` processor.
        spec: The backbone's canonical prototype.
        groups: One entry per tenant, in the row order wanted.
        signatures: Schema signature of each group (same order), for the slice table.
        validated: Every batch was already checked against its schema (the Inference
            Model Service validates a request once, at admission); skip that check.
        encoder: The backbone's tensor canonicalizer (the default path: pixels laid out
            on ``device``, prompt ids cached); ``None`` runs the processor on CPU.
        device: Where the tensor path puts the inputs (default: CPU).

    Raises:
        InvalidRequestError: No groups, or a tenant id appears twice.
        SchemaMismatchError: A batch does not match its schema, or a schema has more
            cameras than the backbone has camera slots.
    """
    if not groups:
        raise InvalidRequestError("canonicalize: expected at least one (tenant, schema, batch)")
    seen: set[str] = set()
    for tenant_id, schema, batch in groups:
        if tenant_id in seen:
            raise InvalidRequestError(
                f"tenant {tenant_id!r} appears twice; concatenate its batches first "
                "(ObservationBatch.concat)",
                tenant_id=tenant_id,
            )
        seen.add(tenant_id)
        if len(schema.cameras) > spec.num_camera_slots:
            raise SchemaMismatchError(
                f"cameras: schema {schema.name!r} of tenant {tenant_id!r} has "
                f"{len(schema.cameras)} cameras but the base model has "
                f"{spec.num_camera_slots} camera slots",
                field="cameras",
                tenant_id=tenant_id,
                num_camera_slots=spec.num_camera_slots,
            )
        if not validated:
            batch.validate(schema)

    size, slots = spec.canonical_image_size, spec.num_camera_slots
    total = sum(b.batch_size for _, _, b in groups)
    max_state = max(s.state_dim for _, s, _ in groups)
    # numpy's zeroed allocation costs a fraction of torch.zeros on a cold CPU (a lone
    # request's canonicalization follows a whole forward that evicted the caches).
    pixels = np.zeros((total, slots, 3, size, size), dtype=np.uint8)
    images = torch.from_numpy(pixels)
    # The small per-row tables are filled in numpy (an indexed write there costs a
    # fraction of a torch op's dispatch) and shared with torch at the end.
    camera_mask = np.zeros((total, slots), dtype=np.bool_)
    state = np.zeros((total, max_state), dtype=np.float32)
    state_mask = np.zeros((total, max_state), dtype=np.bool_)
    instructions: list[str] = []
    slices: list[SliceEntry] = []
    # Cameras of one source shape are resized in one call whatever tenant they belong
    # to (each image's result depends on that image alone).
    by_shape: dict[tuple[int, ...], list[tuple[int, int, int, np.ndarray]]] = {}
    row = 0
    for (tenant_id, schema, batch), signature in zip(groups, signatures, strict=True):
        n = batch.batch_size
        for slot, name in enumerate(schema.camera_names):
            img = batch.cameras[name]
            by_shape.setdefault(tuple(img.shape[1:]), []).append((row, n, slot, img))
            camera_mask[row : row + n, slot] = True
        state[row : row + n, : schema.state_dim] = batch.state
        state_mask[row : row + n, : schema.state_dim] = True
        instructions.extend(batch.instructions)
        slices.append(SliceEntry(tenant_id, signature, row, row + n))
        row += n
    for parts in by_shape.values():
        if len(parts) == 1:  # one tenant's camera: resized straight into its slot
            start, n, slot, img = parts[0]
            # Its slot viewed through numpy: an index there is not a torch op.
            resize_with_pad(img, size, into=torch.from_numpy(pixels[start : start + n, slot]))
            continue
        resized = resize_with_pad(np.concatenate([img for _, _, _, img in parts]), size).numpy()
        offset = 0
        for start, n, slot, _ in parts:  # numpy's copies: a group batch has one per tenant
            pixels[start : start + n, slot] = resized[offset : offset + n]
            offset += n
    mask = torch.from_numpy(camera_mask)
    shown = images
    if spec.model_pixels is not None:
        shown = torch.zeros((total, slots, 3, size, size), dtype=torch.float32)
        for parts in by_shape.values():
            for start, n, slot, img in parts:
                shown[start : start + n, slot] = spec.model_pixels(img, size)

    if encoder is None:
        model_inputs = processor_inputs(processor, spec, images, mask, instructions)
    else:
        model_inputs = encoder.encode(shown, mask, instructions, device or torch.device("cpu"))
    return VLAFeature(
        model_inputs=model_inputs,
        state=torch.from_numpy(state),
        state_mask=torch.from_numpy(state_mask),
        camera_mask=mask,
        slices=slices,
        images=images,
    )


def processor_inputs(
    processor: Any,
    spec: CanonicalSpec,
    images: torch.Tensor,
    camera_mask: torch.Tensor,
    instructions: Sequence[str],
) -> dict[str, torch.Tensor]:
    """The backbone inputs the Hugging Face processor makes of canonical ``uint8
    [B, slots, 3, S, S]`` images and one instruction per row (CPU): the reference the
    tensor path (:mod:`joynexus.models.canon.tensor`) is held equal to."""
    total, slots = int(images.shape[0]), int(images.shape[1])
    texts = [_cached_prompt(processor, spec, text) for text in instructions]
    nested = [[images[i, s] for s in range(slots)] for i in range(total)]
    if spec.pixels == "present":
        # Absent cameras are masked (pixel_attention_mask), not shown as blank images;
        # a tenant's cameras fill the first slots, so its row keeps exactly those.
        nested = [[images[i, s] for s in range(slots) if camera_mask[i, s]] for i in range(total)]
    kwargs: dict[str, Any] = dict(spec.processor_kwargs)
    with warnings.catch_warnings():
        # PaliGemma's processor builds (unused) labels via np.array on tensors.
        warnings.filterwarnings("ignore", message=".*__array__ implementation.*")
        # π0's processor defaults to max_length padding, which ``padding=True`` replaces.
        warnings.filterwarnings("ignore", message=".*max_length. is ignored.*")
        encoded = processor(
            text=texts,
            images=nested,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            **kwargs,
        )
    return {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor) and k not in _DROP_KEYS}
