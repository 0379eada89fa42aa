"""A LeRobot π0 / π0.5 checkpoint read in the project venv: the shared PaliGemma prefix,
the prompt its processor writes, and the expert every ``pi0_expert`` / ``pi05_expert``
tenant starts from (:class:`LeRobotPiCheckpoint`; :class:`Pi0LeRobotCheckpoint`,
:class:`Pi05Checkpoint` say what differs).

LeRobot (0.5 and later) saves π0.5 as ``config.json`` (``type: pi05``, the Gemma
variants of the prefix and the expert, chunk and dims), ``model.safetensors``
(``model.paligemma_with_expert.paligemma.*``: SigLIP tower, projector and Gemma;
``model.paligemma_with_expert.gemma_expert.*``: the action expert, whose RMS norms are
*adaptive*: a ``dense`` layer maps the time embedding to a scale, shift and residual
gate; ``model.action_in_proj`` / ``action_out_proj`` / ``time_mlp_in`` /
``time_mlp_out``) and its processor pipelines (normalizer statistics; the tokenizer's
name and length).

The prefix is rebuilt as ``transformers``' ``PaliGemmaModel`` of the same sizes and run
as lerobot runs it: each camera's SigLIP tokens (an absent camera masked), then the
prompt's tokens; every valid token sees every valid token; positions count valid tokens;
the per-layer keys and values are kept for the expert. The prompt is π0.5's own: the
instruction and the *state*, normalized to [-1, 1] and discretized into 256 bins, written
as text (``Task: …, State: 12 200 …;\\nAction: ``) and tokenized right-padded to the
processor's length. So the prefix's *weights* are shared by every tenant while its
*tokens* differ per row (docs/BACKBONES.md).

π0 (``type: pi0``) has the same prefix and files; its prompt is the instruction alone
(lerobot's π0 processor appends a newline), its expert's norms are plain Gemma RMS
norms, and its projections are ``state_proj`` (the state: one token of the expert's
suffix) and ``action_time_mlp_in`` / ``action_time_mlp_out`` (the time mixed into each
action token). Its processor normalizes by mean and standard deviation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from safetensors import safe_open

from joynexus.errors import SpecError
from joynexus.interop.lerobot import (
    ACTION_KEY,
    PREPROCESSOR,
    STATE_KEY,
    WEIGHTS,
    LeRobotCheckpoint,
    SchemaDims,
    read_lerobot_checkpoint,
    schema_problems,
)
from joynexus.models.archs.hf import hf
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.schema import DataSchema
from joynexus.models.tiny import SIDECAR
from joynexus.models.types import BackboneOutput

PI05_TYPE = "pi05"
PI0_TYPE = "pi0"
#: lerobot's Gemma variants (openpi's): the only sizes its π configs name.
GEMMA_VARIANTS: dict[str, dict[str, int]] = {
    "gemma_300m": {
        "width": 1024,
        "depth": 18,
        "mlp_dim": 4096,
        "num_heads": 8,
        "num_kv_heads": 1,
        "head_dim": 256,
    },
    "gemma_2b": {
        "width": 2048,
        "depth": 18,
        "mlp_dim": 16384,
        "num_heads": 8,
        "num_kv_heads": 1,
        "head_dim": 256,
    },
}
#: Where a checkpoint made smaller than lerobot's variants (tests' tiny ones) records
#: its sizes: the folder's ``joynexus.json``, under this key.
SIZES_KEY = "lerobot_pi_sizes"
VOCAB_SIZE = 257152
#: SigLIP's MLP width and the projection lerobot's PaliGemma config pins.
VISION_INTERMEDIATE = 4304
#: The additive mask value of openpi / lerobot for a hidden key.
MASKED = -2.3819763e38
PREFIX_KEYS = "paligemma_with_expert.paligemma.model."
EXPERT_KEYS = "paligemma_with_expert.gemma_expert.model."
#: The expert's projections, by their lerobot names (π0.5's; π0's below).
PROJECTIONS = ("action_in_proj.", "action_out_proj.", "time_mlp_in.", "time_mlp_out.")
PI0_PROJECTIONS = (
    "action_in_proj.",
    "action_out_proj.",
    "state_proj.",
    "action_time_mlp_in.",
    "action_time_mlp_out.",
)
#: openpi's names of the time MLP → lerobot's, per family (lerobot's
#: ``_fix_pytorch_state_dict_keys`` renames them so on load).
_TIME_MLP_NAMES = {
    PI05_TYPE: (("action_time_mlp_in.", "time_mlp_in."), ("action_time_mlp_out.", "time_mlp_out.")),
    PI0_TYPE: (("time_mlp_in.", "action_time_mlp_in."), ("time_mlp_out.", "action_time_mlp_out.")),
}
STATE_BINS = 256


@dataclass(frozen=True)
class GemmaSizes:
    """One Gemma stack's sizes (lerobot's ``GemmaConfig`` fields)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def hf_config(self, **extra: Any) -> Any:
        """The ``transformers`` ``GemmaConfig`` of these sizes, as lerobot makes it."""
        return hf().GemmaConfig(
            hidden_size=self.width,
            intermediate_size=self.mlp_dim,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_hidden_layers=self.depth,
            vocab_size=VOCAB_SIZE,
            hidden_activation="gelu_pytorch_tanh",
            hidden_act="gelu_pytorch_tanh",
            **extra,
        )


@dataclass(frozen=True)
class TokenizerStep:
    """The processor's tokenizer step: which tokenizer, and how it pads."""

    name: str
    max_length: int
    padding: str
    padding_side: str
    truncation: bool


def _fail(
    path: Path, message: str, field: str = "base_model.id", label: str = "π0/π0.5"
) -> SpecError:
    return SpecError(f"LeRobot {label} checkpoint {str(path)!r}: {message}", field=field)


def _sizes(root: Path, config: dict[str, Any]) -> tuple[GemmaSizes, GemmaSizes, dict[str, int]]:
    sidecar = root / SIDECAR
    recorded = json.loads(sidecar.read_text()).get(SIZES_KEY) if sidecar.is_file() else None
    if isinstance(recorded, dict):
        return (
            GemmaSizes(**recorded["paligemma"]),
            GemmaSizes(**recorded["action_expert"]),
            dict(recorded.get("vision", {})),
        )
    out: list[GemmaSizes] = []
    for key in ("paligemma_variant", "action_expert_variant"):
        variant = config.get(key)
        if variant not in GEMMA_VARIANTS:
            raise _fail(
                root, f"{key} {variant!r} is not one of lerobot's {list(GEMMA_VARIANTS)}", key
            )
        out.append(GemmaSizes(**GEMMA_VARIANTS[str(variant)]))
    return out[0], out[1], {}


def _tokenizer_step(root: Path, label: str) -> TokenizerStep:
    steps = json.loads((root / PREPROCESSOR).read_text()).get("steps", [])
    for step in steps:
        if isinstance(step, dict) and step.get("registry_name") == "tokenizer_processor":
            cfg = step.get("config", {})
            name = cfg.get("tokenizer_name")
            if not name:
                break
            return TokenizerStep(
                name=str(name),
                max_length=int(cfg.get("max_length", 200)),
                padding=str(cfg.get("padding", "max_length")),
                padding_side=str(cfg.get("padding_side", "right")),
                truncation=bool(cfg.get("truncation", True)),
            )
    raise _fail(root, f"{PREPROCESSOR} has no tokenizer step naming its tokenizer", label=label)


def _stats(ckpt: LeRobotCheckpoint, key: str, mode: str) -> FeatureNormStats | None:
    stats = ckpt.stats.get(key, {})
    need = ("q01", "q99") if mode == "QUANTILES" else ("mean", "std")
    if not set(need) <= set(stats):
        return None
    if "mean" in stats:
        mean = stats["mean"]
    else:
        mean = [(lo + hi) / 2 for lo, hi in zip(stats["q01"], stats["q99"], strict=True)]
    std = stats.get("std", [1.0] * len(mean))
    return FeatureNormStats(
        mean=mean,
        std=std,
        q01=stats.get("q01", stats.get("min", mean)),
        q99=stats.get("q99", stats.get("max", mean)),
    )


def _as_named_by(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` under ``model``'s names: newer ``transformers`` drop SigLIP's
    ``vision_model.`` level that lerobot's (older) saves."""
    names = set(model.state_dict())
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        flat = key.replace("vision_tower.vision_model.", "vision_tower.", 1)
        out[flat if key not in names and flat in names else key] = value
    return out


V = TypeVar("V")


def lerobot_names(state: dict[str, V], family: str = PI05_TYPE) -> dict[str, V]:
    """A π0.5 (π0: ``family`` ``pi0``) ``model.safetensors`` under the names lerobot
    0.6.1's ``PI05Policy`` (``PI0Policy``) loads it by (what its ``from_pretrained``
    fixes, so hub checkpoints saved by openpi's converter load too): no ``model.``
    prefix; π0.5's time MLP is ``time_mlp_*`` (openpi's ``action_time_mlp_*``), π0's
    ``action_time_mlp_*``; a tied PaliGemma saved as its ``lm_head`` alone gives the
    embedding; π0.5 drops ``state_proj`` (π0's). The values are carried as they are (a
    map of names to the file's own keys gives the renaming alone)."""
    out: dict[str, V] = {}
    for key, value in state.items():
        name = key.removeprefix("model.")
        if family == PI05_TYPE and name.startswith("state_proj."):
            continue
        for old, new in _TIME_MLP_NAMES[family]:
            if name.startswith(old):
                name = new + name[len(old) :]
        out[name] = value
    head = "paligemma_with_expert.paligemma.lm_head.weight"
    embed = PREFIX_KEYS + "language_model.embed_tokens.weight"
    if embed not in out and head in out:
        out[embed] = out[head]
    return out


def discretize_state(state: np.ndarray) -> np.ndarray:
    """π0.5's state bins: values in [-1, 1] → 0..255 (openpi's tokenizer rule, kept
    as it is: a value below -1 gives -1, one above 1 gives 255)."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
    bins: np.ndarray = np.digitize(state, bins=edges) - 1
    return bins


def pi05_prompt(task: str, state: np.ndarray) -> str:
    """The text π0.5's processor makes of an instruction and a normalized state."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    numbers = " ".join(str(int(b)) for b in discretize_state(state))
    return f"Task: {cleaned}, State: {numbers};\nAction: "


class FileTensors(Mapping[str, torch.Tensor]):
    """Some of a ``.safetensors`` file's tensors, by names of our own, read when asked.

    Every tensor read from one open file is a view of one memory map of the *whole*
    file: keeping a few of them (a π checkpoint's expert) kept all of it resident, the
    prefix's pages included, after the prefix had been copied into the model (a real
    π0.5 resident took 7.6 GB for 3.8 GB of parameters). Each tensor here is copied out
    of its map, and the map closed, before it is returned.

    Args:
        path: The file.
        names: Our name -> the file's key.
    """

    def __init__(self, path: Path, names: Mapping[str, str]) -> None:
        self.path = path
        self._names = dict(names)

    def __getitem__(self, name: str) -> torch.Tensor:
        key = self._names[name]
        with safe_open(str(self.path), framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(key).clone()
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def read_all(self) -> dict[str, torch.Tensor]:
        """Every tensor, from one open of the file, *not* copied: views of one map of it,
        which lives while any of them does. For a caller that copies them at once and
        drops them (``load_state_dict``)."""
        with safe_open(str(self.path), framework="pt") as f:
            return {name: f.get_tensor(key) for name, key in self._names.items()}


class LeRobotPiCheckpoint:
    """A loaded LeRobot π checkpoint: the frozen prefix (:attr:`vlm`), its tokenizer,
    the config, and the expert's tensors (:attr:`expert_state`, by the tenant module's
    names) that every tenant's expert starts from. A family (:class:`Pi05Checkpoint`,
    :class:`Pi0LeRobotCheckpoint`) says its ``type``, its projections and its prompt.

    Raises:
        SpecError: (from :meth:`read`) a checkpoint of another type or lacking its parts.
    """

    #: The LeRobot ``type`` it reads, its name in messages, its tenants' head type.
    TYPE: ClassVar[str] = PI05_TYPE
    LABEL: ClassVar[str] = "π0.5"
    HEAD: ClassVar[str] = "pi05_expert"
    #: The expert's projections, by their lerobot names.
    PROJECTIONS: ClassVar[tuple[str, ...]] = PROJECTIONS

    def __init__(self, root: Path, *, device: torch.device, dtype: torch.dtype):
        self.root = root
        self.ckpt = read_lerobot_checkpoint(root)
        if self.ckpt.type != self.TYPE:
            raise _fail(root, f"type is {self.ckpt.type!r}, not {self.TYPE!r}", label=self.LABEL)
        self.config: dict[str, Any] = json.loads((root / "config.json").read_text())
        self.prefix_sizes, self.expert_sizes, vision = _sizes(root, self.config)
        self.tokenizer_step = _tokenizer_step(root, self.LABEL)
        resolution = self.config.get("image_resolution") or [224, 224]
        self.image_size = int(resolution[0])
        weights = root / WEIGHTS
        with safe_open(str(weights), framework="pt") as f:
            # Our names -> the file's keys: the renaming alone, nothing read yet.
            keys: list[str] = list(f.keys())  # a safe_open handle is not iterable
        names = self.lerobot_names({key: key for key in keys})
        self.vlm = self._build_vlm(vision)
        prefix = FileTensors(
            weights,
            {n[len(PREFIX_KEYS) :]: key for n, key in names.items() if n.startswith(PREFIX_KEYS)},
        )
        self.vlm.load_state_dict(_as_named_by(self.vlm, prefix.read_all()), strict=True)
        self.vlm.requires_grad_(False)
        self.vlm.to(device=device, dtype=dtype).eval()
        expert = {
            "gemma_expert." + n[len(EXPERT_KEYS) :]: key
            for n, key in names.items()
            if n.startswith(EXPERT_KEYS)
        }
        expert.update({n: key for n, key in names.items() if n.startswith(self.PROJECTIONS)})
        # Read from the file when a tenant starts from it, never held by the resident.
        self.expert_state: Mapping[str, torch.Tensor] = FileTensors(weights, expert)
        self.tokenizer = self._load_tokenizer()

    @classmethod
    def lerobot_names(cls, state: dict[str, V]) -> dict[str, V]:
        """``state`` under the names lerobot 0.6.1 loads this family by."""
        return lerobot_names(state, cls.TYPE)

    def prompt(self, task: str, state: np.ndarray) -> str:
        """The text this family's processor makes of an instruction and a normalized
        state (π0.5: :func:`pi05_prompt`)."""
        return pi05_prompt(task, state)

    @classmethod
    def claims(cls, path: Path) -> bool:
        """Whether ``path`` is a LeRobot directory of this ``type`` (checked no further)."""
        config = path / "config.json"
        if not config.is_file():
            return False
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("type") == cls.TYPE and "model_type" not in data

    # --- sizes ---------------------------------------------------------------------

    @property
    def chunk_size(self) -> int:
        return self.ckpt.chunk_size

    @property
    def max_action_dim(self) -> int:
        return self.ckpt.max_action_dim

    @property
    def max_state_dim(self) -> int:
        return self.ckpt.max_state_dim

    @property
    def num_inference_steps(self) -> int:
        return int(self.config.get("num_inference_steps", 10))

    @property
    def num_cameras(self) -> int:
        return max(1, len(self.ckpt.cameras))

    def setting(self, key: str, default: float) -> float:
        return float(self.config.get(key, default))

    # --- loading -------------------------------------------------------------------

    def _build_vlm(self, vision: dict[str, int]) -> torch.nn.Module:
        text = self.prefix_sizes.hf_config()
        base = hf().PaliGemmaConfig()
        vision_config = base.vision_config
        vision_config.image_size = self.image_size
        vision_config.intermediate_size = VISION_INTERMEDIATE
        for key, value in vision.items():
            setattr(vision_config, key, value)
        vision_config.projection_dim = self.prefix_sizes.width
        config = hf().PaliGemmaConfig(
            text_config=text.to_dict(),
            vision_config=vision_config.to_dict(),
            projection_dim=self.prefix_sizes.width,
            image_token_index=VOCAB_SIZE,
        )
        # lerobot's prefix runs eager attention with an explicit additive mask.
        config.text_config._attn_implementation = "eager"
        model: Any = hf().PaliGemmaModel(config)
        model.config.text_config._attn_implementation = "eager"
        built: torch.nn.Module = model
        return built

    def _load_tokenizer(self) -> Any:
        name = self.tokenizer_step.name
        local = self.root / name
        # A tokenizer the folder carries is named relative to it (lerobot resolves it
        # from its working folder); otherwise a hub id, from the local hub cache.
        source = str(local) if local.is_dir() else name
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or local.is_dir()
        return hf().AutoTokenizer.from_pretrained(source, local_files_only=offline)

    # --- the prefix ----------------------------------------------------------------

    def tokenize(self, prompts: Sequence[str], device: torch.device) -> dict[str, torch.Tensor]:
        step = self.tokenizer_step
        out = self.tokenizer(
            list(prompts),
            max_length=step.max_length,
            truncation=step.truncation,
            padding=step.padding,
            padding_side=step.padding_side,
            return_tensors="pt",
        )
        return {
            "input_ids": out["input_ids"].to(device),
            "lang_mask": out["attention_mask"].to(device).bool(),
        }

    def encode(
        self,
        pixel_values: torch.Tensor,
        camera_mask: torch.Tensor,
        input_ids: torch.Tensor,
        lang_mask: torch.Tensor,
    ) -> BackboneOutput:
        """The prefix forward as lerobot's ``sample_actions`` runs it.

        Args:
            pixel_values: ``[B, slots, 3, S, S]`` in [-1, 1].
            camera_mask: ``[B, slots]`` present cameras.
            input_ids, lang_mask: ``[B, L]`` the prompts' tokens, right-padded.

        Returns:
            Last hidden state (zero at padding), the prefix's validity and its per-layer
            keys and values.
        """
        rows, slots = int(pixel_values.shape[0]), int(pixel_values.shape[1])
        vlm: Any = self.vlm
        dtype = next(vlm.parameters()).dtype
        images = vlm.get_image_features(pixel_values.flatten(0, 1).to(dtype)).pooler_output
        tokens = int(images.shape[1])
        images = images.reshape(rows, slots * tokens, -1)
        image_pad = camera_mask.bool().repeat_interleave(tokens, dim=1)
        lang = vlm.language_model.embed_tokens(input_ids)
        embeds = torch.cat([images.to(lang.dtype), lang], dim=1)
        pad = torch.cat([image_pad, lang_mask.bool()], dim=1)
        both = pad[:, None, :, None] & pad[:, None, None, :]
        mask = torch.zeros(both.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill(~both, MASKED)
        out = vlm.language_model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=pad.long().cumsum(-1) - 1,
            use_cache=True,
        )
        hidden = out.last_hidden_state.masked_fill(~pad[..., None], 0.0)
        kv = tuple((layer.keys, layer.values) for layer in out.cache.layers)
        return BackboneOutput(hidden_states=hidden, attention_mask=pad.long(), prefix_kv=kv)

    # --- tenants -------------------------------------------------------------------

    def normalization(self) -> NormalizationStats | None:
        """The checkpoint's processor statistics as a tenant's normalization, in its
        own mode (π0.5: quantiles, π0: mean/std); ``None`` when the mode or statistics
        are missing."""
        mapping = self.config.get("normalization_mapping") or {}
        mode = str(mapping.get("STATE", "QUANTILES"))
        if mode not in ("QUANTILES", "MEAN_STD") or mapping.get("ACTION", mode) != mode:
            return None
        state = _stats(self.ckpt, STATE_KEY, mode)
        action = _stats(self.ckpt, ACTION_KEY, mode)
        if state is None or action is None:
            return None
        return NormalizationStats(
            mode="quantile" if mode == "QUANTILES" else "mean_std", state=state, action=action
        )

    def check_dims(self, name: str, *, state_dim: int, action_dim: int, action_chunk: int) -> None:
        """Raise unless a tenant of these dims fits the checkpoint's expert.

        Raises:
            SpecError: naming each offending schema field and the checkpoint's limit.
        """
        dims = SchemaDims(state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk)
        problems = schema_problems(self.ckpt, dims)
        if problems:
            raise SpecError(
                f"a {self.HEAD!r} for schema {name!r} does not fit this {self.LABEL} "
                "checkpoint:\n" + "\n".join(f"  {f}: {m}" for f, m in problems),
                fields=[f for f, _ in problems],
                problems=dict(problems),
            )

    def check_schema(self, schema: DataSchema) -> None:
        """:meth:`check_dims` of ``schema``."""
        self.check_dims(
            schema.name,
            state_dim=schema.state_dim,
            action_dim=schema.action_dim,
            action_chunk=schema.action_chunk,
        )


class Pi05Checkpoint(LeRobotPiCheckpoint):
    """A LeRobot π0.5 checkpoint (``pi05_expert`` tenants): the state is written into
    the prompt, discretized (:func:`pi05_prompt`)."""


def pi0_prompt(task: str) -> str:
    """The text lerobot's π0 processor tokenizes: the instruction, ending in a newline."""
    return task if task.endswith("\n") else task + "\n"


class Pi0LeRobotCheckpoint(LeRobotPiCheckpoint):
    """A LeRobot π0 checkpoint (``pi0_expert`` tenants): the prompt is the instruction
    alone; the state enters the expert as a token of its own (``state_proj``)."""

    TYPE = PI0_TYPE
    LABEL = "π0"
    HEAD = "pi0_expert"
    PROJECTIONS = PI0_PROJECTIONS

    def prompt(self, task: str, state: np.ndarray) -> str:
        return pi0_prompt(task)
