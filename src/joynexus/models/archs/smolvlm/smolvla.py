"""A LeRobot SmolVLA checkpoint, computed by JoyNexus in the project's own venv.

LeRobot's SmolVLA runs a truncated SmolVLM (vision tower, connector, the first
``num_vlm_layers`` text layers) over a prefix of image, language and state tokens, and a
narrower Llama-style *action expert* that denoises an action chunk by flow matching while
attending to the prefix's per-layer keys and values: in "self" layers the expert's own
keys and values are appended to the prefix's, in "cross" layers it reads the prefix's
keys and values through its own key/value projections and nothing else.

:class:`SmolVLA` holds the checkpoint's modules under the checkpoint's own state-dict
names (``model.vlm_with_expert.vlm.*``, ``model.vlm_with_expert.lm_expert.*``,
``model.state_proj`` ...), built from ``transformers``' SmolVLM and Llama classes, and
loads ``model.safetensors`` strictly — so every tensor is accounted for, and writing the
state dict back is LeRobot's layout. Its forward is written here from the published
SmolVLA design (rotary positions on absolute token indices, fp32 attention scores,
block-causal masks: image and language tokens see each other, the state token sees them,
action tokens see the prefix and the earlier action tokens), and it is checked against
the real ``lerobot`` package: same observation, same noise, same actions
(tests/models/test_smolvla.py).

The prefix split that keeps a SmolVLA prefix shared: image and language tokens never
attend to the state token, so their keys and values do not depend on any tenant.
:meth:`SmolVLA.shared_cache` computes them once for every row, and
:meth:`SmolVLA.with_state` extends that cache by each row's state token (projected by a
tenant's ``state_proj``) through the frozen layers: the cache of the whole prefix, as
lerobot computes it in one pass (tests/models/test_smolvla.py compares the actions).
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from joynexus.errors import InvalidRequestError
from joynexus.interop.lerobot import (
    POSTPROCESSOR,
    PREPROCESSOR,
    WEIGHTS,
    LeRobotCheckpoint,
    read_lerobot_checkpoint,
    write_processors,
)

#: Per layer: the prefix's (keys, values), ``[B, P, kv_heads, head_dim]``, keys rotated.
PrefixCache = list[tuple[torch.Tensor, torch.Tensor]]
NORM_EPS = 1e-8


#: The rule that gives SmolVLM's vision patches their position embeddings (the
#: transformers release the checkpoint's lerobot ran on): :func:`patch_buckets`.
VisionPositions = Literal["transformers4", "transformers5"]
#: The config key lerobot 0.6 and later write (``PreTrainedConfig.pretrained_revision``)
#: and 0.5 and earlier do not.
LEROBOT_06_KEY = "pretrained_revision"


def vision_positions(config: dict[str, Any], vlm_config: Any) -> VisionPositions:
    """The patch-position rule a SmolVLA checkpoint is run with: lerobot's, as the
    lerobot that wrote the checkpoint ran it.

    A checkpoint names no lerobot or transformers release, so the rule is read from
    what the writer left: lerobot >= 0.6 (transformers 5) writes ``pretrained_revision``
    into ``config.json``; lerobot 0.5 (transformers 5) leaves its VLM's ``config.json``
    stamped with a transformers 5 version when the VLM is a local folder it saved. A
    checkpoint with neither mark — lerobot <= 0.4, transformers 4, the era of
    ``lerobot/smolvla_base``, whose hub VLM is stamped 4.x — keeps transformers 4's rule,
    the one it was trained with. (lerobot >= 0.5 runs such a checkpoint with
    transformers 5's rule; docs/BACKBONES.md says what that moves.)
    """
    if LEROBOT_06_KEY in config:
        return "transformers5"
    stamp = str(getattr(vlm_config, "transformers_version", None) or "")
    major = stamp.split(".", 1)[0]
    if major.isdigit() and int(major) >= 5:
        return "transformers5"
    return "transformers4"


def patch_buckets(
    n: int, side: int, rule: VisionPositions, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The position-embedding row (of ``side`` per axis) of each of ``n`` patches along
    one axis: patch ``i`` at fraction ``i / n``, bucketed between ``side`` equal steps.

    transformers 4 computes the fraction as ``i / n · (1 − 1e-6)`` in the pixels' dtype,
    which puts every patch but the first one bucket below its own when ``n`` is the
    tower's side; transformers 5 computes ``i · (1 / n)`` in fp32, clamped below 1, then
    casts it to the pixels' dtype — patch ``i`` in bucket ``i``. Both are written as the
    release computes them, so float rounding lands on the same side.
    """
    bounds = torch.arange(1 / side, 1.0, 1 / side, device=device)
    if rule == "transformers4":
        coords = torch.arange(n, device=device, dtype=dtype) / n * (1 - 1e-6)
    else:
        step = 1.0 / torch.tensor([n], device=device)
        coords = torch.arange(n, device=device, dtype=torch.float32) * step
        coords = torch.clamp(coords, max=(1.0 - 1e-6)).to(dtype)
    return torch.bucketize(coords, bounds, right=True)


def _ffn_width(hidden: int) -> int:
    """The expert MLP width SmolVLA derives from its hidden size (2/3 · 4 ·, to 256)."""
    width = 4 * int(2 * hidden / 3)
    return 256 * ((width + 255) // 256)


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10_000.0) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, L, H, D]`` at integer ``positions`` ``[B, L]``
    (the two halves of each head rotated as complex pairs), computed in fp32."""
    half = x.shape[-1] // 2
    exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device)
    angles = positions[..., None].float() / (base**exponents)[None, None, :]
    sin, cos = torch.sin(angles)[..., None, :], torch.cos(angles)[..., None, :]
    x32 = x.float()
    first, second = x32[..., :half], x32[..., half:]
    out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return out.to(x.dtype)


def time_embedding(t: torch.Tensor, width: int, min_period: float, max_period: float) -> Any:
    """Sine/cosine features ``[B, width]`` of flow times ``t`` ``[B]`` over periods spaced
    geometrically from ``min_period`` to ``max_period`` (computed in fp64)."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    phase = (2 * math.pi / period)[None, :] * t[:, None].double()
    return torch.cat([torch.sin(phase), torch.cos(phase)], dim=1)


def resize_with_pad(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """lerobot's SmolVLA image resize: float ``[B, 3, H, W]`` scaled (bilinear, no
    antialiasing) so that it fits ``height × width`` with its aspect ratio kept (sides
    truncated to whole pixels), zero-padded on the top and left. An image of that size
    is returned as it is."""
    h, w = image.shape[-2:]
    if (h, w) == (height, width):
        return image
    ratio = max(w / width, h / height)
    size = (int(h / ratio), int(w / ratio))
    image = F.interpolate(image, size=size, mode="bilinear", align_corners=False)
    return F.pad(image, (max(0, width - size[1]), 0, max(0, height - size[0]), 0), value=0.0)


def camera_pixels(frames: np.ndarray, size: int) -> torch.Tensor:
    """What lerobot's SmolVLA makes of a camera's ``uint8 [N, H, W, C]`` frames before
    its ``[-1, 1]`` scaling: floats in [0, 1] (``/ 255``, as its datasets and robots hand
    them over), then :func:`resize_with_pad` to the ``size`` square, in fp32. The
    canonical input of a SmolVLA prefix (``CanonicalSpec.model_pixels``): resizing the
    uint8 squares instead moves a tiny model's actions by 1.7e-3 at 32 px."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    channels = int(x.shape[1])
    if channels != 3:  # grey replicated to RGB, alpha dropped (as the uint8 squares)
        x = x[:, :1].expand(-1, 3, -1, -1) if channels < 3 else x[:, :3]
    return resize_with_pad(x.float() / 255.0, size, size)


class _VLMWithExpert(nn.Module):
    """The checkpoint's ``vlm_with_expert``: the truncated SmolVLM and the action expert."""

    def __init__(self, vlm_config: Any, config: dict[str, Any]):
        super().__init__()
        hf: Any = importlib.import_module("transformers")
        self.vlm: Any = hf.SmolVLMForConditionalGeneration(vlm_config)
        text = self.vlm.model.text_model
        text.layers = text.layers[: int(config["num_vlm_layers"])]
        text_config = vlm_config.text_config
        expert_config = copy.deepcopy(text_config)
        width = int(text_config.hidden_size * float(config["expert_width_multiplier"]))
        expert_config.hidden_size = width
        expert_config.intermediate_size = _ffn_width(width)
        n_expert = int(config.get("num_expert_layers", -1))
        expert_config.num_hidden_layers = n_expert if n_expert > 0 else len(text.layers)
        self.lm_expert: Any = hf.AutoModel.from_config(expert_config)
        self.lm_expert.embed_tokens = None
        self.cross = "cross" in str(config["attention_mode"])
        self.every = int(config["self_attn_every_n_layers"])
        kv_width = int(text_config.num_key_value_heads) * int(text_config.head_dim)
        for i, layer in enumerate(self.lm_expert.layers):
            if self.cross and not self.is_self_layer(i):
                # Cross layers project the prefix's keys/values, not the expert's tokens.
                expert_kv = int(expert_config.num_key_value_heads) * int(expert_config.head_dim)
                bias = bool(expert_config.attention_bias)
                layer.self_attn.k_proj = nn.Linear(kv_width, expert_kv, bias=bias)
                layer.self_attn.v_proj = nn.Linear(kv_width, expert_kv, bias=bias)
        self.heads = int(text_config.num_attention_heads)
        self.kv_heads = int(text_config.num_key_value_heads)
        self.head_dim = int(text_config.head_dim)
        self.expert_width = width

    def is_self_layer(self, i: int) -> bool:
        return not self.cross or (self.every > 0 and i % self.every == 0)

    def expert_layer(self, i: int, expert: Any = None) -> Any:
        """The layer of ``expert`` (default: the checkpoint's) paired with VLM layer ``i``
        (``None``: the expert skips it)."""
        expert = self.lm_expert if expert is None else expert
        n_vlm, n_expert = len(self.vlm.model.text_model.layers), len(expert.layers)
        step = n_vlm // n_expert
        if step > 0 and i > 0 and i % step:
            return None
        return expert.layers[i // step if step > 0 else i]

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Grouped-query attention with fp32 scores; ``[B, Lq, heads · head_dim]``."""
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=2)
        v = v.repeat_interleave(groups, dim=2)
        scores = torch.matmul(q.float().transpose(1, 2), k.float().permute(0, 2, 3, 1))
        scores = scores * self.head_dim**-0.5
        scores = scores.masked_fill(~mask[:, None], torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v.transpose(1, 2)).transpose(1, 2)
        return out.reshape(q.shape[0], q.shape[1], -1)

    @staticmethod
    def finish(layer: Any, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP, residual."""
        out = layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype)) + hidden
        result: torch.Tensor = out + layer.mlp(layer.post_attention_layernorm(out))
        return result

    def _qkv(self, layer: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shape = (*x.shape[:-1], -1, self.head_dim)
        attn = layer.self_attn
        return attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)


class _FlowModel(nn.Module):
    """The checkpoint's ``model``: the VLM with its expert, and the projections around."""

    def __init__(self, core: _VLMWithExpert, state_dim: int, action_dim: int, text: int):
        super().__init__()
        width = core.expert_width
        self.vlm_with_expert = core
        self.state_proj = nn.Linear(state_dim, text)
        self.action_in_proj = nn.Linear(action_dim, width)
        self.action_out_proj = nn.Linear(width, action_dim)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)


class SmolVLA(nn.Module):
    """A LeRobot SmolVLA policy (its weights under its own names) with its processors.

    Build it with :meth:`from_lerobot`.
    """

    def __init__(self, ckpt: LeRobotCheckpoint, config: dict[str, Any], vlm_config: Any):
        super().__init__()
        self.ckpt = ckpt
        self.config = config
        self.model = _FlowModel(
            _VLMWithExpert(vlm_config, config),
            ckpt.max_state_dim,
            ckpt.max_action_dim,
            int(vlm_config.text_config.hidden_size),
        )
        self.image_size = tuple(int(s) for s in config["resize_imgs_with_padding"])
        self.tokenizer: Any = None
        self.vision_positions: VisionPositions = vision_positions(config, vlm_config)

    @property
    def core(self) -> _VLMWithExpert:
        return self.model.vlm_with_expert

    @classmethod
    def from_lerobot(cls, path: str | Path) -> SmolVLA:
        """Load a LeRobot ``smolvla`` directory (weights strictly, tokenizer of its VLM).

        Raises:
            SpecError: not a readable LeRobot SmolVLA checkpoint.
        """
        ckpt = read_lerobot_checkpoint(path)
        config = json.loads((Path(ckpt.path) / "config.json").read_text())
        hf: Any = importlib.import_module("transformers")
        vlm = vlm_path(config, ckpt.path)
        vlm_config = hf.AutoConfig.from_pretrained(vlm)
        model = cls(ckpt, config, vlm_config)
        state = load_file(str(Path(ckpt.path) / "model.safetensors"))
        model.load_state_dict(state, strict=True)
        model.tokenizer = hf.AutoTokenizer.from_pretrained(vlm)
        return model.eval()

    # -- inputs ----------------------------------------------------------------------

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        stats = self.ckpt.stats["observation.state"]
        mean, std = torch.tensor(stats["mean"]), torch.tensor(stats["std"])
        out = (state - mean.to(state)) / (std.to(state) + NORM_EPS)
        return F.pad(out, (0, self.ckpt.max_state_dim - out.shape[-1]))

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        stats = self.ckpt.stats["action"]
        mean, std = torch.tensor(stats["mean"]), torch.tensor(stats["std"])
        return actions * (std.to(actions) + NORM_EPS) + mean.to(actions)

    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1] → the checkpoint's size (:func:`resize_with_pad`),
        scaled to [-1, 1]."""
        width, height = self.image_size  # lerobot keeps it as (width, height)
        return resize_with_pad(image, height, width) * 2.0 - 1.0

    def tokenize(self, tasks: list[str], device: torch.device) -> tuple[torch.Tensor, ...]:
        """Task strings → ``(ids, mask)``, each task ending in a newline, right-padded."""
        texts = [t if t.endswith("\n") else t + "\n" for t in tasks]
        out = self.tokenizer(
            texts,
            max_length=int(self.config["tokenizer_max_length"]),
            truncation=True,
            padding=str(self.config["pad_language_to"]),
            padding_side="right",
            return_tensors="pt",
        )
        return out["input_ids"].to(device), out["attention_mask"].to(device).bool()

    # -- the prefix ------------------------------------------------------------------

    def embed_shared(
        self,
        images: list[torch.Tensor],
        ids: torch.Tensor,
        lang_mask: torch.Tensor,
        camera_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tenant-independent prefix: embeddings ``[B, P, W]`` of the cameras, then the
        language, and their validity ``[B, P]`` (language right-padded; the tokens of a
        camera a row lacks, ``camera_mask[:, i]`` False, are invalid)."""
        vlm = self.core.vlm.model
        embs, pads = [], []
        for i, image in enumerate(images):
            emb = vlm.connector(self.see(image))
            embs.append(emb * math.sqrt(emb.shape[-1]))
            seen = torch.ones(emb.shape[:2], dtype=torch.bool, device=emb.device)
            if camera_mask is not None:
                seen = seen & camera_mask[:, i : i + 1].to(seen.device)
            pads.append(seen)
        lang = vlm.text_model.get_input_embeddings()(ids)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(lang_mask)
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)

    def see(self, image: torch.Tensor) -> torch.Tensor:
        """The vision tower on whole ``[B, 3, S, S]`` images, with the patch positions of
        the checkpoint's rule (:attr:`vision_positions`, see :func:`vision_positions`)."""
        tower = self.core.vlm.model.vision_model
        emb = tower.embeddings
        pixels = image.to(emb.patch_embedding.weight.dtype)
        patches = emb.patch_embedding(pixels).flatten(2).transpose(1, 2)
        rows, cols = pixels.shape[-2] // emb.patch_size, pixels.shape[-1] // emb.patch_size
        side = emb.num_patches_per_side
        rule = self.vision_positions
        ids = (
            patch_buckets(rows, side, rule, pixels.dtype, pixels.device)[:, None] * side
            + patch_buckets(cols, side, rule, pixels.dtype, pixels.device)[None, :]
        ).flatten()
        hidden = patches + emb.position_embedding(ids)[None]
        hidden = tower.encoder(inputs_embeds=hidden, attention_mask=None).last_hidden_state
        out: torch.Tensor = tower.post_layernorm(hidden)
        return out

    def shared_cache(self, embs: torch.Tensor, pad: torch.Tensor) -> PrefixCache:
        """The truncated VLM over the shared prefix (every valid token sees every other);
        its per-layer rotated keys and values. Computed once for all tenants' rows."""
        return self.shared_forward(embs, pad)[0]

    def shared_forward(
        self, embs: torch.Tensor, pad: torch.Tensor
    ) -> tuple[PrefixCache, torch.Tensor]:
        """:meth:`shared_cache` and the last layer's hidden states ``[B, P, W]``."""
        mask = pad[:, None, :] & pad[:, :, None]
        positions = torch.cumsum(pad.long(), dim=1) - 1
        hidden, cache = embs, []
        for layer in self.core.vlm.model.text_model.layers:
            q, k, v = self.core._qkv(layer, layer.input_layernorm(hidden))
            q, k = rotate(q, positions), rotate(k, positions)
            cache.append((k, v))
            hidden = self.core.finish(layer, hidden, self.core.attend(q, k, v, mask))
        return cache, hidden

    def with_state(
        self,
        shared: PrefixCache,
        pad: torch.Tensor,
        state: torch.Tensor,
        state_proj: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[PrefixCache, torch.Tensor]:
        """Extend the shared cache by the state token of normalized, padded ``state``
        projected by ``state_proj`` (a tenant's; default: the checkpoint's).

        SmolVLA's state token opens its own attention block at the end of the prefix:
        it sees every shared token, none sees it. So it runs alone through the frozen
        layers, attending to the shared keys and values, and the result is exactly the
        cache of the whole prefix — while only ``state_proj`` (a tenant's) touched it.

        Returns:
            The whole prefix's cache and its validity ``[B, P + 1]``.
        """
        project = self.model.state_proj if state_proj is None else state_proj
        hidden = project(state)[:, None, :]
        full_pad = torch.cat([pad, torch.ones_like(pad[:, :1])], dim=1)
        positions = pad.long().sum(dim=1, keepdim=True)
        cache: PrefixCache = []
        for layer, (keys, values) in zip(
            self.core.vlm.model.text_model.layers, shared, strict=True
        ):
            q, k, v = self.core._qkv(layer, layer.input_layernorm(hidden))
            q, k = rotate(q, positions), rotate(k, positions)
            keys, values = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
            cache.append((keys, values))
            attended = self.core.attend(q, keys, values, full_pad[:, None, :])
            hidden = self.core.finish(layer, hidden, attended)
        return cache, full_pad

    # -- the expert ------------------------------------------------------------------

    def velocity(
        self,
        cache: PrefixCache,
        pad: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
        head: Any = None,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk, max_action_dim]`` at noisy chunk ``x``.

        ``head``: a tenant's expert — a module with the checkpoint's ``action_*``
        projections and an ``lm_expert`` (default: the checkpoint's own).
        """
        core = self.core
        m: Any = self.model if head is None else head
        expert = core.lm_expert if head is None else head.lm_expert
        action = m.action_in_proj(x)
        times = time_embedding(
            t, core.expert_width, float(self.config["min_period"]), float(self.config["max_period"])
        ).to(action.dtype)
        joint = torch.cat([action, times[:, None, :].expand_as(action)], dim=2)
        hidden = m.action_time_mlp_out(F.silu(m.action_time_mlp_in(joint)))
        b, chunk = hidden.shape[:2]
        positions = pad.long().sum(dim=1, keepdim=True) + torch.arange(chunk, device=x.device)
        causal = torch.ones((chunk, chunk), dtype=torch.bool, device=x.device).tril()
        prefix_seen = pad[:, None, :].expand(b, chunk, pad.shape[1])
        self_mask = torch.cat([prefix_seen, causal.expand(b, -1, -1)], dim=2)
        for i, (keys, values) in enumerate(cache):
            layer = core.expert_layer(i, expert)
            if layer is None:
                continue
            x_in = layer.input_layernorm(hidden)
            if core.is_self_layer(i):
                q, k, v = core._qkv(layer, x_in)
                q, k = rotate(q, positions), rotate(k, positions)
                keys, values = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
                attended = core.attend(q, keys, values, self_mask)
            else:
                q = layer.self_attn.q_proj(x_in).view(b, chunk, -1, core.head_dim)
                q = rotate(q, positions - positions.min(dim=1, keepdim=True).values)
                k = layer.self_attn.k_proj(keys.flatten(2)).view(*keys.shape[:2], -1, core.head_dim)
                v = layer.self_attn.v_proj(values.flatten(2))
                v = v.view(*values.shape[:2], -1, core.head_dim)
                attended = core.attend(q, k, v, prefix_seen)
            hidden = core.finish(layer, hidden, attended)
        out: torch.Tensor = m.action_out_proj(expert.norm(hidden).float())
        return out

    @torch.no_grad()
    def predict(
        self, images: list[torch.Tensor], state: torch.Tensor, tasks: list[str], noise: torch.Tensor
    ) -> torch.Tensor:
        """Actions ``[B, chunk, action_dim]`` in the checkpoint's units, from raw
        observations (cameras in [0, 1], state unnormalized) and the starting noise
        ``[B, chunk, max_action_dim]``: Euler steps from t = 1 to t = 0."""
        ids, lang_mask = self.tokenize(tasks, state.device)
        embs, pad = self.embed_shared([self.prepare_image(i) for i in images], ids, lang_mask)
        cache, pad = self.with_state(self.shared_cache(embs, pad), pad, self.normalize_state(state))
        steps = int(self.config["num_steps"])
        x, dt = noise, -1.0 / steps
        for step in range(steps):
            t = torch.full((x.shape[0],), 1.0 + step * dt, dtype=torch.float32, device=x.device)
            x = x + dt * self.velocity(cache, pad, x, t)
        return self.unnormalize_actions(x[:, :, : self.ckpt.action_dim])


def export_smolvla(
    model: SmolVLA,
    out: str | Path,
    *,
    stats: dict[str, dict[str, list[float]]] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``model`` as a LeRobot ``smolvla`` policy directory: the checkpoint's
    ``config.json``, ``model.safetensors`` from the model's state dict (the same names
    LeRobot saved) with ``tensors`` (a tenant's expert, by those names) in place of the
    checkpoint's, and the processor pipelines with ``stats`` (a tenant's own
    normalization statistics) or the checkpoint's.

    Raises:
        InvalidRequestError: ``tensors`` names a tensor the checkpoint lacks, or one of
            another shape.
    """
    from safetensors.torch import save_file

    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    src = Path(model.ckpt.path)
    config = json.loads((src / "config.json").read_text())
    vlm_name = str(config["vlm_model_name"])
    vlm, moved = Path(vlm_path(config, src)), None
    if vlm.is_dir() and vlm.resolve().is_relative_to(src.resolve()):
        # A VLM kept inside the checkpoint (a tiny one) travels with the export, so the
        # directory stands alone once the checkpoint is gone.
        shutil.copytree(vlm, dst / vlm.name, dirs_exist_ok=True)
        moved = str((dst / vlm.name).resolve())
        config["vlm_model_name"] = moved
    (dst / "config.json").write_text(json.dumps(config, indent=4))
    # Tied tensors (a shared storage) are written as separate copies, as LeRobot does.
    state = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    for key, value in (tensors or {}).items():
        if key not in state or state[key].shape != value.shape:
            raise InvalidRequestError(
                f"export: {key!r} {list(value.shape)} is not a tensor of this SmolVLA checkpoint",
                field="tensors",
            )
        state[key] = value.detach().to("cpu", state[key].dtype).clone().contiguous()
    save_file(state, str(dst / WEIGHTS), metadata={"format": "pt"})
    write_processors(src, dst, stats)
    if moved is not None:
        # The tokenizer step names the VLM too.
        for name in (PREPROCESSOR, POSTPROCESSOR):
            pipeline = json.loads((dst / name).read_text())
            (dst / name).write_text(json.dumps(_renamed(pipeline, vlm_name, moved), indent=2))
    return dst


def vlm_path(config: dict[str, Any], root: str | Path) -> str:
    """The VLM a LeRobot SmolVLA ``config`` names: a relative ``vlm_model_name`` (an
    export's ``"vlm"``) is the folder of that name inside the checkpoint ``root`` when
    there is one, so loading does not depend on the working directory; otherwise (a hub
    id, an absolute path) the name as it is."""
    name = str(config["vlm_model_name"])
    inside = Path(root) / name
    if name and not Path(name).is_absolute() and inside.is_dir():
        return str(inside.resolve())
    return name


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` (JSON data) with every string equal to ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    return new if value == old else value
