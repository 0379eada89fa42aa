"""Write LeRobot v3.0 datasets: ``create → add_frame → save_episode → finalize``.

Everything is written into a hidden staging directory next to ``root`` and moved into
place by one ``rename`` in :meth:`LeRobotDatasetWriter.finalize`, after
``meta/info.json`` (written last). A writer that crashes or is aborted therefore never
leaves a directory at ``root`` that looks like a complete dataset.

Camera features are stored as mp4 videos (``dtype="video"``, one stream per camera,
episodes concatenated in time) or, with ``use_videos=False``, as PNG images inside the
data parquet files (``dtype="image"``), exactly as LeRobot does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from joynexus.data.arrow_io import (
    IMAGE_STRUCT,
    arrow_type,
    column_to_numpy,
    encode_png,
    hf_features_metadata,
    tasks_table,
)
from joynexus.data.lerobot_format import (
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_FEATURES,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    EPISODES_PATH,
    INFO_PATH,
    KNOWN_DTYPES,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    DatasetInfo,
    FeatureSpec,
    advance_chunk_file,
    atomic_write_json,
)
from joynexus.data.stats import (
    Stats,
    aggregate_stats,
    array_stats,
    image_stats,
    sample_frame_indices,
    stats_to_json,
)
from joynexus.data.video import DEFAULT_CODEC, VideoEncoder, probe_video
from joynexus.errors import ConflictError, DatasetError

__all__ = ["LeRobotDatasetWriter"]

_MB = 1024 * 1024


class LeRobotDatasetWriter:
    """Writes one LeRobot v3.0 dataset. Build with :meth:`create`.

    Use as a context manager to abort (remove the staging directory) on an exception
    and finalize on a clean exit::

        with LeRobotDatasetWriter.create(root, repo_id="me/pusht", fps=10, features=f) as w:
            for frame in episode:
                w.add_frame(frame, task="push the T")
            w.save_episode()
    """

    def __init__(
        self,
        root: Path,
        staging: Path,
        info: DatasetInfo,
        *,
        repo_id: str,
        video_codec: str,
    ) -> None:
        self.root = root
        self.repo_id = repo_id
        self._staging = staging
        self.info = info
        self.features: dict[str, FeatureSpec] = dict(info.features)
        self._user_keys = [k for k in self.features if k not in DEFAULT_FEATURES]
        self._video_codec = video_codec
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict[str, Any]] = []
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._buffer: dict[str, list[Any]] = {k: [] for k in self._user_keys}
        self._buffer_tasks: list[str] = []
        self._total_frames = 0
        self._data_slot = (0, 0)
        self._data_writer: pq.ParquetWriter | None = None
        self._data_files: list[Path] = []
        self._video_slots: dict[str, tuple[int, int]] = {k: (0, 0) for k in info.video_keys}
        self._encoders: dict[str, VideoEncoder] = {}
        self._arrow_schema = pa.schema(
            [(k, arrow_type(f)) for k, f in self.features.items() if f.dtype != "video"],
            metadata={b"huggingface": hf_features_metadata(self.features)},
        )
        self._state = "open"

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        root: str | Path,
        *,
        repo_id: str,
        fps: int,
        features: Mapping[str, FeatureSpec | Mapping[str, Any]],
        robot_type: str | None = None,
        use_videos: bool = True,
        video_codec: str = DEFAULT_CODEC,
        chunks_size: int = DEFAULT_CHUNK_SIZE,
        data_files_size_in_mb: float = DEFAULT_DATA_FILE_SIZE_IN_MB,
        video_files_size_in_mb: float = DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    ) -> LeRobotDatasetWriter:
        """Start a new dataset that will appear at ``root`` on :meth:`finalize`.

        Args:
            root: Final dataset directory; must not exist (or be an empty directory).
            repo_id: The dataset's hub-style id, e.g. ``"me/pusht_demos"`` (informational).
            fps: Frames per second of every episode.
            features: Feature key → :class:`FeatureSpec` (or its dict form). The default
                index features (``timestamp``, ``frame_index``, ...) are added.
            robot_type: Written to ``info.json``.
            use_videos: Store camera features as mp4 videos; ``False`` turns every
                ``video`` feature into an ``image`` feature (PNG in the parquet data).
            video_codec: PyAV encoder for videos (``libx264`` writes ``h264``).
            chunks_size, data_files_size_in_mb, video_files_size_in_mb: File layout
                limits (LeRobot's defaults).

        Raises:
            ConflictError: ``root`` already holds something.
            DatasetError: a feature is malformed or uses a reserved name.
        """
        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise ConflictError(f"{root}: already exists and is not an empty directory")
        if fps <= 0:
            raise DatasetError(f"fps must be positive, got {fps}")
        feats: dict[str, FeatureSpec] = {}
        for key, spec in features.items():
            if key in DEFAULT_FEATURES:
                raise DatasetError(
                    f"feature {key!r} is reserved (added automatically); rename it",
                    feature=key,
                )
            if "/" in key:
                raise DatasetError(f"feature names may not contain '/': {key!r}", feature=key)
            fs = spec if isinstance(spec, FeatureSpec) else FeatureSpec.model_validate(spec)
            if fs.dtype not in KNOWN_DTYPES:
                raise DatasetError(
                    f"feature {key!r}: unknown dtype {fs.dtype!r}; expected one of "
                    f"{list(KNOWN_DTYPES)}",
                    feature=key,
                )
            if fs.dtype == "video" and not use_videos:
                fs = fs.model_copy(update={"dtype": "image", "info": None})
            if fs.is_visual:
                _, _, c = fs.image_hwc()
                if fs.dtype == "video" and c != 3:
                    raise DatasetError(
                        f"video feature {key!r} needs 3 channels (RGB), got shape {list(fs.shape)}",
                        feature=key,
                    )
            feats[key] = fs
        feats.update(DEFAULT_FEATURES)
        has_video = any(f.dtype == "video" for f in feats.values())
        info = DatasetInfo(
            codebase_version=CODEBASE_VERSION,
            robot_type=robot_type,
            total_episodes=0,
            total_frames=0,
            total_tasks=0,
            chunks_size=chunks_size,
            data_files_size_in_mb=data_files_size_in_mb,
            video_files_size_in_mb=video_files_size_in_mb,
            fps=fps,
            splits={},
            data_path=DATA_PATH,
            video_path=VIDEO_PATH if has_video else None,
            features=feats,
        )
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = root.parent / f".{root.name}.writing-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            return cls(root, staging, info, repo_id=repo_id, video_codec=video_codec)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def __enter__(self) -> LeRobotDatasetWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.finalize()

    # ------------------------------------------------------------------ frames
    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def episode_buffer_size(self) -> int:
        """Frames added since the last :meth:`save_episode`."""
        return len(self._buffer_tasks)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ConflictError(f"dataset writer for {self.root} is {self._state}")

    def add_frame(self, frame: Mapping[str, Any], task: str) -> None:
        """Buffer one frame of the current episode.

        Args:
            frame: Every user feature key → its value: uint8 ``[H, W, C]`` images for
                image/video features, arrays of the feature's shape (or scalars for
                shape ``(1,)``), ``str`` for string features.
            task: The natural-language task of this frame.

        Raises:
            DatasetError: a key is missing or unexpected, or a value has the wrong
                shape or dtype (the message names the feature and the expectation).
        """
        self._check_open()
        missing = [k for k in self._user_keys if k not in frame]
        extra = [k for k in frame if k not in self._user_keys]
        if missing or extra:
            raise DatasetError(
                f"frame keys do not match the dataset features: missing {missing}, "
                f"unexpected {extra} (expected {self._user_keys})",
                missing=missing,
                unexpected=extra,
            )
        if not isinstance(task, str) or not task:
            raise DatasetError("task must be a non-empty string")
        values: dict[str, Any] = {}
        for key in self._user_keys:
            values[key] = self._check_value(key, self.features[key], frame[key])
        for key, value in values.items():
            self._buffer[key].append(value)
        self._buffer_tasks.append(task)

    @staticmethod
    def _check_value(key: str, spec: FeatureSpec, value: Any) -> Any:
        if spec.dtype == "string":
            if not isinstance(value, str):
                raise DatasetError(f"feature {key!r}: expected str", feature=key)
            return value
        if spec.is_visual:
            hwc = spec.image_hwc()
            arr = np.asarray(value)
            if arr.dtype != np.uint8 or arr.shape != hwc:
                raise DatasetError(
                    f"feature {key!r}: expected a uint8 image of shape [H, W, C] = "
                    f"{list(hwc)}, got {arr.dtype} {list(arr.shape)}",
                    feature=key,
                    expected_shape=list(hwc),
                    shape=list(arr.shape),
                )
            return arr
        arr = np.asarray(value)
        if arr.shape != spec.shape and not (spec.shape == (1,) and arr.shape == ()):
            raise DatasetError(
                f"feature {key!r}: expected shape {list(spec.shape)}, got {list(arr.shape)}",
                feature=key,
                expected_shape=list(spec.shape),
                shape=list(arr.shape),
            )
        if not np.can_cast(arr.dtype, np.dtype(spec.dtype), casting="same_kind") and not (
            arr.dtype.kind in "iub" and np.dtype(spec.dtype).kind == "f"
        ):
            raise DatasetError(
                f"feature {key!r}: expected dtype {spec.dtype}, got {arr.dtype}", feature=key
            )
        return arr.astype(spec.dtype).reshape(spec.shape)

    def clear_episode_buffer(self) -> None:
        """Drop the frames of the current (unsaved) episode."""
        for values in self._buffer.values():
            values.clear()
        self._buffer_tasks.clear()

    # ------------------------------------------------------------------ episodes
    def save_episode(self) -> int:
        """Write the buffered frames as the next episode; returns its episode index.

        Raises:
            DatasetError: no frames were added since the last save.
        """
        self._check_open()
        n = len(self._buffer_tasks)
        if n == 0:
            raise DatasetError("save_episode: no frames were added to this episode")
        ep = len(self._episodes)
        fps = self.info.fps
        for task in self._buffer_tasks:
            if task not in self._tasks:
                self._tasks[task] = len(self._tasks)
        ep_tasks = list(dict.fromkeys(self._buffer_tasks))
        start = self._total_frames
        columns: dict[str, np.ndarray | list[Any]] = {}
        for key in self._user_keys:
            spec = self.features[key]
            if spec.is_visual or spec.dtype == "string":
                columns[key] = self._buffer[key]
            else:
                columns[key] = np.stack(self._buffer[key]).astype(spec.dtype)
        frame_index = np.arange(n, dtype=np.int64)
        columns["timestamp"] = (frame_index / fps).astype(np.float32)
        columns["frame_index"] = frame_index
        columns["episode_index"] = np.full(n, ep, dtype=np.int64)
        columns["index"] = np.arange(start, start + n, dtype=np.int64)
        columns["task_index"] = np.array([self._tasks[t] for t in self._buffer_tasks], np.int64)

        stats = self._episode_stats_of(columns)
        row: dict[str, Any] = {"episode_index": ep, "tasks": ep_tasks, "length": n}
        row.update(self._write_data(columns, ep, n))
        row["dataset_from_index"] = start
        row["dataset_to_index"] = start + n
        for key in self.info.video_keys:
            row.update(self._write_video(key, columns[key]))
        for key, feat_stats in stats.items():
            for name, value in feat_stats.items():
                row[f"stats/{key}/{name}"] = value.tolist()
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        self._episodes.append(row)
        self._episode_stats.append(stats)
        self._total_frames += n
        self.clear_episode_buffer()
        return ep

    def _episode_stats_of(self, columns: Mapping[str, Any]) -> dict[str, dict[str, np.ndarray]]:
        stats: dict[str, dict[str, np.ndarray]] = {}
        for key, spec in self.features.items():
            if spec.dtype == "string":
                continue
            if spec.is_visual:
                frames = columns[key]
                picks = sample_frame_indices(len(frames))
                stats[key] = image_stats(np.stack([frames[int(i)] for i in picks]))
            else:
                stats[key] = array_stats(np.asarray(columns[key]))
        return stats

    def _write_data(self, columns: Mapping[str, Any], ep: int, n: int) -> dict[str, int]:
        arrays = []
        for field in self._arrow_schema:
            key = field.name
            spec = self.features[key]
            values = columns[key]
            if spec.dtype == "image":
                arrays.append(
                    pa.array(
                        [
                            {"bytes": encode_png(img), "path": f"frame-{i:06d}.png"}
                            for i, img in enumerate(values)
                        ],
                        type=IMAGE_STRUCT,
                    )
                )
            elif spec.dtype == "string":
                arrays.append(pa.array(values, type=pa.string()))
            elif spec.shape == (1,):
                arrays.append(pa.array(np.asarray(values).reshape(n), type=field.type))
            else:
                flat: pa.Array = pa.array(np.asarray(values).reshape(-1))
                for dim in reversed(spec.shape):
                    flat = pa.FixedSizeListArray.from_arrays(flat, dim)
                arrays.append(flat)
        table = pa.Table.from_arrays(arrays, schema=self._arrow_schema)
        chunk, file = self._data_slot
        if self._data_writer is None:
            path = self._staging / DATA_PATH.format(chunk_index=chunk, file_index=file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(
                str(path), self._arrow_schema, compression="snappy"
            )
            self._data_files.append(path)
        self._data_writer.write_table(table)
        limit = float(self.info.data_files_size_in_mb or DEFAULT_DATA_FILE_SIZE_IN_MB)
        if self._data_files[-1].stat().st_size >= limit * _MB:
            self._data_writer.close()
            self._data_writer = None
            self._data_slot = advance_chunk_file(chunk, file, self.info.chunks_size)
        return {"data/chunk_index": chunk, "data/file_index": file}

    def _write_video(self, key: str, frames: np.ndarray | list[Any]) -> dict[str, Any]:
        """Append an episode's frames (``[T, H, W, C]``, or one array per frame) to the
        key's video file."""
        chunk, file = self._video_slots[key]
        enc = self._encoders.get(key)
        if enc is None:
            h, w, _ = self.features[key].image_hwc()
            path = self._staging / VIDEO_PATH.format(
                video_key=key, chunk_index=chunk, file_index=file
            )
            enc = VideoEncoder(path, fps=self.info.fps, width=w, height=h, codec=self._video_codec)
            self._encoders[key] = enc
        fps = self.info.fps
        from_ts = enc.frames_written / fps
        for img in frames:
            enc.add_frame(img)
        to_ts = enc.frames_written / fps
        limit = float(self.info.video_files_size_in_mb or DEFAULT_VIDEO_FILE_SIZE_IN_MB)
        if enc.size_bytes() >= limit * _MB:
            enc.close()
            del self._encoders[key]
            self._video_slots[key] = advance_chunk_file(chunk, file, self.info.chunks_size)
        return {
            f"videos/{key}/chunk_index": chunk,
            f"videos/{key}/file_index": file,
            f"videos/{key}/from_timestamp": from_ts,
            f"videos/{key}/to_timestamp": to_ts,
        }

    # ------------------------------------------------------------------ finishing
    def _close_files(self) -> None:
        if self._data_writer is not None:
            self._data_writer.close()
            self._data_writer = None
        for enc in self._encoders.values():
            enc.close()
        self._encoders.clear()

    def _dataset_stats(self) -> Stats:
        visual = [k for k, f in self.features.items() if f.is_visual]
        agg = aggregate_stats([{k: s[k] for k in visual} for s in self._episode_stats])
        numeric = [k for k, f in self.features.items() if not f.is_visual and f.dtype != "string"]
        stats: Stats = {}
        tables = [pq.read_table(str(p), columns=numeric) for p in self._data_files]
        for key in self.features:
            if key in agg:
                stats[key] = agg[key]
            elif key in numeric:
                spec = self.features[key]
                parts = [
                    column_to_numpy(t.column(key), key, spec, path)
                    for t, path in zip(tables, self._data_files, strict=True)
                ]
                stats[key] = array_stats(np.concatenate(parts))
        return stats

    def finalize(self) -> Path:
        """Write the metadata and move the dataset into place at ``root``.

        Returns:
            ``root``.

        Raises:
            DatasetError: no episode was saved, or frames are still buffered.
        """
        self._check_open()
        if self.episode_buffer_size:
            raise DatasetError(
                f"finalize: {self.episode_buffer_size} frames are buffered; call "
                "save_episode() or clear_episode_buffer() first"
            )
        if not self._episodes:
            raise DatasetError("finalize: the dataset has no episodes; save at least one")
        try:
            self._close_files()
            self._finalize_metadata()
            if self.root.exists():
                self.root.rmdir()  # checked empty at create; a race makes this raise
            os.replace(self._staging, self.root)
        except BaseException:
            self.abort()
            raise
        self._state = "finalized"
        return self.root

    def _finalize_metadata(self) -> None:
        staging = self._staging
        tasks = sorted(self._tasks, key=self._tasks.__getitem__)
        (staging / TASKS_PATH).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tasks_table(tasks), str(staging / TASKS_PATH))
        episodes_path = staging / EPISODES_PATH.format(chunk_index=0, file_index=0)
        episodes_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self._episodes), str(episodes_path))
        atomic_write_json(staging / STATS_PATH, stats_to_json(self._dataset_stats()))
        for key in self.info.video_keys:
            first_file = VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
            probe = probe_video(staging / first_file)
            c = self.features[key].image_hwc()[2]
            self.features[key] = self.features[key].model_copy(
                update={
                    "info": {
                        "video.height": probe.height,
                        "video.width": probe.width,
                        "video.codec": probe.codec,
                        "video.pix_fmt": probe.pix_fmt,
                        "video.is_depth_map": False,
                        "video.fps": int(self.info.fps)
                        if float(self.info.fps).is_integer()
                        else self.info.fps,
                        "video.channels": c,
                        "has_audio": False,
                    }
                }
            )
        info = self.info.model_copy(
            update={
                "total_episodes": len(self._episodes),
                "total_frames": self._total_frames,
                "total_tasks": len(tasks),
                "splits": {"train": f"0:{len(self._episodes)}"},
                "features": self.features,
            }
        )
        # info.json last: its presence is what marks the dataset complete.
        atomic_write_json(staging / INFO_PATH, info.to_json())
        self.info = info

    def abort(self) -> None:
        """Discard everything written so far (idempotent); ``root`` is left untouched."""
        if self._state == "aborted":
            return
        self._state = "aborted"
        with contextlib.suppress(Exception):  # the files are being thrown away anyway
            self._close_files()
        shutil.rmtree(self._staging, ignore_errors=True)
