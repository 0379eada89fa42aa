"""A Training Queue storage backend on the Ray object store.

:class:`RayObjectStorePartitionStorage` implements
:class:`~joynexus.queues.storage.PartitionStorage`: every write (a ``queue_put`` append
or a ``put`` of derived fields) becomes one ``ray.put`` object per field, and the
partition index keeps only the :class:`ray.ObjectRef` plus, per field, the two index
arrays sample → (chunk, row). Sample data therefore lives in the shared-memory object
store of the node, not in the heap of the process that hosts the queue, and is freed by
Ray's reference counting as soon as the index drops its last ref to a chunk (a cleared
partition, or a derived field rewritten for every sample).

Reads fetch only the chunks the requested rows touch. The queue holds its own lock
around every call, so this class does no locking of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from joynexus.errors import InternalError, InvalidRequestError, PartitionNotFoundError
from joynexus.queues._arrays import Array, FieldSpec, IndexArray, gather, nbytes, spec_of
from joynexus.queues.meta import SampleMeta

__all__ = ["RayObjectStorePartitionStorage"]

BoolArray = npt.NDArray[np.bool_]


def _ray() -> Any:
    import ray  # an optional dependency: imported only where this backend is used

    return ray


@dataclass(slots=True)
class _Chunk:
    ref: Any  # ray.ObjectRef
    live: int
    size: int


@dataclass(slots=True)
class _Field:
    spec: FieldSpec
    chunks: list[_Chunk | None] = field(default_factory=list)
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

    def add(self, ref: Any, size: int, indexes: IndexArray) -> None:
        previous = self.seg[indexes]
        previous = previous[previous >= 0]
        if previous.size:
            ids, counts = np.unique(previous, return_counts=True)
            for chunk_id, count in zip(ids.tolist(), counts.tolist(), strict=True):
                chunk = self.chunks[chunk_id]
                assert chunk is not None
                chunk.live -= count
                if chunk.live == 0:  # dropping the ref lets Ray free the object
                    self.nbytes -= chunk.size
                    self.chunks[chunk_id] = None
        self.chunks.append(_Chunk(ref, int(indexes.shape[0]), size))
        self.nbytes += size
        self.seg[indexes] = len(self.chunks) - 1
        self.row[indexes] = np.arange(indexes.shape[0], dtype=np.int64)


@dataclass(slots=True)
class _Partition:
    num_samples: int = 0
    capacity: int = 0
    fields: dict[str, _Field] = field(default_factory=dict)
    meta: list[SampleMeta] = field(default_factory=list)

    def ensure_capacity(self, n: int) -> None:
        if n <= self.capacity:
            return
        self.capacity = max(n, 2 * self.capacity, 64)
        for f in self.fields.values():
            f.grow(self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fields.values())


class RayObjectStorePartitionStorage:
    """Partition chunks in the Ray object store; refs and indexes in this process.

    Requires an initialised Ray (``ray.init`` or a Ray worker process).
    """

    def __init__(self) -> None:
        self._partitions: dict[str, _Partition] = {}
        self._total_nbytes = 0

    def _get(self, partition_id: str) -> _Partition:
        try:
            return self._partitions[partition_id]
        except KeyError:
            raise PartitionNotFoundError(
                f"training-queue partition {partition_id!r} does not exist "
                "(never written, or already cleared)",
                partition_id=partition_id,
            ) from None

    def create(self, partition_id: str) -> None:
        if partition_id in self._partitions:
            raise InternalError(f"partition {partition_id!r} created twice")
        self._partitions[partition_id] = _Partition()

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

    def object_refs(self, partition_id: str) -> list[Any]:
        """The live object-store refs of a partition (for inspection and tests)."""
        part = self._get(partition_id)
        return [c.ref for f in part.fields.values() for c in f.chunks if c is not None]

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

    def _add(self, part: _Partition, name: str, value: Array, indexes: IndexArray) -> None:
        store = part.fields.get(name)
        if store is None:
            store = _Field(spec_of(value))
            store.grow(part.capacity)
            part.fields[name] = store
        before = store.nbytes
        store.add(_ray().put(value), nbytes(value), indexes)
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
            needed = np.unique(segs).tolist()
            if not needed:  # an empty read still needs one chunk as the dtype template
                needed = [next(i for i, c in enumerate(store.chunks) if c is not None)]
            refs = []
            for i in needed:
                chunk = store.chunks[i]
                assert chunk is not None
                refs.append(chunk.ref)
            values = _ray().get(refs)
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
