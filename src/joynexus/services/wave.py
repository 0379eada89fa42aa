"""One wave of leased jobs, stepped in one worker thread (the pipelined actor).

A wave is the jobs of different tenants that train together: their k-th microbatches
share step k (:meth:`~joynexus.services.training.TrainingModelService.train_jobs`).
Each step is device work in a worker thread; reading a microbatch and beating the
jobs' leases belong to the event loop (the Training Queue and the Training Scheduler
live there). Handing every step to a thread and back cost the device two thread hops
and a turn of the loop between two steps — on a loop busy with other tenants' rollouts,
most of the device's idle time in the demo's SFT jobs (RESULTS §1.2). So the wave's
steps run back to back in ONE worker thread, and the loop serves it alongside:

* microbatch k + 1 is read on the loop (:func:`read_wave`) while step k runs, so the
  thread finds it ready;
* the leases of a step's jobs are beaten on the loop while the next step runs (the
  last step's by the caller); a beat that failed (a lost lease) stops the wave before
  the step after, as a failed read would;
* a job whose step failed drops the microbatch read ahead for it (``isolate``);
* cancelling the caller stops the thread before its next step (the running step ends
  first, as a step already handed to a thread always did).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from joynexus.models.execution.grouped_step import Outcome
from joynexus.queues.training import TrainingQueue
from joynexus.services.job_plan import JobPlan, Microbatch, read_microbatch

__all__ = ["read_wave", "run_wave"]

Step = Callable[[list[Microbatch], bool], list[Outcome]]
Ready = list[tuple[JobPlan, Microbatch]]
T = TypeVar("T")
#: How often a thread waiting on the loop checks whether the wave was stopped.
_POLL_S = 0.5
#: How far into a step the loop starts what the step's thread asked of it.
_LOOP_DELAY_S = 0.002


async def read_wave(
    queue: TrainingQueue, wave: Sequence[JobPlan], k: int, *, isolate: bool
) -> Ready:
    """Microbatch ``k`` of every plan of ``wave`` that has one and has not failed.

    With ``isolate`` a plan whose read fails keeps the error (``plan.error``) and is left
    out; without it the error propagates.
    """
    out: Ready = []
    for plan in wave:
        if k >= plan.num_microbatches or plan.error is not None:
            continue
        try:
            out.append((plan, await read_microbatch(queue, plan, k)))
        except Exception as error:
            if not isolate:
                raise
            plan.error = error
    return out


def _record(ready: Ready, outcomes: list[Outcome]) -> None:
    for (plan, item), outcome in zip(ready, outcomes, strict=True):
        if isinstance(outcome, Exception):
            plan.error = outcome
            continue
        result, stats = outcome
        plan.losses.append(result.loss)
        plan.samples += item.batch.batch_size
        plan.stats.setdefault("grad_norm", []).append(result.grad_norm)
        for name, value in stats.items():
            plan.stats.setdefault(name, []).append(value)


async def run_wave(
    queue: TrainingQueue,
    wave: Sequence[JobPlan],
    step: Step,
    beat: Callable[[list[JobPlan]], None],
    *,
    isolate: bool,
) -> None:
    """Train ``wave``'s microbatches, step k of every job together (see the module).

    Args:
        queue: Where the microbatches are read from.
        wave: Jobs of distinct tenants.
        step: The grouped step of one microbatch per job (runs in the worker thread).
        beat: Called on the loop after each step with the jobs that stepped.
        isolate: A job's failed read or step fails that job only.

    Raises:
        Whatever a read, a step or a beat raised (without ``isolate``; a beat always).
    """
    loop = asyncio.get_running_loop()
    steps = max(p.num_microbatches for p in wave)
    stop = threading.Event()
    pending: list[concurrent.futures.Future[Any]] = []
    tasks: list[asyncio.Task[Any]] = []

    def on_loop(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop once the step about to start is into its device work:
        the loop's Python then runs while the step's kernels hold no GIL, instead of
        holding up the step's own start."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def settle(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                future.cancel()
                return
            # The waiting thread may have cancelled the future meanwhile (a stop).
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                if (error := task.exception()) is not None:
                    future.set_exception(error)
                else:
                    future.set_result(task.result())

        def start() -> None:
            if stop.is_set() or future.cancelled():
                coro.close()
                future.cancel()
                return
            task = loop.create_task(coro)
            tasks.append(task)
            task.add_done_callback(settle)

        loop.call_soon_threadsafe(loop.call_later, _LOOP_DELAY_S, start)
        pending.append(future)
        return future

    def wait(future: concurrent.futures.Future[T]) -> T:
        # Never blocks past a stop: a loop shutting down may not run what was asked.
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except concurrent.futures.TimeoutError:
                if stop.is_set():
                    future.cancel()
                    raise concurrent.futures.CancelledError from None

    async def beat_on_loop(active: list[JobPlan]) -> None:
        beat(active)

    def run(ready: Ready) -> list[JobPlan]:
        """The steps; returns the jobs of the last one (the caller beats them)."""
        reads: concurrent.futures.Future[Ready] | None = None
        beats: concurrent.futures.Future[None] | None = None
        active: list[JobPlan] = []
        for k in range(steps):
            if reads is not None:
                ready, reads = wait(reads), None
            if beats is not None:
                # Asked of the loop before the last step, so it ran meanwhile: a lost
                # lease stops the wave here.
                wait(beats)
                beats = None
            if stop.is_set():
                return []
            ready = [(p, it) for p, it in ready if p.error is None]
            if k + 1 < steps:
                reads = on_loop(read_wave(queue, wave, k + 1, isolate=isolate))
            if not ready:
                continue
            if active:  # the previous step's jobs, beaten while this step runs
                beats = on_loop(beat_on_loop(active))
            _record(ready, step([it for _, it in ready], isolate))
            active = [p for p, _ in ready]
        if beats is not None:
            wait(beats)
        return active

    try:
        # Microbatch 0 is read here, on the loop, before the thread starts.
        first = await read_wave(queue, wave, 0, isolate=isolate)
        last = await asyncio.to_thread(run, first)
        if last:
            beat(last)
    finally:
        # A failed or cancelled wave: the thread stops before its next step, and what it
        # asked of the loop is not wanted (a cancelled future also wakes a waiting thread).
        stop.set()
        for future in pending:
            future.cancel()
        for task in tasks:
            task.cancel()
