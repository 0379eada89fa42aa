"""The LeRobot dataset format: version constants, file layout, ``meta/info.json`` model.

JoyNexus reads and writes this format itself (the ``lerobot`` package pins
dependencies this project cannot share), so this module is the single place that
knows the on-disk names. Two layouts exist:

* **v3.0** (written and read): many episodes per file.
  ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``,
  ``meta/episodes/chunk-XXX/file-XXX.parquet`` (one row per episode: lengths, file
  indices, video time ranges and per-episode stats), ``data/chunk-XXX/file-XXX.parquet``
  and ``videos/<video_key>/chunk-XXX/file-XXX.mp4``.
* **v2.0 / v2.1** (read only): one file per episode.
  ``meta/info.json``, ``meta/tasks.jsonl``, ``meta/episodes.jsonl``,
  ``meta/episodes_stats.jsonl`` (v2.1) or ``meta/stats.json`` (v2.0),
  ``data/chunk-XXX/episode_XXXXXX.parquet`` and
  ``videos/chunk-XXX/<video_key>/episode_XXXXXX.mp4``.

Image and video features are described in ``info.json`` with a 3-d ``shape`` whose
axis order is given by ``names`` (LeRobot writes ``["height", "width", "channels"]``;
older datasets use channels-first). :meth:`FeatureSpec.image_hwc` resolves either.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from joynexus.errors import DatasetError
from joynexus.utils.files import atomic_write_bytes

__all__ = [
    "CODEBASE_VERSION",
    "DATA_PATH",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_DATA_FILE_SIZE_IN_MB",
    "DEFAULT_FEATURES",
    "DEFAULT_VIDEO_FILE_SIZE_IN_MB",
    "EPISODES_DIR",
    "EPISODES_PATH",
    "INFO_PATH",
    "KNOWN_DTYPES",
    "LEGACY_DATA_PATH",
    "LEGACY_EPISODES_PATH",
    "LEGACY_EPISODES_STATS_PATH",
    "LEGACY_TASKS_PATH",
    "LEGACY_VERSIONS",
    "LEGACY_VIDEO_PATH",
    "QUANTILES",
    "STATS_PATH",
    "TASKS_PATH",
    "VIDEO_PATH",
    "DatasetInfo",
    "FeatureSpec",
    "advance_chunk_file",
    "atomic_write_json",
    "load_info",
]

CODEBASE_VERSION = "v3.0"
LEGACY_VERSIONS = ("v2.0", "v2.1")

DEFAULT_CHUNK_SIZE = 1000  # files per chunk-XXX directory
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 200

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
EPISODES_PATH = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

LEGACY_TASKS_PATH = "meta/tasks.jsonl"
LEGACY_EPISODES_PATH = "meta/episodes.jsonl"
LEGACY_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"
LEGACY_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
LEGACY_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

# Quantiles stored next to min/max/mean/std (name -> fraction). Tenants that normalize
# by quantiles use q01/q99; the others are kept for inspection and robust scaling.
QUANTILES: dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}

VISUAL_DTYPES = ("image", "video")
_NUMERIC_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
KNOWN_DTYPES = (*_NUMERIC_DTYPES, *VISUAL_DTYPES, "string")


class FeatureSpec(BaseModel):
    """One entry of ``info.json["features"]``.

    Args:
        dtype: ``float32``/``int64``/... for arrays, ``image`` (PNG bytes inside the
            parquet data), ``video`` (mp4 files) or ``string``.
        shape: Per-frame shape. Scalars are ``(1,)``; images ``(H, W, C)`` unless
            ``names`` says otherwise.
        names: Axis or element names (free-form, kept as written).
        info: Extra metadata; for videos the ``video.*`` codec fields.
    """

    # Other tools add their own keys to feature entries; keep them rather than fail.
    model_config = ConfigDict(extra="allow")

    dtype: str = Field(min_length=1)
    shape: tuple[int, ...] = Field(min_length=1)
    names: list[str] | dict[str, Any] | None = None
    info: dict[str, Any] | None = None

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in shape):
            raise ValueError(f"every dimension of shape must be positive, got {list(shape)}")
        return shape

    @property
    def is_visual(self) -> bool:
        return self.dtype in VISUAL_DTYPES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def image_hwc(self) -> tuple[int, int, int]:
        """The ``(height, width, channels)`` of an image/video feature.

        Uses ``names`` when it spells the axes; otherwise a leading axis of size 1, 3
        or 4 followed by larger axes is taken as channels-first.
        """
        if len(self.shape) != 3:
            raise DatasetError(
                f"image/video feature must have a 3-d shape, got {list(self.shape)}",
                shape=list(self.shape),
            )
        names = [str(n).lower() for n in self.names] if isinstance(self.names, list) else []
        a, b, c = self.shape
        # Some published datasets list names that contradict the shape (e.g. names
        # "height, width, channel" with shape [3, 256, 256]); a channel count outside
        # 1/3/4 means the names are wrong and the shape heuristic below decides.
        if len(names) == 3 and names[0].startswith("c") and a in (1, 3, 4):
            return (b, c, a)
        if len(names) == 3 and names[2].startswith("c") and c in (1, 3, 4):
            return (a, b, c)
        if a in (1, 3, 4) and c not in (1, 3, 4):
            return (b, c, a)
        return (a, b, c)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info is not None:
            out["info"] = self.info
        if self.model_extra:
            out.update(self.model_extra)
        return out


DEFAULT_FEATURES: dict[str, FeatureSpec] = {
    "timestamp": FeatureSpec(dtype="float32", shape=(1,), names=None),
    "frame_index": FeatureSpec(dtype="int64", shape=(1,), names=None),
    "episode_index": FeatureSpec(dtype="int64", shape=(1,), names=None),
    "index": FeatureSpec(dtype="int64", shape=(1,), names=None),
    "task_index": FeatureSpec(dtype="int64", shape=(1,), names=None),
}


class DatasetInfo(BaseModel):
    """``meta/info.json``. Fields not used here are kept (``extra="allow"``) because
    other LeRobot tools write their own keys and a round trip must not drop them."""

    model_config = ConfigDict(extra="allow")

    codebase_version: str
    robot_type: str | None = None
    total_episodes: int = Field(ge=0)
    total_frames: int = Field(ge=0)
    total_tasks: int = Field(ge=0)
    chunks_size: int = Field(default=DEFAULT_CHUNK_SIZE, gt=0)
    data_files_size_in_mb: float | None = None
    video_files_size_in_mb: float | None = None
    fps: float = Field(gt=0)
    splits: dict[str, str] = Field(default_factory=dict)
    data_path: str
    video_path: str | None = None
    features: dict[str, FeatureSpec]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_visual]

    def to_json(self) -> dict[str, Any]:
        """The JSON object in LeRobot's key order."""
        out: dict[str, Any] = {
            "codebase_version": self.codebase_version,
            "robot_type": self.robot_type,
            "total_episodes": self.total_episodes,
            "total_frames": self.total_frames,
            "total_tasks": self.total_tasks,
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": _int_if_whole(self.data_files_size_in_mb),
            "video_files_size_in_mb": _int_if_whole(self.video_files_size_in_mb),
            "fps": _int_if_whole(self.fps),
            "splits": self.splits,
            "data_path": self.data_path,
            "video_path": self.video_path,
            "features": {k: f.to_json() for k, f in self.features.items()},
        }
        if self.model_extra:
            out.update(self.model_extra)
        return out


def _int_if_whole(x: float | None) -> float | int | None:
    if x is not None and float(x).is_integer():
        return int(x)
    return x


_REQUIRED_INFO_KEYS = ("codebase_version", "fps", "features", "data_path", "total_episodes")


def load_info(root: Path) -> DatasetInfo:
    """Read and validate ``<root>/meta/info.json``.

    Raises:
        DatasetError: the file is missing or not JSON, a required key is missing, a
            feature entry is malformed, or the codebase version is not one this reader
            understands (v3.0, v2.1, v2.0).
    """
    path = root / INFO_PATH
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing; a LeRobot dataset needs meta/info.json "
            "(is this the dataset root, and did its writer finish?)",
            file=str(path),
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a JSON object", file=str(path))
    missing = [k for k in _REQUIRED_INFO_KEYS if k not in raw]
    if missing:
        raise DatasetError(
            f"{path}: missing required keys {missing} (expected at least "
            f"{list(_REQUIRED_INFO_KEYS)})",
            file=str(path),
            missing=missing,
        )
    version = raw["codebase_version"]
    if version != CODEBASE_VERSION and version not in LEGACY_VERSIONS:
        raise DatasetError(
            f"{path}: unknown codebase_version {version!r}; this reader understands "
            f"{[CODEBASE_VERSION, *LEGACY_VERSIONS]}",
            file=str(path),
            codebase_version=version,
        )
    # v2.x files carry no total_tasks/total_frames in a few hand-made copies; let the
    # loader recount them instead of rejecting the dataset.
    raw.setdefault("total_tasks", 0)
    raw.setdefault("total_frames", 0)
    try:
        info = DatasetInfo.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise DatasetError(
            f"{path}: invalid value at {loc!r}: {first['msg']}", file=str(path), field=loc
        ) from exc
    for key, feat in info.features.items():
        if feat.dtype not in KNOWN_DTYPES:
            raise DatasetError(
                f"{path}: feature {key!r} has unknown dtype {feat.dtype!r}; expected one of "
                f"{list(KNOWN_DTYPES)}",
                file=str(path),
                feature=key,
            )
        if feat.is_visual and len(feat.shape) != 3:
            raise DatasetError(
                f"{path}: {feat.dtype} feature {key!r} must have a 3-d shape, got "
                f"{list(feat.shape)}",
                file=str(path),
                feature=key,
            )
    if info.video_keys and not info.video_path:
        raise DatasetError(
            f"{path}: features {info.video_keys} are videos but 'video_path' is empty",
            file=str(path),
        )
    return info


def advance_chunk_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """The next ``(chunk, file)`` slot: a chunk directory holds ``chunks_size`` files."""
    if file_index + 1 >= chunks_size:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


def atomic_write_json(path: Path, obj: Any) -> None:
    """JSON with 4-space indent (LeRobot's style), written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=4, ensure_ascii=False) + "\n").encode())
