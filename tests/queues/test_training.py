"""Training Queue: two-step interface, consumption, validation, memory cap, storage."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from joynexus.errors import (
    InvalidRequestError,
    MemoryCapExceededError,
    PartitionNotFoundError,
    SchemaMismatchError,
)
from joynexus.queues.training import (
    BatchMeta,
    InMemoryPartitionStorage,
    PartitionStorage,
    SampleMeta,
    TrainingQueue,
)

META = SampleMeta(tenant_id="t1", schema_signature="sig-a", behavior_policy_version=3)


def as_tensor(value: object) -> torch.Tensor:
    assert isinstance(value, torch.Tensor), type(value)
    return value


def rollout(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    idx = torch.arange(start, start + n, dtype=torch.float32)
    return {
        "obs": idx[:, None].repeat(1, 4),
        "reward": idx.clone(),
        "image": torch.zeros(n, 3, 8, 8, dtype=torch.uint8),
    }


def test_put_then_read_back_in_batches_until_exhausted() -> None:
    q = TrainingQueue()
    assert q.queue_put("p", rollout(5), META) == [0, 1, 2, 3, 4]
    metas = [q.get_meta("p", ["obs", "reward"], 2, "adv") for _ in range(4)]
    assert [m.indexes for m in metas] == [[0, 1], [2, 3], [4], []]
    assert metas[3].is_empty and metas[3].size == 0
    data = q.get_data(metas[1])
    assert set(data) == {"obs", "reward"}
    assert isinstance(data["obs"], torch.Tensor)
    assert torch.equal(as_tensor(data["reward"]), torch.tensor([2.0, 3.0]))
    assert data["obs"].shape == (2, 4)
    assert metas[0].sample_meta == [META, META]
    empty = q.get_data(metas[3])
    assert empty["obs"].shape == (0, 4) and empty["obs"].dtype == torch.float32


def test_numpy_stays_numpy_and_appends_continue_indexes() -> None:
    q = TrainingQueue()
    q.queue_put("p", {"x": np.arange(3, dtype=np.int64)}, META)
    assert q.queue_put("p", {"x": np.arange(3, 5, dtype=np.int64)}, META) == [3, 4]
    meta = q.get_meta("p", ["x"], 10, "actor")
    out = q.get_data(meta)["x"]
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.arange(5))
    assert q.info("p").num_samples == 5


def test_each_task_consumes_independently_and_reset_replays() -> None:
    q = TrainingQueue()
    q.queue_put("p", rollout(3), META)
    assert q.get_meta("p", ["obs"], 2, "a").indexes == [0, 1]
    assert q.get_meta("p", ["obs"], 5, "b").indexes == [0, 1, 2]
    assert q.get_meta("p", ["obs"], 5, "a").indexes == [2]
    assert q.info("p").consumed == {"a": 3, "b": 3}
    q.reset_consumption("p", "a")
    assert q.get_meta("p", ["obs"], 5, "a").indexes == [0, 1, 2]
    assert q.get_meta("p", ["obs"], 5, "b").is_empty
    # Appended samples become available to a task that had drained the partition.
    q.queue_put("p", rollout(2, start=3), META)
    assert q.get_meta("p", ["obs"], 5, "b").indexes == [3, 4]


def test_per_sample_metadata_list() -> None:
    q = TrainingQueue()
    metas = [
        SampleMeta(tenant_id="t", schema_signature="s", behavior_policy_version=i) for i in range(3)
    ]
    q.queue_put("p", rollout(3), metas)
    got = q.get_meta("p", ["obs"], 3, "x").sample_meta
    assert [m.behavior_policy_version for m in got] == [0, 1, 2]
    with pytest.raises(InvalidRequestError, match="2 SampleMeta for 3 samples"):
        q.queue_put("p", rollout(3), metas[:2])


def test_derived_fields_join_the_same_samples() -> None:
    q = TrainingQueue()
    q.queue_put("p", rollout(4), META)
    meta = q.get_meta("p", ["reward"], 4, "compute_advantages")
    rewards = q.get_data(meta)["reward"]
    assert isinstance(rewards, torch.Tensor)
    q.put({"advantages": rewards * 10, "returns": rewards + 1}, metadata=meta)
    actor = q.get_meta("p", ["obs", "advantages", "returns"], 4, "actor")
    data = q.get_data(actor)
    assert torch.equal(as_tensor(data["advantages"]), torch.tensor([0.0, 10.0, 20.0, 30.0]))
    assert torch.equal(as_tensor(data["returns"]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert sorted(q.info("p").fields) == ["advantages", "image", "obs", "returns", "reward"]


def test_samples_without_a_requested_field_are_not_ready_yet() -> None:
    q = TrainingQueue()
    q.queue_put("p", rollout(6), META)
    part = BatchMeta(
        partition_id="p", task_name="adv", indexes=[1, 3], fields=[], sample_meta=[META] * 2
    )
    q.put({"adv": torch.tensor([1.0, 3.0])}, metadata=part)
    first = q.get_meta("p", ["adv"], 10, "actor")
    assert first.indexes == [1, 3]
    rest = BatchMeta(
        partition_id="p", task_name="adv", indexes=[0, 2, 4, 5], fields=[], sample_meta=[META] * 4
    )
    q.put({"adv": torch.tensor([0.0, 2.0, 4.0, 5.0])}, metadata=rest)
    second = q.get_meta("p", ["adv"], 10, "actor")
    assert second.indexes == [0, 2, 4, 5]
    assert torch.equal(as_tensor(q.get_data(second)["adv"]), torch.tensor([0.0, 2.0, 4.0, 5.0]))
    with pytest.raises(InvalidRequestError, match=r"no field\(s\) \['adv2'\]"):
        q.get_meta("p", ["adv2"], 1, "actor")


def test_get_data_gathers_across_puts_in_the_requested_order() -> None:
    q = TrainingQueue()
    q.queue_put("p", {"x": np.arange(0, 4, dtype=np.float32)[:, None]}, META)
    q.queue_put("p", {"x": np.arange(4, 8, dtype=np.float32)[:, None]}, META)
    meta = BatchMeta(
        partition_id="p", task_name="t", indexes=[6, 1, 5, 2], fields=["x"], sample_meta=[META] * 4
    )
    np.testing.assert_array_equal(q.get_data(meta)["x"][:, 0], [6, 1, 5, 2])
    tq = TrainingQueue()
    tq.queue_put("p", {"x": torch.arange(0, 4)}, META)
    tq.queue_put("p", {"x": torch.arange(4, 8)}, META)
    assert q.get_data(meta)["x"].shape == (4, 1)
    assert tq.get_data(meta.model_copy(update={"fields": ["x"]}))["x"].tolist() == [6, 1, 5, 2]


def test_writes_and_reads_are_copies() -> None:
    q = TrainingQueue()
    src = {"x": torch.zeros(3)}
    q.queue_put("p", src, META)
    src["x"][0] = 99.0
    meta = q.get_meta("p", ["x"], 3, "t")
    out = q.get_data(meta)["x"]
    assert isinstance(out, torch.Tensor)
    assert out[0].item() == 0.0
    out[1] = 7.0
    assert q.get_data(meta)["x"][1].item() == 0.0


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({}, "non-empty mapping"),
        (
            {"a": torch.zeros(3), "b": torch.zeros(4)},
            r"field 'b' has leading dimension 4; expected 3",
        ),
        ({"a": torch.tensor(1.0)}, "0-d tensor"),
        ({"a": [1, 2, 3]}, "field 'a' is a list; expected a torch.Tensor or numpy.ndarray"),
        ({3: torch.zeros(2)}, "field names must be non-empty strings"),
        ({"a": np.array([object()], dtype=object)}, "dtype object"),
    ],
)
def test_malformed_puts_name_the_problem(data: dict[object, object], match: str) -> None:
    q = TrainingQueue()
    with pytest.raises(InvalidRequestError, match=match):
        q.queue_put("p", data, META)  # type: ignore[arg-type]
    assert q.partitions() == []


def test_shape_dtype_and_field_set_must_match_earlier_puts() -> None:
    q = TrainingQueue()
    q.queue_put("p", {"obs": torch.zeros(2, 4), "act": torch.zeros(2, 7)}, META)
    with pytest.raises(
        SchemaMismatchError, match=r"field 'obs'.*\[N, 5\].*expected torch float32 \[N, 4\]"
    ):
        q.queue_put("p", {"obs": torch.zeros(2, 5), "act": torch.zeros(2, 7)}, META)
    with pytest.raises(SchemaMismatchError, match="float64"):
        q.queue_put(
            "p", {"obs": torch.zeros(2, 4, dtype=torch.float64), "act": torch.zeros(2, 7)}, META
        )
    with pytest.raises(SchemaMismatchError, match="numpy"):
        q.queue_put("p", {"obs": np.zeros((2, 4), np.float32), "act": torch.zeros(2, 7)}, META)
    with pytest.raises(SchemaMismatchError, match=r"missing \['act'\], unexpected \['extra'\]"):
        q.queue_put("p", {"obs": torch.zeros(2, 4), "extra": torch.zeros(2)}, META)
    assert q.info("p").num_samples == 2  # failed puts left nothing behind


def test_put_validates_against_the_batch_meta() -> None:
    q = TrainingQueue()
    q.queue_put("p", rollout(4), META)
    meta = q.get_meta("p", ["obs"], 3, "adv")
    with pytest.raises(
        InvalidRequestError, match=r"field 'adv' has leading dimension 2; expected 3"
    ):
        q.put({"adv": torch.zeros(2)}, metadata=meta)
    with pytest.raises(SchemaMismatchError, match="field 'reward'"):
        q.put({"reward": torch.zeros(3, 2)}, metadata=meta)
    bad = meta.model_copy(update={"indexes": [0, 1, 9]})
    with pytest.raises(InvalidRequestError, match=r"must lie in \[0, 4\)"):
        q.put({"adv": torch.zeros(3)}, metadata=bad)
    dup = meta.model_copy(update={"indexes": [0, 0, 1]})
    with pytest.raises(InvalidRequestError, match="repeats a sample"):
        q.put({"adv": torch.zeros(3)}, metadata=dup)
    with pytest.raises(InvalidRequestError, match="batch_size"):
        q.get_meta("p", ["obs"], 0, "adv")


def test_unknown_partition_is_a_clear_error_and_clear_is_idempotent() -> None:
    q = TrainingQueue()
    meta = BatchMeta(partition_id="nope", task_name="t", indexes=[], fields=[], sample_meta=[])
    for call in (
        lambda: q.get_meta("nope", ["x"], 1, "t"),
        lambda: q.get_data(meta),
        lambda: q.put({"x": torch.zeros(0)}, metadata=meta),
        lambda: q.info("nope"),
        lambda: q.reset_consumption("nope", "t"),
        lambda: q.clear("nope", missing_ok=False),
    ):
        with pytest.raises(PartitionNotFoundError, match="'nope' does not exist"):
            call()
    q.clear("nope")  # best-effort cleanup on failure paths must not raise
    q.queue_put("p", rollout(2), META)
    q.clear("p")
    assert not q.has_partition("p")
    with pytest.raises(PartitionNotFoundError):
        q.get_meta("p", ["obs"], 1, "t")


def test_byte_accounting_listing_and_clear() -> None:
    q = TrainingQueue()
    q.queue_put("a", {"x": torch.zeros(10, 4)}, META)  # 160 bytes
    q.queue_put("b", {"x": np.zeros((5, 2), np.float64)}, META)  # 80 bytes
    assert [p.partition_id for p in q.partitions()] == ["a", "b"]
    assert q.info("a").nbytes == 160 and q.info("b").nbytes == 80
    assert q.nbytes == 240
    q.clear("a")
    assert q.nbytes == 80
    assert [p.partition_id for p in q.partitions()] == ["b"]


def test_rewriting_a_derived_field_releases_the_old_copy() -> None:
    q = TrainingQueue()
    q.queue_put("p", {"x": torch.zeros(4)}, META)
    meta = q.get_meta("p", ["x"], 4, "adv")
    q.put({"adv": torch.ones(4)}, metadata=meta)
    assert q.nbytes == 32
    q.put({"adv": torch.full((4,), 2.0)}, metadata=meta)
    assert q.nbytes == 32
    assert q.get_data(meta.model_copy(update={"fields": ["adv"]}))["adv"].tolist() == [2.0] * 4


def test_memory_cap_refuses_writes_and_never_drops_data() -> None:
    q = TrainingQueue(memory_cap_bytes=100)
    q.queue_put("a", {"x": torch.zeros(20)}, META)  # 80 bytes
    with pytest.raises(MemoryCapExceededError) as err:
        q.queue_put("b", {"x": torch.zeros(10)}, META)
    assert err.value.details["current_bytes"] == 80
    assert err.value.details["limit_bytes"] == 100
    assert "100 bytes" in err.value.message
    assert not q.has_partition("b")
    meta = q.get_meta("a", ["x"], 20, "adv")
    with pytest.raises(MemoryCapExceededError):
        q.put({"adv": torch.zeros(20)}, metadata=meta)
    assert q.info("a").num_samples == 20 and q.nbytes == 80
    q.clear("a")
    q.queue_put("b", {"x": torch.zeros(10)}, META)
    assert q.nbytes == 40


def test_async_variants() -> None:
    async def main() -> list[float]:
        q = TrainingQueue()
        await q.async_queue_put("p", rollout(3), META)
        meta = await q.async_get_meta("p", ["reward"], 3, "adv")
        data = await q.async_get_data(meta)
        await q.async_put({"adv": data["reward"] * 2}, metadata=meta)
        out = await q.async_get_data(meta.model_copy(update={"fields": ["adv"]}))
        await q.async_clear_partition("p")
        assert not q.has_partition("p")
        await q.async_clear("p")
        adv = out["adv"]
        assert isinstance(adv, torch.Tensor)
        return [float(v) for v in adv.tolist()]

    assert asyncio.run(main()) == [0.0, 2.0, 4.0]


def test_concurrent_producers_and_consumers_see_each_sample_once() -> None:
    q = TrainingQueue()
    got: list[int] = []
    lock = threading.Lock()

    def produce(k: int) -> None:
        for i in range(20):
            q.queue_put("p", {"x": torch.full((5,), float(k * 100 + i))}, META)

    def consume() -> None:
        for _ in range(200):
            meta = q.get_meta("p", ["x"], 7, "actor")
            with lock:
                got.extend(meta.indexes)

    q.queue_put("p", {"x": torch.zeros(0)}, META)
    threads = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    threads += [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got.extend(q.get_meta("p", ["x"], 1000, "actor").indexes)
    assert sorted(got) == list(range(300))


def test_in_memory_storage_satisfies_the_protocol() -> None:
    assert isinstance(InMemoryPartitionStorage(), PartitionStorage)
    storage = InMemoryPartitionStorage()
    q = TrainingQueue(storage)
    q.queue_put("p", rollout(2), META)
    assert storage.partition_ids() == ["p"]
    assert storage.total_nbytes() == q.nbytes


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 6)),
            st.tuples(st.just("get"), st.integers(1, 5), st.sampled_from(["a", "b"])),
            st.tuples(st.just("reset"), st.sampled_from(["a", "b"])),
        ),
        max_size=30,
    )
)
def test_consumption_matches_a_reference_model(ops: list[tuple[object, ...]]) -> None:
    q = TrainingQueue()
    q.queue_put("p", {"v": np.zeros(0, np.int64)}, META)
    total = 0
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    for op in ops:
        if op[0] == "put":
            n = int(op[1])  # type: ignore[call-overload]
            q.queue_put("p", {"v": np.arange(total, total + n, dtype=np.int64)}, META)
            total += n
        elif op[0] == "get":
            size, task = int(op[1]), str(op[2])  # type: ignore[call-overload]
            meta = q.get_meta("p", ["v"], size, task)
            expected = [i for i in range(total) if i not in seen[task]][:size]
            assert meta.indexes == expected
            values = q.get_data(meta)["v"]
            assert isinstance(values, np.ndarray)
            assert values.tolist() == expected
            seen[task].update(expected)
        else:
            task = str(op[1])
            q.reset_consumption("p", task)
            seen[task] = set()
        assert q.info("p").consumed.get("a", 0) == len(seen["a"])


def test_metadata_calls_answer_on_the_loop_and_never_block_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``async_get_meta`` / ``async_info`` / ``async_reset_consumption`` and small
    ``async_get_data`` reads take no worker thread when the lock is free; a large read,
    or any call while another thread holds the lock (a producer's put), waits in a
    worker thread while the event loop goes on."""
    import joynexus.queues.training as module

    q = TrainingQueue()
    q.queue_put("p", rollout(3), META)
    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(fn.__name__)
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(module.asyncio, "to_thread", spy)

    async def free() -> None:
        assert (await q.async_info("p")).num_samples == 3
        assert (await q.async_get_meta("p", ["reward"], 2, "t")).indexes == [0, 1]
        await q.async_reset_consumption("p", "t")
        meta = await q.async_get_meta("p", ["reward", "image"], 3, "t")
        assert meta.indexes == [0, 1, 2]
        assert as_tensor((await q.async_get_data(meta))["reward"]).tolist() == [0.0, 1.0, 2.0]

    asyncio.run(free())
    assert hops == []  # a small read is copied on the loop too

    big = {"image": torch.zeros(2, 3, 512, 512, dtype=torch.uint8)}  # 1.5 MiB
    q.queue_put("big", big, META)

    async def large() -> None:
        meta = await q.async_get_meta("big", ["image"], 2, "t")
        assert tuple(as_tensor((await q.async_get_data(meta))["image"]).shape) == (2, 3, 512, 512)

    asyncio.run(large())
    assert hops == ["get_data"]  # a large read goes to a worker thread
    hops.clear()

    held, release = threading.Event(), threading.Event()

    def producer() -> None:
        with q._lock:
            held.set()
            release.wait(10)

    async def contended() -> int:
        ticks = 0
        call = asyncio.ensure_future(q.async_info("p"))
        for _ in range(5):  # the loop keeps running while the call waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not call.done()
        release.set()
        assert (await call).num_samples == 3
        return ticks

    thread = threading.Thread(target=producer)
    thread.start()
    assert held.wait(10)
    assert asyncio.run(contended()) == 5
    thread.join()
    assert hops == ["info"]


def test_a_cancelled_write_lands_before_the_cancellation_reaches_its_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thread cannot be stopped: the caller's cleanup (clear the partition) must run
    # after the write, or the write lands afterwards and leaks the partition.
    q = TrainingQueue()
    started, gate = threading.Event(), threading.Event()
    real = q.queue_put

    def slow_put(*args: Any) -> list[int]:
        started.set()
        gate.wait(10)
        return real(*args)

    monkeypatch.setattr(q, "queue_put", slow_put)
    seen_at_cancel: list[bool] = []

    async def producer() -> None:
        try:
            await q.async_queue_put("p", rollout(3), META)
        except asyncio.CancelledError:
            seen_at_cancel.append(any(i.partition_id == "p" for i in q.partitions()))
            await q.async_clear("p")
            raise

    async def main() -> None:
        task = asyncio.create_task(producer())
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen_at_cancel == [True]  # the write had landed when the caller saw the cancel
    assert q.partitions() == []
