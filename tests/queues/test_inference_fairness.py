"""A tenant flooding the Inference Queue within its quota must not starve another
(issue 28 item 3): the victim's queue wait is measured on a FakeClock, each batch
costing one fixed tick, so the figures are exact and nothing depends on wall time."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from joynexus.queues.inference import InferenceQueue, InferenceRequest
from joynexus.utils.clock import FakeClock

B = 4
BATCH_S = 0.01  # fake seconds one batch holds the backbone
FLOOD_DEPTH = 200  # the flooder keeps this many requests queued at all times
VICTIM_REQUESTS = 50


def _req(tenant: str, i: int) -> InferenceRequest:
    return InferenceRequest(
        tenant_id=tenant,
        session_id=f"{tenant}-{i}",
        schema_signature="sig",
        policy_version=0,
        observation=i,
        compat_key="backbone",  # one shared backbone: every tenant is compatible
    )


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


async def _victim_waits() -> tuple[list[float], int]:
    clock = FakeClock()
    flood: list[asyncio.Future[Any]] = []
    sent = 0

    def top_up(queue: InferenceQueue) -> None:
        nonlocal sent
        while sum(not f.done() for f in flood[-FLOOD_DEPTH:]) < FLOOD_DEPTH:
            flood.append(queue.enqueue(_req("flooder", sent)))
            sent += 1

    async def batch(requests: list[InferenceRequest]) -> list[int]:
        clock.advance(BATCH_S)  # the batch holds the backbone for one tick
        await asyncio.sleep(0)
        return [r.observation for r in requests]

    queue = InferenceQueue(batch, max_batch_size=B, max_wait_s=1.0, clock=clock)
    waits: list[float] = []
    async with queue:
        top_up(queue)
        for i in range(VICTIM_REQUESTS):  # closed loop: one request at a time
            t0 = clock.now()
            fut = queue.enqueue(_req("victim", i))
            while not fut.done():
                top_up(queue)
                await asyncio.sleep(0)
            assert fut.result() == i
            waits.append(clock.now() - t0)
        for f in flood:
            f.cancel()
    return waits, sent


def test_a_flooding_tenant_does_not_starve_another() -> None:
    waits, flooded = asyncio.run(_victim_waits())
    assert flooded > VICTIM_REQUESTS * B  # the flood really was there all along
    p99 = _p99(waits)
    print(f"victim wait under a flood: p99 {p99 * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms")
    # Round-robin: the victim's request rides in the next batch. FIFO would make it
    # wait behind the whole flood, FLOOD_DEPTH / B batches.
    assert max(waits) <= BATCH_S + 1e-9, waits
    assert p99 <= BATCH_S + 1e-9
