"""The Training Queue contract, run against the queue the runtime builds (with a memory
cap) and the queue of the fake plane the Master's tests run on: the two-step read,
derived fields, per-task consumption, clearing, and the tenant each sample belongs to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from joynexus.errors import InvalidRequestError, PartitionNotFoundError, SchemaMismatchError
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.protocols import TrainingQueueAPI
from tests.fakes.plane import open_fake_plane

A, B = "alice", "bob"


@pytest.fixture
def queue(kind: str, tmp_path: Path) -> Iterator[TrainingQueueAPI]:
    if kind == "real":
        yield TrainingQueue(memory_cap_bytes=1 << 20)
        return
    plane = open_fake_plane(tmp_path)
    try:
        yield plane.queue
    finally:
        plane.close()


def meta(tenant: str = A) -> SampleMeta:
    return SampleMeta(tenant_id=tenant, schema_signature="sig", behavior_policy_version=0)


def cols(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {
        "state": np.arange(start, start + n, dtype=np.float32)[:, None].repeat(2, 1),
        "actions": np.ones((n, 1, 2), np.float32),
    }


def test_put_then_read_in_two_steps_with_per_task_consumption(queue: TrainingQueueAPI) -> None:
    async def main() -> None:
        assert not queue.has_partition("p") and queue.nbytes == 0
        assert await queue.async_queue_put("p", cols(3), meta()) == [0, 1, 2]
        assert await queue.async_queue_put("p", cols(2, 3), [meta(), meta()]) == [3, 4]
        assert queue.has_partition("p") and queue.nbytes > 0
        info = queue.info("p")
        assert (info.partition_id, info.num_samples) == ("p", 5)
        assert set(info.fields) == {"state", "actions"}
        assert [p.partition_id for p in queue.partitions()] == ["p"]
        first = await queue.async_get_meta("p", ["state"], 2, "train")
        assert (first.partition_id, first.indexes, first.fields) == ("p", [0, 1], ["state"])
        data = await queue.async_get_data(first)
        np.testing.assert_array_equal(data["state"][:, 0], [0.0, 1.0])
        rest = await queue.async_get_meta("p", ["state"], 10, "train")
        assert rest.indexes == [2, 3, 4]
        assert (await queue.async_get_meta("p", ["state"], 10, "train")).indexes == []
        # Another task consumes independently, from the start.
        assert (await queue.async_get_meta("p", ["state"], 1, "eval")).indexes == [0]

    asyncio.run(main())


def test_a_derived_field_makes_only_its_samples_ready(queue: TrainingQueueAPI) -> None:
    async def main() -> None:
        await queue.async_queue_put("p", cols(4), meta())
        some = await queue.async_get_meta("p", ["state"], 2, "advantage")
        await queue.async_put({"advantages": np.array([0.5, -0.5], np.float32)}, some)
        ready = await queue.async_get_meta("p", ["state", "advantages"], 10, "train")
        assert ready.indexes == [0, 1]
        data = await queue.async_get_data(ready)
        np.testing.assert_array_equal(data["advantages"], [0.5, -0.5])
        assert "advantages" in queue.info("p").fields
        with pytest.raises(InvalidRequestError, match="no field"):
            await queue.async_get_meta("p", ["not_a_field"], 1, "train")
        with pytest.raises(InvalidRequestError):
            await queue.async_put({"advantages": np.zeros(3, np.float32)}, some)
        with pytest.raises(SchemaMismatchError):
            await queue.async_queue_put("p", {"state": np.zeros((1, 2), np.float32)}, meta())
        with pytest.raises(SchemaMismatchError):
            await queue.async_queue_put("p", {**cols(1), "state": np.zeros((1, 3))}, meta())

    asyncio.run(main())


def test_every_sample_keeps_the_tenant_that_wrote_it(queue: TrainingQueueAPI) -> None:
    async def main() -> None:
        await queue.async_queue_put("p", cols(2), meta(A))
        await queue.async_queue_put("p", cols(1), meta(B))
        got = await queue.async_get_meta("p", ["state"], 10, "train")
        assert [m.tenant_id for m in got.sample_meta] == [A, A, B]
        assert all(m.schema_signature == "sig" for m in got.sample_meta)

    asyncio.run(main())


def test_clear_releases_the_partition(queue: TrainingQueueAPI) -> None:
    async def main() -> None:
        await queue.async_queue_put("p", cols(2), meta())
        await queue.async_queue_put("q", cols(1), meta())
        stale = await queue.async_get_meta("p", ["state"], 2, "train")
        before = queue.nbytes
        await queue.async_clear("p")
        assert not queue.has_partition("p") and queue.has_partition("q")
        assert 0 < queue.nbytes < before
        await queue.async_clear("p")  # missing_ok by default: cleanup paths may repeat
        for call in (
            queue.async_clear("p", missing_ok=False),
            queue.async_get_meta("p", ["state"], 1, "train"),
            queue.async_get_data(stale),
            queue.async_put({"advantages": np.zeros(2, np.float32)}, stale),
        ):
            with pytest.raises(PartitionNotFoundError, match="'p'"):
                await call
        with pytest.raises(PartitionNotFoundError):
            queue.info("p")
        # A cleared name starts over as a new partition.
        assert await queue.async_queue_put("p", cols(1), meta()) == [0]

    asyncio.run(main())
