"""Runs INSIDE the LeRobot reference environment (lerobot 0.6.1, Python 3.13), never in
the project venv: tiny π0 / π0.5 checkpoints made by lerobot's own classes, and their
actions through lerobot's own ``select_action``.

* ``make-tiny``: ``PI05Config`` / ``PI0Config`` as a user writes it (variants
  ``gemma_300m``), then the model is shrunk inside this process only, after the config
  is constructed (see :func:`_shrunk`): lerobot's ``get_gemma_config`` answers the tiny
  widths and depths below for the variant names, and the PaliGemma config lerobot
  builds is given a tiny SigLIP tower just before the module is made (lerobot pins the
  tower's MLP width and a 2048-wide projection, which a 64-wide Gemma cannot take).
  Every class that computes is lerobot's, unmodified. The policy is saved with
  ``save_pretrained`` and its pre/post-processor pipelines (a byte-level BPE tokenizer
  trained offline stands in for PaliGemma's, saved in the folder as ``tokenizer``,
  named relative: lerobot finds it from the checkpoint folder as working folder), and
  the sizes are recorded in the folder's ``joynexus.json`` (config.json can only name
  lerobot's variants);
  With ``--size real`` nothing is shrunk: lerobot's unmodified ``gemma_300m`` policy
  (about 1.9 B parameters, 7.8 GB in fp32) at lerobot's own defaults for the chunk,
  the denoising steps, the padded dims, the image side and the prompt length; the
  same offline tokenizer, and no sizes in ``joynexus.json``. One change, recorded
  there (``lerobot_pi_projection``), without which lerobot cannot run this variant:
  lerobot 0.6.1 pins PaliGemma's image projection to 2048 wide (the ``gemma_2b``
  width), so with ``paligemma_variant="gemma_300m"`` (1024 wide) its ``embed_prefix``
  fails to concatenate image and language embeddings; the projection is built 1024
  wide instead (:func:`_projected`), on build and on every load;
* ``predict``: ``from_pretrained`` + ``make_pre_post_processors`` + ``select_action``
  over one chunk, the noise drawn by lerobot itself from a seeded generator and written
  out with the actions.

Prints one JSON line on success. Imports only the standard library, torch, safetensors,
tokenizers, transformers and lerobot.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

SIDECAR = "joynexus.json"
SIZES_KEY = "lerobot_pi_sizes"
PROJECTION_KEY = "lerobot_pi_projection"
TOKENIZER_DIR = "tokenizer"
#: The tiny sizes (lerobot's GemmaConfig fields; vision: SigLIP config fields).
TINY_SIZES: dict[str, dict[str, int]] = {
    "paligemma": {
        "width": 64,
        "depth": 2,
        "mlp_dim": 96,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 16,
    },
    "action_expert": {
        "width": 32,
        "depth": 2,
        "mlp_dim": 48,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 16,
    },
    "vision": {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 48,
        "patch_size": 8,
    },
}
#: The tiny builds' settings; ``--size real`` leaves them at lerobot's own defaults.
TINY_SETTINGS: dict[str, int] = {
    "chunk_size": 4,
    "num_steps": 3,
    "max_state_dim": 8,
    "max_action_dim": 8,
    "side": 32,
    "max_tokens": 48,
}
_CORPUS = [
    "Task: pick up the red block, State: 0 1 2 3 4 5 6 7 8 9 10 100 128 200 255;\nAction: ",
    "Task: push the cube to the goal, State: 12 34 56 78 90 111 222 233 244;\nAction: ",
    "Task: open the drawer and place the bowl, State: 13 57 91 113 157 191 213 251;\nAction: ",
]


def _allow_cpu_torchvision() -> None:
    """torchvision's ops library may not load beside this torch; lerobot imports it at
    module level without calling its ops (declared up front, the import goes through)."""
    for op in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):
            torch.library.define(
                f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            )


def _modeling(family: str) -> Any:
    return importlib.import_module(f"lerobot.policies.{family}.modeling_{family}")


@contextlib.contextmanager
def _shrunk(family: str, sizes: dict[str, dict[str, int]]) -> Iterator[None]:
    """While inside, lerobot builds π0/π0.5 at ``sizes``: ``get_gemma_config`` answers
    them for either variant name (PaliGemma and the expert by role), and the PaliGemma
    config is given the tiny SigLIP tower (projection to the Gemma width) just before
    lerobot's ``PaliGemmaForConditionalGenerationWithPiGemma`` is made of it."""
    modeling = _modeling(family)
    original_config = modeling.get_gemma_config
    original_vlm = modeling.PaliGemmaForConditionalGenerationWithPiGemma
    calls = iter(("paligemma", "action_expert"))

    def gemma_config(variant: str) -> Any:
        # PaliGemmaWithExpertModel asks for the PaliGemma variant first, then the expert's.
        original_config(variant)  # still refuses an unknown variant
        role = next(calls)
        return modeling.GemmaConfig(**sizes[role])

    def vlm(config: Any) -> Any:
        vision = config.vision_config
        for key, value in sizes["vision"].items():
            setattr(vision, key, value)
        vision.projection_dim = config.text_config.hidden_size
        config.projection_dim = config.text_config.hidden_size
        return original_vlm(config)

    modeling.get_gemma_config = gemma_config
    modeling.PaliGemmaForConditionalGenerationWithPiGemma = vlm
    try:
        yield
    finally:
        modeling.get_gemma_config = original_config
        modeling.PaliGemmaForConditionalGenerationWithPiGemma = original_vlm


@contextlib.contextmanager
def _projected(family: str) -> Iterator[None]:
    """While inside, lerobot's PaliGemma projects images to the language model's width
    (lerobot pins 2048, which only ``gemma_2b`` takes)."""
    modeling = _modeling(family)
    original_vlm = modeling.PaliGemmaForConditionalGenerationWithPiGemma

    def vlm(config: Any) -> Any:
        config.vision_config.projection_dim = config.text_config.hidden_size
        config.projection_dim = config.text_config.hidden_size
        return original_vlm(config)

    modeling.PaliGemmaForConditionalGenerationWithPiGemma = vlm
    try:
        yield
    finally:
        modeling.PaliGemmaForConditionalGenerationWithPiGemma = original_vlm


def _projection_fixed(path: Path) -> bool:
    sidecar = path / SIDECAR
    return sidecar.is_file() and bool(json.loads(sidecar.read_text()).get(PROJECTION_KEY))


def _sizes_of(path: Path) -> dict[str, dict[str, int]] | None:
    sidecar = path / SIDECAR
    if not sidecar.is_file():
        return None
    sizes = json.loads(sidecar.read_text()).get(SIZES_KEY)
    return sizes if isinstance(sizes, dict) else None


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    fast: Any = importlib.import_module("transformers").PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    wrapped = fast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    wrapped.save_pretrained(str(out / TOKENIZER_DIR))


@contextlib.contextmanager
def _local_tokenizer(folder: Path) -> Iterator[None]:
    """lerobot's π processors name PaliGemma's tokenizer on the hub (not reachable
    here): while inside, the tokenizer step loads the one trained in ``folder``."""
    module: Any = importlib.import_module("lerobot.processor.tokenizer_processor")
    real = module.AutoTokenizer

    class _Local:
        @staticmethod
        def from_pretrained(name: str, *args: Any, **kwargs: Any) -> Any:
            return real.from_pretrained(str(folder), *args, **kwargs)

    module.AutoTokenizer = _Local
    try:
        yield
    finally:
        module.AutoTokenizer = real


def _features(state_dim: int, action_dim: int, cameras: list[str], side: int) -> tuple[Any, Any]:
    types = importlib.import_module("lerobot.configs.types")
    inputs = {
        f"observation.images.{name}": types.PolicyFeature(
            type=types.FeatureType.VISUAL, shape=(3, side, side)
        )
        for name in cameras
    }
    inputs["observation.state"] = types.PolicyFeature(
        type=types.FeatureType.STATE, shape=(state_dim,)
    )
    outputs = {"action": types.PolicyFeature(type=types.FeatureType.ACTION, shape=(action_dim,))}
    return inputs, outputs


def _stats(state_dim: int, action_dim: int, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """Made-up but non-trivial statistics (quantiles for π0.5, mean/std for π0)."""
    g = torch.Generator().manual_seed(seed + 1)
    out = {}
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        mean = torch.randn(dim, generator=g) * 0.5
        std = torch.rand(dim, generator=g) + 0.5
        out[key] = {
            "mean": mean,
            "std": std,
            "min": mean - 3 * std,
            "max": mean + 3 * std,
            "q01": mean - 2 * std,
            "q99": mean + 2 * std,
        }
    return out


def make_tiny(args: argparse.Namespace) -> dict[str, Any]:
    family = args.family
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    _tokenizer(out)
    cameras = args.camera or ["top"]
    config_mod = importlib.import_module(f"lerobot.policies.{family}.configuration_{family}")
    processors = importlib.import_module(f"lerobot.policies.{family}.processor_{family}")
    config_class = config_mod.PI05Config if family == "pi05" else config_mod.PI0Config
    real = args.size == "real"
    settings = {
        key: value if value is not None else (None if real else TINY_SETTINGS[key])
        for key, value in (
            ("chunk_size", args.chunk_size),
            ("num_steps", args.num_steps),
            ("max_state_dim", args.max_state_dim),
            ("max_action_dim", args.max_action_dim),
            ("side", args.side),
            ("max_tokens", args.max_tokens),
        )
    }
    names = {
        "chunk_size": ("chunk_size", "n_action_steps"),
        "num_steps": ("num_inference_steps",),
        "max_state_dim": ("max_state_dim",),
        "max_action_dim": ("max_action_dim",),
        "max_tokens": ("tokenizer_max_length",),
    }
    chosen: dict[str, Any] = {}
    for key, fields in names.items():
        if settings[key] is not None:
            chosen.update(dict.fromkeys(fields, settings[key]))
    if settings["side"] is not None:
        chosen["image_resolution"] = (settings["side"], settings["side"])
    side = settings["side"] or 224  # lerobot's default image_resolution
    inputs, outputs = _features(args.state_dim, args.action_dim, cameras, side)
    config = config_class(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        push_to_hub=False,
        paligemma_variant="gemma_300m",
        action_expert_variant="gemma_300m",
        dtype="float32",
        **chosen,
    )
    torch.manual_seed(args.seed)
    with _projected(family) if real else _shrunk(family, TINY_SIZES):
        policy = _modeling(family).__dict__["PI05Policy" if family == "pi05" else "PI0Policy"](
            config
        )
    # lerobot zero-initialises the adaptive norms' modulation (identity at start); a
    # random one makes the time conditioning visible in the comparison.
    g = torch.Generator().manual_seed(args.seed + 7)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".dense." in name:
                # At the real width 0.05 would make the modulation large; keep its
                # spread about the tiny one's.
                std = 0.4 / param.shape[-1] ** 0.5 if real else 0.05
                param.copy_(torch.randn(param.shape, generator=g) * std)
    policy.eval()
    stats = _stats(args.state_dim, args.action_dim, args.seed)
    make = getattr(processors, f"make_{family}_pre_post_processors")
    with _local_tokenizer(out / TOKENIZER_DIR):
        pre, post = make(config, dataset_stats=stats)
    for step in pre.steps:
        if type(step).__name__ == "TokenizerProcessorStep":
            step.tokenizer_name = TOKENIZER_DIR
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    sidecar = {PROJECTION_KEY: "language width"} if real else {SIZES_KEY: TINY_SIZES}
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    params = sum(p.numel() for p in policy.parameters())
    return {"out": str(out), "family": family, "size": args.size, "parameters": params}


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """``from_pretrained`` + saved processors + ``select_action`` over one chunk; the
    noise is lerobot's own draw after ``torch.manual_seed(seed)``."""
    safetensors = importlib.import_module("safetensors.torch")
    configs = importlib.import_module("lerobot.configs.policies")
    factory = importlib.import_module("lerobot.policies.factory")
    path = Path(args.policy).resolve()
    config = configs.PreTrainedConfig.from_pretrained(str(path))
    sizes = _sizes_of(path)
    if sizes:
        context: Any = _shrunk(config.type, sizes)
    elif _projection_fixed(path):
        context = _projected(config.type)
    else:
        context = contextlib.nullcontext()
    with context:
        policy = factory.get_policy_class(config.type).from_pretrained(str(path))
    policy.eval()
    pre, post = factory.make_pre_post_processors(config, pretrained_path=str(path))
    batch: dict[str, Any] = dict(safetensors.load_file(args.obs))
    batch["task"] = json.loads(Path(args.task).read_text())
    batch = pre(batch)
    rows = int(batch["observation.state"].shape[0])
    shape = (rows, int(config.chunk_size), int(config.max_action_dim))
    torch.manual_seed(args.seed)
    noise = policy.model.sample_noise(shape, torch.device("cpu"))
    policy.reset()
    torch.manual_seed(args.seed)  # select_action draws this same noise
    with torch.no_grad():
        steps = int(config.n_action_steps)
        actions = torch.stack([post(policy.select_action(batch)) for _ in range(steps)], dim=1)
    tokens = batch["observation.language.tokens"]
    safetensors.save_file(
        {"actions": actions.contiguous(), "noise": noise, "tokens": tokens.contiguous()},
        args.out,
    )
    return {"shape": list(actions.shape), "type": config.type}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lerobot_pi")
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny")
    tiny.add_argument("--family", choices=("pi0", "pi05"), required=True)
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--state-dim", type=int, default=6)
    tiny.add_argument("--action-dim", type=int, default=6)
    for option in ("--max-state-dim", "--max-action-dim", "--chunk-size", "--num-steps"):
        tiny.add_argument(option, type=int, default=None, help="default: the size's")
    for option in ("--side", "--max-tokens"):
        tiny.add_argument(option, type=int, default=None, help="default: the size's")
    tiny.add_argument("--size", choices=("tiny", "real"), default="tiny")
    tiny.add_argument("--camera", action="append")
    pred = sub.add_parser("predict")
    pred.add_argument("--policy", required=True)
    pred.add_argument("--obs", required=True, help="safetensors: observation tensors")
    pred.add_argument("--task", required=True, help="JSON file: the list of task strings")
    pred.add_argument("--out", required=True)
    pred.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if torch.version.cuda is None:
        _allow_cpu_torchvision()
    commands = {"make-tiny": make_tiny, "predict": predict}
    result = commands[args.command](args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
