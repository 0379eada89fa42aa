"""The one msgpack codec for numpy arrays on every JoyNexus wire (HTTP API, remote envs).

An array travels as a msgpack extension (code 42) whose payload is a small msgpack
header ``[dtype.str, shape]`` followed by the raw C-order bytes: no base64, no
per-element boxing, so an image costs about one memory copy each way. JSON bodies
carry the same three things as ``{"dtype", "shape", "data"}`` with base64 data
(:func:`tensor_to_json` / :func:`tensor_from_json`), for clients without msgpack.

Decoding is defensive because bodies come from untrusted callers: only plain numeric,
boolean and fixed-width unicode dtypes in little-endian (or byte-order-free) layout
are accepted, the header must name a shape whose element count matches the bytes,
and every failure is an :class:`~joynexus.errors.InvalidRequestError` that says what
was wrong, never an arbitrary exception.

torch tensors are encoded through ``.numpy()`` by duck typing, so this module (and
the server that uses it) never imports torch.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from joynexus.errors import InvalidRequestError, SchemaMismatchError

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_DIM",
    "MSGPACK_MEDIA_TYPE",
    "ND_EXT",
    "check_tensor",
    "packb",
    "tensor_from_json",
    "tensor_to_json",
    "unpackb",
]

ND_EXT = 42
MSGPACK_MEDIA_TYPE = "application/msgpack"

#: dtype names a decoder accepts (plus fixed-width unicode ``<U<n>`` for strings such as
#: instructions). Object, void/structured, datetime and complex dtypes are refused:
#: they either cannot be rebuilt from raw bytes safely or no model consumes them.
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    }
)
_MAX_NDIM = 8
#: Largest size of one dimension of an array on the wire.
MAX_DIM = 2**31 - 1
_MAX_UNICODE_CHARS = 4096


def _contiguous(arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _as_numpy(obj: Any) -> npt.NDArray[Any] | None:
    if isinstance(obj, np.ndarray):
        return obj
    # torch.Tensor without importing torch: the server must stay torch-free.
    if type(obj).__module__.startswith("torch") and hasattr(obj, "detach"):
        return np.asarray(obj.detach().cpu().numpy())
    return None


def _default(obj: Any) -> Any:
    arr = _as_numpy(obj)
    if arr is not None:
        arr = _contiguous(arr)
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(ND_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


#: Dtype strings already accepted by :func:`parse_dtype` (a handful in practice: every
#: array of every request names one, and parsing it costs more than the rest of its
#: header's checks).
_PARSED_DTYPES: dict[str, np.dtype[Any]] = {}
_MAX_PARSED_DTYPES = 256


def parse_dtype(dtype: Any, *, name: str = "tensor") -> np.dtype[Any]:
    """The numpy dtype named by ``dtype`` if it is allowed on the wire.

    Raises:
        InvalidRequestError: unknown, non-native byte order, or not in the allow-list.
    """
    if isinstance(dtype, str):
        known = _PARSED_DTYPES.get(dtype)
        if known is not None:
            return known
    if not isinstance(dtype, str) or not dtype or len(dtype) > 32:
        raise InvalidRequestError(
            f"{name}: dtype must be a short string such as 'float32', got {dtype!r}", field=name
        )
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or (
        dt.name not in ALLOWED_DTYPES
        and not (dt.kind == "U" and 0 < dt.itemsize // 4 <= _MAX_UNICODE_CHARS)
    ):
        allowed = sorted(ALLOWED_DTYPES)
        raise InvalidRequestError(
            f"{name}: dtype {dtype!r} is not allowed; expected one of {allowed} or '<U<n>'",
            field=name,
            allowed=allowed,
        )
    if dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False):
        raise InvalidRequestError(
            f"{name}: dtype {dtype!r} is big-endian; send little-endian data ('<' prefix)",
            field=name,
        )
    if len(_PARSED_DTYPES) >= _MAX_PARSED_DTYPES:
        _PARSED_DTYPES.clear()
    _PARSED_DTYPES[dtype] = dt
    return dt


def _parse_shape(shape: Any, *, name: str) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or len(shape) > _MAX_NDIM:
        raise InvalidRequestError(
            f"{name}: shape must be a list of at most {_MAX_NDIM} non-negative ints, got {shape!r}",
            field=name,
        )
    dims: list[int] = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise InvalidRequestError(
                f"{name}: shape must hold non-negative ints, got {list(shape)!r}", field=name
            )
        if d > MAX_DIM:  # numpy refuses such shapes (even with a 0 elsewhere)
            raise InvalidRequestError(
                f"{name}: shape {list(shape)!r} has a dimension above {MAX_DIM}", field=name
            )
        dims.append(d)
    return tuple(dims)


def array_from_bytes(
    dtype: Any, shape: Any, data: bytes | memoryview, *, name: str = "tensor"
) -> npt.NDArray[Any]:
    """Rebuild an array from its wire parts, checking that shape and byte count agree.

    Raises:
        InvalidRequestError: a refused dtype, a malformed shape, or ``len(data)`` other
            than ``prod(shape) * itemsize``.
    """
    dt = parse_dtype(dtype, name=name)
    dims = _parse_shape(shape, name=name)
    expected = math.prod(dims) * dt.itemsize
    if len(data) != expected:
        raise InvalidRequestError(
            f"{name}: {dt.name}{list(dims)} needs {expected} bytes, got {len(data)} "
            "(truncated or inconsistent tensor)",
            field=name,
            expected_bytes=expected,
            got_bytes=len(data),
        )
    return np.frombuffer(data, dtype=dt).reshape(dims).copy()


def _ext_hook(code: int, data: bytes) -> Any:
    if code != ND_EXT:
        raise InvalidRequestError(f"unknown msgpack extension type {code}; only {ND_EXT} (array)")
    unpacker = msgpack.Unpacker(max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    try:
        header = unpacker.unpack()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData) as exc:
        raise InvalidRequestError(f"array header is not valid msgpack: {exc}") from None
    if not isinstance(header, list | tuple) or len(header) != 2:
        raise InvalidRequestError("array header must be [dtype, shape]")
    dtype, shape = header
    # A view of the payload: array_from_bytes copies it once, into the array.
    return array_from_bytes(dtype, shape, memoryview(data)[unpacker.tell() :], name="array")


def packb(obj: Any) -> bytes:
    """Encode a msgpack body; numpy arrays (and torch tensors) and scalars included."""
    out: bytes = msgpack.packb(obj, default=_default, use_bin_type=True)
    return out


def unpackb(data: bytes) -> Any:
    """Decode a msgpack body produced by :func:`packb`.

    Raises:
        InvalidRequestError: The body is not valid msgpack, or carries a malformed or
            refused array.
    """
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except InvalidRequestError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise InvalidRequestError(f"body is not valid msgpack: {exc}") from None


def tensor_to_json(value: Any) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}`` with base64 ``data``: an array in a JSON body."""
    arr = _as_numpy(value)
    if arr is None:
        raise TypeError(f"expected an array, got {type(value).__name__}")
    arr = _contiguous(arr)
    return {
        "dtype": arr.dtype.str if arr.dtype.kind == "U" else arr.dtype.name,
        "shape": list(arr.shape),
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


def tensor_from_json(value: Any, *, name: str = "tensor") -> npt.NDArray[Any]:
    """Decode the JSON form of :func:`tensor_to_json` (or pass an ndarray through).

    Raises:
        InvalidRequestError: missing keys, bad base64, or inconsistent shape/bytes.
    """
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data"}:
        raise InvalidRequestError(
            f"{name}: expected a tensor: an array (msgpack) or an object with exactly "
            "'dtype', 'shape' and base64 'data' (JSON)",
            field=name,
        )
    data = value["data"]
    if not isinstance(data, str):
        raise InvalidRequestError(f"{name}: 'data' must be a base64 string", field=name)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{name}: 'data' is not valid base64", field=name) from None
    return array_from_bytes(value["dtype"], value["shape"], raw, name=name)


def check_tensor(
    arr: npt.NDArray[Any],
    *,
    name: str,
    dtypes: Sequence[str] | None = None,
    shape: Sequence[int | None] | None = None,
    finite: bool = False,
    max_bytes: int | None = None,
) -> npt.NDArray[Any]:
    """Check one decoded array against what a field requires.

    Args:
        name: The field name used in messages.
        dtypes: Allowed dtype names (``None``: any wire-allowed dtype).
        shape: Expected shape; ``None`` entries match any size.
        finite: Refuse NaN and ±inf (floating dtypes only).
        max_bytes: Upper bound on ``arr.nbytes``.

    Raises:
        SchemaMismatchError: a dtype or shape other than the expected one.
        InvalidRequestError: non-finite values or too many bytes.
    """
    if dtypes is not None and arr.dtype.name not in dtypes:
        raise SchemaMismatchError(
            f"{name}: dtype {arr.dtype.name} is not accepted; expected one of {list(dtypes)}",
            field=name,
            expected_dtypes=list(dtypes),
            got_dtype=arr.dtype.name,
        )
    if shape is not None and (
        arr.ndim != len(shape)
        or any(want is not None and got != want for got, want in zip(arr.shape, shape, strict=True))
    ):
        pretty = ["*" if d is None else d for d in shape]
        raise SchemaMismatchError(
            f"{name}: shape {list(arr.shape)} does not match the expected {pretty}",
            field=name,
            expected_shape=pretty,
            got_shape=list(arr.shape),
        )
    if max_bytes is not None and arr.nbytes > max_bytes:
        raise InvalidRequestError(
            f"{name}: {arr.nbytes} bytes exceeds the limit of {max_bytes} bytes",
            field=name,
            limit_bytes=max_bytes,
            got_bytes=int(arr.nbytes),
        )
    if finite and arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
        raise InvalidRequestError(
            f"{name}: contains NaN or infinite values; expected finite numbers", field=name
        )
    return arr
