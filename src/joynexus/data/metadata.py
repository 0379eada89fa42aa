"""Load a LeRobot dataset's metadata (v3.0, or v2.0/v2.1) into one common shape.

Both layouts end up as a :class:`DatasetMeta`: the parsed ``info.json``, the task
strings by index, one :class:`EpisodeMeta` per episode (length, tasks, where its rows
and video frames live) and the statistics. Everything after loading is
version-independent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from joynexus.data.lerobot_format import (
    CODEBASE_VERSION,
    EPISODES_DIR,
    LEGACY_EPISODES_PATH,
    LEGACY_EPISODES_STATS_PATH,
    LEGACY_TASKS_PATH,
    STATS_PATH,
    TASKS_PATH,
    DatasetInfo,
    FeatureSpec,
    load_info,
)
from joynexus.data.stats import Stats, aggregate_stats, stats_from_json
from joynexus.errors import DatasetError

__all__ = ["DatasetMeta", "EpisodeMeta", "check_inside", "load_meta"]


@dataclass(frozen=True)
class EpisodeMeta:
    """Where one episode lives.

    Attributes:
        episode_index: The episode's id (the ``episode_index`` column value).
        length: Number of frames.
        tasks: The episode's task strings.
        data_file: Parquet file (relative to the root) holding its rows.
        video_files: Video key → mp4 file (relative) holding its frames.
        video_from_timestamp: Video key → time in that file of the episode's frame 0.
        stats: Per-episode statistics when the dataset stores them.
    """

    episode_index: int
    length: int
    tasks: list[str]
    data_file: Path
    video_files: dict[str, Path] = field(default_factory=dict)
    video_from_timestamp: dict[str, float] = field(default_factory=dict)
    stats: Stats | None = None


@dataclass(frozen=True)
class DatasetMeta:
    """A dataset's metadata, independent of the on-disk version."""

    root: Path
    info: DatasetInfo
    tasks: dict[int, str]
    episodes: list[EpisodeMeta]
    stats: Stats | None

    @property
    def version(self) -> str:
        return self.info.codebase_version

    @property
    def fps(self) -> float:
        return self.info.fps

    @property
    def features(self) -> dict[str, FeatureSpec]:
        return self.info.features

    @property
    def video_keys(self) -> list[str]:
        return self.info.video_keys

    @property
    def image_keys(self) -> list[str]:
        return self.info.image_keys

    @property
    def camera_keys(self) -> list[str]:
        return self.info.camera_keys

    @property
    def total_frames(self) -> int:
        return sum(e.length for e in self.episodes)


def load_meta(root: str | Path) -> DatasetMeta:
    """Read all metadata of the dataset at ``root``.

    Raises:
        DatasetError: a metadata file is missing or malformed, or the version is unknown.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"{root}: dataset directory does not exist", file=str(root))
    info = load_info(root)
    meta = (
        _load_v3(root, info) if info.codebase_version == CODEBASE_VERSION else _load_v2(root, info)
    )
    for ep in meta.episodes:
        for rel in (ep.data_file, *ep.video_files.values()):
            check_inside(root, rel)
    return meta


def check_inside(root: Path, rel: str | Path) -> Path:
    """``root / rel`` for a path the dataset's own files name, refused when it leaves
    the dataset (absolute, or through ``..``): metadata must never make a reader open
    another folder's files.

    Raises:
        DatasetError: ``rel`` is absolute or has a ``..`` part.
    """
    rel = Path(rel)
    if rel.is_absolute() or ".." in rel.parts:
        raise DatasetError(
            f"{root}: the dataset names file {str(rel)!r} outside its own folder; every "
            "file it names must be a relative path inside it (no '..')",
            file=str(rel),
        )
    return root / rel


# ---------------------------------------------------------------------- v3.0
def _read_parquet(path: Path) -> pa.Table:
    if not path.is_file():
        raise DatasetError(f"{path}: missing", file=str(path))
    try:
        return pq.read_table(str(path))
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable parquet file ({exc})", file=str(path)) from exc


def _load_v3_tasks(root: Path) -> dict[int, str]:
    path = root / TASKS_PATH
    table = _read_parquet(path)
    names = table.column_names
    text_col = next(
        (c for c in ("task", "__index_level_0__") if c in names),
        next((c for c in names if pa.types.is_string(table.schema.field(c).type)), None),
    )
    if "task_index" not in names or text_col is None:
        raise DatasetError(
            f"{path}: expected columns 'task_index' and 'task', found {names}", file=str(path)
        )
    indices = table.column("task_index").to_pylist()
    texts = table.column(text_col).to_pylist()
    return {int(i): str(t) for i, t in zip(indices, texts, strict=True)}


def _episode_stats(row: dict[str, Any]) -> Stats:
    stats: Stats = {}
    for col, value in row.items():
        if not col.startswith("stats/") or value is None:
            continue
        key, _, name = col[len("stats/") :].rpartition("/")
        stats.setdefault(key, {})[name] = np.asarray(value)
    return stats


_V3_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index")


def _load_v3(root: Path, info: DatasetInfo) -> DatasetMeta:
    tasks = _load_v3_tasks(root)
    ep_dir = root / EPISODES_DIR
    files = sorted(ep_dir.glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(
            f"{ep_dir}: no episode metadata files (expected chunk-XXX/file-XXX.parquet)",
            file=str(ep_dir),
        )
    episodes: list[EpisodeMeta] = []
    for path in files:
        table = _read_parquet(path)
        missing = [c for c in _V3_EPISODE_COLUMNS if c not in table.column_names]
        missing += [
            f"videos/{k}/{s}"
            for k in info.video_keys
            for s in ("chunk_index", "file_index", "from_timestamp")
            if f"videos/{k}/{s}" not in table.column_names
        ]
        if missing:
            raise DatasetError(
                f"{path}: missing episode columns {missing}", file=str(path), missing=missing
            )
        for row in table.to_pylist():
            data_file = info.data_path.format(
                chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
            )
            videos: dict[str, Path] = {}
            offsets: dict[str, float] = {}
            for key in info.video_keys:
                assert info.video_path is not None  # checked by load_info
                videos[key] = Path(
                    info.video_path.format(
                        video_key=key,
                        chunk_index=row[f"videos/{key}/chunk_index"],
                        file_index=row[f"videos/{key}/file_index"],
                    )
                )
                offsets[key] = float(row[f"videos/{key}/from_timestamp"])
            ep_tasks = row.get("tasks") or []
            episodes.append(
                EpisodeMeta(
                    episode_index=int(row["episode_index"]),
                    length=int(row["length"]),
                    tasks=[str(t) for t in ep_tasks],
                    data_file=Path(data_file),
                    video_files=videos,
                    video_from_timestamp=offsets,
                    stats=_episode_stats(row) or None,
                )
            )
    episodes.sort(key=lambda e: e.episode_index)
    stats = _load_stats_json(root)
    return DatasetMeta(root=root, info=info, tasks=tasks, episodes=episodes, stats=stats)


def _load_stats_json(root: Path) -> Stats | None:
    path = root / STATS_PATH
    if not path.is_file():
        return None
    try:
        return stats_from_json(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc


# ---------------------------------------------------------------------- v2.x
def _read_jsonl(path: Path, *, required: bool = True) -> list[dict[str, Any]]:
    if not path.is_file():
        if required:
            raise DatasetError(f"{path}: missing", file=str(path))
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{n}: not JSON ({exc})", file=str(path)) from exc
    return rows


def _load_v2(root: Path, info: DatasetInfo) -> DatasetMeta:
    task_rows = _read_jsonl(root / LEGACY_TASKS_PATH)
    tasks = {int(r["task_index"]): str(r["task"]) for r in task_rows}
    ep_stats = {
        int(r["episode_index"]): stats_from_json(r["stats"])
        for r in _read_jsonl(root / LEGACY_EPISODES_STATS_PATH, required=False)
    }
    episodes: list[EpisodeMeta] = []
    for row in _read_jsonl(root / LEGACY_EPISODES_PATH):
        if "episode_index" not in row or "length" not in row:
            raise DatasetError(
                f"{root / LEGACY_EPISODES_PATH}: each line needs 'episode_index' and 'length'",
                file=str(root / LEGACY_EPISODES_PATH),
            )
        ep = int(row["episode_index"])
        chunk = ep // info.chunks_size
        videos = {
            key: Path(
                str(info.video_path).format(episode_chunk=chunk, video_key=key, episode_index=ep)
            )
            for key in info.video_keys
        }
        episodes.append(
            EpisodeMeta(
                episode_index=ep,
                length=int(row["length"]),
                tasks=[str(t) for t in row.get("tasks", [])],
                data_file=Path(info.data_path.format(episode_chunk=chunk, episode_index=ep)),
                video_files=videos,
                video_from_timestamp=dict.fromkeys(info.video_keys, 0.0),
                stats=ep_stats.get(ep),
            )
        )
    episodes.sort(key=lambda e: e.episode_index)
    stats = _load_stats_json(root)
    if stats is None and ep_stats:
        stats = aggregate_stats(list(ep_stats.values()))
    return DatasetMeta(root=root, info=info, tasks=tasks, episodes=episodes, stats=stats)
