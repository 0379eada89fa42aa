"""A serving loop whose iteration fails before its first ``await`` must not spin.

The finding: on a full disk the scheduler's lease raised synchronously, the advantage
stage went round again at once, never yielded, starved the event loop and logged a
warning per spin (10 GB of captured log lines in one test).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from joynexus.errors import StorageFullError
from joynexus.utils.clock import FakeClock
from joynexus.workflows.actor import actor_consumer
from joynexus.workflows.context import STORAGE_BACKOFF_S, WorkflowContext
from joynexus.workflows.stages import advantage_stage

_SPIN_LIMIT = 50  # tries before the fake gives up: a spinning loop reaches it at once


class _FullDiskScheduler:
    """Every lease is refused as on a full disk, synchronously; then, once ``freed``,
    nothing is ready."""

    def __init__(self) -> None:
        self.leases = 0
        self.freed = False

    def _lease(self, *_: Any) -> None:
        self.leases += 1
        if self.leases >= _SPIN_LIMIT:
            raise asyncio.CancelledError  # ends a spinning loop so the test can fail
        if not self.freed:
            raise StorageFullError("could not persist 1 training-job change(s): disk is full")

    lease_stage = _lease
    lease_next = _lease

    async def async_wait_for_ready(self, *_: Any, timeout_s: float) -> None:
        await asyncio.sleep(0)


def _context(scheduler: _FullDiskScheduler, clock: FakeClock) -> WorkflowContext:
    return cast(
        WorkflowContext,
        type(
            "Ctx",
            (),
            {
                "scheduler": scheduler,
                "clock": clock,
                "poll_s": 0.05,
                "domain": "vla",
                "actor_group_size": 1,
                "ready_wait_s": 1.0,
                "commits_behind": {},
                "tenants": {},
            },
        )(),
    )


@pytest.mark.parametrize("loop", [advantage_stage, actor_consumer], ids=["stage", "actor"])
def test_a_lease_the_full_disk_refuses_backs_off_and_is_logged_once(
    loop: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        scheduler, clock = _FullDiskScheduler(), FakeClock()
        task = asyncio.create_task(loop(_context(scheduler, clock)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert scheduler.leases == 1, "the loop went round again without waiting"
        assert clock.pending_sleepers == 1
        clock.advance(STORAGE_BACKOFF_S * 0.9)
        await asyncio.sleep(0)
        assert scheduler.leases == 1, "the full disk's back-off was cut short"
        for expected in (2, 3, 4):
            clock.advance(STORAGE_BACKOFF_S)
            for _ in range(5):
                await asyncio.sleep(0)
            assert scheduler.leases == expected
        scheduler.freed = True  # space is back: the loop serves on
        clock.advance(STORAGE_BACKOFF_S)
        for _ in range(5):
            await asyncio.sleep(0)
        assert 5 <= scheduler.leases < _SPIN_LIMIT
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    refused = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
