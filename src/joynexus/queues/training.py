"""The Training Queue: partitions of training samples and a two-step read interface.

Paper Appendix A.5 (TransferQueue-style). A producer writes a job's samples into the
partition named by the job's ``partition_id`` (``queue_put``); stages then read in two
steps — ``get_meta`` chooses samples and returns a small :class:`BatchMeta`,
``get_data`` fetches their tensors — and may write derived fields (advantages,
returns) back against the same samples with ``put``. The Training Scheduler holds the
job's control state; this queue holds only data.

Semantics worth knowing:

* **Columnar.** ``queue_put`` takes ``field -> array`` with one leading sample
  dimension ``N`` shared by every field. The first ``queue_put`` fixes the partition's
  *base fields*; later appends must carry exactly the same fields. Each field keeps the
  kind (torch or numpy), dtype, per-sample shape and device it was first written with.
* **Consumption per task.** ``get_meta`` returns, in index order, the next samples the
  task has not received yet *and* that already have every requested field (a sample
  whose derived field has not been ``put`` yet is not ready and is skipped for now). A
  task never receives a sample twice unless :meth:`TrainingQueue.reset_consumption`.
  Asking for a field that no sample of the partition has is an error, not an empty
  batch, so a misspelt field fails loudly.
* **Copies.** Writes copy the caller's arrays and reads return new arrays, so neither
  side can change the other's data after the call.
* **Memory cap.** A write that would take the total above ``memory_cap_bytes`` raises
  :class:`~joynexus.errors.MemoryCapExceededError`; nothing is ever dropped to make
  room. ``clear`` releases a partition's memory. Bytes replaced by a ``put`` count until
  the write has succeeded, so the check is conservative.
* **Threads and asyncio.** One lock guards every operation; the ``async_*`` variants
  run the same code in a worker thread so long copies never block the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from joynexus.errors import (
    InvalidRequestError,
    MemoryCapExceededError,
    SchemaMismatchError,
    unknown_id,
)
from joynexus.queues._arrays import (
    Array,
    FieldSpec,
    IndexArray,
    as_array,
    leading_dim,
    nbytes,
    owned_copy,
    spec_of,
)
from joynexus.queues.meta import BatchMeta, PartitionInfo, SampleMeta
from joynexus.queues.storage import InMemoryPartitionStorage, PartitionStorage

__all__ = [
    "BatchMeta",
    "InMemoryPartitionStorage",
    "PartitionInfo",
    "PartitionStorage",
    "SampleMeta",
    "TrainingQueue",
]


_T = TypeVar("_T")

#: Largest ``async_get_data`` read copied on the caller's event loop (bytes).
INLINE_READ_BYTES = 1 << 20


@dataclass(slots=True)
class _Consumption:
    """Which samples one task has received; everything below ``low`` has been."""

    taken: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    count: int = 0
    low: int = 0

    def grow(self, n: int) -> None:
        if n > self.taken.shape[0]:
            taken = np.zeros(max(n, 2 * self.taken.shape[0]), dtype=np.bool_)
            taken[: self.taken.shape[0]] = self.taken
            self.taken = taken


@dataclass(slots=True)
class _PartitionState:
    base_fields: tuple[str, ...] | None = None
    tasks: dict[str, _Consumption] = field(default_factory=dict)


class TrainingQueue:
    """Partitioned sample store with per-task consumption (paper Appendix A.5).

    Args:
        storage: Where samples live; defaults to :class:`InMemoryPartitionStorage`.
        memory_cap_bytes: Upper bound on the bytes of sample data held across all
            partitions; ``None`` means unbounded.
    """

    def __init__(
        self, storage: PartitionStorage | None = None, *, memory_cap_bytes: int | None = None
    ) -> None:
        if memory_cap_bytes is not None and memory_cap_bytes <= 0:
            raise InvalidRequestError(
                f"memory_cap_bytes must be positive or None, got {memory_cap_bytes}"
            )
        self._storage: PartitionStorage = (
            storage if storage is not None else InMemoryPartitionStorage()
        )
        self._cap = memory_cap_bytes
        # Re-entrant: the async fast path (_on_loop) holds it around a call that takes it.
        self._lock = threading.RLock()
        self._state: dict[str, _PartitionState] = {
            pid: _PartitionState() for pid in self._storage.partition_ids()
        }

    # ------------------------------------------------------------------ writes

    def queue_put(
        self,
        partition_id: str,
        data: Mapping[str, Array],
        metadata: SampleMeta | Sequence[SampleMeta],
    ) -> list[int]:
        """Append samples to a partition, creating it on the first put.

        Args:
            partition_id: The training job's partition id.
            data: Field name → tensor or ndarray, all with the same leading dimension N.
            metadata: One :class:`SampleMeta` for all N samples, or exactly N of them.

        Returns:
            The indexes the new samples got in the partition.

        Raises:
            InvalidRequestError: Empty data, a non-string field name, a value that is
                not an array, unequal leading dimensions, or a metadata count ≠ N.
            SchemaMismatchError: Fields differ from the partition's earlier puts, or a
                field's dtype / per-sample shape / kind / device differs.
            MemoryCapExceededError: The write would exceed the memory cap.
        """
        _check_partition_id(partition_id)
        arrays, n = _check_columns(data, expected_n=None)
        if isinstance(metadata, SampleMeta):
            sample_meta: list[SampleMeta] = [metadata] * n
        else:
            sample_meta = list(metadata)
            if len(sample_meta) != n:
                raise InvalidRequestError(
                    f"got {len(sample_meta)} SampleMeta for {n} samples; pass one SampleMeta "
                    f"for all samples or exactly {n}",
                    partition_id=partition_id,
                )
            for i, m in enumerate(sample_meta):
                if not isinstance(m, SampleMeta):
                    raise InvalidRequestError(
                        f"metadata[{i}] is a {type(m).__name__}; expected SampleMeta"
                    )
        owned = {name: owned_copy(value) for name, value in arrays.items()}
        incoming = sum(nbytes(v) for v in owned.values())
        with self._lock:
            exists = self._storage.exists(partition_id)
            state = self._state.get(partition_id) if exists else None
            if state is not None and state.base_fields is not None:
                _check_same_fields(partition_id, state.base_fields, owned)
            if exists:
                _check_specs(partition_id, self._storage.field_specs(partition_id), owned)
            self._check_cap(incoming, partition_id)
            if not exists:
                self._storage.create(partition_id)
                state = self._state[partition_id] = _PartitionState()
            assert state is not None
            if state.base_fields is None:
                state.base_fields = tuple(sorted(owned))
            start = self._storage.append(partition_id, owned, sample_meta)
        return list(range(start, start + n))

    def put(self, data: Mapping[str, Array], metadata: BatchMeta) -> None:
        """Write (derived) fields for the samples of ``metadata``, row i → ``indexes[i]``.

        Raises:
            PartitionNotFoundError: The partition no longer exists.
            InvalidRequestError: A field's leading dimension ≠ ``len(metadata.indexes)``,
                indexes out of range or repeated, or malformed data.
            SchemaMismatchError: A field exists with another dtype / shape / kind.
            MemoryCapExceededError: The write would exceed the memory cap.
        """
        arrays, _ = _check_columns(data, expected_n=len(metadata.indexes))
        owned = {name: owned_copy(value) for name, value in arrays.items()}
        incoming = sum(nbytes(v) for v in owned.values())
        with self._lock:
            self._require(metadata.partition_id)
            indexes = self._check_indexes(metadata)
            if len(np.unique(indexes)) != indexes.shape[0]:
                raise InvalidRequestError(
                    "BatchMeta.indexes repeats a sample; each sample can be written once per put",
                    partition_id=metadata.partition_id,
                )
            _check_specs(
                metadata.partition_id, self._storage.field_specs(metadata.partition_id), owned
            )
            self._check_cap(incoming, metadata.partition_id)
            if indexes.size:
                self._storage.write(metadata.partition_id, indexes, owned)

    # ------------------------------------------------------------------- reads

    def get_meta(
        self, partition_id: str, data_fields: Sequence[str], batch_size: int, task_name: str
    ) -> BatchMeta:
        """Choose the next ``batch_size`` samples this task has not received yet.

        Returns fewer samples when fewer are ready, and an empty :class:`BatchMeta` when
        the task has received every ready sample. Chosen samples count as consumed.

        Raises:
            PartitionNotFoundError: Unknown partition.
            InvalidRequestError: ``batch_size < 1``, an empty ``task_name``, or a field
                that no sample of the partition has.
        """
        if batch_size < 1:
            raise InvalidRequestError(f"batch_size must be ≥ 1, got {batch_size}")
        if not task_name:
            raise InvalidRequestError("task_name must be a non-empty string")
        fields = list(data_fields)
        with self._lock:
            state = self._require(partition_id)
            specs = self._storage.field_specs(partition_id)
            unknown = [f for f in fields if f not in specs]
            if unknown:
                raise InvalidRequestError(
                    f"partition {partition_id!r} has no field(s) {unknown}; "
                    f"its fields are {sorted(specs)}",
                    partition_id=partition_id,
                    fields=unknown,
                )
            n = self._storage.num_samples(partition_id)
            cons = state.tasks.setdefault(task_name, _Consumption())
            cons.grow(n)
            start = cons.low
            free = self._storage.ready(partition_id, fields, start) & ~cons.taken[start:n]
            chosen = np.flatnonzero(free)[:batch_size].astype(np.int64) + start
            if chosen.size:
                cons.taken[chosen] = True
                cons.count += int(chosen.size)
                if int(chosen[0]) == cons.low:
                    rest = cons.taken[cons.low : n]
                    untaken = np.flatnonzero(~rest)
                    cons.low += int(untaken[0]) if untaken.size else int(rest.shape[0])
            sample_meta = self._storage.sample_meta(partition_id, chosen)
        # model_construct: every value was built here from validated state.
        return BatchMeta.model_construct(
            partition_id=partition_id,
            task_name=task_name,
            indexes=chosen.tolist(),
            fields=fields,
            sample_meta=sample_meta,
        )

    def get_data(self, meta: BatchMeta) -> dict[str, Array]:
        """The fields ``meta.fields`` of the samples ``meta.indexes``, rows in that order.

        Raises:
            PartitionNotFoundError: The partition no longer exists.
            InvalidRequestError: An index out of range, an unknown field, or a sample
                that does not have one of the fields.
        """
        with self._lock:
            self._require(meta.partition_id)
            indexes = self._check_indexes(meta)
            specs = self._storage.field_specs(meta.partition_id)
            unknown = [f for f in meta.fields if f not in specs]
            if unknown:
                raise InvalidRequestError(
                    f"partition {meta.partition_id!r} has no field(s) {unknown}; "
                    f"its fields are {sorted(specs)}",
                    partition_id=meta.partition_id,
                    fields=unknown,
                )
            return self._storage.read(meta.partition_id, indexes, meta.fields)

    # -------------------------------------------------------------- lifecycle

    def clear(self, partition_id: str, *, missing_ok: bool = True) -> None:
        """Release a partition and its memory.

        Clearing an unknown partition is a no-op by default, because cleanup runs on
        failure paths where the partition may never have been created (paper A.4).

        Raises:
            PartitionNotFoundError: Unknown partition and ``missing_ok=False``.
        """
        with self._lock:
            if not self._storage.exists(partition_id):
                if missing_ok:
                    return
                self._require(partition_id)
            self._storage.delete(partition_id)
            self._state.pop(partition_id, None)

    def reset_consumption(self, partition_id: str, task_name: str) -> None:
        """Let ``task_name`` receive every sample of the partition again."""
        with self._lock:
            self._require(partition_id).tasks.pop(task_name, None)

    def partitions(self) -> list[PartitionInfo]:
        """One :class:`PartitionInfo` per partition, in creation order."""
        with self._lock:
            return [self._info(pid) for pid in self._storage.partition_ids()]

    def read_nbytes(self, partition_id: str, fields: Sequence[str], count: int) -> int:
        """Bytes ``get_data`` of ``count`` samples of ``fields`` would return (unknown
        fields count 0: ``get_data`` refuses them), known before anything is read."""
        with self._lock:
            self._require(partition_id)
            specs = self._storage.field_specs(partition_id)
            return count * sum(specs[f].row_nbytes() for f in set(fields) if f in specs)

    def info(self, partition_id: str) -> PartitionInfo:
        with self._lock:
            self._require(partition_id)
            return self._info(partition_id)

    def has_partition(self, partition_id: str) -> bool:
        with self._lock:
            return self._storage.exists(partition_id)

    @property
    def nbytes(self) -> int:
        """Bytes of sample data held across all partitions."""
        with self._lock:
            return self._storage.total_nbytes()

    @property
    def memory_cap_bytes(self) -> int | None:
        return self._cap

    # ------------------------------------------------------------------ async

    async def async_queue_put(
        self,
        partition_id: str,
        data: Mapping[str, Array],
        metadata: SampleMeta | Sequence[SampleMeta],
    ) -> list[int]:
        return await _written(self.queue_put, partition_id, data, metadata)

    async def _on_loop(
        self, fn: Callable[..., _T], *args: Any, inline: Callable[[], bool] | None = None
    ) -> _T:
        # Metadata calls (no sample data copied) answer on the caller's event loop when
        # the lock is free: they take microseconds, a worker-thread hop about a
        # millisecond on a busy core, several per training job (the demo's profile,
        # RESULTS §1.2). When another thread holds the lock (a producer's put), or
        # ``inline`` (asked under the lock) says the call is too big for the loop, it
        # goes to a worker thread instead, so the loop never blocks on it.
        if self._lock.acquire(blocking=False):
            try:
                if inline is None or inline():
                    return fn(*args)
            finally:
                self._lock.release()
        return await asyncio.to_thread(fn, *args)

    async def async_get_meta(
        self, partition_id: str, data_fields: Sequence[str], batch_size: int, task_name: str
    ) -> BatchMeta:
        return await self._on_loop(self.get_meta, partition_id, data_fields, batch_size, task_name)

    async def async_info(self, partition_id: str) -> PartitionInfo:
        return await self._on_loop(self.info, partition_id)

    async def async_reset_consumption(self, partition_id: str, task_name: str) -> None:
        await self._on_loop(self.reset_consumption, partition_id, task_name)

    async def async_get_data(self, meta: BatchMeta) -> dict[str, Array]:
        # A small read (an SFT microbatch of small images) is copied on the loop too:
        # the copy takes less than the hop. A large one, or a busy lock, goes to a thread.
        def small() -> bool:
            if not self._storage.exists(meta.partition_id):
                return False  # get_data's own error, raised in the thread
            nbytes = self.read_nbytes(meta.partition_id, meta.fields, meta.size)
            return nbytes <= INLINE_READ_BYTES

        return await self._on_loop(self.get_data, meta, inline=small)

    async def async_put(self, data: Mapping[str, Array], metadata: BatchMeta) -> None:
        await _written(self.put, data, metadata)

    async def async_clear(self, partition_id: str, *, missing_ok: bool = True) -> None:
        await asyncio.to_thread(self.clear, partition_id, missing_ok=missing_ok)

    # The paper's pseudocode (Appendix A.4/A.6) calls it by this name.
    async_clear_partition = async_clear

    # --------------------------------------------------------------- helpers

    def _require(self, partition_id: str) -> _PartitionState:
        state = self._state.get(partition_id)
        if state is None or not self._storage.exists(partition_id):
            raise unknown_id("partition", partition_id)
        return state

    def _check_indexes(self, meta: BatchMeta) -> IndexArray:
        indexes = np.asarray(meta.indexes, dtype=np.int64)
        n = self._storage.num_samples(meta.partition_id)
        if indexes.size and (int(indexes.min()) < 0 or int(indexes.max()) >= n):
            raise InvalidRequestError(
                f"BatchMeta.indexes must lie in [0, {n}) for partition {meta.partition_id!r}",
                partition_id=meta.partition_id,
            )
        return indexes

    def _check_cap(self, incoming: int, partition_id: str) -> None:
        if self._cap is None:
            return
        current = self._storage.total_nbytes()
        if current + incoming > self._cap:
            raise MemoryCapExceededError(
                f"writing {incoming} bytes to partition {partition_id!r} would hold "
                f"{current + incoming} bytes, above the Training Queue memory cap of "
                f"{self._cap} bytes (currently {current}); clear consumed partitions or "
                "raise the cap",
                current_bytes=current,
                requested_bytes=incoming,
                limit_bytes=self._cap,
                partition_id=partition_id,
            )

    def _info(self, partition_id: str) -> PartitionInfo:
        state = self._state[partition_id]
        return PartitionInfo(
            partition_id=partition_id,
            num_samples=self._storage.num_samples(partition_id),
            fields=sorted(self._storage.field_specs(partition_id)),
            nbytes=self._storage.nbytes(partition_id),
            consumed={task: c.count for task, c in state.tasks.items()},
        )


def _check_partition_id(partition_id: str) -> None:
    if not isinstance(partition_id, str) or not partition_id:
        raise InvalidRequestError(f"partition_id must be a non-empty string, got {partition_id!r}")


def _check_columns(
    data: Mapping[str, Array], *, expected_n: int | None
) -> tuple[dict[str, Array], int]:
    """Validate names, array types and the shared leading dimension; return (arrays, N)."""
    if not isinstance(data, Mapping) or not data:
        raise InvalidRequestError("data must be a non-empty mapping of field name -> array")
    arrays: dict[str, Array] = {}
    n = expected_n
    first: str | None = None
    for name, value in data.items():
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"field names must be non-empty strings, got {name!r}")
        arr = as_array(name, value)
        rows = leading_dim(arr)
        if n is None:
            n, first = rows, name
        elif rows != n:
            expected = (
                f"{n} (len(BatchMeta.indexes))"
                if expected_n is not None
                else f"{n} (the leading dim of field {first!r})"
            )
            raise InvalidRequestError(
                f"field {name!r} has leading dimension {rows}; expected {expected}",
                field=name,
                expected_leading_dim=n,
                got=rows,
            )
        arrays[name] = arr
    assert n is not None
    return arrays, n


def _check_same_fields(partition_id: str, base: tuple[str, ...], data: Mapping[str, Array]) -> None:
    missing = sorted(set(base) - set(data))
    extra = sorted(set(data) - set(base))
    if missing or extra:
        raise SchemaMismatchError(
            f"queue_put to partition {partition_id!r} must carry the fields of its first put "
            f"{list(base)}; missing {missing}, unexpected {extra} (write derived fields "
            "with put(data, metadata=BatchMeta))",
            partition_id=partition_id,
            missing=missing,
            unexpected=extra,
        )


def _check_specs(
    partition_id: str, specs: Mapping[str, FieldSpec], data: Mapping[str, Array]
) -> None:
    for name, value in data.items():
        expected = specs.get(name)
        if expected is None:
            continue
        got = spec_of(value)
        if got != expected:
            raise SchemaMismatchError(
                f"field {name!r} of partition {partition_id!r} is {got.describe()}; "
                f"expected {expected.describe()} as in earlier writes",
                partition_id=partition_id,
                field=name,
                expected_shape=[-1, *expected.sample_shape],
                expected_dtype=expected.dtype,
                got_shape=[-1, *got.sample_shape],
                got_dtype=got.dtype,
            )


async def _written(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` (a write) in a worker thread, finished even when the caller is
    cancelled meanwhile.

    A thread cannot be stopped: a cancelled caller that went on at once would run its
    cleanup (``async_clear`` of the partition) while the write was still landing, and
    the write would then leave a partition nobody clears. So the cancellation is
    re-raised once the write is done, and the cleanup sees it.
    """
    write = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        await asyncio.wait([write])
        raise
