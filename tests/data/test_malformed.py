"""Malformed datasets fail with DatasetError naming the file/feature and the expectation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from joynexus.data import LeRobotDataset
from joynexus.errors import DatasetError, InvalidRequestError


@pytest.fixture
def dataset(tiny_dataset: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dataset, copy)
    return copy


def _edit_info(root: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


def test_missing_info_json(dataset: Path) -> None:
    (dataset / "meta/info.json").unlink()
    with pytest.raises(DatasetError, match=r"meta/info.json: missing") as err:
        LeRobotDataset(dataset)
    assert isinstance(err.value, InvalidRequestError)
    assert err.value.details["file"].endswith("info.json")


def test_missing_info_keys(dataset: Path) -> None:
    _edit_info(dataset, lambda info: (info.pop("features"), info.pop("fps")))
    with pytest.raises(DatasetError, match=r"missing required keys \['fps', 'features'\]"):
        LeRobotDataset(dataset)


def test_unknown_version(dataset: Path) -> None:
    _edit_info(dataset, lambda info: info.update(codebase_version="v9.0"))
    with pytest.raises(DatasetError, match=r"unknown codebase_version 'v9.0'.*v3.0"):
        LeRobotDataset(dataset)


def test_missing_data_file(dataset: Path) -> None:
    (dataset / "data/chunk-000/file-000.parquet").unlink()
    with pytest.raises(DatasetError, match=r"file-000.parquet: data file missing"):
        LeRobotDataset(dataset)


def test_missing_video_file(dataset: Path) -> None:
    (dataset / "videos/observation.images.top/chunk-000/file-000.mp4").unlink()
    with pytest.raises(DatasetError, match=r"video file for feature 'observation.images.top'"):
        LeRobotDataset(dataset)


def test_missing_episodes_metadata(dataset: Path) -> None:
    shutil.rmtree(dataset / "meta/episodes")
    with pytest.raises(DatasetError, match="no episode metadata files"):
        LeRobotDataset(dataset)


def test_missing_tasks(dataset: Path) -> None:
    (dataset / "meta/tasks.parquet").unlink()
    with pytest.raises(DatasetError, match=r"tasks.parquet: missing"):
        LeRobotDataset(dataset)


def test_state_shape_mismatch(dataset: Path) -> None:
    _edit_info(dataset, lambda info: info["features"]["observation.state"].update(shape=[5]))
    with pytest.raises(
        DatasetError,
        match=r"feature 'observation.state' holds 3 values per frame but meta/info.json "
        r"declares shape \[5\]",
    ) as err:
        LeRobotDataset(dataset)
    assert err.value.details["feature"] == "observation.state"


def test_image_shape_mismatch(dataset: Path) -> None:
    _edit_info(
        dataset,
        lambda info: info["features"]["observation.images.wrist"].update(shape=[64, 64, 3]),
    )
    with pytest.raises(
        DatasetError, match=r"'observation.images.wrist' decodes to .*\[32, 32, 3\].*\[64, 64, 3\]"
    ):
        LeRobotDataset(dataset)


def test_video_shape_mismatch(dataset: Path) -> None:
    _edit_info(
        dataset,
        lambda info: info["features"]["observation.images.top"].update(shape=[48, 32, 3]),
    )
    with pytest.raises(DatasetError, match=r"is 32x32 \(HxW\), meta/info.json declares 48x32"):
        LeRobotDataset(dataset)


def test_feature_column_missing_from_data(dataset: Path) -> None:
    path = dataset / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["action"]), path)
    with pytest.raises(DatasetError, match=r"no column for features \['action'\]"):
        LeRobotDataset(dataset)


def test_episode_length_disagrees_with_data(dataset: Path) -> None:
    path = dataset / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, len(table) - 1), path)  # drop the last frame
    with pytest.raises(DatasetError, match="episode 2 has 4 rows, the episode metadata says 5"):
        LeRobotDataset(dataset)


def test_not_a_parquet_file(dataset: Path) -> None:
    (dataset / "data/chunk-000/file-000.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="unreadable parquet"):
        LeRobotDataset(dataset)


def test_unknown_feature_dtype(dataset: Path) -> None:
    _edit_info(dataset, lambda info: info["features"]["action"].update(dtype="complex42"))
    with pytest.raises(DatasetError, match=r"feature 'action' has unknown dtype 'complex42'"):
        LeRobotDataset(dataset)


def test_episode_table_missing_columns(dataset: Path) -> None:
    path = dataset / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["data/file_index"]), path)
    with pytest.raises(DatasetError, match=r"missing episode columns \['data/file_index'\]"):
        LeRobotDataset(dataset)
