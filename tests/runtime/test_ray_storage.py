"""Training Queue over the Ray object store: same queue semantics, chunks as objects."""

from __future__ import annotations

import numpy as np
import pytest

from joynexus.errors import PartitionNotFoundError
from joynexus.queues.meta import SampleMeta
from joynexus.queues.ray_storage import RayObjectStorePartitionStorage
from joynexus.queues.storage import PartitionStorage
from joynexus.queues.training import TrainingQueue

pytestmark = pytest.mark.ray


def test_queue_on_the_object_store_puts_reads_derives_and_frees(ray_cluster: None) -> None:
    import ray

    storage = RayObjectStorePartitionStorage()
    assert isinstance(storage, PartitionStorage)
    queue = TrainingQueue(storage)
    meta = [SampleMeta(tenant_id="a", schema_signature="sig") for _ in range(6)]
    obs = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    queue.queue_put("p", {"obs": obs[:3], "r": np.ones(3, np.float32)}, meta[:3])
    queue.queue_put("p", {"obs": obs[3:], "r": np.zeros(3, np.float32)}, meta[3:])
    refs = storage.object_refs("p")
    assert len(refs) == 4 and all(isinstance(r, ray.ObjectRef) for r in refs)

    batch = queue.get_meta("p", ["obs", "r"], 4, "adv")
    data = queue.get_data(batch)
    np.testing.assert_array_equal(data["obs"], obs[:4])  # spans both chunks
    np.testing.assert_array_equal(data["r"], [1, 1, 1, 0])
    queue.put({"adv": np.full(4, 2.0, np.float32)}, batch)
    rest = queue.get_meta("p", ["obs", "r"], 10, "adv")
    queue.put({"adv": np.full(2, 3.0, np.float32)}, rest)
    train = queue.get_meta("p", ["adv"], 6, "train")
    np.testing.assert_array_equal(queue.get_data(train)["adv"], [2, 2, 2, 2, 3, 3])
    assert queue.nbytes == obs.nbytes + 6 * 4 + 6 * 4

    queue.clear("p")
    assert queue.partitions() == [] and queue.nbytes == 0
    with pytest.raises(PartitionNotFoundError):
        storage.object_refs("p")
