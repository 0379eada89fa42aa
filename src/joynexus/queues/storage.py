"""Where Training Queue partitions keep their samples.

:class:`PartitionStorage` is the small interface the :class:`~joynexus.queues.training.
TrainingQueue` talks to; it knows nothing about tasks, consumption, memory caps or
validation (the queue does all of that under its own lock). A Ray object-store backend
only has to implement these methods. :class:`InMemoryPartitionStorage` is the default.

Layout of the in-memory backend: every write (an append by ``queue_put`` or a derived
field written by ``put``) becomes one *chunk* per field, kept exactly as given. Per
field, two index arrays map sample index → (chunk, row); ``-1`` marks a sample that does
not have the field yet. A chunk is released as soon as no sample points at it any more
(for instance when ``put`` rewrites every sample of an earlier derived field).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from joynexus.errors import InternalError, InvalidRequestError, unknown_id
from joynexus.queues._arrays import Array, FieldSpec, IndexArray, gather, nbytes, spec_of
from joynexus.queues.meta import SampleMeta

BoolArray = npt.NDArray[np.bool_]


@runtime_checkable
class PartitionStorage(Protocol):
    """Storage backend of the Training Queue.

    Callers (the queue) guarantee: partition ids exist when they say so, arrays were
    validated against :meth:`field_specs`, index arrays are in range and unique, and
    calls are serialized (one at a time). Every method that names a partition raises
    :class:`~joynexus.errors.PartitionNotFoundError` if it does not exist.
    """

    def create(self, partition_id: str) -> None:
        """Create an empty partition (the queue checks it does not exist yet)."""
        ...

    def exists(self, partition_id: str) -> bool: ...

    def partition_ids(self) -> list[str]:
        """All partitions, in creation order."""
        ...

    def num_samples(self, partition_id: str) -> int: ...

    def field_specs(self, partition_id: str) -> dict[str, FieldSpec]:
        """Field name → spec of every field any sample of the partition has."""
        ...

    def nbytes(self, partition_id: str) -> int:
        """Bytes of sample data held for this partition."""
        ...

    def total_nbytes(self) -> int:
        """Bytes of sample data held for all partitions."""
        ...

    def append(
        self, partition_id: str, data: Mapping[str, Array], sample_meta: Sequence[SampleMeta]
    ) -> int:
        """Add ``len(sample_meta)`` samples at the end; return the first new index.

        The storage takes ownership of the arrays (the queue has already copied them).
        """
        ...

    def write(self, partition_id: str, indexes: IndexArray, data: Mapping[str, Array]) -> None:
        """Set fields of existing samples: row ``i`` of each array goes to ``indexes[i]``."""
        ...

    def read(
        self, partition_id: str, indexes: IndexArray, fields: Sequence[str]
    ) -> dict[str, Array]:
        """New arrays (never views of storage) with the given samples' fields, in order.

        Raises:
            InvalidRequestError: A sample does not have one of the fields.
        """
        ...

    def ready(self, partition_id: str, fields: Sequence[str], start: int) -> BoolArray:
        """Mask over samples ``[start, num_samples)``: which have every field in ``fields``."""
        ...

    def sample_meta(self, partition_id: str, indexes: IndexArray) -> list[SampleMeta]: ...

    def delete(self, partition_id: str) -> int:
        """Drop a partition and everything in it; return the bytes released."""
        ...


@dataclass(slots=True)
class _FieldStore:
    spec: FieldSpec
    # A chunk handle is the array itself in memory, an object ref in the Ray backend.
    chunks: list[Any | None] = field(default_factory=list)
    chunk_live: list[int] = field(default_factory=list)
    chunk_bytes: list[int] = field(default_factory=list)
    seg: npt.NDArray[np.int32] = field(default_factory=lambda: np.full(0, -1, dtype=np.int32))
    row: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    nbytes: int = 0

    def grow(self, capacity: int) -> None:
        old = self.seg.shape[0]
        if capacity <= old:
            return
        seg = np.full(capacity, -1, dtype=np.int32)
        seg[:old] = self.seg
        row = np.zeros(capacity, dtype=np.int64)
        row[:old] = self.row
        self.seg, self.row = seg, row

    def add_chunk(self, handle: Any, size: int, indexes: IndexArray) -> None:
        """Point ``indexes`` at a new chunk; release chunks nobody points at any more."""
        previous = self.seg[indexes]
        previous = previous[previous >= 0]
        if previous.size:
            ids, counts = np.unique(previous, return_counts=True)
            for chunk_id, count in zip(ids.tolist(), counts.tolist(), strict=True):
                self.chunk_live[chunk_id] -= count
                if self.chunk_live[chunk_id] == 0:
                    self.chunks[chunk_id] = None
                    self.nbytes -= self.chunk_bytes[chunk_id]
                    self.chunk_bytes[chunk_id] = 0
        chunk_id = len(self.chunks)
        self.chunks.append(handle)
        self.chunk_live.append(int(indexes.shape[0]))
        self.chunk_bytes.append(size)
        self.nbytes += size
        self.seg[indexes] = chunk_id
        self.row[indexes] = np.arange(indexes.shape[0], dtype=np.int64)


@dataclass(slots=True)
class _PartitionStore:
    num_samples: int = 0
    capacity: int = 0
    fields: dict[str, _FieldStore] = field(default_factory=dict)
    meta: list[SampleMeta] = field(default_factory=list)

    def ensure_capacity(self, n: int) -> None:
        if n <= self.capacity:
            return
        # Doubling keeps the index-array copies amortised O(1) per appended sample.
        self.capacity = max(n, 2 * self.capacity, 64)
        for store in self.fields.values():
            store.grow(self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fields.values())


class InMemoryPartitionStorage:
    """Keeps partitions in this process's memory (tensors stay on their device).

    Where a chunk's data lives is the only thing a backend changes: subclasses override
    :meth:`_store_chunk` / :meth:`_load_chunks` (the Ray backend keeps object refs) and
    inherit the indexing, release and accounting.
    """

    def _store_chunk(self, value: Array) -> Any:
        """The handle kept for a written chunk (here: the array itself)."""
        return value

    def _load_chunks(self, handles: list[Any]) -> list[Array]:
        """The arrays behind ``handles``."""
        return handles

    def __init__(self) -> None:
        self._partitions: dict[str, _PartitionStore] = {}
        self._total_nbytes = 0

    def _get(self, partition_id: str) -> _PartitionStore:
        try:
            return self._partitions[partition_id]
        except KeyError:
            raise unknown_id("partition", partition_id) from None

    def create(self, partition_id: str) -> None:
        if partition_id in self._partitions:
            raise InternalError(f"partition {partition_id!r} created twice")
        self._partitions[partition_id] = _PartitionStore()

    def exists(self, partition_id: str) -> bool:
        return partition_id in self._partitions

    def partition_ids(self) -> list[str]:
        return list(self._partitions)

    def num_samples(self, partition_id: str) -> int:
        return self._get(partition_id).num_samples

    def field_specs(self, partition_id: str) -> dict[str, FieldSpec]:
        return {name: f.spec for name, f in self._get(partition_id).fields.items()}

    def nbytes(self, partition_id: str) -> int:
        return self._get(partition_id).nbytes

    def total_nbytes(self) -> int:
        return self._total_nbytes

    def append(
        self, partition_id: str, data: Mapping[str, Array], sample_meta: Sequence[SampleMeta]
    ) -> int:
        part = self._get(partition_id)
        start = part.num_samples
        n = len(sample_meta)
        part.ensure_capacity(start + n)
        indexes = np.arange(start, start + n, dtype=np.int64)
        for name, value in data.items():
            self._add(part, name, value, indexes)
        part.meta.extend(sample_meta)
        part.num_samples = start + n
        return start

    def write(self, partition_id: str, indexes: IndexArray, data: Mapping[str, Array]) -> None:
        part = self._get(partition_id)
        for name, value in data.items():
            self._add(part, name, value, indexes)

    def _add(self, part: _PartitionStore, name: str, value: Array, indexes: IndexArray) -> None:
        store = part.fields.get(name)
        if store is None:
            store = _FieldStore(spec_of(value))
            store.grow(part.capacity)
            part.fields[name] = store
        before = store.nbytes
        store.add_chunk(self._store_chunk(value), nbytes(value), indexes)
        self._total_nbytes += store.nbytes - before

    def read(
        self, partition_id: str, indexes: IndexArray, fields: Sequence[str]
    ) -> dict[str, Array]:
        part = self._get(partition_id)
        out: dict[str, Array] = {}
        for name in fields:
            store = part.fields[name]
            segs = store.seg[indexes].astype(np.int64)
            if indexes.size and int(segs.min()) < 0:
                missing = indexes[segs < 0][:5].tolist()
                raise InvalidRequestError(
                    f"samples {missing} of partition {partition_id!r} have no field {name!r} "
                    "yet (it was never written for them)",
                    partition_id=partition_id,
                    field=name,
                )
            # Resolve only the chunks these rows touch (one fetch for a remote backend);
            # an empty read still needs one chunk as the dtype template.
            needed = np.unique(segs).tolist() or [
                next(i for i, c in enumerate(store.chunks) if c is not None)
            ]
            values = self._load_chunks([store.chunks[i] for i in needed])
            resolved: list[Array | None] = [None] * len(store.chunks)
            for i, value in zip(needed, values, strict=True):
                resolved[i] = value
            out[name] = gather(resolved, segs, store.row[indexes], store.spec)
        return out

    def ready(self, partition_id: str, fields: Sequence[str], start: int) -> BoolArray:
        part = self._get(partition_id)
        mask = np.ones(part.num_samples - start, dtype=np.bool_)
        for name in fields:
            mask &= part.fields[name].seg[start : part.num_samples] >= 0
        return mask

    def sample_meta(self, partition_id: str, indexes: IndexArray) -> list[SampleMeta]:
        meta = self._get(partition_id).meta
        return [meta[i] for i in indexes.tolist()]

    def delete(self, partition_id: str) -> int:
        part = self._get(partition_id)
        freed = part.nbytes
        del self._partitions[partition_id]
        self._total_nbytes -= freed
        return freed
