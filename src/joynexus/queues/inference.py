"""The Inference Queue and its group-batching scheduler (paper §4.3, Appendix A.3).

Rollout and evaluation sessions ``enqueue`` one :class:`InferenceRequest` per
environment step and await the returned future. One worker task forms batches of
*compatible* requests — equal ``compat_key``, the key of the shared frozen-prefix
interface (see :func:`joynexus.models.schema.prefix_key`), never the tenant — and
hands each batch to the injected batch function (the Inference Model Service's
encode + per-tenant decode). Each request gets its own result or its own error.

Batching policy (B = ``max_batch_size`` in samples, T = ``max_wait_s``):

* **Head-first, compatible-skip.** The *head* is the oldest queued request. Its batch
  takes queued requests with the head's ``compat_key`` until adding the next one would
  pass B samples; incompatible requests in between are skipped over, not blocking the
  head's group (a strict prefix would make interleaved tenants run at batch size 1).
* **Fair across tenants.** Within a group, a batch takes requests round-robin over the
  tenants that have some queued — one request of each in turn, FIFO within a tenant —
  the turns starting with the tenant served longest ago (a tenant that has just
  arrived counts as never served; ties go to the older request). A tenant puts at most
  C samples (``max_tenant_samples``) into one batch. So a tenant that floods the queue
  (within its rate quota) gets one share per batch like everyone else, and another
  tenant's request — even one that arrives while the flooder's batch runs — rides in
  the next batch: it waits at most one batch in which the flooder holds ≤ C samples.
  (The service splits a larger predict into C-row pieces, so C is the most any one
  tenant's work can push another's back.)
* **When a batch fires.** The head's batch fires when the head has waited T, or when
  its group is *full*: it holds ≥ B samples, or every tenant in it has ≥ C queued (its
  batch cannot grow until another tenant arrives). A group other than the head's fires
  early only when it is full (a full batch gains nothing by waiting); the oldest such
  group goes first. Time is read from the injected :class:`~joynexus.utils.clock.Clock`.
* **No starvation.** A full non-head group can overtake the head only while the head
  has waited less than T; once the head is due, it fires next. So after a request R
  has waited T, every batch that runs before R's own is headed by a request older than
  R: R is overtaken by younger requests only during its first T, and its total wait is
  bounded by T plus the time to serve the requests queued before it. Within a tenant
  of a group, order is strictly FIFO.
* **Oversize requests.** The queue never splits a request. One with ``num_samples`` > B
  runs alone, as its own batch, as soon as it reaches the front of its group (it
  counts as a full group); one with more than C samples is its tenant's whole share of
  a batch. The batch function receives it whole.
* **One batch at a time.** The worker awaits the batch function before forming the
  next batch, so requests arriving meanwhile accumulate into a fuller next batch.

Error isolation:

* ``validate`` (optional) runs inside :meth:`InferenceQueue.enqueue`; a request it
  rejects never enters the queue and its future carries the error
  (:class:`~joynexus.errors.InvalidRequestError` unless the validator raised another
  JoyNexus error).
* If the batch function raises for a batch of several requests, each member is retried
  alone, so only the culprit's future gets the exception.
* If it returns a number of results different from the number of requests, every
  member fails with :class:`~joynexus.errors.InternalError` (results cannot be matched).
* ``deadline_s`` bounds the time a request may spend *queued*: one still queued at its
  deadline fails with :class:`~joynexus.errors.DeadlineExceededError` and never runs.
  Once dispatched, a request runs to completion (wrap the await in
  :func:`asyncio.wait_for` to bound the total). Deadlines that pass while a batch is
  running are enforced as soon as that batch returns.
* Cancelling the returned future frees the request's queue slot at once; it is not
  sent to the batch function.
* :meth:`InferenceQueue.stop` fails queued and running requests with
  :class:`~joynexus.errors.ServiceUnavailableError` (``stop(drain=True)`` first runs
  everything queued, without waiting for T).

Cost: ``enqueue`` is O(1) (O(log n) with a deadline); forming a batch scans the
distinct compatibility keys queued, not the requests. Use the queue from one event
loop: ``enqueue`` must be called on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from joynexus.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidRequestError,
    JoyNexusError,
    QueueFullError,
    ServiceUnavailableError,
)
from joynexus.queues.inference_entries import _DISPATCHED, _DONE, _QUEUED, _Entry, _Group
from joynexus.queues.inference_metrics import InferenceQueueMetrics, QueueWaitStats, _Counters
from joynexus.queues.request import BatchFn, InferenceRequest, ValidateFn
from joynexus.utils.clock import Clock, SystemClock

_log = logging.getLogger(__name__)

__all__ = [
    "BatchFn",
    "InferenceQueue",
    "InferenceQueueMetrics",
    "InferenceRequest",
    "QueueWaitStats",
    "ValidateFn",
]


class InferenceQueue:
    """Bounded request queue plus the group-batching worker (see module docstring).

    Args:
        batch_fn: Async function run on each formed batch; one result per request.
        max_batch_size: B, the target batch size in samples.
        max_wait_s: T, the longest the oldest request waits for a fuller batch.
        max_queue_size: Queued requests beyond which ``enqueue`` rejects at once.
        clock: Time source (tests pass a FakeClock).
        validate: Optional per-request check run at ``enqueue``.
        max_tenant_samples: C, the most samples one tenant puts into one batch (a
            single larger request still runs, as its tenant's whole share); None: B.

    Raises:
        InvalidRequestError: a bound below 1 (or a negative T).
    """

    def __init__(
        self,
        batch_fn: BatchFn,
        *,
        max_batch_size: int = 128,
        max_wait_s: float = 0.005,
        max_queue_size: int = 4096,
        clock: Clock | None = None,
        validate: ValidateFn = None,
        max_tenant_samples: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise InvalidRequestError(f"max_batch_size must be ≥ 1, got {max_batch_size}")
        if max_tenant_samples is not None and max_tenant_samples < 1:
            raise InvalidRequestError(f"max_tenant_samples must be ≥ 1, got {max_tenant_samples}")
        if not max_wait_s >= 0:
            raise InvalidRequestError(f"max_wait_s must be ≥ 0, got {max_wait_s}")
        if max_queue_size < 1:
            raise InvalidRequestError(f"max_queue_size must be ≥ 1, got {max_queue_size}")
        self._batch_fn = batch_fn
        self._b = max_batch_size
        self._c = min(max_batch_size, max_tenant_samples or max_batch_size)
        self._t = float(max_wait_s)
        self._cap = max_queue_size
        self._clock: Clock = clock or SystemClock()
        self._validate = validate
        self._groups: dict[str, _Group] = {}
        self._deadlines: list[tuple[float, _Entry]] = []
        self._size = 0
        self._seq = 0
        self._stats = _Counters()
        self._inflight: list[_Entry] = []
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._draining = False
        self._waiter: asyncio.Future[None] | None = None
        self._wake_at = math.inf

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the batching worker on the running event loop (idempotent)."""
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._draining = False
        self._worker = self._loop.create_task(self._run(), name="inference-queue-worker")

    async def stop(self, *, drain: bool = False) -> None:
        """Stop the worker.

        Args:
            drain: Run every queued request first (batches fire without waiting for
                T). Otherwise queued and in-flight requests fail with
                :class:`~joynexus.errors.ServiceUnavailableError`.
        """
        worker = self._worker
        if worker is None:
            return
        if drain and self._running and not worker.done():
            self._draining = True
            self._wake()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._running = False
        if not worker.done():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._worker = None
        self._fail_all(ServiceUnavailableError("the inference queue was stopped before this ran"))

    async def __aenter__(self) -> InferenceQueue:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._running and not self._draining

    def __len__(self) -> int:
        """Requests queued now (not counting the batch being run)."""
        return self._size

    # ---------------------------------------------------------------- enqueue

    def enqueue(self, request: InferenceRequest) -> asyncio.Future[Any]:
        """Queue a request; the future resolves to its result or error.

        Raises:
            ServiceUnavailableError: The queue is not running (or is draining).
            QueueFullError: ``max_queue_size`` requests are already queued.
            InvalidRequestError: ``num_samples`` is not a positive int.
        """
        if not self._running or self._draining or self._loop is None:
            raise ServiceUnavailableError(
                "the inference queue is not running; call start() (or use 'async with')"
            )
        n = request.num_samples
        if type(n) is not int or n < 1:
            raise InvalidRequestError(f"num_samples must be a positive int, got {n!r}")
        if self._size >= self._cap:
            self._stats.rejections += 1
            raise QueueFullError(
                f"the inference queue holds {self._size} requests, its limit; retry later",
                limit=self._cap,
            )
        future: asyncio.Future[Any] = self._loop.create_future()
        if self._validate is not None:
            try:
                self._validate(request)
            except Exception as exc:
                self._stats.validation_failures += 1
                future.set_exception(_as_invalid(exc))
                return future
        key = request.compat_key
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
        now = self._clock.now()
        expires_at = None if request.deadline_s is None else now + request.deadline_s
        self._seq += 1
        entry = _Entry(self, request, future, group, self._seq, now, expires_at)
        group.add(entry)
        self._size += 1
        self._stats.requests += 1
        future.add_done_callback(entry.on_done)
        wake_by = now + self._t
        if expires_at is not None:
            heapq.heappush(self._deadlines, (expires_at, entry))
            wake_by = min(wake_by, expires_at)
        # Wake the worker only when this request changes what it should do next: a
        # full group, or a time it must act by that is earlier than it planned.
        if (
            group.samples >= self._b
            or group.tenant_samples[request.tenant_id] >= self._c
            or wake_by < self._wake_at
        ):
            self._wake()
        return future

    async def submit(self, request: InferenceRequest) -> Any:
        """``enqueue`` and await the result."""
        return await self.enqueue(request)

    @property
    def metrics(self) -> InferenceQueueMetrics:
        return self._stats.snapshot(
            max_batch_size=self._b, max_wait_s=self._t, queue_depth=self._size
        )

    # ----------------------------------------------------------------- worker

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    def _discard(self, entry: _Entry) -> None:
        """Take a queued entry out of the counts (cancelled, expired or failed)."""
        if entry.state == _QUEUED:
            entry.state = _DONE
            entry.group.take(entry)
            self._size -= 1

    async def _run(self) -> None:
        try:
            while True:
                group, delay = self._next_action()
                if group is not None:
                    await self._fire(self._collect(group))
                    # Let enqueuers and resolved callers run between batches.
                    await asyncio.sleep(0)
                elif self._draining and self._size == 0:
                    return
                else:
                    await self._sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the worker: fail loudly, never hang callers
            _log.exception("inference queue worker crashed")
            self._running = False
            self._fail_all(InternalError(f"inference queue worker crashed: {exc!r}"))

    async def _sleep(self, delay: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer: asyncio.Task[None] | None = None
        if delay is not None:
            self._wake_at = self._clock.now() + delay
            timer = loop.create_task(self._clock.sleep(delay))
            # Bound to this waiter: a late callback must not wake a later sleep.
            timer.add_done_callback(lambda _t: _resolve(waiter))
        else:
            self._wake_at = math.inf
        try:
            await waiter
        finally:
            self._waiter = None
            self._wake_at = -math.inf  # while awake, nobody needs to wake us
            if timer is not None and not timer.done():
                timer.cancel()

    def _expire_due(self, now: float) -> None:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, entry = heapq.heappop(heap)
            if entry.state == _QUEUED and not entry.future.done():
                self._discard(entry)
                self._stats.timeouts += 1
                entry.future.set_exception(
                    DeadlineExceededError(
                        f"request of session {entry.request.session_id!r} waited "
                        f"{now - entry.t0:.6f}s in the inference queue, past its deadline of "
                        f"{entry.request.deadline_s}s",
                        tenant_id=entry.request.tenant_id,
                        session_id=entry.request.session_id,
                        deadline_s=entry.request.deadline_s,
                    )
                )

    def _next_action(self) -> tuple[_Group | None, float | None]:
        """The group to fire now, or (None, seconds to sleep; None = until woken)."""
        now = self._clock.now()
        self._expire_due(now)
        head_group: _Group | None = None
        head: _Entry | None = None
        full_group: _Group | None = None
        full_seq = 0
        empty: list[str] = []
        for key, group in self._groups.items():
            first = group.head()
            if first is None:
                empty.append(key)
                continue
            if head is None or first.seq < head.seq:
                head, head_group = first, group
            if group.full(self._b, self._c) and (full_group is None or first.seq < full_seq):
                full_group, full_seq = group, first.seq
        for key in empty:
            del self._groups[key]
        if head is None or head_group is None:
            return None, None
        due = head.t0 + self._t
        if now >= due or head_group is full_group or self._draining:
            return head_group, None
        if full_group is not None:
            return full_group, None
        wake = due
        if self._deadlines:
            wake = min(wake, self._deadlines[0][0])
        return None, max(0.0, wake - now)

    def _collect(self, group: _Group) -> list[_Entry]:
        """Take up to B samples of the group's queued requests: one request per tenant
        per turn (FIFO within each), the tenant served longest ago first, at most C
        samples of any one tenant."""
        now = self._clock.now()
        batch: list[_Entry] = []
        total = 0
        b, c = self._b, self._c
        shares: dict[str, int] = {}
        turns = group.turns()
        while turns:
            tenant = turns.popleft()
            e = group.tenant_head(tenant)
            if e is None:
                continue
            if total and total + e.n > b:
                break  # the next in turn does not fit: the batch is complete
            share = shares.get(tenant, 0)
            if share and share + e.n > c:
                continue  # the tenant has its share of this batch
            group.tenants[tenant].popleft()
            e.state = _DISPATCHED
            group.take(e)
            self._size -= 1
            batch.append(e)
            total += e.n
            shares[tenant] = share + e.n
            if total >= b:
                break
            turns.append(tenant)
        group.batches += 1
        for tenant in shares:
            group.served[tenant] = group.batches
        self._stats.record_batch(total, b)
        self._stats.record_waits([now - e.t0 for e in batch])
        return batch

    async def _fire(self, batch: list[_Entry]) -> None:
        # Not cleared on cancellation: stop() then fails the in-flight requests.
        self._inflight = batch
        try:
            results = await self._batch_fn([e.request for e in batch])
        except (Exception, asyncio.CancelledError) as exc:
            if _being_cancelled(exc):
                raise
            if len(batch) == 1:
                self._fail(batch[0], exc)
            else:
                self._stats.retried_batches += 1
                for e in batch:
                    await self._run_alone(e)
        else:
            self._deliver(batch, results)
        self._inflight = []

    async def _run_alone(self, entry: _Entry) -> None:
        if entry.future.done():  # cancelled meanwhile
            return
        try:
            results = await self._batch_fn([entry.request])
        except (Exception, asyncio.CancelledError) as exc:
            if _being_cancelled(exc):
                raise
            self._fail(entry, exc)
            return
        self._deliver([entry], results)

    def _deliver(self, batch: list[_Entry], results: Sequence[Any]) -> None:
        try:
            count = len(results)
        except TypeError:
            count = -1
        if count != len(batch):
            error = InternalError(
                f"the batch function returned {count if count >= 0 else 'no sequence of'} "
                f"results for {len(batch)} requests; it must return one result per request",
                expected=len(batch),
                got=count,
            )
            for e in batch:
                self._fail(e, error)
            return
        for e, result in zip(batch, results, strict=True):
            e.state = _DONE
            if not e.future.done():
                e.future.set_result(result)
                self._stats.completed += 1

    def _fail(self, entry: _Entry, error: BaseException) -> None:
        entry.state = _DONE
        if isinstance(error, asyncio.CancelledError):
            # Delivered as-is it would look to the caller as if *it* had been cancelled.
            cause = error
            error = InternalError("the batch function was cancelled while running this request")
            error.__cause__ = cause
        if not entry.future.done():
            entry.future.set_exception(error)
            self._stats.errors += 1

    def _fail_all(self, error: JoyNexusError) -> None:
        for e in self._inflight:
            self._fail(e, error)
        self._inflight = []
        for group in self._groups.values():
            for e in group.entries:
                if e.state == _QUEUED:
                    self._discard(e)
                    self._fail(e, error)
        self._groups.clear()
        self._deadlines.clear()


def _being_cancelled(exc: BaseException) -> bool:
    """True when ``exc`` cancels the worker itself, not a batch function's own cancellation.

    A batch function may let a CancelledError from its own internals escape; that must
    fail the batch like any error instead of silently ending the worker.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _as_invalid(exc: Exception) -> JoyNexusError:
    if isinstance(exc, JoyNexusError):
        return exc
    error = InvalidRequestError(f"request rejected by validation: {exc}")
    error.__cause__ = exc
    return error
