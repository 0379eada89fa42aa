"""Long operations as futures (Tinker style): submit now, poll or await the result later.

A route that starts something slow (a simulator worker, a training job, a rollout)
calls :meth:`FutureRegistry.submit` with a coroutine and answers ``202 {"future_id"}``
at once; ``GET /v1/futures/{id}`` reports its state and, once finished, its result or
its error body; ``?wait=<s>`` holds the poll open until the future finishes or ``wait``
seconds of the registry's clock pass. Futures are tenant-scoped: another tenant's id
answers 404 exactly as an unknown one does (ids carry a random part: nobody can probe
for them).

A finished future is kept ``retention_s`` (clock time) for a late poller, but only
``read_retention_s`` after its result was first read (or after a pending one was
cancelled), then forgotten; ``DELETE`` forgets a finished one at once. Only *pending*
futures are bounded by the tenant's ``max_pending_futures`` quota: finished ones are
history, and when a tenant's futures would pass ``max_per_tenant`` the oldest finished
ones are forgotten first, so history never locks a tenant out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from joynexus.errors import CapacityError, JoyNexusError, unknown_id
from joynexus.server.quotas import QuotaManager
from joynexus.utils.clock import Clock
from joynexus.utils.ids import random_id
from joynexus.utils.storage import as_storage_full

__all__ = ["FutureRef", "FutureRegistry", "FutureState", "FutureStatus"]

log = logging.getLogger("joynexus.server")


class FutureState(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FutureRef(BaseModel):
    """What a route that started a long operation answers (HTTP 202)."""

    model_config = ConfigDict(extra="forbid")

    future_id: str
    kind: str
    state: FutureState


class FutureStatus(BaseModel):
    """The state of one future; ``result`` once succeeded, ``error`` once failed."""

    model_config = ConfigDict(extra="forbid")

    future_id: str
    kind: str
    state: FutureState
    created_at: float
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass
class _Future:
    future_id: str
    tenant_id: str
    kind: str
    created_at: float
    task: asyncio.Task[dict[str, Any]]
    finished_at: float | None = None
    finished_mono: float | None = None
    #: Clock time after which a finished future is forgotten early (read or cancelled).
    forget_at: float | None = None
    forget_after_s: float | None = None  # set by a cancel: applied once it has finished
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def status(self) -> FutureStatus:
        state, result, error = FutureState.PENDING, None, None
        if self.task.done():
            if self.task.cancelled():
                state = FutureState.CANCELLED
            elif (exc := self.task.exception()) is not None:
                state = FutureState.FAILED
                error = _error_body(exc, self.future_id)
            else:
                state, result = FutureState.SUCCEEDED, self.task.result()
        return FutureStatus(
            future_id=self.future_id,
            kind=self.kind,
            state=state,
            created_at=self.created_at,
            finished_at=self.finished_at,
            result=result,
            error=error,
        )


def _error_body(exc: BaseException, future_id: str) -> dict[str, Any]:
    # A full disk is the reason whatever layer wrapped it (a safetensors or SQLite
    # error, an InternalError around it): storage_full, never internal_error.
    full = as_storage_full(exc, "the operation could not write")
    if full is not None:
        return full.to_dict()
    if isinstance(exc, JoyNexusError):
        return exc.to_dict()
    return {
        "code": "internal_error",
        "message": f"the operation failed with an internal error; quote future {future_id}",
        "details": {"future_id": future_id},
    }


class FutureRegistry:
    """Tenant-scoped futures over asyncio tasks.

    Args:
        clock: Source of timestamps, retention and long-poll waits.
        quotas: Checks the tenant's ``max_pending_futures``.
        retention_s: How long finished futures nobody has read stay readable.
        read_retention_s: How long a finished future stays readable after it was read.
        max_per_tenant: Futures (pending and retained) one tenant may hold; the oldest
            finished ones are forgotten to make room for a new one.
    """

    def __init__(
        self,
        clock: Clock,
        quotas: QuotaManager,
        *,
        retention_s: float,
        read_retention_s: float = 60.0,
        max_per_tenant: int,
    ) -> None:
        self._clock = clock
        self._quotas = quotas
        self._retention_s = retention_s
        self._read_retention_s = min(read_retention_s, retention_s)
        self._max_per_tenant = max_per_tenant
        self._futures: dict[str, _Future] = {}

    def submit(
        self,
        tenant_id: str,
        kind: str,
        work: Callable[[], Awaitable[dict[str, Any]]],
        *,
        max_pending: int,
    ) -> FutureRef:
        """Start ``work()`` as a task owned by ``tenant_id``.

        Finished futures never count against a quota: when the tenant holds
        ``max_per_tenant`` futures, its oldest finished ones are forgotten first.

        Raises:
            QuotaExceededError: the tenant already has ``max_pending`` unfinished futures.
            CapacityError: the tenant has ``max_per_tenant`` futures all still pending.
        """
        self._expire()
        mine = [f for f in self._futures.values() if f.tenant_id == tenant_id]
        pending = sum(1 for f in mine if not f.task.done())
        self._quotas.check_count(
            tenant_id, "pending_futures", pending, 1, max_pending, "unfinished operations"
        )
        finished = sorted(
            (f for f in mine if f.task.done()), key=lambda f: (f.forget_at is None, f.created_at)
        )
        while len(mine) >= self._max_per_tenant and finished:
            oldest = finished.pop(0)
            del self._futures[oldest.future_id]
            mine.remove(oldest)
        if len(mine) >= self._max_per_tenant:
            raise CapacityError(
                f"tenant {tenant_id!r} has {len(mine)} operations still pending, the "
                "server's limit of futures per tenant; wait for some to finish or cancel them",
                limit=self._max_per_tenant,
            )
        future_id = random_id("fut")

        async def run() -> dict[str, Any]:
            return await work()

        def on_done(_: asyncio.Task[dict[str, Any]]) -> None:
            # A callback, not a ``finally``: it also runs for a task cancelled before it
            # ever started, which would otherwise never expire.
            fut.finished_at = self._clock.wall()
            fut.finished_mono = self._clock.now()
            if fut.forget_after_s is not None:
                fut.forget_at = fut.finished_mono + fut.forget_after_s
            fut.done.set()

        task = asyncio.get_running_loop().create_task(run(), name=future_id)
        fut = _Future(future_id, tenant_id, kind, self._clock.wall(), task)
        task.add_done_callback(on_done)
        task.add_done_callback(self._log_unexpected)
        self._futures[future_id] = fut
        return FutureRef(future_id=future_id, kind=kind, state=FutureState.PENDING)

    @staticmethod
    def _log_unexpected(task: asyncio.Task[dict[str, Any]]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, JoyNexusError):
            log.error("future %s failed", task.get_name(), exc_info=exc)

    def _owned(self, tenant_id: str, future_id: str) -> _Future:
        self._expire()
        fut = self._futures.get(future_id)
        if fut is None or fut.tenant_id != tenant_id:
            # Another tenant's future answers exactly as an unknown one: no existence oracle.
            raise unknown_id("future", future_id)
        return fut

    def _read(self, fut: _Future) -> FutureStatus:
        """``fut``'s status; a finished one delivered to its tenant expires soon after."""
        status = fut.status()
        if fut.finished_mono is not None and status.state is not FutureState.PENDING:
            soon = self._clock.now() + self._read_retention_s
            fut.forget_at = soon if fut.forget_at is None else min(fut.forget_at, soon)
        return status

    async def get(self, tenant_id: str, future_id: str, wait_s: float = 0.0) -> FutureStatus:
        """The future's status, after waiting up to ``wait_s`` clock seconds for it to finish."""
        fut = self._owned(tenant_id, future_id)
        if wait_s > 0 and not fut.task.done():
            sleeper = asyncio.ensure_future(self._clock.sleep(wait_s))
            waiter = asyncio.ensure_future(fut.done.wait())
            try:
                await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waiter.cancel()
        return self._read(fut)

    def cancel(self, tenant_id: str, future_id: str) -> FutureStatus:
        """Cancel a pending future; it is kept ``read_retention_s`` once it has stopped."""
        fut = self._owned(tenant_id, future_id)
        if not fut.task.done():
            fut.forget_after_s = self._read_retention_s
            fut.task.cancel()
            return fut.status()
        return self._read(fut)

    def delete(self, tenant_id: str, future_id: str) -> FutureStatus:
        """Forget a finished future now, or cancel a pending one (see :meth:`cancel`).

        Returns:
            The future's last status (a pending one's as the cancel found it).
        """
        fut = self._owned(tenant_id, future_id)
        if not fut.task.done() or fut.finished_mono is None:
            return self.cancel(tenant_id, future_id)
        del self._futures[future_id]
        return fut.status()

    def list(self, tenant_id: str) -> list[FutureStatus]:
        self._expire()
        return [self._read(f) for f in self._futures.values() if f.tenant_id == tenant_id]

    def _expire(self) -> None:
        now = self._clock.now()
        cutoff = now - self._retention_s
        for fid in [
            fid
            for fid, f in self._futures.items()
            if f.finished_mono is not None
            and (f.finished_mono <= cutoff or (f.forget_at is not None and f.forget_at <= now))
        ]:
            del self._futures[fid]

    async def aclose(self) -> None:
        """Cancel every pending future (server shutdown)."""
        tasks = [f.task for f in self._futures.values() if not f.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
