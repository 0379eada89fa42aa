"""The LeRobot side venv in tests: required (never skipped), tiny checkpoints, and
lerobot's own predictions on an observation with fixed noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from joynexus.errors import InvalidRequestError, ServiceUnavailableError
from joynexus.interop.lerobot import lerobot_python, make_tiny_lerobot, run_lerobot_side

CAMERAS = ["top", "wrist"]
TASKS = ["pick up the red block", "open the top drawer of the cabinet"]


def require_lerobot_venv() -> None:
    """The LeRobot venv must run lerobot's policy code; the test FAILS (never skips)."""
    try:
        versions = run_lerobot_side(["probe"])
    except (ServiceUnavailableError, InvalidRequestError) as error:
        pytest.fail(
            f"the LeRobot venv at {lerobot_python()} cannot run lerobot ({error}); build it "
            "with `bash scripts/install-python-extras.sh .venv/bin/python` (make install does)"
        )
    assert versions["lerobot"] == "0.4.4"


def tiny_smolvla(out: Path, seed: int = 3) -> Path:
    """A tiny SmolVLA written by lerobot's own ``SmolVLAPolicy.save_pretrained``."""
    require_lerobot_venv()
    make_tiny_lerobot("smolvla", out, seed=seed, cameras=CAMERAS)
    return out


def observation(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows: cameras in [0, 1] (the wrist one not square), state, and the noise
    ``[2, chunk 4, max_action_dim 8]`` both sides start from."""
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.images.top": torch.rand(2, 3, 64, 64, generator=g),
        "observation.images.wrist": torch.rand(2, 3, 48, 64, generator=g),
        "observation.state": torch.randn(2, 6, generator=g),
        "noise": torch.randn(2, 4, 8, generator=g),
    }


def lerobot_actions(
    policy: Path, obs: dict[str, torch.Tensor], work: Path, *, select: bool = False
) -> torch.Tensor:
    """``from_pretrained`` + saved processors + ``predict_action_chunk`` (``select``:
    ``select_action`` once per chunk step) in the side venv."""
    work.mkdir(parents=True, exist_ok=True)
    save_file(obs, str(work / "obs.safetensors"))
    (work / "task.json").write_text(json.dumps(TASKS))
    out = work / "actions.safetensors"
    run_lerobot_side(
        [
            "predict",
            "--policy",
            str(policy),
            "--obs",
            str(work / "obs.safetensors"),
            "--task",
            str(work / "task.json"),
            "--out",
            str(out),
            *(["--select"] if select else []),
        ],
        # An export names its VLM folder relative to itself ("vlm"): lerobot resolves
        # it against the working folder.
        cwd=policy,
    )
    return load_file(str(out))["actions"]


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def assert_no_absolute_paths(folder: Path) -> None:
    """No string in any JSON file of an exported ``folder`` is an absolute path (one
    that would name the machine it was exported on)."""
    for file in folder.rglob("*.json"):
        for text in _strings(json.loads(file.read_text())):
            assert not text.startswith("/"), f"{file.name} holds the path {text!r}"
