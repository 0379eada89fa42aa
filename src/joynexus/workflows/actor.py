"""The actor consumer (paper Figures 6–7 right, Appendix A.6).

The one consumer of ready RL and SFT jobs, exactly as App. A.6 composes it:

1. ``lease_next(actor, [domain])``; if nothing is ready, park on
   ``async_wait_for_ready`` (never a busy loop);
2. RL staleness, Eq. (1): ``v_actor − v_behavior > Δmax`` (``TrainingScheduler.is_stale``
   with the tenant's current training version) → clear the partition, then
   ``drop(policy_stale)``;
3. ``train_job`` (heartbeating the consumer lease between microbatches);
4. checkpoint: every update under the Master (``WorkflowContext.durable_checkpoints``,
   with a ledger naming the job), else every ``scheduling.checkpoint_every`` versions;
5. publish the new version to inference (``export_params`` → ``load_weights``) for RL
   tenants and for tenants an evaluation reads;
6. clear the partition, then ``complete`` with the actor versions in the metadata
   (4–6: :mod:`joynexus.workflows.commit`; under the Master an SFT job's 4–6 run behind
   the tenant's next update, ``WorkflowContext.overlap_updates``);
7. on an exception: best-effort clear, ``fail`` with the reason, re-raise.

Consumer groups (:func:`consume_training_jobs`, what :func:`actor_consumer` runs when
``WorkflowContext.actor_group_size`` > 1): after the first ``lease_next`` the actor
keeps leasing ready jobs while they belong to tenants not yet in the group, up to
``actor_group_size`` jobs, and trains them with ONE
``TrainingModelService.train_jobs_isolated`` call, so the k-th microbatches of the
group's tenants share one grouped backbone forward (paper §4.3, App. A.6). Everything
else stays per job: the staleness check (with the tenant's version at that moment),
publication, checkpointing, clearing and the terminal state; one job's failure fails
only that job. A leased job of a tenant already in the group is not trained in that
group (a tenant's updates are sequential): it keeps its lease (heartbeated with the
group) and is consumed alone right after, with its staleness checked then, exactly as
the single-job loop would. The look-ahead past such jobs is bounded (at most
``2 × actor_group_size`` leases per iteration).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from joynexus.control.job import JobState, TaskType, TrainingJob
from joynexus.errors import NotFoundError, StaleLeaseError
from joynexus.utils.storage import storage_full_cause
from joynexus.workflows.commit import (
    commit_behind,
    commit_update,
    drain_behind,
    settle_behind,
    take_update,
)
from joynexus.workflows.context import (
    ACTOR_ROLE,
    ROLE_RESTARTED_REASON,
    WorkflowContext,
    job_heartbeat,
    reason_of,
)
from joynexus.workflows.storage import (
    FailedIteration,
    fail_until_stored,
    failure_reason,
    until_stored,
)

__all__ = [
    "REASON_POLICY_STALE",
    "actor_consumer",
    "consume_training_job",
    "consume_training_jobs",
    "fail_job",
    "settle_committed",
]

REASON_POLICY_STALE = "policy_stale"

log = logging.getLogger(__name__)


def settle_committed(ctx: WorkflowContext, job: TrainingJob) -> bool:
    """Complete ``job`` if its update is in the tenant's latest checkpoint.

    The checkpoint is the commit point of an update: whatever fails after it
    (publication, clearing, the role itself) cannot take the update back, so the job
    counts as completed. Returns True when it did (or the job had completed already).
    """
    if ctx.in_checkpoint is None or not ctx.in_checkpoint(job):
        return False
    current = ctx.scheduler.get(job.job_id)
    if current.state is JobState.COMPLETED:
        return True
    if current.is_terminal:  # failed or dropped by someone else: leave it
        return False
    ctx.scheduler.complete_recovered(job.job_id)
    return True


async def _drop_stale(ctx: WorkflowContext, job: TrainingJob, actor_version: int) -> TrainingJob:
    """Eq. (1) violated: clear the partition, then drop the job."""
    await ctx.queue.async_clear(job.partition_id)
    dropped = ctx.scheduler.drop(job.job_id, REASON_POLICY_STALE, job.lease_epoch)
    tenant = ctx.tenants.get(job.tenant_id)
    if tenant is None:  # its workload ended meanwhile
        return dropped
    tenant.metrics.write(
        "dropped",
        job_id=job.job_id,
        behavior_version=job.behavior_policy_version,
        actor_version=actor_version,
    )
    return dropped


async def _has_slot(ctx: WorkflowContext, tenant_id: str) -> bool | None:
    """Whether the training role holds the tenant's slot (None: the role did not answer).

    In a thread: over Ray the getter is a blocking call to an actor that may be being
    re-created, and the event loop must go on meanwhile."""
    try:
        return tenant_id in await asyncio.to_thread(ctx.training.tenant_ids)
    except Exception:  # a role being re-created answers nothing for a while
        return None


async def _slot_lost(ctx: WorkflowContext, job: TrainingJob, error: BaseException) -> bool:
    """Whether ``error`` is the training role having lost the slot of a tenant whose
    workload is live — Ray re-created the role after its node was lost, and the
    Master's restart (:meth:`~joynexus.master.recovery.Recovery.restart_training`)
    has not rebuilt the slots yet. Waits up to ``ctx.slot_grace_s`` for the slot to
    come back: True when it did (the job was merely in flight during a role restart),
    False when the error is anything else or the slot stays gone (then the failure
    counts, and a role that never recovers ends the workload instead of looping)."""
    if not isinstance(error, NotFoundError) or ctx.slot_grace_s <= 0:
        return False
    if job.tenant_id not in ctx.tenants or await _has_slot(ctx, job.tenant_id):
        return False  # its workload ended, or the slot is there: a NotFound of its own
    log.warning(
        "actor: the training role holds no slot for live tenant %s (restarted?); waiting "
        "up to %.0f s for it to be rebuilt",
        job.tenant_id,
        ctx.slot_grace_s,
    )
    deadline = ctx.clock.now() + ctx.slot_grace_s
    while ctx.clock.now() < deadline and job.tenant_id in ctx.tenants:
        await ctx.clock.sleep(max(ctx.poll_s, 0.1))
        if await _has_slot(ctx, job.tenant_id):
            return True
    return False


async def fail_job(ctx: WorkflowContext, job: TrainingJob, error: BaseException) -> None:
    """Best-effort clear, then ``fail`` the job with the error's reason — or complete
    it when its update already reached the checkpoint (``ctx.in_checkpoint``), or fail
    it ``role_restarted`` when the training role had lost the tenant's slot
    (:func:`_slot_lost`). A full disk fails it ``storage_full`` (from any layer: the
    checkpoint writer, SQLite), and a terminal state the disk cannot take yet is
    retried until it can (:mod:`joynexus.workflows.storage`): the partition is gone,
    so the job must never be leased again."""
    await ctx.queue.async_clear(job.partition_id)
    tid = job.tenant_id
    if await until_stored(ctx, tid, lambda: settle_committed(ctx, job), f"job {job.job_id}"):
        log.warning(
            "actor: job %s failed after its update was checkpointed (%s); completed",
            job.job_id,
            reason_of(error),
        )
        return
    if ctx.scheduler.get(job.job_id).is_terminal:
        pass
    elif isinstance(error, asyncio.CancelledError) or storage_full_cause(error) is not None:
        # A cancel, or the service's fault: its slot rolled back.
        await fail_until_stored(ctx, job.job_id, tid, failure_reason(error))
    else:
        reason = ROLE_RESTARTED_REASON if await _slot_lost(ctx, job, error) else None
        await fail_until_stored(ctx, job.job_id, tid, reason or reason_of(error))
    tenant = ctx.tenants.get(tid)  # gone when its workload was cancelled
    if tenant is not None and not isinstance(error, asyncio.CancelledError):
        tenant.errors.append(reason_of(error))


def _rollbacks(ctx: WorkflowContext, job: TrainingJob) -> int:
    """The tenant's rollback count as ``job`` starts training (see ``_finish``)."""
    tenant = ctx.tenants.get(job.tenant_id)
    return tenant.rollbacks if tenant is not None else 0


async def _finish(
    ctx: WorkflowContext, job: TrainingJob, result: Any, rollbacks: int
) -> TrainingJob:
    """Steps 4–6 after a job trained: checkpoint, publish, clear, complete
    (:mod:`joynexus.workflows.commit`).

    The tenant's previous commit running behind is settled first (``rollbacks``: the
    tenant's count when this job started training; a rollback since fails the job).
    The checkpoint comes first: a version is served only once it is durable, so a
    restart never issues the same version number for other weights. Once started, the
    steps run to their end even if the actor is cancelled (a clean shutdown): a
    checkpoint holding the update of a job failed ``cancelled`` would leave the weights
    one update ahead of the completed jobs.

    Returns:
        The job completed; or still leased when its commit runs behind the tenant's
        next update (``ctx.overlap_updates``, SFT jobs).
    """

    async def run() -> TrainingJob:
        await settle_behind(ctx, job.tenant_id, rollbacks)
        taken = await take_update(ctx, job, result)
        if ctx.overlap_updates and job.task_type is TaskType.SFT:
            commit_behind(ctx, taken, fail_job)
            return ctx.scheduler.get(job.job_id)
        return await commit_update(ctx, taken)

    task = asyncio.ensure_future(run())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task  # bounded work: a save, a publication, one transaction
        raise


async def consume_training_job(ctx: WorkflowContext) -> TrainingJob | None:
    """One actor iteration (App. A.6 ``consume_training_job``).

    Returns:
        The job in its terminal state, or None when nothing was ready.

    Raises:
        Whatever ``train_job`` (or publication / checkpointing) raised, after the
        partition was cleared and the job failed.
    """
    sched = ctx.scheduler
    job = sched.lease_next(ACTOR_ROLE, [ctx.domain])
    if job is None:
        await sched.async_wait_for_ready(ACTOR_ROLE, [ctx.domain], timeout_s=ctx.ready_wait_s)
        return None
    return await _consume_leased(ctx, job)


async def _consume_leased(ctx: WorkflowContext, job: TrainingJob) -> TrainingJob:
    settle = functools.partial(settle_committed, ctx, job)
    if job.attempts > 0 and await until_stored(ctx, job.tenant_id, settle, f"job {job.job_id}"):
        # Leased again after its lease expired, but its update is in the checkpoint
        # already (its end could not be recorded then): complete it, never train it
        # twice — its partition was cleared with the commit.
        return ctx.scheduler.get(job.job_id)
    try:
        actor_version = ctx.training.policy_version(job.tenant_id)
        if ctx.scheduler.is_stale(job, actor_version):
            return await _drop_stale(ctx, job, actor_version)
        rollbacks = _rollbacks(ctx, job)
        result = await ctx.training.train_job(job, heartbeat=job_heartbeat(ctx.scheduler, job))
        return await _finish(ctx, job, result, rollbacks)
    except BaseException as error:
        await fail_job(ctx, job, error)
        raise


def _group_heartbeat(ctx: WorkflowContext, jobs: list[TrainingJob]) -> Callable[[], None]:
    beats = [job_heartbeat(ctx.scheduler, j) for j in jobs]

    def beat() -> None:
        # A job whose lease is lost fails on its own at complete(); the others go on.
        for one in beats:
            with contextlib.suppress(StaleLeaseError):
                one()

    return beat


async def consume_training_jobs(ctx: WorkflowContext) -> list[TrainingJob]:
    """One grouped actor iteration (see "Consumer groups" in the module docstring).

    Returns:
        Every leased job in its terminal state (empty when nothing was ready). A job
        whose training failed is returned failed; its error is on its tenant.

    Raises:
        CancelledError, or what the grouped call raised as a whole (a failed shared
        forward), after every job of the iteration was cleared and failed.
    """
    sched = ctx.scheduler
    first = sched.lease_next(ACTOR_ROLE, [ctx.domain])
    if first is None:
        await sched.async_wait_for_ready(ACTOR_ROLE, [ctx.domain], timeout_s=ctx.ready_wait_s)
        return []
    group = [first]
    carried: list[TrainingJob] = []
    # Bounded look-ahead past jobs of tenants already in the group (they stay leased).
    while len(group) < ctx.actor_group_size and len(group) + len(carried) < 2 * (
        ctx.actor_group_size
    ):
        nxt = sched.lease_next(ACTOR_ROLE, [ctx.domain])
        if nxt is None:
            break
        if any(j.tenant_id == nxt.tenant_id for j in group):
            carried.append(nxt)
        else:
            group.append(nxt)
    leased = group + carried
    finished: list[TrainingJob] = []
    try:
        live: list[TrainingJob] = []
        for job in group:
            actor_version = ctx.training.policy_version(job.tenant_id)
            if sched.is_stale(job, actor_version):
                finished.append(await _drop_stale(ctx, job, actor_version))
            else:
                live.append(job)
        if live:
            beat = _group_heartbeat(ctx, live + carried)
            rollbacks = [_rollbacks(ctx, job) for job in live]
            outcomes = await ctx.training.train_jobs_isolated(live, heartbeat=beat)
            for job, outcome, rolled in zip(live, outcomes, rollbacks, strict=True):
                try:
                    if isinstance(outcome, Exception):
                        raise outcome
                    finished.append(await _finish(ctx, job, outcome, rolled))
                except Exception as error:
                    log.warning("actor: training job %s failed: %s", job.job_id, error)
                    await fail_job(ctx, job, error)
                    finished.append(sched.get(job.job_id))
        for job in carried:  # in lease order; each one alone, staleness checked now
            try:
                finished.append(await _consume_leased(ctx, job))
            except Exception as error:
                log.warning("actor: training job %s failed: %s", job.job_id, error)
                finished.append(sched.get(job.job_id))
    except BaseException as error:
        for job in leased:
            if not sched.get(job.job_id).is_terminal:
                await fail_job(ctx, job, error)
        raise
    return finished


async def actor_consumer(ctx: WorkflowContext) -> None:
    """Consume ready jobs of every tenant until cancelled.

    Groups jobs of different tenants (:func:`consume_training_jobs`) when
    ``ctx.actor_group_size`` > 1. A failed job is recorded on its tenant and the loop
    goes on: one tenant's bad batch never stops the others' training.
    """
    failed = FailedIteration(ctx, "actor: training job failed")
    try:
        while True:
            try:
                if ctx.actor_group_size > 1:
                    await consume_training_jobs(ctx)
                else:
                    await consume_training_job(ctx)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                await failed.after(error)
                continue
            failed.succeeded()
    finally:
        # Commits still running behind are bounded work that ends with its job's
        # terminal state: let them finish, as an inline commit would have.
        if ctx.commits_behind:
            await asyncio.shield(drain_behind(ctx))
