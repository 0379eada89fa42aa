"""The actor consumer (paper Figures 6–7 right, Appendix A.6).

The one consumer of ready RL and SFT jobs, exactly as App. A.6 composes it:

1. ``lease_next(actor, [domain])``; if nothing is ready, park on
   ``async_wait_for_ready`` (never a busy loop);
2. RL staleness, Eq. (1): ``v_actor − v_behavior > Δmax`` (``TrainingScheduler.is_stale``
   with the tenant's current training version) → clear the partition, then
   ``drop(policy_stale)``;
3. ``train_job`` (heartbeating the consumer lease between microbatches);
4. publish the new version to inference (``export_params`` → ``load_weights``) for RL
   tenants and for tenants an evaluation reads;
5. maybe checkpoint (``scheduling.checkpoint_every`` policy versions);
6. clear the partition, then ``complete`` with the actor versions in the metadata;
7. on an exception: best-effort clear, ``fail`` with the reason, re-raise.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from joynexus.control.job import TaskType, TrainingJob
from joynexus.workflows.context import (
    ACTOR_ROLE,
    WorkflowContext,
    WorkflowTenant,
    job_heartbeat,
    reason_of,
)

__all__ = ["REASON_POLICY_STALE", "actor_consumer", "consume_training_job", "publish"]

REASON_POLICY_STALE = "policy_stale"

log = logging.getLogger(__name__)


async def publish(ctx: WorkflowContext, tenant_id: str) -> int:
    """Policy publication: the tenant's training parameters become its serving version."""
    payload = await ctx.training.export_params(tenant_id)
    await ctx.inference.load_weights(tenant_id, payload.policy_version, payload.named_tensors)
    return int(payload.policy_version)


async def _maybe_checkpoint(ctx: WorkflowContext, tenant: WorkflowTenant, version: int) -> None:
    every = tenant.spec.scheduling.checkpoint_every
    if every <= 0:
        return
    if version // every > tenant.last_checkpoint_version // every:
        await ctx.training.save(version, [tenant.tenant_id], include_optim=True)
        tenant.last_checkpoint_version = version
        tenant.metrics.write("checkpoint", policy_version=version)


def _mean(values: Any) -> float | None:
    vals = [float(v) for v in values or [] if math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else None


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
    partition = job.partition_id
    tenant = ctx.tenants[job.tenant_id]
    actor_version = ctx.training.policy_version(job.tenant_id)
    if sched.is_stale(job, actor_version):
        await ctx.queue.async_clear(partition)
        dropped = sched.drop(job.job_id, REASON_POLICY_STALE, job.lease_epoch)
        tenant.metrics.write(
            "dropped",
            job_id=job.job_id,
            behavior_version=job.behavior_policy_version,
            actor_version=actor_version,
        )
        return dropped
    try:
        result = await ctx.training.train_job(job, heartbeat=job_heartbeat(sched, job))
        version = int(result.policy_version)
        if job.task_type is TaskType.RL or tenant.serve:
            await publish(ctx, job.tenant_id)
        await _maybe_checkpoint(ctx, tenant, version)
        await ctx.queue.async_clear(partition)
        done = sched.complete(
            job.job_id,
            job.lease_epoch,
            metadata={"actor_versions": {job.tenant_id: version}},
        )
    except BaseException as error:
        await ctx.queue.async_clear(partition)
        if not sched.get(job.job_id).is_terminal:
            cancelled = isinstance(error, asyncio.CancelledError)
            sched.fail(job.job_id, "cancelled" if cancelled else reason_of(error))
        if not isinstance(error, asyncio.CancelledError):
            tenant.errors.append(reason_of(error))
        raise
    tenant.metrics.write(
        "train",
        job_id=job.job_id,
        task=job.task_type.value,
        behavior_version=job.behavior_policy_version,
        policy_version=version,
        num_microbatches=result.num_microbatches,
        num_samples=result.num_samples,
        loss=_mean(result.losses),
        **{f"metric.{k}": float(v) for k, v in dict(result.metrics).items()},
    )
    return done


async def actor_consumer(ctx: WorkflowContext) -> None:
    """Consume ready jobs of every tenant until cancelled.

    A failed job is recorded on its tenant and the loop goes on: one tenant's bad batch
    never stops the others' training.
    """
    while True:
        try:
            await consume_training_job(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("actor: training job failed: %s", error)
