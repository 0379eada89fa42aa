"""Real-size backbones with random weights, built offline (``--size real``).

The benches' tiny and small models (:func:`joynexus.models.tiny.make_tiny`) stay under
20 M parameters; users run SmolVLA (≈ 450 M) and Qwen-VL models of billions. These
builders write a randomly initialised model at the *published* configuration of such a
checkpoint — the widths, heads, layer counts, vision tower, image size and token counts
— through the same real ``transformers`` classes and ``save_pretrained`` layout, so it
loads through ``from_pretrained`` like a hub id would. Nothing is downloaded: the values
below are written here from the checkpoints' published configurations.

* ``smolvla``: the VLM prefix LeRobot's SmolVLA runs, at ``lerobot/smolvla_base``'s
  configuration: ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct`` (SigLIP-B/16 at 512 px,
  pixel-shuffle ×4 → 64 tokens per image, a SmolLM2-360M-shaped Llama decoder) cut to
  its first ``num_vlm_layers`` = 16 text layers, images resized with padding to 512 px.
  This is JoyNexus's resident, shared part; SmolVLA's action expert (≈ 100 M at width
  0.75 × 960) is tenant-private and not built here.
* ``qwen2_5_vl``: ``Qwen/Qwen2.5-VL-3B-Instruct``'s widths (text 2048 × FFN 11008,
  16 heads / 2 KV heads; vision 1280 × FFN 3420, 16 heads, window attention), with
  fewer layers — 4 of 36 text layers and 8 of 32 vision blocks — and the embedding
  table cut to the offline tokenizer's vocabulary, so that it is a few hundred M
  parameters (the 3B does not fit several copies in a CPU box's memory). The cut is
  recorded in the sidecar and the bench's JSON.

:func:`real_config` returns the ``transformers`` config alone, so a test can count a
configuration's parameters on the meta device without allocating it.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from joynexus.models.tiny import (
    _QWEN_SPECIALS,
    _QWEN_TEMPLATE,
    _SMOLVLM_SPECIALS,
    _SMOLVLM_TEMPLATE,
    SIDECAR,
    _train_tokenizer,
    quiet_transformers,
)

__all__ = ["REAL_ARCHES", "REAL_SPECS", "RealSpec", "build_real", "meta_parameters", "real_config"]

#: The BPE vocabulary of the offline tokenizer (the weights are random: a real
#: tokenizer would not make the features any more meaningful).
TOKENIZER_VOCAB = 1024


@dataclass(frozen=True)
class RealSpec:
    """One real-size configuration: what it follows, what it keeps."""

    arch: str
    #: The ``make_tiny`` architecture family the saved model is (what serves it).
    family: str
    follows: str
    #: The published checkpoint's parameter count (the full model this follows).
    published_parameters: int
    text_layers: int
    text_layers_published: int
    vision_layers: int
    vision_layers_published: int
    vocab_size: int
    vocab_size_published: int
    canonical_image_size: int
    image_tokens_per_camera: int
    note: str


REAL_SPECS: dict[str, RealSpec] = {
    "smolvla": RealSpec(
        arch="smolvla",
        family="smolvlm",
        follows="lerobot/smolvla_base (VLM HuggingFaceTB/SmolVLM2-500M-Video-Instruct)",
        published_parameters=507_000_000,
        text_layers=16,
        text_layers_published=32,
        vision_layers=12,
        vision_layers_published=12,
        vocab_size=49_280,
        vocab_size_published=49_280,
        canonical_image_size=512,
        image_tokens_per_camera=64,
        note="SmolVLA's resident VLM prefix: SmolVLM2-500M cut to num_vlm_layers=16 as "
        "smolvla_base runs it; the action expert is tenant-private (not built)",
    ),
    "qwen2_5_vl": RealSpec(
        arch="qwen2_5_vl",
        family="qwen2_5_vl",
        follows="Qwen/Qwen2.5-VL-3B-Instruct",
        published_parameters=3_750_000_000,
        text_layers=4,
        text_layers_published=36,
        vision_layers=8,
        vision_layers_published=32,
        vocab_size=TOKENIZER_VOCAB,
        vocab_size_published=151_936,
        canonical_image_size=224,
        image_tokens_per_camera=64,
        note="Qwen2.5-VL-3B widths with 4/36 text layers, 8/32 vision blocks and the "
        "embedding table cut to the offline tokenizer (reduced to a few hundred M)",
    ),
}
REAL_ARCHES: tuple[str, ...] = tuple(REAL_SPECS)


def _hf(module: str = "transformers") -> Any:
    return importlib.import_module(module)


def _ids(tok: Any, names: list[str]) -> dict[str, int]:
    return {t: int(tok.convert_tokens_to_ids(t)) for t in names}


def _smolvlm_config(tok: Any, *, text_layers: int, vocab_size: int) -> Any:
    ids = _ids(tok, _SMOLVLM_SPECIALS)
    return _hf().SmolVLMConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": 960,
            "intermediate_size": 2560,
            "num_hidden_layers": text_layers,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100_000.0},
            "tie_word_embeddings": False,
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
            "eos_token_id": ids["<end_of_utterance>"],
        },
        vision_config={
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "image_size": 512,
            "patch_size": 16,
        },
        scale_factor=4,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )


def _qwen_config(tok: Any, *, text_layers: int, vision_layers: int, vocab_size: int) -> Any:
    ids = _ids(tok, _QWEN_SPECIALS)
    # Full-attention blocks every 8th, as the 3B's [7, 15, 23, 31]; window attention else.
    full = [i for i in range(vision_layers) if i % 8 == 7] or [vision_layers - 1]
    return _hf().Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": text_layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128_000,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [16, 24, 24],
            },
        },
        vision_config={
            "depth": vision_layers,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": full,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def _tokenizer(family: str) -> Any:
    if family == "smolvlm":
        return _train_tokenizer(
            _SMOLVLM_SPECIALS,
            TOKENIZER_VOCAB,
            eos_token="<end_of_utterance>",
            pad_token="<|endoftext|>",
            extra_special_tokens={
                "fake_image_token": "<fake_token_around_image>",
                "image_token": "<image>",
                "global_image_token": "<global-img>",
                "end_of_utterance_token": "<end_of_utterance>",
            },
        )
    return _train_tokenizer(
        _QWEN_SPECIALS, TOKENIZER_VOCAB, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def _check(arch: str) -> RealSpec:
    if arch not in REAL_SPECS:
        raise ValueError(f"real-size arch must be one of {list(REAL_ARCHES)}, got {arch!r}")
    return REAL_SPECS[arch]


def real_config(
    arch: str,
    *,
    published: bool = False,
    tokenizer: Any = None,
) -> Any:
    """The ``transformers`` config of ``arch`` at real size.

    Args:
        arch: ``smolvla`` or ``qwen2_5_vl``.
        published: The full published model (every layer, the real vocabulary) rather
            than what the bench builds (:data:`REAL_SPECS`'s kept layers and vocabulary).
        tokenizer: The tokenizer whose special-token ids the config names (default: a
            fresh offline one).

    Raises:
        ValueError: an unknown ``arch``.
    """
    spec = _check(arch)
    tok = tokenizer if tokenizer is not None else _tokenizer(spec.family)
    vocab = spec.vocab_size_published if published else max(spec.vocab_size, len(tok))
    if spec.family == "smolvlm":
        layers = spec.text_layers_published if published else spec.text_layers
        return _smolvlm_config(tok, text_layers=layers, vocab_size=vocab)
    return _qwen_config(
        tok,
        text_layers=spec.text_layers_published if published else spec.text_layers,
        vision_layers=spec.vision_layers_published if published else spec.vision_layers,
        vocab_size=vocab,
    )


def _model_class(family: str) -> Any:
    hf = _hf()
    if family == "smolvlm":
        return hf.SmolVLMForConditionalGeneration
    return hf.Qwen2_5_VLForConditionalGeneration


def meta_parameters(arch: str, *, published: bool = False) -> int:
    """Parameters of ``arch``'s real-size model, counted on the meta device (no weights
    are allocated)."""
    spec = _check(arch)
    config = real_config(arch, published=published)
    with torch.device("meta"):
        model = _model_class(spec.family)(config)
    return sum(p.numel() for p in model.parameters())


def _processor(family: str, tok: Any, side: int) -> Any:
    hf = _hf()
    if family == "smolvlm":
        return hf.SmolVLMProcessor(
            image_processor=hf.SmolVLMImageProcessor(
                do_image_splitting=False,
                size={"longest_edge": side},
                max_image_size={"longest_edge": side},
            ),
            tokenizer=tok,
            video_processor=hf.SmolVLMVideoProcessor(),
            image_seq_len=REAL_SPECS["smolvla"].image_tokens_per_camera,
            chat_template=_SMOLVLM_TEMPLATE,
        )
    patch = 14
    return hf.Qwen2_5_VLProcessor(
        image_processor=hf.Qwen2VLImageProcessor(
            min_pixels=(2 * patch) ** 2,
            max_pixels=(32 * 2 * patch) ** 2,
            patch_size=patch,
            merge_size=2,
            temporal_patch_size=2,
        ),
        tokenizer=tok,
        video_processor=hf.Qwen2VLVideoProcessor(),
        chat_template=_QWEN_TEMPLATE,
    )


def build_real(arch: str, out_dir: str | Path, *, seed: int = 0, num_camera_slots: int = 2) -> Path:
    """Build ``arch`` at real size with random weights and save it (model, processor and
    the ``joynexus.json`` sidecar, which also records the :class:`RealSpec`).

    Takes about twice the model's fp32 size in memory while it runs (≈ 4 GB): the
    benches call it in a child process so their own memory figures start clean.

    Raises:
        ValueError: an unknown ``arch``.
    """
    spec = _check(arch)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(spec.family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(spec.family)(real_config(arch, tokenizer=tok))
    model.eval()
    processor = _processor(spec.family, tok, spec.canonical_image_size)
    with quiet_transformers():
        model.save_pretrained(out)
        processor.save_pretrained(out)
    sidecar = {
        "arch": spec.family,
        "size": "real",
        "seed": seed,
        "canonical_image_size": spec.canonical_image_size,
        "num_camera_slots": num_camera_slots,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "real": asdict(spec),
    }
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return out


def build_real_isolated(arch: str, out_dir: str | Path, *, seed: int = 0) -> Path:
    """:func:`build_real` in a child Python process: the caller's memory never holds
    the build's transient copy, so what it measures afterwards is what loading costs.

    Raises:
        RuntimeError: the child failed (its last output lines).
    """
    import subprocess
    import sys

    _check(arch)
    code = (
        "import sys, torch; torch.set_num_threads(1); "
        "from joynexus.bench.real_models import build_real; "
        "build_real(sys.argv[1], sys.argv[2], seed=int(sys.argv[3]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, arch, str(out_dir), str(seed)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"building the real-size {arch} failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-1500:]}"
        )
    return Path(out_dir)


def model_bytes(model_dir: str | Path) -> int:
    """Bytes of the saved weights (every ``*.safetensors`` file): the resident backbone
    a server holds, read off the disk rather than computed from a parameter count."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
