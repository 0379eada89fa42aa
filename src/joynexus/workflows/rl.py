"""The RL producer (paper Figure 6 left, Appendix A.4).

Each iteration records the tenant's current serving version *before* any env
interaction, reserves an RL job with it as ``behavior_policy_version`` (sample count =
``num_envs × horizon``), runs the rollout through the Inference Model Service (which
writes the job's partition), heartbeating the producer lease meanwhile, and ends
production: ``mark(needs_advantages)``, or ``hand_off`` when the tenant's pipeline has
the actor-forward stage. Weights reach inference from the actor side (``load_weights``
after each update), so the next rollout picks up the latest published version.

Seeds: an ungrouped rollout resets sub-env ``i`` with ``seed · 100003 + job + i``. A
grouped one (GRPO with ``algorithm.group_size``) resets the sub-envs of group ``g`` with
``first + g``, where ``first`` is the job's block of the training seed range
(:func:`~joynexus.envs.seeds.grouped_rollout_seed`): one initial state per group, a new
one for every group of every rollout, never an evaluation seed.
"""

from __future__ import annotations

import logging

import numpy as np

from joynexus.control.job import JobState, TaskType
from joynexus.envs.seeds import grouped_rollout_seed
from joynexus.services.inference import RolloutConfig
from joynexus.workflows.compile import policy_key
from joynexus.workflows.context import (
    ACTOR_ROLE,
    ROLLOUT_ROLE,
    WorkflowContext,
    WorkflowTenant,
    job_heartbeat,
    produce_until_target,
)
from joynexus.workflows.storage import fail_until_stored, failure_reason

__all__ = ["SESSION_UNAVAILABLE", "produce_rl", "rl_producer"]

log = logging.getLogger(__name__)

# The tenant's simulator session is being recreated after a crash (Health Manager):
# the producer backs off without reserving a job that could only fail.
SESSION_UNAVAILABLE = "session_unavailable"


async def produce_rl(ctx: WorkflowContext, tenant: WorkflowTenant) -> str | None:
    """One producer iteration (App. A.4 ``produce_rl``).

    Returns:
        None when a job was produced, else the scheduler's refusal reason (or
        :data:`SESSION_UNAVAILABLE` while the tenant's session is being recreated).

    Raises:
        Whatever the rollout raised, after cleaning up the partition and failing the job.
    """
    spec = tenant.spec
    assert spec.env is not None
    if tenant.session_id is None:
        return SESSION_UNAVAILABLE
    num_envs, horizon = spec.env.num_envs, spec.algorithm.horizon
    version = ctx.inference.current_policy_version(tenant.tenant_id)
    job = ctx.scheduler.reserve(
        policy_key=policy_key(tenant.tenant_id, TaskType.RL),
        domain=ctx.domain,
        tenant_id=tenant.tenant_id,
        task_type=TaskType.RL,
        sample_count=num_envs * horizon,
        behavior_policy_version=version,
        max_policy_staleness=spec.scheduling.max_policy_staleness,
        producer_role=ROLLOUT_ROLE,
        consumer_role=ACTOR_ROLE,
        metadata=tenant.job_metadata(),
    )
    if job is None:
        return ctx.scheduler.last_refusal(tenant.tenant_id, TaskType.RL) or "refused"
    group_size = spec.algorithm.group_size or 1
    if group_size > 1:  # GRPO: each group of sub-envs tries one initial state
        seed = grouped_rollout_seed(spec.seed, job.created_seq, num_envs // group_size)
    else:
        seed = spec.seed * 100_003 + job.created_seq
    config = RolloutConfig(
        tenant_id=tenant.tenant_id,
        session_id=tenant.session_id,
        schema_signature=tenant.schema_signature,
        seed=seed,
        group_size=group_size,
    )
    try:
        stats = await ctx.inference.rollout(
            config,
            job.job_id,
            job.partition_id,
            num_envs,
            horizon,
            version,
            heartbeat=job_heartbeat(ctx.scheduler, job),
        )
        if spec.algorithm.actor_forward:
            ctx.scheduler.hand_off(job.job_id, job.lease_epoch)
        else:
            ctx.scheduler.mark(job.job_id, JobState.NEEDS_ADVANTAGES, lease_epoch=job.lease_epoch)
    except BaseException as error:
        await ctx.queue.async_clear(job.partition_id)
        # A full disk fails it storage_full, recorded once the disk takes it.
        await fail_until_stored(ctx, job.job_id, tenant.tenant_id, failure_reason(error))
        raise
    returns = list(stats.episode_returns)
    tenant.metrics.write(
        "rollout",
        job_id=job.job_id,
        behavior_version=version,
        num_samples=stats.num_samples,
        episodes=len(returns),
        mean_return=float(np.mean(returns)) if returns else None,
        success_rate=stats.success_rate,
        mean_reward=stats.mean_reward,
    )
    return None


async def rl_producer(ctx: WorkflowContext, tenant: WorkflowTenant) -> None:
    """Produce RL jobs until the tenant's completion target is reached (or cancelled).

    See :func:`~joynexus.workflows.context.produce_until_target` for refusals and failures.
    """
    await produce_until_target(ctx, tenant, lambda: produce_rl(ctx, tenant), "rl")
