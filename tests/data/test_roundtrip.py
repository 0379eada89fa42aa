"""Writer → reader round trip of the LeRobot v3.0 layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from joynexus.data import FeatureSpec, LeRobotDataset, LeRobotDatasetWriter
from joynexus.errors import ConflictError, DatasetError
from tests.data.conftest import (
    EPISODE_LENGTHS,
    FEATURES,
    FPS,
    SIZE,
    TASKS,
    action_of,
    frame_image,
    state_of,
)


def _global(ep: int, frame: int) -> int:
    return sum(EPISODE_LENGTHS[:ep]) + frame


def test_layout_and_info(tiny_dataset: Path) -> None:
    root = tiny_dataset
    for rel in (
        "meta/info.json",
        "meta/stats.json",
        "meta/tasks.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "data/chunk-000/file-000.parquet",
        "videos/observation.images.top/chunk-000/file-000.mp4",
    ):
        assert (root / rel).is_file(), rel
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["fps"] == FPS
    assert info["total_episodes"] == len(EPISODE_LENGTHS)
    assert info["total_frames"] == sum(EPISODE_LENGTHS)
    assert info["total_tasks"] == 2
    assert info["chunks_size"] == 1000
    assert info["data_files_size_in_mb"] == 100
    assert info["video_files_size_in_mb"] == 200
    assert info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"].startswith("videos/{video_key}/")
    video = info["features"]["observation.images.top"]
    assert video["dtype"] == "video"
    assert video["info"]["video.codec"] == "h264"
    assert video["info"]["video.pix_fmt"] == "yuv420p"
    assert (video["info"]["video.height"], video["info"]["video.width"]) == (SIZE, SIZE)
    assert info["features"]["observation.images.wrist"]["dtype"] == "image"
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert key in info["features"]

    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert "observation.images.top" not in data.column_names  # videos live in mp4 files
    assert data.column("index").to_pylist() == list(range(sum(EPISODE_LENGTHS)))
    assert data.schema.field("observation.images.wrist").type.names == ["bytes", "path"]
    tasks = pq.read_table(root / "meta/tasks.parquet").to_pydict()
    assert tasks == {"task_index": [0, 1], "task": ["push the block", "open the drawer"]}
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert eps["length"] == list(EPISODE_LENGTHS)
    assert eps["tasks"] == [[t] for t in TASKS]
    assert eps["dataset_from_index"] == [0, 6, 15]
    assert eps["dataset_to_index"] == [6, 15, 20]
    assert eps["videos/observation.images.top/from_timestamp"] == [0.0, 0.6, 1.5]
    assert "stats/action/q99" in eps


def test_frames_round_trip(tiny_dataset: Path) -> None:
    ds = LeRobotDataset(tiny_dataset)
    assert len(ds) == sum(EPISODE_LENGTHS)
    assert ds.num_episodes == 3
    assert ds.meta.tasks == {0: "push the block", 1: "open the drawer"}
    for ep, frame in [(0, 0), (1, 4), (2, 4), (1, 8)]:
        item = ds[_global(ep, frame)]
        np.testing.assert_array_equal(item["observation.state"], state_of(ep, frame))
        np.testing.assert_array_equal(item["action"], action_of(ep, frame))
        # PNG image features are lossless.
        np.testing.assert_array_equal(
            item["observation.images.wrist"], frame_image(ep, frame, salt=77)
        )
        video = item["observation.images.top"]
        assert video.shape == (SIZE, SIZE, 3) and video.dtype == np.uint8
        diff = np.abs(video.astype(int) - frame_image(ep, frame).astype(int)).mean()
        assert diff < 8.0, f"decoded video frame ({ep}, {frame}) differs by {diff:.1f}"
        assert item["episode_index"] == ep
        assert item["frame_index"] == frame
        assert item["timestamp"] == pytest.approx(frame / FPS)
        assert item["task"] == TASKS[ep]
    assert ds[-1]["index"] == len(ds) - 1
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_video_frames_are_the_right_ones(tiny_dataset: Path) -> None:
    """Each decoded frame is closer to its own source frame than to its neighbours."""
    ds = LeRobotDataset(tiny_dataset)
    for ep, frame in [(1, 0), (1, 3), (2, 4)]:
        video = ds[_global(ep, frame)]["observation.images.top"].astype(int)
        errors = {
            f: np.abs(video - frame_image(ep, f).astype(int)).mean()
            for f in range(EPISODE_LENGTHS[ep])
        }
        assert min(errors, key=errors.__getitem__) == frame


def test_delta_timestamps_chunks_and_padding(tiny_dataset: Path) -> None:
    ds = LeRobotDataset(
        tiny_dataset,
        delta_timestamps={
            "action": [0.0, 0.1, 0.2, 0.3],
            "observation.images.top": [-0.1, 0.0],
            "observation.images.wrist": [-0.2, 0.0],
        },
    )
    # Middle of episode 1: nothing padded.
    item = ds[_global(1, 2)]
    np.testing.assert_array_equal(item["action"], np.stack([action_of(1, f) for f in range(2, 6)]))
    assert not item["action_is_pad"].any()
    assert item["observation.images.top"].shape == (2, SIZE, SIZE, 3)
    # Last frame of episode 0: the chunk runs past the end -> repeats the last action.
    item = ds[_global(0, 5)]
    np.testing.assert_array_equal(item["action"], np.stack([action_of(0, 5)] * 4))
    assert item["action_is_pad"].tolist() == [False, True, True, True]
    # First frame of episode 2: the past frames are padded with the first frame.
    item = ds[_global(2, 0)]
    assert item["observation.images.top_is_pad"].tolist() == [True, False]
    assert item["observation.images.wrist_is_pad"].tolist() == [True, False]
    np.testing.assert_array_equal(item["observation.images.wrist"][0], frame_image(2, 0, salt=77))
    # The padding never crosses into the previous episode.
    video = item["observation.images.top"].astype(int)
    assert np.abs(video[0] - frame_image(2, 0).astype(int)).mean() < 8.0


def test_delta_timestamps_must_be_frame_multiples(tiny_dataset: Path) -> None:
    with pytest.raises(DatasetError, match="not a multiple of 1/fps"):
        LeRobotDataset(tiny_dataset, delta_timestamps={"action": [0.0, 0.05]})
    with pytest.raises(DatasetError, match="unknown feature"):
        LeRobotDataset(tiny_dataset, delta_timestamps={"nope": [0.0]})


def test_images_instead_of_videos(make_dataset: Callable[..., Path]) -> None:
    root = make_dataset(use_videos=False)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["video_path"] is None
    assert info["features"]["observation.images.top"]["dtype"] == "image"
    assert not (root / "videos").exists()
    item = LeRobotDataset(root)[_global(1, 3)]
    np.testing.assert_array_equal(item["observation.images.top"], frame_image(1, 3))


def test_small_file_limits_split_into_several_files(make_dataset: Callable[..., Path]) -> None:
    root = make_dataset(data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6, chunks_size=2)
    assert sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet")) == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    assert len(list((root / "videos").rglob("*.mp4"))) == 3
    ds = LeRobotDataset(root, delta_timestamps={"action": [0.0, 0.1]})
    item = ds[_global(2, 1)]
    np.testing.assert_array_equal(item["observation.state"], state_of(2, 1))
    assert np.abs(item["observation.images.top"].astype(int) - frame_image(2, 1)).mean() < 8.0


def test_crash_leaves_no_dataset(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    w = LeRobotDatasetWriter.create(root, repo_id="t/x", fps=FPS, features=FEATURES)
    with pytest.raises(RuntimeError, match="boom"), w:
        w.add_frame(
            {
                "observation.images.top": frame_image(0, 0),
                "observation.images.wrist": frame_image(0, 0),
                "observation.state": state_of(0, 0),
                "action": action_of(0, 0),
            },
            task="t",
        )
        w.save_episode()
        raise RuntimeError("boom")
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []  # the staging directory is gone too


def test_unfinished_writer_is_not_a_dataset(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    w = LeRobotDatasetWriter.create(root, repo_id="t/x", fps=FPS, features=FEATURES)
    w.add_frame(
        {
            "observation.images.top": frame_image(0, 0),
            "observation.images.wrist": frame_image(0, 0),
            "observation.state": state_of(0, 0),
            "action": action_of(0, 0),
        },
        task="t",
    )
    w.save_episode()
    # Simulated crash: the process dies before finalize().
    assert not root.exists()
    with pytest.raises(DatasetError, match="does not exist"):
        LeRobotDataset(root)
    w.abort()


def test_writer_rejects_bad_frames_and_states(tmp_path: Path) -> None:
    w = LeRobotDatasetWriter.create(tmp_path / "ds", repo_id="t/x", fps=FPS, features=FEATURES)
    good = {
        "observation.images.top": frame_image(0, 0),
        "observation.images.wrist": frame_image(0, 0),
        "observation.state": state_of(0, 0),
        "action": action_of(0, 0),
    }
    with pytest.raises(DatasetError, match=r"observation.state.*expected shape \[3\]"):
        w.add_frame({**good, "observation.state": np.zeros(4, np.float32)}, task="t")
    with pytest.raises(DatasetError, match=r"uint8 image of shape \[H, W, C\] = \[32, 32, 3\]"):
        w.add_frame({**good, "observation.images.top": np.zeros((16, 16, 3), np.uint8)}, task="t")
    with pytest.raises(DatasetError, match="missing"):
        w.add_frame({k: v for k, v in good.items() if k != "action"}, task="t")
    with pytest.raises(DatasetError, match="no frames"):
        w.save_episode()
    with pytest.raises(DatasetError, match="no episodes"):
        w.finalize()
    w.abort()
    with pytest.raises(ConflictError):
        w.add_frame(good, task="t")
    with pytest.raises(DatasetError, match="reserved"):
        LeRobotDatasetWriter.create(
            tmp_path / "x", repo_id="t/x", fps=FPS, features={"index": FEATURES["action"]}
        )


def test_existing_root_is_refused(tiny_dataset: Path) -> None:
    with pytest.raises(ConflictError, match="already exists"):
        LeRobotDatasetWriter.create(tiny_dataset, repo_id="t/x", fps=FPS, features=FEATURES)


def test_odd_video_size_is_refused(tmp_path: Path) -> None:
    feats = {"cam": FeatureSpec(dtype="video", shape=(15, 16, 3), names=None)}
    w = LeRobotDatasetWriter.create(tmp_path / "ds", repo_id="t/x", fps=FPS, features=feats)
    w.add_frame({"cam": np.zeros((15, 16, 3), np.uint8)}, task="t")
    with pytest.raises(DatasetError, match="even width and height"):
        w.save_episode()
    w.abort()


def test_unknown_dtype_is_refused_without_leftovers(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dtype 'complex42'"):
        LeRobotDatasetWriter.create(
            tmp_path / "ds",
            repo_id="t/x",
            fps=FPS,
            features={"a": {"dtype": "complex42", "shape": [1]}},
        )
    assert list(tmp_path.iterdir()) == []
