"""Slots of a front's shared-memory block: what goes in comes out, and a full ring or
an oversized observation falls back to the frame."""

from __future__ import annotations

import asyncio
from multiprocessing import shared_memory

import numpy as np

from joynexus.server.front.channel import SlotRing, encode_frame, read_frame, take_arrays


def test_slots_round_trip_and_fall_back_when_full_or_too_big() -> None:
    block = shared_memory.SharedMemory(create=True, size=2 * 8192)
    try:
        ring = SlotRing(block, 2)
        rng = np.random.default_rng(0)
        a = {
            "cam:top": rng.integers(0, 255, (1, 9, 7, 3), dtype=np.uint8),
            "state": rng.normal(size=(1, 5)).astype(np.float32),
        }
        b = {"state": rng.normal(size=(2, 3)).astype(np.float64)}
        first, second = ring.put(a), ring.put(b)
        assert first is not None and second is not None and first[0] != second[0]
        assert ring.put(b) is None  # every slot taken
        got_a, got_b = take_arrays(block, first[1]), take_arrays(block, second[1])
        for want, got in ((a, got_a), (b, got_b)):
            assert got.keys() == want.keys()
            for k in want:
                assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
        ring.release(first[0])
        again = ring.put({"state": np.ones((1, 5), np.float32)})
        assert again is not None and again[0] == first[0]
        assert np.array_equal(got_a["state"], a["state"])  # copies: the reuse left them be
        assert ring.put({"x": np.zeros(10_000, np.uint8)}) is None  # larger than a slot
    finally:
        block.close()
        block.unlink()


def test_frames_carry_tuples() -> None:
    async def run() -> tuple[object, ...]:
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame(("predict", 3, {"x": np.arange(4)})))
        reader.feed_eof()
        return await read_frame(reader)

    kind, n, payload = asyncio.run(run())
    assert (kind, n) == ("predict", 3) and np.array_equal(payload["x"], np.arange(4))
