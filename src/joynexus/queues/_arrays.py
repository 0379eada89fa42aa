"""Small helpers that treat torch tensors and numpy arrays alike.

The Training Queue keeps whatever kind of array a producer gave it (a tensor stays a
tensor, an ndarray stays an ndarray), so every operation it needs — byte size,
trailing shape, copy, gather by sample index — exists here once for both kinds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from joynexus.errors import InternalError, InvalidRequestError

Array: TypeAlias = torch.Tensor | np.ndarray
IndexArray: TypeAlias = npt.NDArray[np.int64]
ArrayKind = Literal["torch", "numpy"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """What every sample of one field looks like: array kind, dtype, per-sample shape.

    ``device`` is only meaningful for torch tensors (numpy arrays live on the host).
    """

    kind: ArrayKind
    dtype: str
    sample_shape: tuple[int, ...]
    device: str = "cpu"

    def row_nbytes(self) -> int:
        """Bytes of one sample of this field."""
        if self.kind == "torch":
            itemsize = int(getattr(torch, self.dtype).itemsize)
        else:
            itemsize = np.dtype(self.dtype).itemsize
        return itemsize * math.prod(self.sample_shape)

    def describe(self) -> str:
        where = f" on {self.device}" if self.kind == "torch" else ""
        return f"{self.kind} {self.dtype} [N, {', '.join(map(str, self.sample_shape))}]{where}"


def as_array(name: str, value: object) -> Array:
    """Check that ``value`` is a tensor or ndarray with a leading sample dimension."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise InvalidRequestError(
                f"field {name!r} is a 0-d tensor; expected a leading sample dimension [N, ...]",
                field=name,
            )
        if value.is_sparse:
            raise InvalidRequestError(
                f"field {name!r}: sparse tensors are not supported", field=name
            )
        return value
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise InvalidRequestError(
                f"field {name!r} is a 0-d array; expected a leading sample dimension [N, ...]",
                field=name,
            )
        if value.dtype == np.dtype(object):
            raise InvalidRequestError(
                f"field {name!r} has dtype object, whose memory cannot be accounted for; "
                "store a numeric or fixed-width string array instead",
                field=name,
            )
        return value
    raise InvalidRequestError(
        f"field {name!r} is a {type(value).__name__}; expected a torch.Tensor or numpy.ndarray "
        "with a leading sample dimension",
        field=name,
    )


def spec_of(value: Array) -> FieldSpec:
    if isinstance(value, torch.Tensor):
        return FieldSpec(
            "torch",
            str(value.dtype).removeprefix("torch."),
            tuple(value.shape[1:]),
            str(value.device),
        )
    return FieldSpec("numpy", value.dtype.str, tuple(value.shape[1:]))


def leading_dim(value: Array) -> int:
    return int(value.shape[0])


def nbytes(value: Array) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.element_size() * value.nelement())
    return int(value.nbytes)


def owned_copy(value: Array) -> Array:
    """A contiguous copy that shares no memory with the caller's array.

    Producers often reuse buffers between steps; without the copy a later write by the
    producer would silently change samples already in the queue.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.contiguous_format)
    return np.array(value, copy=True, order="C")


def gather(
    chunks: Sequence[Array | None], segs: IndexArray, rows: IndexArray, spec: FieldSpec
) -> Array:
    """Rows ``rows[i]`` of chunk ``segs[i]`` for every i, as one new array.

    A run of consecutive rows from a single chunk (the common case: a batch read back
    in the order it was written) is one slice copy; anything else is a per-chunk
    fancy-index gather into a preallocated output.
    """
    n = int(rows.shape[0])
    if n == 0:
        return _empty(spec, 0, next(c for c in chunks if c is not None))
    first_seg = int(segs[0])
    if bool((segs == first_seg).all()):
        chunk = _live(chunks, first_seg)
        lo = int(rows[0])
        if int(rows[-1]) - lo == n - 1 and (n == 1 or bool((np.diff(rows) == 1).all())):
            return _copy_slice(chunk, lo, lo + n)
        return _take(chunk, rows)
    out = _empty(spec, n, _live(chunks, first_seg))
    for seg in np.unique(segs):
        mask = segs == seg
        pos = np.flatnonzero(mask)
        part = _take(_live(chunks, int(seg)), rows[mask])
        if isinstance(out, torch.Tensor):
            assert isinstance(part, torch.Tensor)
            out[torch.from_numpy(pos).to(out.device)] = part
        else:
            out[pos] = part
    return out


def _live(chunks: Sequence[Array | None], seg: int) -> Array:
    chunk = chunks[seg]
    if chunk is None:  # a released chunk is never pointed at; reaching here is a bug
        raise InternalError(f"sample points at released chunk {seg}")
    return chunk


def _empty(spec: FieldSpec, n: int, like: Array) -> Array:
    if isinstance(like, torch.Tensor):
        return torch.empty((n, *spec.sample_shape), dtype=like.dtype, device=like.device)
    return np.empty((n, *spec.sample_shape), dtype=like.dtype)


def _copy_slice(chunk: Array, lo: int, hi: int) -> Array:
    if isinstance(chunk, torch.Tensor):
        return chunk[lo:hi].clone()
    return chunk[lo:hi].copy()


def _take(chunk: Array, rows: IndexArray) -> Array:
    # Fancy indexing always returns a new array, so callers never alias storage.
    if isinstance(chunk, torch.Tensor):
        return chunk[torch.from_numpy(rows).to(chunk.device)]
    return chunk[rows]
