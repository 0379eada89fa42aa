"""Tiny π0 / π0.5 checkpoints saved by lerobot 0.6.1 itself, in the reference environment.

How they are shrunk is the side script's docstring (``joynexus/interop/side/
lerobot_pi.py``): lerobot's own ``PI0Config`` / ``PI05Config`` with the ``gemma_300m``
variants, made small inside the reference process after the config is constructed.
Tests that use one FAIL (never skip) when the reference environment is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from joynexus.interop.reference import reference_problem, run_reference
from joynexus.interop.tiny_pi import TINY_PI_CAMERAS, make_tiny_pi
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput

CAMERAS = TINY_PI_CAMERAS
#: The tiny checkpoints' camera side (pixels).
SIDE = 32


def pi_schema(action_dim: int = 6) -> DataSchema:
    """A tenant schema the tiny π checkpoints fit (``action_dim`` above 8 does not)."""
    return DataSchema(
        name="own",
        cameras={c: CameraSpec(height=SIDE, width=SIDE) for c in CAMERAS},
        state_dim=6,
        action_dim=action_dim,
        action_chunk=4,
        fps=10.0,
        instruction="pick up the red block",
    )


def require_reference() -> None:
    """The reference environment must run; the test FAILS (never skips) when not."""
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


def tiny_pi05(out: Path, *, seed: int = 3) -> Path:
    """A tiny π0.5 (cameras ``top`` and ``wrist`` at 32 px, state and action 6 padded
    to 8, chunk 4, 3 denoising steps) written by lerobot 0.6.1 into ``out``."""
    require_reference()
    return make_tiny_pi("pi05", out, seed=seed, cameras=CAMERAS)


def tiny_pi0(out: Path, *, seed: int = 3) -> Path:
    """:func:`tiny_pi05`'s π0 (lerobot 0.6.1's ``PI0Config``, the same sizes)."""
    require_reference()
    return make_tiny_pi("pi0", out, seed=seed, cameras=CAMERAS)


@dataclass
class LerobotAnswer:
    """What lerobot 0.6.1's ``select_action`` made of one fixed observation."""

    pixels: dict[str, torch.Tensor]  # camera → (2, side, side, 3) uint8
    state: torch.Tensor  # (2, 6), the robot's units
    actions: torch.Tensor
    noise: torch.Tensor
    tokens: torch.Tensor


def lerobot_pi_answer(policy: Path, work: Path, tasks: list[str], *, side: int) -> LerobotAnswer:
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


@dataclass
class JoyNexusAnswer:
    """What JoyNexus made of the same observation and noise as a :class:`LerobotAnswer`."""

    actions: torch.Tensor  # (rows, 4, 6), the robot's units
    chunk: torch.Tensor  # the expert's normalized, padded chunk
    features: BackboneOutput  # the tenant's rows of the shared prefix
    state: torch.Tensor  # the normalized state the expert was handed
    input_ids: torch.Tensor  # the prompts' tokens


def joynexus_pi_answer(
    base: ResidentBaseModel, slot: TenantSlot, answer: LerobotAnswer, tasks: list[str]
) -> JoyNexusAnswer:
    """``slot``'s actions (its normalization, its expert) for lerobot's observation and
    noise, the tenant alone in a grouped executor."""
    norm = slot.normalization
    assert norm is not None
    model_state = norm.normalize(answer.state.numpy(), "state")
    batch = ObservationBatch(
        cameras={c: p.numpy() for c, p in answer.pixels.items()},
        state=model_state,
        instructions=tasks,
    )
    feature = base.canonicalize([(slot.tenant_id, slot.schema, batch)])
    executor = GroupedExecutor(base, [slot])
    features = executor.shared_forward({slot.tenant_id: batch})[slot.tenant_id]
    state = torch.from_numpy(model_state)
    with torch.no_grad():
        chunk = slot.action_module.denoise(features, state, answer.noise)
    _, steps, dims = answer.actions.shape
    actions = torch.from_numpy(norm.unnormalize(chunk[:, :steps, :dims].numpy(), "action"))
    return JoyNexusAnswer(actions, chunk, features, state, feature.model_inputs["input_ids"].cpu())
