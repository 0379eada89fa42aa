"""Shared helpers for the dataset tests: tiny synthetic episodes written with the writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joynexus.data import FeatureSpec, LeRobotDatasetWriter

SIZE = 32
FPS = 10
HWC = ["height", "width", "channels"]


def frame_image(episode: int, frame: int, salt: int = 0) -> np.ndarray:
    """A smooth, frame-dependent RGB image (compresses well, so decoded video stays close)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    r = (x * 6 + frame * 8 + salt) % 256
    g = (y * 6 + episode * 40) % 256
    b = np.full_like(x, (frame * 12 + episode * 30 + salt) % 256)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def state_of(episode: int, frame: int) -> np.ndarray:
    return np.array([episode * 100 + frame, -frame * 0.5, np.sin(frame)], dtype=np.float32)


def action_of(episode: int, frame: int) -> np.ndarray:
    return np.array([episode + frame * 0.1, frame * 2.0], dtype=np.float32)


FEATURES = {
    "observation.images.top": FeatureSpec(dtype="video", shape=(SIZE, SIZE, 3), names=HWC),
    "observation.images.wrist": FeatureSpec(dtype="image", shape=(SIZE, SIZE, 3), names=HWC),
    "observation.state": FeatureSpec(dtype="float32", shape=(3,), names=None),
    "action": FeatureSpec(dtype="float32", shape=(2,), names=None),
}

EPISODE_LENGTHS = (6, 9, 5)
TASKS = ("push the block", "open the drawer", "push the block")


def write_dataset(
    root: Path,
    lengths: tuple[int, ...] = EPISODE_LENGTHS,
    *,
    use_videos: bool = True,
    **kwargs: Any,
) -> Path:
    with LeRobotDatasetWriter.create(
        root, repo_id="test/tiny", fps=FPS, features=FEATURES, use_videos=use_videos, **kwargs
    ) as writer:
        for ep, n in enumerate(lengths):
            for i in range(n):
                writer.add_frame(
                    {
                        "observation.images.top": frame_image(ep, i),
                        "observation.images.wrist": frame_image(ep, i, salt=77),
                        "observation.state": state_of(ep, i),
                        "action": action_of(ep, i),
                    },
                    task=TASKS[ep % len(TASKS)],
                )
            writer.save_episode()
    return root


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ds") / "tiny")


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "ds", **kwargs: Any) -> Path:
        return write_dataset(tmp_path / name, **kwargs)

    return make
