"""A Training Queue storage backend on the Ray object store.

:class:`RayObjectStorePartitionStorage` implements
:class:`~joynexus.queues.storage.PartitionStorage` by reusing the in-memory backend's
indexing and accounting and changing only where a chunk lives: every write (a
``queue_put`` append or a ``put`` of derived fields) becomes one ``ray.put`` object per
field, and the partition index keeps only the :class:`ray.ObjectRef`. Sample data
therefore lives in the shared-memory object store of the node, not in the heap of the
process that hosts the queue, and is freed by Ray's reference counting as soon as the
index drops its last ref to a chunk (a cleared partition, or a derived field rewritten
for every sample).

Reads fetch only the chunks the requested rows touch, in one ``ray.get``. The queue
holds its own lock around every call, so this class does no locking of its own.
"""

from __future__ import annotations

from typing import Any

from joynexus.queues._arrays import Array
from joynexus.queues.storage import InMemoryPartitionStorage

__all__ = ["RayObjectStorePartitionStorage"]


def _ray() -> Any:
    import ray  # an optional dependency: imported only where this backend is used

    return ray


class RayObjectStorePartitionStorage(InMemoryPartitionStorage):
    """Partition chunks in the Ray object store; refs and indexes in this process.

    Requires an initialised Ray (``ray.init`` or a Ray worker process).
    """

    def _store_chunk(self, value: Array) -> Any:
        return _ray().put(value)

    def _load_chunks(self, handles: list[Any]) -> list[Array]:
        values: list[Array] = _ray().get(handles)
        return values

    def object_refs(self, partition_id: str) -> list[Any]:
        """The live object-store refs of a partition (for inspection and tests)."""
        part = self._get(partition_id)
        return [ref for f in part.fields.values() for ref in f.chunks if ref is not None]
