"""Read LeRobot datasets (v3.0 and v2.0/v2.1) frame by frame.

:class:`LeRobotDataset` loads the metadata and the parquet data of a local dataset
once, validates them against ``meta/info.json`` (missing files, missing columns,
per-frame shapes, video sizes), and then serves frames by global index. Video frames
are decoded with PyAV by timestamp; image features are decoded from the PNG bytes in
the parquet data.

``delta_timestamps`` turns a feature into a window around the current frame, e.g.
``{"action": [0, 0.1, 0.2, 0.3]}`` for a 4-step action chunk at 10 fps. Frames that
fall outside the current episode are filled with the nearest frame of the episode
(first or last) and flagged in ``<key>_is_pad``, so a training loss can mask them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from joynexus.data.arrow_io import column_to_numpy, decode_image
from joynexus.data.frame_cache import DEFAULT_FRAME_CACHE_MB, FrameCache
from joynexus.data.lerobot_format import FeatureSpec
from joynexus.data.metadata import DatasetMeta, check_inside, load_meta
from joynexus.data.video import decode_frames, decode_span, pick_frames, probe_video
from joynexus.errors import DatasetError

__all__ = ["DEFAULT_TOLERANCE_S", "LeRobotDataset"]

DEFAULT_TOLERANCE_S = 1e-4


class LeRobotDataset:
    """A local LeRobot dataset, indexable by global frame index.

    Args:
        root: Dataset directory (holding ``meta/info.json``).
        delta_timestamps: Feature key → time offsets in seconds (multiples of
            ``1/fps``) to return as a window around each frame.
        tolerance_s: How far a decoded video frame's time (and a delta timestamp
            from a multiple of ``1/fps``) may be from the requested time.
        frame_cache_mb: Budget of decoded video frames kept per episode
            (:class:`~joynexus.data.frame_cache.FrameCache`); 0 decodes every sample's
            frames from the file.

    ``dataset[i]`` returns a dict: each non-video feature as a numpy value (images
    uint8 ``[H, W, C]``), each video feature as uint8 ``[H, W, 3]``, windowed features
    as ``[T, ...]`` plus a bool ``[T]`` ``<key>_is_pad``, and ``"task"`` (the string).

    Raises:
        DatasetError: the dataset is malformed (the message names the file/feature).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        frame_cache_mb: float = DEFAULT_FRAME_CACHE_MB,
    ) -> None:
        self.root = Path(root)
        self.tolerance_s = tolerance_s
        self.frame_cache = FrameCache(int(frame_cache_mb * 2**20)) if frame_cache_mb > 0 else None
        self.meta: DatasetMeta = load_meta(self.root)
        self._arrays: dict[str, np.ndarray] = {}
        self._images: dict[str, pa.Array] = {}
        self._strings: dict[str, list[str]] = {}
        self._load_data()
        self._index_episodes()
        self._check_videos()
        self.delta_indices = self._delta_indices(delta_timestamps or {})

    # ------------------------------------------------------------------ loading
    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def features(self) -> dict[str, FeatureSpec]:
        return self.meta.features

    @property
    def num_episodes(self) -> int:
        return len(self.meta.episodes)

    def __len__(self) -> int:
        return self._num_rows

    def _load_data(self) -> None:
        files: list[Path] = []
        for ep in self.meta.episodes:
            if ep.data_file not in files:
                files.append(ep.data_file)
        columns = [k for k, f in self.features.items() if f.dtype != "video"]
        arrays: dict[str, list[np.ndarray]] = {
            k: [] for k in columns if self.features[k].dtype not in ("image", "string")
        }
        images: dict[str, list[pa.Array]] = {k: [] for k in self.meta.image_keys}
        for rel in files:
            path = self.root / rel
            if not path.is_file():
                raise DatasetError(
                    f"{path}: data file missing (referenced by the episode metadata)",
                    file=str(path),
                )
            try:
                table = pq.read_table(str(path))
            except (OSError, pa.ArrowException) as exc:
                raise DatasetError(f"{path}: unreadable parquet ({exc})", file=str(path)) from exc
            absent = [k for k in columns if k not in table.column_names]
            if absent:
                raise DatasetError(
                    f"{path}: no column for features {absent} declared in meta/info.json",
                    file=str(path),
                    missing=absent,
                )
            for key in columns:
                spec = self.features[key]
                col = table.column(key)
                if spec.dtype == "image":
                    images[key].append(col.combine_chunks())
                elif spec.dtype == "string":
                    self._strings.setdefault(key, []).extend(str(v) for v in col.to_pylist())
                else:
                    arrays[key].append(column_to_numpy(col, key, spec, path))
        for key, parts in arrays.items():
            self._arrays[key] = np.concatenate(parts)
        for key, image_parts in images.items():
            self._images[key] = pa.concat_arrays(image_parts)
            self._check_image_shape(key, files[0])
        for required in ("episode_index", "timestamp", "frame_index"):
            if required not in self._arrays:
                raise DatasetError(
                    f"{self.root}: meta/info.json declares no {required!r} feature",
                    feature=required,
                )
        self._num_rows = len(self._arrays["episode_index"])

    def _check_image_shape(self, key: str, file: Path) -> None:
        if len(self._images[key]) == 0:
            return
        expected = self.features[key].image_hwc()
        got = self._decode_image(key, 0).shape
        if got != expected:
            raise DatasetError(
                f"{self.root / file}: image feature {key!r} decodes to [H, W, C] = "
                f"{list(got)}, meta/info.json declares {list(expected)}",
                file=str(self.root / file),
                feature=key,
                expected_shape=list(expected),
                shape=list(got),
            )

    def _index_episodes(self) -> None:
        ep_col = self._arrays["episode_index"].astype(np.int64)
        n_eps = len(self.meta.episodes)
        self._ep_start = np.zeros(n_eps, dtype=np.int64)
        self._ep_end = np.zeros(n_eps, dtype=np.int64)
        self._row_episode = np.full(self._num_rows, -1, dtype=np.int64)
        for pos, ep in enumerate(self.meta.episodes):
            rows = np.flatnonzero(ep_col == ep.episode_index)
            contiguous = len(rows) == 0 or rows[-1] - rows[0] + 1 == len(rows)
            if len(rows) != ep.length or not contiguous:
                raise DatasetError(
                    f"{self.root / ep.data_file}: episode {ep.episode_index} has "
                    f"{len(rows)} {'' if contiguous else 'non-contiguous '}rows, the episode "
                    f"metadata says {ep.length} contiguous rows",
                    file=str(self.root / ep.data_file),
                    episode_index=ep.episode_index,
                )
            if len(rows):
                self._ep_start[pos], self._ep_end[pos] = rows[0], rows[-1] + 1
                self._row_episode[rows] = pos
        stray = int((self._row_episode < 0).sum())
        if stray:
            raise DatasetError(
                f"{self.root}: {stray} data rows belong to no episode in the metadata",
                stray_rows=stray,
            )

    def _check_videos(self) -> None:
        for key in self.meta.video_keys:
            files = {ep.video_files[key] for ep in self.meta.episodes}
            for rel in sorted(files):
                if not (self.root / rel).is_file():
                    raise DatasetError(
                        f"{self.root / rel}: video file for feature {key!r} missing",
                        file=str(self.root / rel),
                        feature=key,
                    )
            first = self.root / self.meta.episodes[0].video_files[key]
            probe = probe_video(first)
            h, w, _ = self.features[key].image_hwc()
            if (probe.height, probe.width) != (h, w):
                raise DatasetError(
                    f"{first}: video feature {key!r} is {probe.height}x{probe.width} (HxW), "
                    f"meta/info.json declares {h}x{w}",
                    file=str(first),
                    feature=key,
                    expected_shape=[h, w],
                    shape=[probe.height, probe.width],
                )

    def _delta_indices(self, delta: Mapping[str, Sequence[float]]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for key, offsets in delta.items():
            if key not in self.features:
                raise DatasetError(
                    f"delta_timestamps: unknown feature {key!r}; dataset features are "
                    f"{list(self.features)}",
                    feature=key,
                )
            if len(offsets) == 0:
                raise DatasetError(f"delta_timestamps[{key!r}] is empty", feature=key)
            idx = []
            for d in offsets:
                steps = round(float(d) * self.fps)
                if abs(float(d) - steps / self.fps) > self.tolerance_s:
                    raise DatasetError(
                        f"delta_timestamps[{key!r}]: {d} s is not a multiple of 1/fps = "
                        f"{1 / self.fps:.6g} s (tolerance {self.tolerance_s} s)",
                        feature=key,
                    )
                idx.append(steps)
            out[key] = np.asarray(idx, dtype=np.int64)
        return out

    # ------------------------------------------------------------------ access
    def column(self, key: str) -> np.ndarray:
        """All frames of a numeric feature, ``[N, *shape]`` (``[N]`` for scalars)."""
        if key not in self._arrays:
            raise DatasetError(
                f"{key!r} is not a numeric feature of this dataset; numeric features are "
                f"{list(self._arrays)}",
                feature=key,
            )
        return self._arrays[key]

    def episode_bounds(self, index: int) -> tuple[int, int]:
        """``[start, end)`` global rows of the episode that frame ``index`` belongs to."""
        pos = int(self._row_episode[index])
        return int(self._ep_start[pos]), int(self._ep_end[pos])

    def _decode_image(self, key: str, row: int) -> np.ndarray:
        cell = self._images[key][row].as_py()
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if data is None:
            rel = cell.get("path") if isinstance(cell, dict) else None
            if not rel or not check_inside(self.root, rel).is_file():
                raise DatasetError(
                    f"{self.root}: image feature {key!r} row {row} has neither bytes nor a "
                    "readable path",
                    feature=key,
                )
            data = (self.root / rel).read_bytes()
        return decode_image(data, self.features[key].image_hwc()[2])

    def _decode_video(self, key: str, rows: np.ndarray) -> np.ndarray:
        pos = int(self._row_episode[rows[0]])
        ep = self.meta.episodes[pos]
        offset = ep.video_from_timestamp[key]
        stamps = self._arrays["timestamp"]
        ts = [float(stamps[r]) + offset for r in rows]
        path = self.root / ep.video_files[key]
        h, w, _ = self.features[key].image_hwc()
        span_bytes = int(self._ep_end[pos] - self._ep_start[pos]) * h * w * 3
        if self.frame_cache is None or span_bytes > self.frame_cache.budget_bytes:
            # An episode too large to keep: decode only the frames asked, every time.
            return decode_frames(path, ts, tolerance_s=self.tolerance_s)
        # The whole episode's span, decoded once (the rows asked always lie inside it).
        first = float(stamps[self._ep_start[pos]]) + offset
        last = float(stamps[self._ep_end[pos] - 1]) + offset
        times, frames = self.frame_cache.get(
            (key, pos),
            lambda: decode_span(path, first, last, tolerance_s=self.tolerance_s),
        )
        return pick_frames(path, times, frames, ts, tolerance_s=self.tolerance_s)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = self._num_rows
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"frame index {index} out of range for {n} frames")
        start, end = self.episode_bounds(index)
        item: dict[str, Any] = {}
        for key, spec in self.features.items():
            if key in self.delta_indices:
                want = index + self.delta_indices[key]
                rows = np.clip(want, start, end - 1)
                item[f"{key}_is_pad"] = (want < start) | (want >= end)
            else:
                rows = np.array([index])
            if spec.dtype == "video":
                value: Any = self._decode_video(key, rows)
            elif spec.dtype == "image":
                value = np.stack([self._decode_image(key, int(r)) for r in rows])
            elif spec.dtype == "string":
                value = [self._strings[key][int(r)] for r in rows]
            else:
                value = self._arrays[key][rows]
            item[key] = value if key in self.delta_indices else value[0]
        task_index = int(self._arrays["task_index"][index]) if "task_index" in self._arrays else 0
        item["task"] = self.meta.tasks.get(task_index, "")
        return item

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset(root={str(self.root)!r}, version={self.meta.version}, "
            f"episodes={self.num_episodes}, frames={len(self)}, fps={self.fps})"
        )
