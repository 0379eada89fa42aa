"""Parquet column types and conversions for LeRobot features (pyarrow ↔ numpy).

LeRobot stores a feature of shape ``(1,)`` as a scalar column, a vector ``(n,)`` as a
fixed-size list of ``n`` values (``datasets.Sequence(length=n)``), higher ranks as
nested lists, and images as ``struct<bytes: binary, path: string>`` holding PNG bytes
(``datasets.Image``). Readers must also accept variable-size lists, which older
writers produced.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

from joynexus.data.lerobot_format import FeatureSpec
from joynexus.errors import DatasetError

__all__ = [
    "IMAGE_STRUCT",
    "arrow_type",
    "column_to_numpy",
    "decode_image",
    "encode_png",
    "hf_features_metadata",
    "tasks_table",
]

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def arrow_type(spec: FeatureSpec) -> pa.DataType:
    """The parquet column type LeRobot uses for a (non-video) feature."""
    if spec.dtype == "image":
        return IMAGE_STRUCT
    if spec.dtype == "string":
        return pa.string()
    base = pa.from_numpy_dtype(np.dtype(spec.dtype))
    if spec.shape == (1,):
        return base
    t = base
    for dim in reversed(spec.shape):
        t = pa.list_(t, dim)
    return t


def _hf_feature(spec: FeatureSpec) -> dict[str, Any]:
    if spec.dtype == "image":
        return {"_type": "Image"}
    out: dict[str, Any] = {"dtype": spec.dtype, "_type": "Value"}
    if spec.shape == (1,):
        return out
    for dim in reversed(spec.shape):
        out = {"feature": out, "length": dim, "_type": "Sequence"}
    return out


def hf_features_metadata(features: Mapping[str, FeatureSpec]) -> bytes:
    """The ``huggingface`` schema metadata that lets the ``datasets`` library (and the
    Hub viewer) decode the columns, images included, without reading ``info.json``."""
    feats = {k: _hf_feature(f) for k, f in features.items() if f.dtype != "video"}
    return json.dumps({"info": {"features": feats}}).encode()


def column_to_numpy(
    column: pa.ChunkedArray | pa.Array, key: str, spec: FeatureSpec, file: Path
) -> np.ndarray:
    """A numeric column as ``[N, *shape]`` (``[N]`` for shape ``(1,)``).

    Raises:
        DatasetError: a row holds a different number of values than ``shape`` says.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    expected = math.prod(spec.shape)
    per_row = 1
    while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if pa.types.is_list(arr.type):
            lengths = np.diff(arr.offsets.to_numpy(zero_copy_only=False))
            if lengths.size and (lengths != lengths[0]).any():
                raise DatasetError(
                    f"{file}: feature {key!r} has rows of different lengths; info.json "
                    f"says shape {list(spec.shape)}",
                    file=str(file),
                    feature=key,
                )
        arr = arr.flatten()
        per_row = len(arr) // n if n else expected
    values = np.asarray(arr.to_numpy(zero_copy_only=False))
    if n and values.size != n * expected:
        raise DatasetError(
            f"{file}: feature {key!r} holds {values.size // n} values per frame but "
            f"meta/info.json declares shape {list(spec.shape)} ({expected} values)",
            file=str(file),
            feature=key,
            expected_shape=list(spec.shape),
            values_per_frame=per_row,
        )
    if spec.shape == (1,):
        return values.reshape(n)
    return values.reshape(n, *spec.shape)


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of a uint8 ``[H, W, C]`` image."""
    arr = image[..., 0] if image.shape[-1] == 1 else image
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def decode_image(data: bytes, channels: int) -> np.ndarray:
    """uint8 ``[H, W, channels]`` from encoded image bytes (PNG/JPEG/...)."""
    with Image.open(io.BytesIO(data)) as img:
        mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(channels, "RGB")
        arr = np.asarray(img.convert(mode))
    return arr[..., None] if arr.ndim == 2 else arr


def tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet``: ``task_index`` column, ``task`` as the pandas index."""
    # pandas metadata makes ``pd.read_parquet`` restore LeRobot's frame (index "task",
    # column "task_index") even though we write it without pandas.
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema(
        [("task_index", pa.int64()), ("task", pa.string())],
        metadata={b"pandas": json.dumps(pandas_meta).encode()},
    )
    return pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks)},
        schema=schema,
    )
