"""One tenant's large request or flood cannot push another's back by more than one
share (issue 43 item 6): a tenant puts at most C samples into a batch, and a batch's
turns start with the tenant served longest ago, so a request that arrives while the
flooder's batch runs rides in the very next batch. Time is a FakeClock; each batch
costs one fixed tick, so waits are exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from joynexus.errors import InvalidRequestError
from joynexus.queues.inference import InferenceQueue, InferenceRequest
from joynexus.utils.clock import FakeClock

B = 128
C = 32
BATCH_S = 0.5  # fake seconds one batch holds the backbone
T = 1.0


def _req(tenant: str, label: str, n: int) -> InferenceRequest:
    return InferenceRequest(
        tenant_id=tenant,
        session_id=label,
        schema_signature="sig",
        policy_version=0,
        observation=label,
        num_samples=n,
        compat_key="backbone",
    )


class _Device:
    """Fake batch function: one tick per batch; records each batch's (label, rows) and
    runs ``during[i]`` (if any) while batch i holds the device."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.batches: list[list[tuple[str, int]]] = []
        self.during: dict[int, Callable[[], None]] = {}

    async def __call__(self, batch: list[InferenceRequest]) -> list[str]:
        index = len(self.batches)
        self.batches.append([(r.session_id, r.num_samples) for r in batch])
        hook = self.during.get(index)
        if hook is not None:
            hook()
        self.clock.advance(BATCH_S)
        await asyncio.sleep(0)
        return [str(r.observation) for r in batch]


def _chunks(tenant: str, rows: int, c: int) -> list[InferenceRequest]:
    """A ``rows``-row predict as the Inference Model Service queues it: c-row pieces."""
    return [_req(tenant, f"{tenant}{i // c}", min(c, rows - i)) for i in range(0, rows, c)]


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def _rows_of(batch: list[tuple[str, int]], tenant: str) -> int:
    return sum(n for label, n in batch if label.startswith(tenant))


def test_a_one_row_request_arriving_during_a_large_predict_waits_one_share() -> None:
    """A 256-row predict of tenant a (8 pieces of C) is running; tenant b's one-row
    request arrives during the first batch and rides in the second, beside one more
    piece of a: it waits one batch of C rows, not the whole predict."""

    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(
            device, max_batch_size=B, max_wait_s=T, clock=clock, max_tenant_samples=C
        )
        async with queue:
            big = [queue.enqueue(r) for r in _chunks("a", 256, C)]
            victim: list[asyncio.Future[Any]] = []
            times: list[float] = []

            def arrive() -> None:
                times.append(clock.now())
                victim.append(queue.enqueue(_req("b", "b0", 1)))
                victim[0].add_done_callback(lambda _f: times.append(clock.now()))

            device.during[0] = arrive
            await asyncio.gather(*big)
            assert victim and await victim[0] == "b0"
        # The rest of the first batch, then its own: two ticks, not eight.
        assert times[1] - times[0] == pytest.approx(2 * BATCH_S)
        first, second = device.batches[0], device.batches[1]
        # The first batch held one piece of a (C rows), never B rows of it.
        assert first == [("a0", C)]
        # b, arrived mid-batch, went first in the next batch, beside one piece of a.
        assert second[0] == ("b0", 1)
        assert _rows_of(second, "a") == C
        assert len(device.batches) == 8  # every piece of a ran, one per batch

    asyncio.run(main())


def test_requests_queued_together_share_the_first_batch() -> None:
    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(
            device, max_batch_size=B, max_wait_s=T, clock=clock, max_tenant_samples=C
        )
        async with queue:
            futures = [queue.enqueue(r) for r in _chunks("a", 256, C)]
            futures.append(queue.enqueue(_req("b", "b0", 1)))
            await asyncio.gather(*futures)
        assert device.batches[0] == [("a0", C), ("b0", 1)]

    asyncio.run(main())


def test_a_flood_arriving_mid_batch_victim_waits_at_most_one_batch() -> None:
    """A flooder keeps 64-row requests (as 2 pieces of C) queued all the time; a
    closed-loop victim sends one row at a time, each arriving while a batch runs. Every
    victim request waits out the batch in flight and rides in the next one."""

    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(
            device, max_batch_size=B, max_wait_s=T, clock=clock, max_tenant_samples=C
        )
        flood: list[asyncio.Future[Any]] = []
        waits: list[float] = []
        async with queue:

            def top_up() -> None:
                while sum(not f.done() for f in flood) < 40:
                    flood.extend(queue.enqueue(r) for r in _chunks("a", 64, C))

            top_up()
            for i in range(20):
                sent: list[tuple[float, asyncio.Future[Any]]] = []

                def arrive(i: int = i, sent: list[Any] = sent) -> None:
                    sent.append((clock.now(), queue.enqueue(_req("b", f"b{i}", 1))))

                device.during[len(device.batches)] = arrive
                while not sent or not sent[0][1].done():
                    top_up()
                    await asyncio.sleep(0)
                waits.append(clock.now() - sent[0][0])
            for f in flood:
                f.cancel()
        # Arrived during batch k, answered with batch k + 1: the rest of the batch in
        # flight (< one tick) plus its own. FIFO, or a fixed rotation that put the
        # newcomer behind the flooder, would add whole batches of the flood.
        assert max(waits) <= 2 * BATCH_S + 1e-9, waits
        for batch in device.batches:
            assert _rows_of(batch, "a") <= C, batch

    asyncio.run(main())


def test_a_lone_tenant_fires_its_share_without_waiting_for_t() -> None:
    """Every queued tenant holds its share: waiting T cannot make the batch fuller."""

    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(
            device, max_batch_size=B, max_wait_s=T, clock=clock, max_tenant_samples=C
        )
        async with queue:
            start = clock.now()
            futures = [queue.enqueue(r) for r in _chunks("a", 64, C)]
            await _settle()
            assert device.batches == [[("a0", C)], [("a1", C)]]
            assert clock.now() - start == pytest.approx(2 * BATCH_S)  # T never waited
            await asyncio.gather(*futures)

    asyncio.run(main())


def test_a_tenant_share_holds_several_small_requests() -> None:
    """C bounds a tenant's samples per batch, not its requests."""

    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(
            device, max_batch_size=B, max_wait_s=0.0, clock=clock, max_tenant_samples=4
        )
        async with queue:
            futures = [queue.enqueue(_req("a", f"a{i}", 1)) for i in range(6)]
            futures.append(queue.enqueue(_req("b", "b0", 1)))
            await asyncio.gather(*futures)
        assert [_rows_of(b, "a") for b in device.batches] == [4, 2]
        assert ("b0", 1) in device.batches[0]

    asyncio.run(main())


def test_a_bad_share_is_refused() -> None:
    async def noop(batch: list[InferenceRequest]) -> list[None]:
        return [None] * len(batch)

    with pytest.raises(InvalidRequestError, match="max_tenant_samples"):
        InferenceQueue(noop, max_tenant_samples=0)


def test_a_newcomer_goes_before_the_tenant_just_served() -> None:
    """Without a share below B too: a request arriving while tenant a's first B-row
    piece runs is served next, not after a's second piece (the former rotation put a
    newcomer behind the tenant that had just opened a batch)."""

    async def main() -> None:
        clock = FakeClock()
        device = _Device(clock)
        queue = InferenceQueue(device, max_batch_size=B, max_wait_s=T, clock=clock)
        async with queue:
            big = [queue.enqueue(r) for r in _chunks("a", 2 * B, B)]
            victim: list[asyncio.Future[Any]] = []
            device.during[0] = lambda: victim.append(queue.enqueue(_req("b", "b0", 1)))
            await asyncio.gather(*big)
            assert await victim[0] == "b0"
        assert device.batches[1] == [("b0", 1)], device.batches

    asyncio.run(main())
