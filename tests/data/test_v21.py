"""A hand-built LeRobot v2.1 dataset (per-episode files, jsonl metadata) reads correctly."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from joynexus.data import LeRobotDataset
from joynexus.errors import DatasetError
from tests.data.conftest import FPS, SIZE, frame_image

LENGTHS = (5, 7)
TASKS = ["stack the cups", "wipe the table"]


def _encode_episode_video(path: Path, episode: int, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(FPS), options={"crf": "18"})
        stream.width, stream.height, stream.pix_fmt = SIZE, SIZE, "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(frame_image(episode, i), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _stats(values: np.ndarray) -> dict[str, list[float]]:
    return {
        "min": values.min(0).tolist(),
        "max": values.max(0).tolist(),
        "mean": values.mean(0).tolist(),
        "std": values.std(0).tolist(),
        "count": [len(values)],
    }


def build_v21(root: Path) -> Path:
    features = {
        "observation.images.cam_high": {
            "dtype": "video",
            "shape": [3, SIZE, SIZE],  # v2.x datasets often list channels first
            "names": ["channels", "height", "width"],
            "info": {"video.fps": FPS, "video.codec": "h264", "video.pix_fmt": "yuv420p"},
        },
        "observation.state": {"dtype": "float32", "shape": [4], "names": None},
        "action": {"dtype": "float32", "shape": [3], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    info = {
        "codebase_version": "v2.1",
        "robot_type": "aloha",
        "total_episodes": len(LENGTHS),
        "total_frames": sum(LENGTHS),
        "total_tasks": len(TASKS),
        "total_videos": len(LENGTHS),
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(LENGTHS)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": (
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        ),
        "features": features,
    }
    (root / "meta").mkdir(parents=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    (root / "meta/tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS))
    )
    episodes, ep_stats = [], []
    start = 0
    for ep, n in enumerate(LENGTHS):
        state = np.stack([v21_state(ep, i) for i in range(n)])
        action = np.stack([v21_action(ep, i) for i in range(n)])
        table = pa.table(
            {
                # variable-size lists, as older datasets wrote them
                "observation.state": pa.array(state.tolist(), type=pa.list_(pa.float32())),
                "action": pa.array(action.tolist(), type=pa.list_(pa.float32())),
                "timestamp": pa.array(np.arange(n, dtype=np.float32) / FPS),
                "frame_index": pa.array(np.arange(n, dtype=np.int64)),
                "episode_index": pa.array(np.full(n, ep, dtype=np.int64)),
                "index": pa.array(np.arange(start, start + n, dtype=np.int64)),
                "task_index": pa.array(np.full(n, ep, dtype=np.int64)),
            }
        )
        path = root / f"data/chunk-000/episode_{ep:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        _encode_episode_video(
            root / f"videos/chunk-000/observation.images.cam_high/episode_{ep:06d}.mp4", ep, n
        )
        episodes.append({"episode_index": ep, "tasks": [TASKS[ep]], "length": n})
        ep_stats.append(
            {
                "episode_index": ep,
                "stats": {"observation.state": _stats(state), "action": _stats(action)},
            }
        )
        start += n
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (root / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ep_stats))
    return root


def v21_state(ep: int, i: int) -> np.ndarray:
    return np.array([ep, i, ep * i, -1.0], dtype=np.float32)


def v21_action(ep: int, i: int) -> np.ndarray:
    return np.array([i * 0.5, ep * 2.0, 1.0], dtype=np.float32)


@pytest.fixture(scope="module")
def v21_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v21(tmp_path_factory.mktemp("v21") / "ds")


def test_reads_v21(v21_root: Path) -> None:
    ds = LeRobotDataset(v21_root, delta_timestamps={"action": [0.0, 0.1, 0.2]})
    assert ds.meta.version == "v2.1"
    assert len(ds) == sum(LENGTHS) and ds.num_episodes == 2
    assert ds.meta.tasks == {0: TASKS[0], 1: TASKS[1]}
    item = ds[LENGTHS[0] + 3]  # episode 1, frame 3
    np.testing.assert_array_equal(item["observation.state"], v21_state(1, 3))
    np.testing.assert_array_equal(item["action"], np.stack([v21_action(1, i) for i in (3, 4, 5)]))
    assert item["task"] == TASKS[1]
    video = item["observation.images.cam_high"]
    assert video.shape == (SIZE, SIZE, 3)
    assert np.abs(video.astype(int) - frame_image(1, 3).astype(int)).mean() < 8.0
    # Each episode's video starts at t=0 in its own file; episode 0's end pads correctly.
    last0 = ds[LENGTHS[0] - 1]
    assert last0["action_is_pad"].tolist() == [False, True, True]
    assert (
        np.abs(
            last0["observation.images.cam_high"].astype(int) - frame_image(0, LENGTHS[0] - 1)
        ).mean()
        < 8.0
    )


def test_v21_stats_are_aggregated_from_episode_stats(v21_root: Path) -> None:
    meta = LeRobotDataset(v21_root).meta
    assert meta.stats is not None
    all_states = np.stack(
        [v21_state(ep, i) for ep, n in enumerate(LENGTHS) for i in range(n)]
    ).astype(np.float64)
    np.testing.assert_allclose(meta.stats["observation.state"]["mean"], all_states.mean(0))
    np.testing.assert_allclose(meta.stats["observation.state"]["std"], all_states.std(0), atol=1e-6)
    assert int(meta.stats["observation.state"]["count"][0]) == sum(LENGTHS)
    assert meta.episodes[1].stats is not None


def test_v21_missing_episode_file(v21_root: Path, tmp_path: Path) -> None:
    root = build_v21(tmp_path / "broken")
    (root / "data/chunk-000/episode_000001.parquet").unlink()
    with pytest.raises(DatasetError, match=r"episode_000001.parquet: data file missing"):
        LeRobotDataset(root)
