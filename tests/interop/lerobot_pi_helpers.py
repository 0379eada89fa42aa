"""Tiny π0 / π0.5 checkpoints saved by lerobot 0.6.1 itself, in the reference environment.

How they are shrunk is the side script's docstring (``joynexus/interop/side/
lerobot_pi.py``): lerobot's own ``PI05Config`` with the ``gemma_300m`` variants, made
small inside the reference process after the config is constructed. Tests that use one
FAIL (never skip) when the reference environment is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from joynexus.interop.reference import reference_problem, run_reference
from joynexus.interop.tiny_pi import TINY_PI_CAMERAS, make_tiny_pi05

CAMERAS = TINY_PI_CAMERAS


def require_reference() -> None:
    """The reference environment must run; the test FAILS (never skips) when not."""
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


def tiny_pi05(out: Path, *, seed: int = 3) -> Path:
    """A tiny π0.5 (cameras ``top`` and ``wrist`` at 32 px, state and action 6 padded
    to 8, chunk 4, 3 denoising steps) written by lerobot 0.6.1 into ``out``."""
    require_reference()
    return make_tiny_pi05(out, seed=seed, cameras=CAMERAS)


@dataclass
class LerobotAnswer:
    """What lerobot 0.6.1's ``select_action`` made of one fixed observation."""

    pixels: dict[str, torch.Tensor]  # camera → (2, side, side, 3) uint8
    state: torch.Tensor  # (2, 6), the robot's units
    actions: torch.Tensor
    noise: torch.Tensor
    tokens: torch.Tensor


def lerobot_pi05_answer(policy: Path, work: Path, tasks: list[str], *, side: int) -> LerobotAnswer:
    """Two rows of random cameras and state (seed 11) through lerobot 0.6.1's
    ``from_pretrained`` + processors + ``select_action`` (noise seed 21), run from
    ``policy``'s folder (it names its tokenizer relative to itself)."""
    g = torch.Generator().manual_seed(11)
    pixels = {
        c: torch.randint(0, 256, (2, side, side, 3), generator=g, dtype=torch.uint8)
        for c in CAMERAS
    }
    state = torch.randn(2, 6, generator=g)
    obs = {
        f"observation.images.{c}": (p.permute(0, 3, 1, 2) / 255).contiguous()
        for c, p in pixels.items()
    }
    save_file({**obs, "observation.state": state}, str(work / "obs.safetensors"))
    (work / "task.json").write_text(json.dumps(tasks))
    out = work / "actions.safetensors"
    args = ["predict", "--policy", str(policy), "--obs", str(work / "obs.safetensors")]
    args += ["--task", str(work / "task.json"), "--out", str(out), "--seed", "21"]
    run_reference("lerobot_pi.py", args, binds=[work], cwd=policy)
    ref = load_file(str(out))
    return LerobotAnswer(pixels, state, ref["actions"], ref["noise"], ref["tokens"])
