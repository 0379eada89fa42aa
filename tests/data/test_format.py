"""The format module: feature axis order, info.json round trip, chunk/file slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joynexus.data.lerobot_format import (
    DatasetInfo,
    FeatureSpec,
    advance_chunk_file,
    atomic_write_json,
    load_info,
)


@pytest.mark.parametrize(
    ("shape", "names", "hwc"),
    [
        ((96, 96, 3), ["height", "width", "channels"], (96, 96, 3)),
        ((3, 96, 128), ["channels", "height", "width"], (96, 128, 3)),
        ((3, 384, 384), ["c", "h", "w"], (384, 384, 3)),
        ((240, 320, 3), None, (240, 320, 3)),
        ((3, 240, 320), None, (240, 320, 3)),
        # names contradicting the shape (seen in published datasets): the shape wins
        ((3, 256, 256), ["height", "width", "channel"], (256, 256, 3)),
    ],
)
def test_image_axis_order(
    shape: tuple[int, int, int], names: list[str] | None, hwc: tuple[int, int, int]
) -> None:
    assert FeatureSpec(dtype="image", shape=shape, names=names).image_hwc() == hwc


def test_info_round_trip_keeps_unknown_keys(tmp_path: Path) -> None:
    raw = {
        "codebase_version": "v3.0",
        "robot_type": "so100",
        "total_episodes": 2,
        "total_frames": 30,
        "total_tasks": 1,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": 30,
        "splits": {"train": "0:2"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": {
            "action": {
                "dtype": "float32",
                "shape": [6],
                "names": ["j0", "j1", "j2", "j3", "j4", "j5"],
                "fps": 30,
            },
        },
        "tools": [{"name": "say"}],
    }
    atomic_write_json(tmp_path / "meta/info.json", raw)
    info = load_info(tmp_path)
    assert isinstance(info, DatasetInfo)
    assert info.to_json() == raw
    assert json.loads((tmp_path / "meta/info.json").read_text()) == raw


def test_advance_chunk_file() -> None:
    assert advance_chunk_file(0, 0, 1000) == (0, 1)
    assert advance_chunk_file(0, 999, 1000) == (1, 0)
    assert advance_chunk_file(2, 1, 2) == (3, 0)
