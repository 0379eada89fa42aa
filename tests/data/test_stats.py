"""Statistics (min/max/mean/std/count + quantiles) agree with numpy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from joynexus.data import LeRobotDataset
from joynexus.data.lerobot_format import QUANTILES
from joynexus.data.stats import aggregate_stats, array_stats, image_stats, sample_frame_indices
from tests.data.conftest import EPISODE_LENGTHS, action_of, frame_image, state_of


def _all_states() -> np.ndarray:
    return np.stack(
        [state_of(ep, i) for ep, n in enumerate(EPISODE_LENGTHS) for i in range(n)]
    ).astype(np.float64)


def test_array_stats_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(57, 4)).astype(np.float32)
    s = array_stats(x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s["mean"], x64.mean(0))
    np.testing.assert_allclose(s["std"], x64.std(0))
    np.testing.assert_array_equal(s["min"], x64.min(0))
    np.testing.assert_array_equal(s["max"], x64.max(0))
    assert s["count"].tolist() == [57]
    for name, q in QUANTILES.items():
        np.testing.assert_allclose(s[name], np.quantile(x64, q, axis=0))
    assert set(QUANTILES) == {"q01", "q10", "q50", "q90", "q99"}
    scalar = array_stats(np.arange(5, dtype=np.int64))
    assert scalar["mean"].shape == (1,) and scalar["q50"].tolist() == [2.0]


def test_image_stats_are_per_channel_in_unit_range() -> None:
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8)
    s = image_stats(frames)
    pixels = frames.reshape(-1, 3).astype(np.float64) / 255.0
    assert s["mean"].shape == (3, 1, 1)
    np.testing.assert_allclose(s["mean"].reshape(3), pixels.mean(0))
    np.testing.assert_allclose(s["std"].reshape(3), pixels.std(0))
    np.testing.assert_allclose(s["q99"].reshape(3), np.quantile(pixels, 0.99, axis=0))
    assert s["count"].tolist() == [4]


def test_aggregate_is_exact_for_mean_and_std() -> None:
    rng = np.random.default_rng(2)
    parts = [rng.normal(loc=i, size=(n, 2)) for i, n in enumerate((5, 11, 3))]
    agg = aggregate_stats([{"x": array_stats(p)} for p in parts])["x"]
    full = np.concatenate(parts)
    np.testing.assert_allclose(agg["mean"], full.mean(0))
    np.testing.assert_allclose(agg["std"], full.std(0))
    np.testing.assert_array_equal(agg["min"], full.min(0))
    assert agg["count"].tolist() == [19]


def test_sample_frame_indices() -> None:
    assert sample_frame_indices(5).tolist() == [0, 1, 2, 3, 4]
    picks = sample_frame_indices(1000, max_samples=10)
    assert len(picks) == 10 and picks[0] == 0 and picks[-1] == 999


def test_dataset_stats_json_matches_numpy(tiny_dataset: Path) -> None:
    raw = json.loads((tiny_dataset / "meta/stats.json").read_text())
    states = _all_states()
    st = raw["observation.state"]
    np.testing.assert_allclose(st["mean"], states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(st["std"], states.std(0), rtol=1e-6)
    np.testing.assert_allclose(st["min"], states.min(0))
    np.testing.assert_allclose(st["max"], states.max(0))
    for name, q in QUANTILES.items():
        np.testing.assert_allclose(st[name], np.quantile(states, q, axis=0), rtol=1e-6)
    assert st["count"] == [sum(EPISODE_LENGTHS)]
    assert raw["index"]["max"] == [sum(EPISODE_LENGTHS) - 1]
    for cam in ("observation.images.top", "observation.images.wrist"):
        assert np.asarray(raw[cam]["mean"]).shape == (3, 1, 1)
        assert 0.0 <= np.min(raw[cam]["min"]) <= np.max(raw[cam]["max"]) <= 1.0
    # The reader hands back the same numbers as arrays.
    meta = LeRobotDataset(tiny_dataset).meta
    assert meta.stats is not None
    np.testing.assert_allclose(meta.stats["observation.state"]["q01"], st["q01"])


def test_episode_stats_match_numpy(tiny_dataset: Path) -> None:
    eps = pq.read_table(tiny_dataset / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    for ep, n in enumerate(EPISODE_LENGTHS):
        actions = np.stack([action_of(ep, i) for i in range(n)]).astype(np.float64)
        np.testing.assert_allclose(eps["stats/action/mean"][ep], actions.mean(0), rtol=1e-6)
        np.testing.assert_allclose(
            eps["stats/action/q90"][ep], np.quantile(actions, 0.9, axis=0), rtol=1e-6
        )
        wrist = np.stack([frame_image(ep, i, salt=77) for i in range(n)])
        expected = wrist.reshape(-1, 3).astype(np.float64).mean(0) / 255.0
        np.testing.assert_allclose(
            np.asarray(eps["stats/observation.images.wrist/mean"][ep]).reshape(3), expected
        )
        assert eps["stats/action/count"][ep] == [n]


def test_dataset_image_stats_aggregate_episodes(tiny_dataset: Path) -> None:
    raw = json.loads((tiny_dataset / "meta/stats.json").read_text())
    frames = np.stack(
        [frame_image(ep, i, salt=77) for ep, n in enumerate(EPISODE_LENGTHS) for i in range(n)]
    )
    pixels = frames.reshape(-1, 3).astype(np.float64) / 255.0
    np.testing.assert_allclose(
        np.asarray(raw["observation.images.wrist"]["mean"]).reshape(3), pixels.mean(0)
    )
    np.testing.assert_allclose(
        np.asarray(raw["observation.images.wrist"]["std"]).reshape(3), pixels.std(0)
    )
    assert pytest.approx(raw["observation.images.wrist"]["count"][0]) == sum(EPISODE_LENGTHS)
