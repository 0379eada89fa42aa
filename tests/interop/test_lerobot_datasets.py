"""LeRobot datasets v3.0 both ways against lerobot 0.6.1 (the reference environment).

Out: a dataset ``joynexus data record`` writes (cameras as mp4 videos) is what lerobot
0.6.1's ``LeRobotDataset`` loads — the same frames, features, episodes and tasks. In: a
dataset lerobot 0.6.1 writes itself (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode`` / ``finalize``: a video camera, a PNG camera, state, action, two tasks)
is what JoyNexus's reader loads. Decoding: lerobot with PyAV, JoyNexus with its own
reader; frames are compared pixel for pixel.

Without the reference environment these tests FAIL and say why (never skip).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.data import LeRobotDataset
from joynexus.interop.reference import reference_problem, run_reference


def _require_reference() -> None:
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)


def _as_lerobot(key: str, value: Any) -> torch.Tensor:
    """A JoyNexus frame value as lerobot hands it over: images ``[C, H, W]`` floats in
    [0, 1], scalars as ``[1]``... (only the layout; the values are compared as they are)."""
    array = np.asarray(value)
    if key.startswith("observation.images."):
        return torch.from_numpy(array).permute(2, 0, 1).float() / 255.0
    return torch.from_numpy(array.copy())


def _assert_same_frames(ours: LeRobotDataset, theirs: dict[str, Any], tensors: Path) -> None:
    assert theirs["codebase_version"] == "v3.0"
    assert theirs["frames"] == len(ours) and theirs["episodes"] == ours.num_episodes
    assert theirs["fps"] == ours.fps
    features = {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in ours.features.items()}
    assert theirs["features"] == features
    frames = load_file(str(tensors))
    compared = set()
    for index in range(len(ours)):
        item = ours[index]
        assert theirs["tasks"][index] == item["task"]
        for key, value in item.items():
            if key == "task":
                continue
            ref = frames[f"{index}/{key}"]
            mine = _as_lerobot(key, value).reshape(ref.shape)
            assert torch.equal(mine.to(ref.dtype), ref), (index, key)
            compared.add(key)
    # Every feature was compared, the cameras among them.
    assert compared == set(ours.features)


def test_a_dataset_joynexus_records_loads_in_lerobot_061(tmp_path: Path) -> None:
    _require_reference()
    root = tmp_path / "recorded"
    args = ["data", "record", "--env", "reach2d", "--episodes", "2", "--image-size", "32"]
    result = CliRunner().invoke(app, [*args, "--out", str(root)])
    assert result.exit_code == 0, result.output
    ours = LeRobotDataset(root)
    assert ours.features["observation.images.top"].dtype == "video"
    out = tmp_path / "frames.safetensors"
    theirs = run_reference(
        "lerobot_run.py", ["dataset-read", "--root", str(root), "--out", str(out)], binds=[tmp_path]
    )
    _assert_same_frames(ours, theirs, out)


def test_a_dataset_lerobot_061_writes_loads_in_joynexus(tmp_path: Path) -> None:
    _require_reference()
    root = tmp_path / "written"
    out = tmp_path / "frames.safetensors"
    theirs = run_reference(
        "lerobot_run.py",
        ["dataset-write", "--root", str(root), "--out", str(out), "--seed", "3"],
        binds=[tmp_path],
    )
    ours = LeRobotDataset(root)
    assert ours.features["observation.images.top"].dtype == "video"
    assert ours.features["observation.images.wrist"].dtype == "image"
    assert ours.num_episodes == 2 and len(ours) == 12
    assert {ours[0]["task"], ours[11]["task"]} == {"stack the cups", "wipe the table"}
    _assert_same_frames(ours, theirs, out)
