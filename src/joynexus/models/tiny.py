"""Randomly initialised VLM backbones of the real architectures, built offline.

Tests, benchmarks and demos need a backbone without downloading weights. :func:`make_tiny`
builds the real ``transformers`` model class (Qwen2.5-VL, Qwen3-VL, PaliGemma,
SmolVLM/Idefics3, and the π0 policy ``PI0ForConditionalGeneration``) from a small
config, trains a small byte-level BPE tokenizer on built-in sentences (plus the special
tokens the architecture needs), wraps it in the architecture's real processor class,
and ``save_pretrained``s everything into one directory. The result loads through
exactly the ``from_pretrained`` path a user's hub id takes
(:meth:`joynexus.models.backbone.ResidentBaseModel.from_pretrained`).

A ``joynexus.json`` sidecar records the preferred canonical image size and number of
camera slots, so a tiny model does not default to a 224-px canvas meant for real models.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

TinyArch = Literal["qwen2_5_vl", "qwen3_vl", "paligemma", "smolvlm", "pi0"]
TinySize = Literal["tiny", "small", "3b"]
ARCHES: tuple[TinyArch, ...] = ("qwen2_5_vl", "qwen3_vl", "paligemma", "smolvlm", "pi0")
#: ``3b``: a Qwen2.5-VL-3B-shaped configuration (~3.4B parameters with random weights)
#: for GPU benchmarks (scripts/gpu-bench.sh); building it on CPU takes ~14 GB of memory.
SIZES: tuple[TinySize, ...] = ("tiny", "small", "3b")
SIDECAR = "joynexus.json"

# Enough text for BPE merges over the words robot instructions use; the tokenizer only
# has to be real (round-trips, saves, reloads), not good.
_CORPUS = (
    "pick up the red block and put it in the bowl",
    "open the top drawer of the cabinet",
    "close the microwave door",
    "push the T-shaped block onto the target",
    "put the bowl on the plate",
    "turn on the stove and put the pot on it",
    "put both the alphabet soup and the cream cheese box in the basket",
    "move the slider to the left",
    "lift the blue cube and place it on the pink cube",
    "rotate the handle clockwise",
    "what action should the robot take to complete the task",
    "user assistant system image camera wrist top front state action",
    "0 1 2 3 4 5 6 7 8 9 zero one two three four five six seven eight nine",
)

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# A ChatML-style template: one user turn whose images come first, then the text.
_QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SMOLVLM_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<global-img>",
    "<image>",
    "<video>",
] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
_SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_PALIGEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"]


@dataclass(frozen=True)
class _Dims:
    """Sizes of one tiny/small configuration (text decoder + vision tower)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    v_hidden: int
    v_layers: int
    v_heads: int
    v_ffn: int


_DIMS: dict[TinySize, _Dims] = {
    "tiny": _Dims(
        vocab=512,
        hidden=128,
        layers=2,
        heads=4,
        kv_heads=2,
        ffn=256,
        v_hidden=64,
        v_layers=2,
        v_heads=2,
        v_ffn=128,
    ),
    "small": _Dims(
        vocab=1024,
        hidden=512,
        layers=6,
        heads=8,
        kv_heads=4,
        ffn=1408,
        v_hidden=256,
        v_layers=4,
        v_heads=4,
        v_ffn=1024,
    ),
    # The text decoder and vision tower of Qwen2.5-VL-3B (small vocabulary: the
    # tokenizer is trained on a tiny corpus).
    "3b": _Dims(
        vocab=1024,
        hidden=2048,
        layers=36,
        heads=16,
        kv_heads=2,
        ffn=11008,
        v_hidden=1280,
        v_layers=32,
        v_heads=16,
        v_ffn=3420,
    ),
}

# Preferred canonical image side per arch: a multiple of patch × merge for the Qwen
# families, the vision tower's fixed input size for PaliGemma and SmolVLM.
_CANONICAL_SIZE: dict[TinySize, dict[TinyArch, int]] = {
    "tiny": {"qwen2_5_vl": 56, "qwen3_vl": 64, "paligemma": 56, "smolvlm": 64, "pi0": 56},
    "small": {"qwen2_5_vl": 112, "qwen3_vl": 128, "paligemma": 112, "smolvlm": 128, "pi0": 112},
    "3b": {"qwen2_5_vl": 112, "qwen3_vl": 128, "paligemma": 112, "smolvlm": 128, "pi0": 112},
}


def _hf(module: str = "transformers") -> Any:
    """A ``transformers`` (sub)module, typed ``Any``: configs and processors take
    architecture-specific keyword arguments its annotations do not describe."""
    return importlib.import_module(module)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence ``transformers`` load reports and progress bars (e.g. the unused
    ``lm_head`` a frozen encoder never loads) while keeping errors."""
    hf_logging = _hf("transformers.utils.logging")
    previous = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()


def _train_tokenizer(specials: list[str], vocab: int, **named: Any) -> Any:
    """A byte-level BPE tokenizer trained offline, wrapped for ``transformers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS), trainer)
    return _hf().PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **named)


def _mrope_section(head_dim: int) -> list[int]:
    # Temporal, height, width rotary sections; they must sum to head_dim / 2.
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def _build_qwen(arch: TinyArch, d: _Dims, side: int) -> tuple[Any, Any]:
    hf = _hf()
    tok = _train_tokenizer(
        _QWEN_SPECIALS, d.vocab, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in _QWEN_SPECIALS}
    head_dim = d.hidden // d.heads
    patch = 14 if arch == "qwen2_5_vl" else 16
    image_processor = hf.Qwen2VLImageProcessor(
        min_pixels=(2 * patch) ** 2,
        max_pixels=(32 * 2 * patch) ** 2,
        patch_size=patch,
        merge_size=2,
        temporal_patch_size=2,
    )
    text_config: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": d.hidden,
        "intermediate_size": d.ffn,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "max_position_embeddings": 4096,
        "pad_token_id": ids["<|endoftext|>"],
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e4,
            "mrope_section": _mrope_section(head_dim),
        },
    }
    vision_config: dict[str, Any] = {
        "depth": d.v_layers,
        "hidden_size": d.v_hidden,
        "intermediate_size": d.v_ffn,
        "num_heads": d.v_heads,
        "out_hidden_size": d.hidden,
        "patch_size": patch,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    common: dict[str, Any] = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    if arch == "qwen2_5_vl":
        vision_config["fullatt_block_indexes"] = [d.v_layers - 1]
        vision_config["window_size"] = 112
        config = hf.Qwen2_5_VLConfig(text_config=text_config, vision_config=vision_config, **common)
        model = hf.Qwen2_5_VLForConditionalGeneration(config)
        processor = hf.Qwen2_5_VLProcessor(
            image_processor=image_processor,
            tokenizer=tok,
            video_processor=hf.Qwen2VLVideoProcessor(),
            chat_template=_QWEN_TEMPLATE,
        )
    else:
        text_config["head_dim"] = head_dim
        text_config["rope_parameters"]["mrope_interleaved"] = True
        # Learned 2-D position table of the vision tower (a square grid), sized to cover
        # the largest canonical image in patches.
        vision_config["num_position_embeddings"] = 16 * 16
        vision_config["deepstack_visual_indexes"] = [0]
        config = hf.Qwen3VLConfig(text_config=text_config, vision_config=vision_config, **common)
        model = hf.Qwen3VLForConditionalGeneration(config)
        processor = hf.Qwen3VLProcessor(
            image_processor=image_processor,
            tokenizer=tok,
            video_processor=hf.Qwen3VLVideoProcessor(),
            chat_template=_QWEN_TEMPLATE,
        )
    return model, processor


def _paligemma_tokenizer(d: _Dims) -> Any:
    return _train_tokenizer(
        _PALIGEMMA_SPECIALS,
        d.vocab,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )


def _gemma_text_config(d: _Dims, tok: Any, vocab: int) -> dict[str, Any]:
    return {
        "model_type": "gemma",
        "vocab_size": vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.ffn,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.hidden // d.heads,
        "pad_token_id": int(tok.convert_tokens_to_ids("<pad>")),
        "bos_token_id": int(tok.convert_tokens_to_ids("<bos>")),
        "eos_token_id": int(tok.convert_tokens_to_ids("<eos>")),
    }


def _siglip_config(d: _Dims, side: int, patch: int, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": "siglip_vision_model",
        "hidden_size": d.v_hidden,
        "intermediate_size": d.v_ffn,
        "num_hidden_layers": d.v_layers,
        "num_attention_heads": d.v_heads,
        "image_size": side,
        "patch_size": patch,
        "projection_dim": d.hidden,
        **extra,
    }


def _build_paligemma(d: _Dims, side: int) -> tuple[Any, Any]:
    hf = _hf()
    patch = 14
    seq = (side // patch) ** 2
    tok = _paligemma_tokenizer(d)
    image_processor = hf.SiglipImageProcessor(
        size={"height": side, "width": side}, image_seq_length=seq
    )
    image_processor.image_seq_length = seq
    # The processor adds ~1,150 <loc>/<seg> tokens to the tokenizer: size the
    # embedding table only after it exists.
    processor = hf.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok)
    vocab = len(processor.tokenizer)
    config = hf.PaliGemmaConfig(
        text_config=_gemma_text_config(d, tok, vocab),
        vision_config=_siglip_config(d, side, patch),
        image_token_index=int(processor.image_token_id),
        projection_dim=d.hidden,
        hidden_size=d.hidden,
        vocab_size=vocab,
    )
    config.text_config.num_image_tokens = seq
    config.vision_config.num_image_tokens = seq
    model = hf.PaliGemmaForConditionalGeneration(config)
    return model, processor


# π0's action expert ("dit" in transformers) shares the VLM's layer count and attention
# geometry (it attends to the VLM's per-layer keys and values) but is narrower.
_PI0_EXPERT_WIDTH = {"tiny": (64, 128), "small": (256, 704)}
#: Chunk length, padded state/action widths and denoising steps of the tiny π0 models.
#: State is wider than π0's 32 so every preset schema (MetaWorld: 39) fits.
PI0_TINY_CHUNK_SIZE = 16
PI0_TINY_MAX_STATE_DIM = 48
PI0_TINY_MAX_ACTION_DIM = 32
PI0_TINY_INFERENCE_STEPS = 10


def _build_pi0(d: _Dims, side: int) -> tuple[Any, Any]:
    """A π0 policy: PaliGemma prefix (SigLIP + Gemma) and a narrower Gemma action expert."""
    hf = _hf()
    patch = 14
    seq = (side // patch) ** 2
    tok = _paligemma_tokenizer(d)
    image_processor = hf.PI0ImageProcessor(
        size={"max_height": side, "max_width": side},
        pad_size={"height": side, "width": side},
        image_seq_length=seq,
    )
    image_processor.image_seq_length = seq
    processor = hf.PI0Processor(
        image_processor=image_processor,
        tokenizer=tok,
        max_state_dim=PI0_TINY_MAX_STATE_DIM,
        chunk_size=PI0_TINY_CHUNK_SIZE,
    )
    vocab = len(processor.tokenizer)
    width, ffn = _PI0_EXPERT_WIDTH["tiny" if d.hidden <= 128 else "small"]
    config = hf.PI0Config(
        vlm_config={
            "model_type": "paligemma",
            "text_config": _gemma_text_config(d, tok, vocab),
            "vision_config": _siglip_config(d, side, patch, vision_use_head=False),
            "projection_dim": d.hidden,
            "hidden_size": d.hidden,
            "image_token_id": int(processor.image_token_id),
            "vocab_size": vocab,
        },
        dit_config={
            "model_type": "gemma",
            "hidden_size": width,
            "intermediate_size": ffn,
            "num_hidden_layers": d.layers,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "head_dim": d.hidden // d.heads,
        },
        chunk_size=PI0_TINY_CHUNK_SIZE,
        max_state_dim=PI0_TINY_MAX_STATE_DIM,
        max_action_dim=PI0_TINY_MAX_ACTION_DIM,
        num_inference_steps=PI0_TINY_INFERENCE_STEPS,
    )
    model = hf.PI0ForConditionalGeneration(config)
    return model, processor


def _build_smolvlm(d: _Dims, side: int) -> tuple[Any, Any]:
    hf = _hf()
    patch, scale = 16, 2
    seq = (side // patch) ** 2 // scale**2
    tok = _train_tokenizer(
        _SMOLVLM_SPECIALS,
        d.vocab,
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    image_processor = hf.SmolVLMImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": side},
        max_image_size={"longest_edge": side},
    )
    processor = hf.SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=hf.SmolVLMVideoProcessor(),
        image_seq_len=seq,
        chat_template=_SMOLVLM_TEMPLATE,
    )
    config = hf.SmolVLMConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tok),
            "hidden_size": d.hidden,
            "intermediate_size": d.ffn,
            "num_hidden_layers": d.layers,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "pad_token_id": int(tok.convert_tokens_to_ids("<|endoftext|>")),
            "bos_token_id": None,
            "eos_token_id": int(tok.convert_tokens_to_ids("<end_of_utterance>")),
        },
        vision_config={
            "hidden_size": d.v_hidden,
            "intermediate_size": d.v_ffn,
            "num_hidden_layers": d.v_layers,
            "num_attention_heads": d.v_heads,
            "image_size": side,
            "patch_size": patch,
        },
        scale_factor=scale,
        image_token_id=int(tok.convert_tokens_to_ids("<image>")),
        pad_token_id=int(tok.convert_tokens_to_ids("<|endoftext|>")),
    )
    model = hf.SmolVLMForConditionalGeneration(config)
    return model, processor


_BUILDERS: dict[TinyArch, Callable[[_Dims, int], tuple[Any, Any]]] = {
    "qwen2_5_vl": lambda d, side: _build_qwen("qwen2_5_vl", d, side),
    "qwen3_vl": lambda d, side: _build_qwen("qwen3_vl", d, side),
    "paligemma": _build_paligemma,
    "smolvlm": _build_smolvlm,
    "pi0": _build_pi0,
}


def make_tiny(
    arch: str,
    out_dir: str | Path,
    *,
    size: str = "tiny",
    seed: int = 0,
    num_camera_slots: int = 2,
) -> Path:
    """Build a randomly initialised model of a real VLM architecture and save it.

    Args:
        arch: One of ``qwen2_5_vl``, ``qwen3_vl``, ``paligemma``, ``smolvlm``, ``pi0``
            (a whole π0 policy: PaliGemma prefix + action expert; sizes tiny, small).
        out_dir: Directory to write (created if missing); holds model, processor and
            the ``joynexus.json`` sidecar.
        size: ``tiny`` (~1M parameters, for tests), ``small`` (tens of millions, for
            benchmarks) or ``3b`` (~3.4B, Qwen2.5-VL-3B-shaped, for GPU benchmarks).
        seed: Weight-initialisation seed; same arguments → identical files' tensors.
        num_camera_slots: Camera slots the backbone is configured for (recorded in
            the sidecar; tenants with fewer cameras get blank, masked slots).

    Returns:
        The output directory.

    Raises:
        ValueError: For an unknown ``arch`` or ``size``.
    """
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {list(ARCHES)}, got {arch!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    if arch == "pi0" and size not in _PI0_EXPERT_WIDTH:
        raise ValueError(f"pi0 comes in sizes {list(_PI0_EXPERT_WIDTH)}, got {size!r}")
    if num_camera_slots < 1:
        raise ValueError(f"num_camera_slots must be >= 1, got {num_camera_slots}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    side = _CANONICAL_SIZE[size][arch]
    # Fork the RNG so building a model never perturbs the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, processor = _BUILDERS[arch](_DIMS[size], side)
    model.eval()
    with quiet_transformers():
        model.save_pretrained(out)
        processor.save_pretrained(out)
    sidecar = {
        "arch": arch,
        "size": size,
        "seed": seed,
        "canonical_image_size": side,
        "num_camera_slots": num_camera_slots,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return out
