"""Decoded frames kept per episode: the same frames as decoding each sample, fewer decodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joynexus.data.frame_cache import FrameCache
from joynexus.data.reader import LeRobotDataset

WINDOWS = {"observation.images.top": [-0.2, -0.1, 0.0], "observation.images.wrist": [0.0, 0.1]}


def test_cached_frames_equal_decoded_frames_everywhere(tiny_dataset: Path) -> None:
    cached = LeRobotDataset(tiny_dataset, delta_timestamps=WINDOWS)
    direct = LeRobotDataset(tiny_dataset, delta_timestamps=WINDOWS, frame_cache_mb=0)
    assert cached.frame_cache is not None and direct.frame_cache is None
    # Every frame, in an order that revisits episodes (padding at both ends included).
    order = [*range(len(cached)), *reversed(range(len(cached)))]
    for i in order:
        a, b = cached[i], direct[i]
        for key in WINDOWS:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key} at {i}")
            np.testing.assert_array_equal(a[f"{key}_is_pad"], b[f"{key}_is_pad"])
    # Each (video camera, episode) span was decoded once; every later sample was a hit
    # (the wrist camera is stored as images: nothing to decode from a video).
    videos = [k for k, f in cached.features.items() if f.dtype == "video"]
    assert videos == ["observation.images.top"]
    spans = len(videos) * cached.num_episodes
    assert cached.frame_cache.misses == spans == len(cached.frame_cache)
    assert cached.frame_cache.hits == 2 * len(cached) * len(videos) - spans


def test_an_episode_larger_than_the_budget_is_decoded_frame_by_frame(tiny_dataset: Path) -> None:
    # 1 KiB cannot hold one episode: every sample decodes only its own frames.
    ds = LeRobotDataset(tiny_dataset, frame_cache_mb=1 / 1024)
    direct = LeRobotDataset(tiny_dataset, frame_cache_mb=0)
    for i in range(len(ds)):
        np.testing.assert_array_equal(
            ds[i]["observation.images.top"], direct[i]["observation.images.top"]
        )
    assert ds.frame_cache is not None and ds.frame_cache.misses == 0 and len(ds.frame_cache) == 0


def _span(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n, dtype=np.float64), np.zeros((n, 4, 4, 3), dtype=np.uint8)


def test_least_recently_used_spans_leave_first_within_the_budget() -> None:
    one = sum(a.nbytes for a in _span(10))  # 80 + 480 bytes
    cache = FrameCache(budget_bytes=2 * one)
    decodes: list[str] = []

    def get(key: str) -> None:
        cache.get(key, lambda: (decodes.append(key), _span(10))[1])

    get("a")
    get("b")
    get("a")  # a is now the most recent
    get("c")  # over budget: b leaves
    assert len(cache) == 2 and cache.nbytes == 2 * one
    get("a")
    get("b")  # decoded again
    assert decodes == ["a", "b", "c", "b"]
    # A span larger than the whole budget is returned but not kept.
    small = FrameCache(budget_bytes=one - 1)
    times, _ = small.get("x", lambda: _span(10))
    assert len(times) == 10 and len(small) == 0 and small.nbytes == 0
    with pytest.raises(ValueError, match="budget_bytes"):
        FrameCache(-1)
