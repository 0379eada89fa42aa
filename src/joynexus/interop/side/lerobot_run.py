"""Runs INSIDE a LeRobot environment, never in the project venv: the side venv
``.venv-lerobot`` (lerobot 0.4.4) or the reference environment (lerobot 0.6.1,
:mod:`joynexus.interop.reference`).

``lerobot`` pins releases the project venv does not have (and 0.6.1 needs Python 3.12+);
this script is what JoyNexus runs with those environments' python (see
:mod:`joynexus.interop.lerobot`) to use the real ``lerobot`` classes:

* ``make-tiny``: a randomly initialised LeRobot policy of a real family built by its own
  class from a small config, its VLM pointed at a local tiny SmolVLM directory (built by
  :func:`joynexus.models.tiny.make_tiny` with the side venv's transformers), saved with
  ``save_pretrained`` together with its pre/post-processor pipelines and their
  normalization statistics — the layout of a hub checkpoint such as ``lerobot/smolvla_base``;
* ``probe``: import the policy modules, print the versions;
* ``predict``: ``from_pretrained`` on a policy directory, its saved processors on an
  observation, ``predict_action_chunk`` with a given noise, actions written back;
* ``dataset-read`` / ``dataset-write`` (lerobot 0.6.1 with its ``dataset`` extra):
  lerobot's ``LeRobotDataset`` on a local dataset, or a small one it creates, every
  frame dumped as lerobot hands it over.

It prints one JSON line on success. Only the standard library, torch, safetensors,
transformers and lerobot are imported here (the project's packages are not installed in
the side venv; ``joynexus.models.tiny`` is loaded from its file).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

#: The families make-tiny builds (pi0 / pi05 need openpi's patched transformers and
#: only come in the 300M / 2B Gemma variants in lerobot 0.4.4).
TINY_FAMILIES = ("smolvla",)
VLM_DIR = "vlm"


def _tiny_module() -> Any:
    path = Path(__file__).resolve().parents[2] / "models" / "tiny.py"
    spec = importlib.util.spec_from_file_location("joynexus_tiny", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
    """Made-up but non-trivial statistics, so normalization is visible in round trips."""
    g = torch.Generator().manual_seed(seed + 1)
    out = {}
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        mean = torch.randn(dim, generator=g) * 0.5
        std = torch.rand(dim, generator=g) + 0.5
        out[key] = {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + 3 * std}
    return out


def make_tiny(args: argparse.Namespace) -> dict[str, Any]:
    if args.family not in TINY_FAMILIES:
        raise SystemExit(
            f"make-tiny: family {args.family!r} cannot be built tiny with lerobot 0.4.4 "
            f"(its pi0/pi05 need openpi's patched transformers and Gemma 300M/2B); "
            f"tiny families: {list(TINY_FAMILIES)}"
        )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tiny = _tiny_module()
    vlm = tiny.make_tiny("smolvlm", out / VLM_DIR, seed=args.seed)
    side = int(json.loads((vlm / tiny.SIDECAR).read_text())["canonical_image_size"])
    cameras = args.camera or ["top"]
    inputs, outputs = _features(args.state_dim, args.action_dim, cameras, side)
    config_mod = importlib.import_module("lerobot.policies.smolvla.configuration_smolvla")
    modeling = importlib.import_module("lerobot.policies.smolvla.modeling_smolvla")
    processors = importlib.import_module("lerobot.policies.smolvla.processor_smolvla")
    config = config_mod.SmolVLAConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        push_to_hub=False,
        chunk_size=args.chunk_size,
        n_action_steps=args.chunk_size,
        max_state_dim=max(args.max_state_dim, args.state_dim),
        max_action_dim=max(args.max_action_dim, args.action_dim),
        resize_imgs_with_padding=(side, side),
        tokenizer_max_length=16,
        num_steps=args.num_steps,
        vlm_model_name=str(vlm),
        load_vlm_weights=False,
        num_vlm_layers=2,
        num_expert_layers=-1,
        self_attn_every_n_layers=2,
        expert_width_multiplier=0.75,
    )
    torch.manual_seed(args.seed)
    policy = modeling.SmolVLAPolicy(config)
    policy.eval()
    stats = _stats(args.state_dim, args.action_dim, args.seed)
    pre, post = processors.make_smolvla_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    return {"out": str(out), "family": args.family, "files": sorted(p.name for p in out.iterdir())}


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """``from_pretrained`` + saved processors + ``predict_action_chunk`` (or, with
    ``--select``, ``select_action`` over a whole chunk) with given noise."""
    safetensors = importlib.import_module("safetensors.torch")
    configs = importlib.import_module("lerobot.configs.policies")
    factory = importlib.import_module("lerobot.policies.factory")
    path = str(Path(args.policy).resolve())
    config = configs.PreTrainedConfig.from_pretrained(path)
    policy = factory.get_policy_class(config.type).from_pretrained(path)
    policy.eval()
    pre, post = factory.make_pre_post_processors(config, pretrained_path=path)
    obs = safetensors.load_file(args.obs)
    noise = obs.pop("noise")
    batch: dict[str, Any] = {k: v for k, v in obs.items()}
    batch["task"] = json.loads(Path(args.task).read_text())
    batch = pre(batch)
    with torch.no_grad():
        if args.select:
            # What a robot loop calls: one action per call, the chunk from its queue.
            policy.reset()
            steps = int(config.n_action_steps)
            actions = torch.stack(
                [post(policy.select_action(batch, noise=noise)) for _ in range(steps)], dim=1
            )
        else:
            actions = post(policy.predict_action_chunk(batch, noise=noise))
    safetensors.save_file({"actions": actions.contiguous()}, args.out)
    return {"shape": list(actions.shape), "type": config.type}


def _dataset_class() -> Any:
    return importlib.import_module("lerobot.datasets.lerobot_dataset").LeRobotDataset


def _dump_dataset(ds: Any, out: str) -> dict[str, Any]:
    """Every frame of ``ds`` as lerobot hands it over (``<index>/<key>`` tensors in
    ``out``) and what its metadata says."""
    safetensors = importlib.import_module("safetensors.torch")
    tensors: dict[str, torch.Tensor] = {}
    tasks = []
    for index in range(len(ds)):
        item = ds[index]
        tasks.append(item["task"])
        for key, value in item.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}/{key}"] = value.contiguous()
    safetensors.save_file(tensors, out)
    meta = ds.meta
    return {
        "frames": len(ds),
        "episodes": int(meta.total_episodes),
        "fps": meta.fps,
        "codebase_version": meta.info["codebase_version"],
        "features": {
            k: {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in meta.features.items()
        },
        "tasks": tasks,
    }


def dataset_read(args: argparse.Namespace) -> dict[str, Any]:
    """lerobot's ``LeRobotDataset`` on a local dataset (PyAV decoding), dumped."""
    ds = _dataset_class()("local/dataset", root=args.root, video_backend="pyav")
    return _dump_dataset(ds, args.out)


def dataset_write(args: argparse.Namespace) -> dict[str, Any]:
    """lerobot's ``LeRobotDataset.create`` + ``add_frame`` + ``save_episode`` +
    ``finalize``: a small dataset of a video camera, an image camera, state and
    action (seeded), then read back by lerobot and dumped (what it wrote)."""
    features = {
        "observation.images.top": {
            "dtype": "video",
            "shape": (32, 48, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.images.wrist": {
            "dtype": "image",
            "shape": (24, 24, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (4,), "names": None},
        "action": {"dtype": "float32", "shape": (3,), "names": None},
    }
    ds = _dataset_class().create(
        "local/dataset",
        fps=10,
        features=features,
        root=args.root,
        robot_type="tiny",
        use_videos=True,
    )
    g = torch.Generator().manual_seed(args.seed)
    tasks = ["stack the cups", "wipe the table"]
    for episode, length in enumerate((5, 7)):
        for i in range(length):
            # Smooth images (a gradient and a moving bright square): what a video codec keeps.
            top = torch.zeros(32, 48, 3, dtype=torch.uint8)
            top[..., 0] = (torch.arange(48) * 5).to(torch.uint8)[None, :]
            top[..., 1] = (torch.arange(32) * 7).to(torch.uint8)[:, None]
            top[8:16, 4 * i : 4 * i + 8, 2] = 200 + 20 * episode
            wrist = torch.randint(0, 256, (24, 24, 3), generator=g, dtype=torch.uint8)
            ds.add_frame(
                {
                    "observation.images.top": top.numpy(),
                    "observation.images.wrist": wrist.numpy(),
                    "observation.state": torch.randn(4, generator=g).numpy(),
                    "action": torch.randn(3, generator=g).numpy(),
                    "task": tasks[episode],
                }
            )
        ds.save_episode()
    ds.finalize()
    return dataset_read(args)


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """Import the policy and processor modules JoyNexus uses; report the versions."""
    for family in ("smolvla", "pi0", "pi05"):
        importlib.import_module(f"lerobot.policies.{family}.modeling_{family}")
        importlib.import_module(f"lerobot.policies.{family}.processor_{family}")
    importlib.import_module("lerobot.policies.factory")
    metadata = importlib.import_module("importlib.metadata")
    versions = {p: metadata.version(p) for p in ("lerobot", "torch", "transformers")}
    return {**versions, "python": ".".join(str(v) for v in sys.version_info[:3])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lerobot_run")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe")
    tiny = sub.add_parser("make-tiny")
    tiny.add_argument("--family", required=True)
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--state-dim", type=int, default=6)
    tiny.add_argument("--action-dim", type=int, default=6)
    tiny.add_argument("--max-state-dim", type=int, default=8)
    tiny.add_argument("--max-action-dim", type=int, default=8)
    tiny.add_argument("--chunk-size", type=int, default=4)
    tiny.add_argument("--num-steps", type=int, default=3)
    tiny.add_argument("--camera", action="append")
    pred = sub.add_parser("predict")
    pred.add_argument("--policy", required=True)
    pred.add_argument("--obs", required=True, help="safetensors: observation tensors + noise")
    pred.add_argument("--task", required=True, help="JSON file: the list of task strings")
    pred.add_argument("--out", required=True)
    pred.add_argument("--select", action="store_true", help="select_action, step by step")
    for name in ("dataset-read", "dataset-write"):
        data = sub.add_parser(name)
        data.add_argument("--root", required=True)
        data.add_argument("--out", required=True, help="safetensors: <index>/<key> tensors")
        data.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    commands = {
        "probe": probe,
        "make-tiny": make_tiny,
        "predict": predict,
        "dataset-read": dataset_read,
        "dataset-write": dataset_write,
    }
    result = commands[args.command](args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
