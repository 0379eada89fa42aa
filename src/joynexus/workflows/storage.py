"""Waiting out a full disk: a job's terminal state is recorded, late, never lost.

The Training Scheduler writes every transition to SQLite before it returns; on a full
disk the write fails (:class:`~joynexus.errors.StorageFullError`) and the scheduler
falls back to its last committed state. A loop that gave up there would leave the job
in flight with its partition already cleared: once its lease expired it was leased
again, found no partition (``partition_not_found``) and counted against its workload.
So a loop that ends a job retries the transition, backing off on the injected clock,
until the disk takes it; the tenant shows the fault meanwhile, and the fault clears
with the first write that succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from joynexus.errors import StorageFullError
from joynexus.utils.storage import storage_full_cause
from joynexus.workflows.context import (
    STORAGE_BACKOFF_S,
    STORAGE_FULL_REASON,
    WorkflowContext,
    reason_of,
)

__all__ = [
    "STORAGE_RETRY_MAX_S",
    "FailedIteration",
    "fail_until_stored",
    "failure_reason",
    "until_stored",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest back-off between two tries of a write while the disk is full: how long
#: training may sit after space returned before it notices.
STORAGE_RETRY_MAX_S = 2.0


def failure_reason(error: BaseException) -> str:
    """The terminal reason of a job failed by ``error``: ``storage_full`` for a full
    disk from any layer and ``cancelled`` for a shutdown (neither counts against the
    workload), else the error's code and message."""
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if storage_full_cause(error) is not None:
        return STORAGE_FULL_REASON
    return reason_of(error)


async def until_stored(
    ctx: WorkflowContext, tenant_id: str, write: Callable[[], T], what: str
) -> T:
    """``write()`` — a scheduler transition — retried while the disk is full.

    Args:
        tenant_id: Whose fault it shows meanwhile (when it shows none already).
        what: What is being recorded, for the fault ("job j-1's end").

    Raises:
        Whatever ``write`` raised but a full disk; CancelledError (a shutdown).
    """
    delay = max(ctx.poll_s, 0.01)
    shown: str | None = None
    while True:
        try:
            result = write()
        except StorageFullError as error:
            tenant = ctx.tenants.get(tenant_id)
            if tenant is not None and tenant.fault is None:
                shown = tenant.fault = (
                    f"{what} cannot be recorded: {error.message}; training resumes by "
                    "itself once space is freed"
                )
                log.error("tenant %s: %s", tenant_id, shown)
            await ctx.clock.sleep(delay)
            delay = min(2 * delay, STORAGE_RETRY_MAX_S)
            continue
        tenant = ctx.tenants.get(tenant_id)
        if shown is not None and tenant is not None and tenant.fault == shown:
            tenant.fault = None
        return result


async def fail_until_stored(ctx: WorkflowContext, job_id: str, tenant_id: str, reason: str) -> None:
    """Fail a job that is still live with ``reason``, waiting out a full disk (a job
    that ended meanwhile — expired, failed by someone else — is left as it is)."""

    def fail() -> None:
        if not ctx.scheduler.get(job_id).is_terminal:
            ctx.scheduler.fail(job_id, reason)

    await until_stored(ctx, tenant_id, fail, f"job {job_id}'s end")


class FailedIteration:
    """How a serving loop (an RL stage, the actor) waits after an iteration that raised.

    It never goes round again at once. A failure raised before the iteration's first
    ``await`` (a lease the full disk refused) would otherwise spin without yielding: the
    event loop starves every other task, and a warning per spin fills memory with
    millions of lines. A full disk is logged once per episode and backed off like the
    producers; any other failure waits ``ctx.poll_s``.
    """

    def __init__(self, ctx: WorkflowContext, what: str) -> None:
        self._ctx = ctx
        self._what = what
        self._full = False  # a full-disk episode is logged once, at its start

    async def after(self, error: Exception) -> None:
        """Log ``error`` and wait before the loop's next iteration."""
        if storage_full_cause(error) is not None:
            if not self._full:
                log.error("%s: %s (waiting for disk space)", self._what, error)
            self._full = True
            await self._ctx.clock.sleep(max(self._ctx.poll_s, STORAGE_BACKOFF_S))
            return
        self._full = False
        log.warning("%s: %s", self._what, error)
        await self._ctx.clock.sleep(self._ctx.poll_s)

    def succeeded(self) -> None:
        """An iteration went through: the next full disk is a new episode."""
        self._full = False
