"""Feature statistics in LeRobot's layout: min / max / mean / std / count + quantiles.

Array features get per-element statistics over frames (shape = the feature's shape).
Image and video features get per-channel statistics of pixel values scaled to
``[0, 1]``, shaped ``(C, 1, 1)``, computed on an evenly spaced sample of frames
(spatially subsampled when large), as LeRobot does. ``count`` is always shape ``(1,)``.

Dataset-level statistics of array features are computed exactly over all frames.
Episode statistics of images are combined with :func:`aggregate_stats`: exact for
min/max/mean/std (parallel variance formula), count-weighted for quantiles (an
approximation, the same one LeRobot makes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from joynexus.data.lerobot_format import QUANTILES

__all__ = [
    "Stats",
    "aggregate_stats",
    "array_stats",
    "image_stats",
    "sample_frame_indices",
    "stats_from_json",
    "stats_to_json",
]

Stats = dict[str, dict[str, np.ndarray]]
"""feature key -> stat name -> array."""

MAX_IMAGE_SAMPLES = 100
_MAX_IMAGE_SIDE = 150


def sample_frame_indices(num_frames: int, max_samples: int = MAX_IMAGE_SAMPLES) -> np.ndarray:
    """Evenly spaced frame indices (first and last included), at most ``max_samples``."""
    if num_frames <= 0:
        return np.zeros(0, dtype=np.int64)
    n = min(num_frames, max_samples)
    return np.unique(np.round(np.linspace(0, num_frames - 1, n)).astype(np.int64))


def array_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics over axis 0 of ``values`` ``[N, *shape]`` (N ≥ 1).

    A 1-d input (a scalar feature) yields stats of shape ``(1,)``, matching LeRobot.
    """
    arr = np.asarray(values)
    if arr.shape[0] == 0:
        raise ValueError("statistics need at least one frame")
    if arr.ndim == 1:
        arr = arr[:, None]
    x = arr.astype(np.float64)
    out = {
        "min": x.min(axis=0),
        "max": x.max(axis=0),
        "mean": x.mean(axis=0),
        "std": x.std(axis=0),
        "count": np.array([arr.shape[0]], dtype=np.int64),
    }
    qs = np.quantile(x, list(QUANTILES.values()), axis=0)
    for i, name in enumerate(QUANTILES):
        out[name] = qs[i]
    return out


def _downsample(frames: np.ndarray) -> np.ndarray:
    h, w = frames.shape[1], frames.shape[2]
    step = max(1, int(max(h, w) // _MAX_IMAGE_SIDE))
    return frames[:, ::step, ::step, :] if step > 1 else frames


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of uint8 ``[N, H, W, C]`` frames, scaled to ``[0, 1]``.

    The caller passes the sampled frames; ``count`` is the number of frames used.
    """
    if frames.ndim != 4 or frames.shape[0] == 0:
        raise ValueError(f"expected non-empty [N, H, W, C] frames, got {list(frames.shape)}")
    small = _downsample(frames)
    c = small.shape[-1]
    pixels = small.reshape(-1, c).astype(np.float64) / 255.0
    out = {
        "min": pixels.min(axis=0),
        "max": pixels.max(axis=0),
        "mean": pixels.mean(axis=0),
        "std": pixels.std(axis=0),
    }
    qs = np.quantile(pixels, list(QUANTILES.values()), axis=0)
    for i, name in enumerate(QUANTILES):
        out[name] = qs[i]
    shaped = {k: v.reshape(c, 1, 1) for k, v in out.items()}
    shaped["count"] = np.array([frames.shape[0]], dtype=np.int64)
    return shaped


def aggregate_stats(per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> Stats:
    """Combine per-episode statistics into dataset statistics (see module docstring)."""
    keys: list[str] = []
    for stats in per_episode:
        keys.extend(k for k in stats if k not in keys)
    out: Stats = {}
    for key in keys:
        parts = [s[key] for s in per_episode if key in s]
        counts = np.array([float(p["count"][0]) for p in parts])
        total = counts.sum()
        w = (counts / total).reshape(-1, *([1] * np.ndim(parts[0]["mean"])))
        means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
        variances = np.stack([np.asarray(p["std"], dtype=np.float64) ** 2 for p in parts])
        mean = (w * means).sum(axis=0)
        var = (w * (variances + (means - mean) ** 2)).sum(axis=0)
        agg: dict[str, np.ndarray] = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0).astype(np.float64),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0).astype(np.float64),
            "mean": mean,
            "std": np.sqrt(var),
            "count": np.array([int(total)], dtype=np.int64),
        }
        for name in QUANTILES:
            if all(name in p for p in parts):
                agg[name] = (w * np.stack([np.asarray(p[name], np.float64) for p in parts])).sum(
                    axis=0
                )
        out[key] = agg
    return out


def stats_to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Nested lists, the ``meta/stats.json`` form."""
    return {
        key: {name: np.asarray(v).tolist() for name, v in feat.items()}
        for key, feat in stats.items()
    }


def stats_from_json(raw: Mapping[str, Any]) -> Stats:
    """Inverse of :func:`stats_to_json` (integers stay integers, the rest float64)."""
    out: Stats = {}
    for key, feat in raw.items():
        if not isinstance(feat, Mapping):
            continue
        out[key] = {}
        for name, value in feat.items():
            arr = np.asarray(value)
            out[key][name] = arr if arr.dtype.kind in "iub" else arr.astype(np.float64)
    return out
