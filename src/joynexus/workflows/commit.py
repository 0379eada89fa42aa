"""Committing a trained job's update: checkpoint, publish, clear, complete (App. A.6 4–6).

The work splits where the slot may move on. **Taking** (:func:`take_update`) copies what
must hold this version's weights — the checkpoint's snapshot (``stage_save``) and, for a
served tenant, the publication payload (``export_params``) — while nothing else trains
the tenant. **Committing** (:func:`commit_update`) needs only those copies: write the
checkpoint (the update's commit point), prune, load the version into inference, clear
the partition, ``complete`` the job.

Run back to back, that is the actor's step 4–6 as always. With
``WorkflowContext.overlap_updates`` (the Master's default) an SFT job's commit runs
*behind* the tenant's next update instead (:func:`commit_behind`): a tenant that trains
alone with sequential SFT updates would otherwise leave the device idle for the whole
commit after every job (about 10 ms per job in the demo's profile, a tenth of its
multi-tenant window; RESULTS §1.2). RL jobs commit inline: their rollouts wait for the
published version anyway.

The order that durability needs is kept: a version is loaded into inference only after
its checkpoint is written, a job completes only after that, and a tenant's commits run
one after another (at most one behind its training). A commit that fails rolls the
slot back to its last checkpoint (:func:`~joynexus.workflows.durability.save_or_roll_back`);
the update trained meanwhile sat on the weights that were rolled back, so it is failed
too and the slot rolled back once more (:func:`settle_behind`): completed jobs stay
exactly the updates in the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from joynexus.control.job import TaskType, TrainingJob
from joynexus.errors import JoyNexusError, NotFoundError, StorageFullError
from joynexus.models.checkpoints.payload import TenantPayload
from joynexus.workflows.context import WorkflowContext, WorkflowTenant, reason_of
from joynexus.workflows.durability import roll_back_to_checkpoint, save_or_roll_back

__all__ = [
    "FailJob",
    "TakenUpdate",
    "commit_behind",
    "commit_update",
    "drain_behind",
    "publish",
    "settle_behind",
    "take_update",
]

log = logging.getLogger(__name__)


async def publish(ctx: WorkflowContext, tenant_id: str) -> int:
    """Policy publication: the tenant's training parameters become its serving version."""
    payload = await ctx.training.export_params(tenant_id)
    await ctx.inference.load_weights(tenant_id, payload.policy_version, payload.named_tensors)
    return int(payload.policy_version)


@dataclass
class TakenUpdate:
    """What a job's update left to commit, copied before the slot moves on."""

    tenant: WorkflowTenant
    job: TrainingJob
    result: Any
    version: int
    #: The staged checkpoint's token and its ledger (None: no checkpoint due).
    staged: str | None = None
    ledger: dict[str, Any] | None = None
    #: The version's publication payload (None: not a served tenant).
    payload: TenantPayload | None = None
    #: Why the payload could not be taken (raised once the checkpoint is written).
    publish_error: Exception | None = None


async def take_update(ctx: WorkflowContext, job: TrainingJob, result: Any) -> TakenUpdate:
    """Copy what committing ``job``'s update needs, before its tenant trains again.

    Raises:
        NotFoundError: the tenant left while the job trained (the Master fails it).
    """
    tenant = ctx.tenants.get(job.tenant_id)
    if tenant is None:  # cancelled while training: the Master fails the job
        raise NotFoundError(f"tenant {job.tenant_id!r} left while job {job.job_id} trained")
    version = int(result.policy_version)
    taken = TakenUpdate(tenant, job, result, version)
    every = tenant.spec.scheduling.checkpoint_every
    applied = tenant.jobs_applied + 1
    if ctx.durable_checkpoints:
        # The ledger saved with the weights names the job and counts the updates they
        # hold, so a restarted Master completes a job whose update reached the
        # checkpoint even if the process died before ``complete``.
        taken.ledger = {
            "job_id": job.job_id,
            "jobs_applied": applied,
            "workload_id": tenant.workload_id,
            "task": job.task_type.value,
        }
    elif every > 0 and version // every > tenant.last_checkpoint_version // every:
        taken.ledger = {"job_id": job.job_id, "jobs_applied": applied, "task": job.task_type.value}
    if taken.ledger is not None:
        taken.staged = await ctx.training.stage_save(
            version, [tenant.tenant_id], include_optim=True, ledger=taken.ledger
        )
    if job.task_type is TaskType.RL or tenant.serve:
        try:
            taken.payload = await ctx.training.export_params(job.tenant_id)
        except Exception as error:
            # Publication fails after the commit point, as it always did: the
            # checkpoint is still written, then the error fails (or completes) the job.
            taken.publish_error = error
        except BaseException:
            if taken.staged is not None:
                await ctx.training.discard_staged(taken.staged)
            raise
    return taken


async def _commit_checkpoint(ctx: WorkflowContext, taken: TakenUpdate) -> None:
    tenant, version = taken.tenant, taken.version
    every = tenant.spec.scheduling.checkpoint_every
    if taken.staged is None:
        tenant.jobs_applied += 1
        return
    assert taken.ledger is not None
    if ctx.durable_checkpoints:
        # A failed write rolls the slot back to its last checkpoint (never a version
        # ahead of what is saved and served) and raises StorageFullError on a full disk.
        await save_or_roll_back(ctx, tenant, version, taken.ledger, staged=taken.staged)
    else:
        await ctx.training.write_staged(taken.staged)
    # Retention: the newest ``keep_last`` only, so checkpoints never fill the disk.
    await ctx.training.prune_checkpoints(
        tenant.tenant_id, keep_last=tenant.spec.scheduling.keep_last
    )
    tenant.jobs_applied = int(taken.ledger["jobs_applied"])
    tenant.last_checkpoint_version = version
    if (every > 0 and version % every == 0) or not ctx.durable_checkpoints:
        tenant.metrics.write("checkpoint", policy_version=version)


def _mean(values: Any) -> float | None:
    vals = [float(v) for v in values or [] if math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else None


async def commit_update(ctx: WorkflowContext, taken: TakenUpdate) -> TrainingJob:
    """Checkpoint (the commit point), publish, clear, complete; the completed job.

    Raises:
        Whatever a step raised (a failed checkpoint write rolled the slot back); the
        job is left to the caller's ``fail_job``.
    """
    job, tenant, version = taken.job, taken.tenant, taken.version
    try:
        await _commit_checkpoint(ctx, taken)
    except BaseException:
        if taken.staged is not None:
            await ctx.training.discard_staged(taken.staged)
        raise
    if taken.publish_error is not None:
        raise taken.publish_error
    if (pay := taken.payload) is not None:
        await ctx.inference.load_weights(job.tenant_id, pay.policy_version, pay.named_tensors)
    await ctx.queue.async_clear(job.partition_id)
    done = ctx.scheduler.complete(
        job.job_id, job.lease_epoch, metadata={"actor_versions": {job.tenant_id: version}}
    )
    result = taken.result
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


# --- commits behind the next update ---------------------------------------------------


#: What fails a job whose commit failed (the actor's ``fail_job``).
FailJob = Callable[[WorkflowContext, TrainingJob, BaseException], Awaitable[None]]


async def _commit_or_fail(ctx: WorkflowContext, taken: TakenUpdate, fail: FailJob) -> None:
    try:
        await commit_update(ctx, taken)
    except BaseException as error:
        log.warning("actor: committing job %s failed: %s", taken.job.job_id, reason_of(error))
        await fail(ctx, taken.job, error)
        if isinstance(error, asyncio.CancelledError):
            raise


def commit_behind(ctx: WorkflowContext, taken: TakenUpdate, fail: FailJob) -> None:
    """Commit ``taken`` in a background task; the tenant may train its next update.

    The caller has settled the tenant's previous commit (:func:`settle_behind`), so a
    tenant's commits stay in order and at most one runs behind its training. A commit
    that raises hands its job to ``fail`` (which completes it instead when its update
    reached the checkpoint).
    """
    tid = taken.tenant.tenant_id
    assert tid not in ctx.commits_behind, "settle_behind first"
    ctx.commits_behind[tid] = asyncio.ensure_future(_commit_or_fail(ctx, taken, fail))


async def settle_behind(ctx: WorkflowContext, tenant_id: str, rollbacks: int | None = None) -> None:
    """Wait for ``tenant_id``'s commit running behind (if any) to end.

    Args:
        rollbacks: The tenant's ``rollbacks`` count when the job now being finished
            started training. If the slot was rolled back since — the commit behind it
            failed — that job's update sat on the discarded weights: the slot is rolled
            back again and the job fails.

    Raises:
        StorageFullError: the rollback came from a full disk (the job then fails
            ``storage_full``, not counted against the workload).
        JoyNexusError: the rollback had another cause.
    """
    task = ctx.commits_behind.pop(tenant_id, None)
    if task is not None:
        await asyncio.shield(task)  # it never raises but CancelledError: it fails its job
    tenant = ctx.tenants.get(tenant_id)
    if rollbacks is None or tenant is None or tenant.rollbacks == rollbacks:
        return
    restored = await roll_back_to_checkpoint(ctx, tenant)
    what = (
        f"the update before it could not be checkpointed, and the policy went back to "
        f"version {restored} (its last checkpoint) while this job trained on top of it"
    )
    if tenant.fault is not None:
        raise StorageFullError(what, tenant_id=tenant_id, restored_version=restored)
    raise JoyNexusError(what)


async def drain_behind(ctx: WorkflowContext) -> None:
    """Let every commit running behind end (the actor's shutdown: bounded work each)."""
    while ctx.commits_behind:
        tenant_id = next(iter(ctx.commits_behind))
        try:
            await settle_behind(ctx, tenant_id)
        except asyncio.CancelledError:
            continue  # that commit was cancelled; it failed its job
