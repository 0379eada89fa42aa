"""Inference Queue: group batching by B and T, fairness, error isolation, limits, metrics.

Every timing behaviour runs on a FakeClock: time moves only when a test advances it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joynexus.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidRequestError,
    QueueFullError,
    ServiceUnavailableError,
)
from joynexus.queues.inference import InferenceQueue, InferenceRequest
from joynexus.utils.clock import FakeClock

T = 1.0


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test body on a fresh event loop (no async pytest plugin needed)."""

    def wrapper() -> None:
        asyncio.run(test())

    wrapper.__name__ = test.__name__
    return wrapper


async def settle() -> None:
    """Let every ready task run until the loop is quiet."""
    for _ in range(30):
        await asyncio.sleep(0)


def req(
    sid: str, key: str = "k", n: int = 1, obs: Any = None, deadline: float | None = None
) -> InferenceRequest:
    return InferenceRequest(
        tenant_id=f"tenant-{sid}",
        session_id=sid,
        schema_signature="sig",
        policy_version=0,
        observation=sid if obs is None else obs,
        num_samples=n,
        compat_key=key,
        deadline_s=deadline,
    )


class Recorder:
    """Fake batch function: logs each call's session ids and echoes the observations."""

    def __init__(self, fail_on: str | None = None, wrong_count: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.wrong_count = wrong_count

    async def __call__(self, batch: list[InferenceRequest]) -> Sequence[Any]:
        self.calls.append([r.session_id for r in batch])
        if self.fail_on is not None and any(r.observation == self.fail_on for r in batch):
            raise RuntimeError(f"cannot process {self.fail_on}")
        results = [f"out-{r.observation}" for r in batch]
        return results[:-1] if self.wrong_count else results


def make(
    fn: Callable[[list[InferenceRequest]], Awaitable[Sequence[Any]]],
    clock: FakeClock,
    **kw: Any,
) -> InferenceQueue:
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("max_wait_s", T)
    return InferenceQueue(fn, clock=clock, **kw)


@run
async def test_fires_as_soon_as_b_samples_are_queued() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock) as q:
        futs = [q.enqueue(req(f"s{i}")) for i in range(4)]
        await settle()
        assert fn.calls == [["s0", "s1", "s2", "s3"]]
        assert [f.result() for f in futs] == ["out-s0", "out-s1", "out-s2", "out-s3"]


@run
async def test_fires_when_the_oldest_has_waited_t_and_not_before() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_batch_size=8) as q:
        first = q.enqueue(req("a"))
        clock.advance(0.5)
        q.enqueue(req("b"))
        await settle()
        clock.advance(0.49)
        await settle()
        assert fn.calls == []
        # Waking the worker just before T (a full batch of another key) must not
        # make the head fire early.
        for i in range(8):
            q.enqueue(req(f"o{i}", key="other"))
        await settle()
        assert fn.calls == [[f"o{i}" for i in range(8)]]
        clock.advance(0.01)
        await settle()
        assert fn.calls[1:] == [["a", "b"]]  # the younger request rides along
        assert first.result() == "out-a"


@run
async def test_batches_keep_fifo_order_and_group_by_compat_key_not_tenant() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_batch_size=8) as q:
        for sid, key in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("a3", "A")]:
            q.enqueue(req(sid, key))  # every request has its own tenant
        await settle()
        clock.advance(T)
        await settle()
        assert fn.calls == [["a1", "a2", "a3"], ["b1", "b2"]]


@run
async def test_full_batches_are_capped_at_b_and_split_in_order() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock) as q:
        for i in range(10):
            q.enqueue(req(f"s{i}"))
        await settle()
        assert fn.calls == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"]]
        clock.advance(T)
        await settle()
        assert fn.calls[-1] == ["s8", "s9"]


@run
async def test_b_counts_samples_not_requests() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock) as q:
        q.enqueue(req("x", n=3))
        q.enqueue(req("y", n=3))  # 6 > B: y must wait for the next batch
        await settle()
        assert fn.calls == [["x"]]
        clock.advance(T)
        await settle()
        assert fn.calls == [["x"], ["y"]]
        assert q.metrics.batch_size_histogram == {3: 2}


@run
async def test_oversize_request_runs_alone_without_waiting() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock) as q:
        small = q.enqueue(req("small"))
        big = q.enqueue(req("big", n=10))
        after = q.enqueue(req("after"))
        await settle()
        assert fn.calls == [["small"], ["big"]]
        assert small.result() == "out-small" and big.result() == "out-big"
        assert not after.done()
        clock.advance(T)
        await settle()
        assert fn.calls[-1] == ["after"]
        assert q.metrics.batch_size_histogram == {1: 2, 10: 1}


@run
async def test_a_full_younger_group_may_go_first_but_a_due_head_is_never_overtaken() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_batch_size=2) as q:
        q.enqueue(req("x", "X"))
        for step in range(5):
            clock.advance(T / 4)
            q.enqueue(req(f"y{step}a", "Y"))
            q.enqueue(req(f"y{step}b", "Y"))
            await settle()
        # X became due at step 3; from then on it ran before any younger Y pair.
        assert fn.calls == [
            ["y0a", "y0b"],
            ["y1a", "y1b"],
            ["y2a", "y2b"],
            ["x"],
            ["y3a", "y3b"],
            ["y4a", "y4b"],
        ]


@run
async def test_interleaved_keys_under_a_steady_flood_are_not_starved() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_batch_size=3) as q:
        futs: dict[str, asyncio.Future[Any]] = {}
        futs["lonely"] = q.enqueue(req("lonely", "L"))
        for step in range(20):
            for j in range(2):
                sid = f"f{step}-{j}"
                futs[sid] = q.enqueue(req(sid, "F"))
            clock.advance(T / 10)
            await settle()
            if step == 9:  # exactly T after 'lonely' arrived
                assert futs["lonely"].done()
        assert futs["lonely"].result() == "out-lonely"


@run
async def test_validation_failure_fails_only_that_request() -> None:
    def validate(r: InferenceRequest) -> None:
        if r.observation == "bad":
            raise ValueError("image must be 32x32x3")

    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, validate=validate) as q:
        good = q.enqueue(req("g1"))
        bad = q.enqueue(req("b", obs="bad"))
        good2 = q.enqueue(req("g2"))
        await settle()
        assert bad.done()
        with pytest.raises(InvalidRequestError, match="image must be 32x32x3"):
            bad.result()
        assert len(q) == 2
        clock.advance(T)
        await settle()
        assert fn.calls == [["g1", "g2"]]
        assert (good.result(), good2.result()) == ("out-g1", "out-g2")
        assert q.metrics.validation_failures == 1


@run
async def test_a_raising_batch_is_retried_one_by_one_so_only_the_culprit_fails() -> None:
    clock, fn = FakeClock(), Recorder(fail_on="poison")
    async with make(fn, clock) as q:
        futs = [q.enqueue(req(s, obs="poison" if s == "p" else None)) for s in ["a", "p", "b", "c"]]
        await settle()
        assert fn.calls == [["a", "p", "b", "c"], ["a"], ["p"], ["b"], ["c"]]
        assert futs[0].result() == "out-a" and futs[3].result() == "out-c"
        with pytest.raises(RuntimeError, match="cannot process poison"):
            futs[1].result()
        m = q.metrics
        assert (m.retried_batches, m.errors, m.completed, m.batches) == (1, 1, 3, 1)


@run
async def test_a_cancelled_error_from_the_batch_function_does_not_kill_the_worker() -> None:
    clock = FakeClock()

    async def fn(batch: list[InferenceRequest]) -> list[str]:
        if batch[0].observation == "cancel-me":
            raise asyncio.CancelledError
        return [r.session_id for r in batch]

    async with make(fn, clock, max_batch_size=1) as q:
        bad = q.enqueue(req("a", obs="cancel-me"))
        await settle()
        assert bad.done()
        with pytest.raises(InternalError, match="batch function was cancelled"):
            bad.result()
        good = q.enqueue(req("b"))
        await settle()
        assert good.result() == "b"


@run
async def test_wrong_result_count_is_an_internal_error_for_every_member() -> None:
    clock, fn = FakeClock(), Recorder(wrong_count=True)
    async with make(fn, clock, max_batch_size=2) as q:
        futs = [q.enqueue(req("a")), q.enqueue(req("b"))]
        await settle()
        for f in futs:
            with pytest.raises(InternalError, match="returned 1 results for 2 requests"):
                f.result()


@run
async def test_a_request_past_its_deadline_while_queued_never_runs() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_batch_size=8) as q:
        keep = q.enqueue(req("keep"))
        late = q.enqueue(req("late", deadline=0.25))
        await settle()
        clock.advance(0.25)
        await settle()
        with pytest.raises(DeadlineExceededError, match=r"deadline of 0\.25s"):
            late.result()
        assert fn.calls == [] and len(q) == 1
        clock.advance(T)
        await settle()
        assert fn.calls == [["keep"]] and keep.result() == "out-keep"
        assert q.metrics.timeouts == 1


@run
async def test_cancelling_frees_the_slot_and_skips_the_request() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_queue_size=3) as q:
        a = q.enqueue(req("a"))
        b = q.enqueue(req("b"))
        c = q.enqueue(req("c"))
        with pytest.raises(QueueFullError):
            q.enqueue(req("d"))
        b.cancel()
        await settle()
        assert len(q) == 2
        d = q.enqueue(req("d"))  # the freed slot is usable at once
        clock.advance(T)
        await settle()
        assert fn.calls == [["a", "c", "d"]]
        assert (a.result(), c.result(), d.result()) == ("out-a", "out-c", "out-d")
        assert q.metrics.cancellations == 1


@run
async def test_cancelling_during_the_batch_call_discards_only_that_result() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    async def slow(batch: list[InferenceRequest]) -> list[str]:
        await release.wait()
        return [r.session_id for r in batch]

    async with make(slow, clock, max_batch_size=2) as q:
        a, b = q.enqueue(req("a")), q.enqueue(req("b"))
        await settle()
        a.cancel()
        release.set()
        await settle()
        assert a.cancelled() and b.result() == "b"


@run
async def test_bounded_queue_rejects_at_once_and_counts_rejections() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock, max_queue_size=2, max_batch_size=8) as q:
        q.enqueue(req("a"))
        q.enqueue(req("b"))
        with pytest.raises(QueueFullError, match="limit"):
            q.enqueue(req("c"))
        assert q.metrics.rejections == 1
        assert q.metrics.queue_depth == 2


@run
async def test_metrics_report_histogram_fill_and_waits() -> None:
    clock, fn = FakeClock(), Recorder()
    async with make(fn, clock) as q:
        for i in range(4):
            q.enqueue(req(f"full{i}"))
        await settle()
        q.enqueue(req("solo"))
        await settle()
        clock.advance(T)
        await settle()
        m = q.metrics
        assert m.batches == 2 and m.requests == 5 and m.completed == 5
        assert m.batch_size_histogram == {1: 1, 4: 1}
        assert m.mean_batch_size == pytest.approx(2.5)
        assert m.fill_ratio == pytest.approx((1.0 + 0.25) / 2)
        assert m.queue_wait.count == 5
        assert m.queue_wait.max_s == pytest.approx(T)
        assert m.queue_wait.mean_s == pytest.approx(T / 5)
        assert m.queue_wait.p50_s == 0.0 and m.queue_wait.p99_s == pytest.approx(T)


@run
async def test_stop_fails_pending_requests_and_refuses_new_ones() -> None:
    clock, fn = FakeClock(), Recorder()
    q = make(fn, clock)
    with pytest.raises(ServiceUnavailableError, match="not running"):
        q.enqueue(req("early"))
    await q.start()
    pending = q.enqueue(req("a"))
    await settle()
    await q.stop()
    with pytest.raises(ServiceUnavailableError, match="stopped before this ran"):
        pending.result()
    with pytest.raises(ServiceUnavailableError):
        q.enqueue(req("late"))


@run
async def test_stop_fails_requests_whose_batch_is_running() -> None:
    clock = FakeClock()

    async def hang(batch: list[InferenceRequest]) -> list[str]:
        await asyncio.Event().wait()
        return []

    q = make(hang, clock, max_batch_size=1)
    await q.start()
    running = q.enqueue(req("a"))
    await settle()
    await q.stop()
    with pytest.raises(ServiceUnavailableError):
        running.result()


@run
async def test_stop_with_drain_runs_everything_queued_without_waiting_for_t() -> None:
    clock, fn = FakeClock(), Recorder()
    q = make(fn, clock)
    await q.start()
    futs = [q.enqueue(req(f"s{i}", key=f"k{i % 2}")) for i in range(5)]
    await settle()
    await q.stop(drain=True)
    assert [f.result() for f in futs] == [f"out-s{i}" for i in range(5)]
    assert fn.calls == [["s0", "s2", "s4"], ["s1", "s3"]]


@run
async def test_invalid_num_samples_is_refused_at_enqueue() -> None:
    async with make(Recorder(), FakeClock()) as q:
        with pytest.raises(InvalidRequestError, match="num_samples"):
            q.enqueue(req("a", n=0))


@run
async def test_submit_with_the_real_clock() -> None:
    async def double(batch: list[InferenceRequest]) -> list[int]:
        return [2 * int(r.observation) for r in batch]

    async with InferenceQueue(double, max_batch_size=8, max_wait_s=0.001) as q:
        out = await asyncio.gather(*(q.submit(req(str(i), obs=i)) for i in range(20)))
    assert out == [2 * i for i in range(20)]


arrivals = st.lists(
    st.tuples(
        st.sampled_from(["A", "B", "C"]),  # compat key
        st.integers(1, 5),  # num_samples
        st.integers(0, 6),  # clock ticks after this arrival
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(arrivals=arrivals, b=st.integers(1, 6))
def test_batching_invariants_hold_for_random_arrivals(
    arrivals: list[tuple[str, int, int]], b: int
) -> None:
    tick = 0.125  # exact in binary, so waits compare exactly against T

    async def scenario() -> None:
        clock = FakeClock()
        batches: list[list[InferenceRequest]] = []
        dispatched_at: dict[str, float] = {}

        async def fn(batch: list[InferenceRequest]) -> list[str]:
            batches.append(batch)
            for r in batch:
                dispatched_at[r.session_id] = clock.now()
            return [r.session_id for r in batch]

        arrived: dict[str, float] = {}
        async with make(fn, clock, max_batch_size=b) as q:
            futs = []
            for i, (key, n, ticks) in enumerate(arrivals):
                sid = f"r{i}"
                arrived[sid] = clock.now()
                futs.append((sid, q.enqueue(req(sid, key, n))))
                await settle()
                for _ in range(ticks):
                    clock.advance(tick)
                    await settle()
            for _ in range(int(T / tick)):
                clock.advance(tick)
                await settle()
            for sid, fut in futs:
                assert fut.result() == sid  # each request got exactly its own result
        keys = {f"r{i}": k for i, (k, _, _) in enumerate(arrivals)}
        order = {f"r{i}": i for i in range(len(arrivals))}
        for batch in batches:
            assert len({r.compat_key for r in batch}) == 1
            samples = sum(r.num_samples for r in batch)
            assert samples <= b or len(batch) == 1
        for key in set(keys.values()):  # FIFO within a compatibility group
            seq = [order[r.session_id] for batch in batches for r in batch if r.compat_key == key]
            assert seq == sorted(seq)
        for sid, t in dispatched_at.items():  # nobody waits longer than T
            assert t - arrived[sid] <= T

    asyncio.run(scenario())
