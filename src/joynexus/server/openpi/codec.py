"""openpi's msgpack encoding of numpy values, both ways, with bounds.

openpi's ``msgpack_numpy`` (in ``openpi-client``) packs an ``np.ndarray`` as the map
``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": <dtype.str>, b"shape": [...]}``
and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": <dtype.str>}``;
the keys are msgpack *bin* values (Python ``bytes``), and its unpacker looks for exactly
those bytes keys, so the answers here use them too. Object, void and complex dtypes
are refused (they are refused by openpi as well: an object array would need pickle).

Unlike a plain ``np.ndarray(buffer=...)`` of the client library, decoding here checks
what it is given before building an array: the dtype is one of a short list of plain
numeric kinds, the shape is a list of non-negative ints, and the buffer holds exactly
``prod(shape) * itemsize`` bytes — a request that lies about its size is a 400-style
error, never a crash or an over-read.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from joynexus.errors import InvalidRequestError

__all__ = ["MAX_ARRAY_DIMS", "packb", "unpackb"]

_NDARRAY = b"__ndarray__"
_NPGENERIC = b"__npgeneric__"
#: Kinds a request array may have: bool, signed / unsigned ints, floats.
_ALLOWED_KINDS = frozenset("biuf")
MAX_ARRAY_DIMS = 8


def _dtype(raw: object) -> np.dtype[Any]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if not isinstance(text, str) or len(text) > 8:
        raise InvalidRequestError(f"msgpack array: bad dtype {raw!r}", field="dtype")
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise InvalidRequestError(f"msgpack array: unknown dtype {text!r}", field="dtype") from None
    if dtype.kind not in _ALLOWED_KINDS:
        raise InvalidRequestError(
            f"msgpack array: dtype {text!r} is not a plain number type (bool, int, uint, float)",
            field="dtype",
        )
    return dtype


def _object_hook(obj: dict[Any, Any]) -> Any:
    if _NDARRAY in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape = obj.get(b"shape")
        data = obj.get(b"data")
        if (
            not isinstance(shape, list | tuple)
            or len(shape) > MAX_ARRAY_DIMS
            or not all(isinstance(d, int) and d >= 0 for d in shape)
        ):
            raise InvalidRequestError(
                f"msgpack array: shape must be a list of at most {MAX_ARRAY_DIMS} "
                f"non-negative ints, got {shape!r}",
                field="shape",
            )
        if not isinstance(data, bytes):
            raise InvalidRequestError("msgpack array: 'data' must be bytes", field="data")
        expected = math.prod(shape) * dtype.itemsize
        if len(data) != expected:
            raise InvalidRequestError(
                f"msgpack array: shape {list(shape)} of {dtype.str} needs {expected} bytes, "
                f"got {len(data)}",
                field="data",
            )
        # A copy: the frame's buffer is read-only and must not be kept alive by the array.
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    if _NPGENERIC in obj:
        dtype = _dtype(obj.get(b"dtype"))
        value = obj.get(b"data")
        if not isinstance(value, bool | int | float):
            raise InvalidRequestError("msgpack scalar: 'data' must be a number", field="data")
        return dtype.type(value)
    return obj


def _default(obj: object) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"cannot pack an array of dtype {obj.dtype}")
        arr = np.ascontiguousarray(obj)
        return {
            _NDARRAY: True,
            b"data": arr.tobytes(),
            b"dtype": arr.dtype.str,
            b"shape": list(arr.shape),
        }
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"cannot pack a scalar of dtype {obj.dtype}")
        return {_NPGENERIC: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def packb(value: Any) -> bytes:
    """``value`` as one msgpack frame in openpi's encoding."""
    out = msgpack.packb(value, default=_default, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def unpackb(frame: bytes, *, max_bytes: int) -> Any:
    """One msgpack frame in openpi's encoding, numpy values restored.

    Raises:
        InvalidRequestError: not msgpack, a malformed array, or a frame over ``max_bytes``.
    """
    if len(frame) > max_bytes:
        raise InvalidRequestError(
            f"request frame of {len(frame)} bytes is over the limit of {max_bytes}",
            field="frame",
        )
    try:
        return msgpack.unpackb(
            frame,
            object_hook=_object_hook,
            raw=False,
            strict_map_key=False,
        )
    except InvalidRequestError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        raise InvalidRequestError(
            "request frame is not one msgpack map in openpi's msgpack_numpy encoding",
            field="frame",
        ) from None
