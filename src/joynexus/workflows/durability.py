"""A durable checkpoint, or the slot rolled back to the last one (disk full, §4.1.3).

Under the Master every update is checkpointed before it is published or its job
completes. When that write fails — the disk or the quota is full — the training slot
has already taken the optimizer step: left alone it runs one version ahead of what is
saved and served, every new rollout's behaviour version falls behind it, and each
later job is dropped ``policy_stale`` forever, even after space is freed. So a failed
save rolls the slot back to the last committed checkpoint (the update is lost with its
job, which fails ``storage_full`` and does not count against the workload), the
tenant shows the fault while it lasts, and the next job's save — once space returns —
commits and clears it: the workload recovers by itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from joynexus.errors import NotFoundError, StorageFullError
from joynexus.utils.storage import storage_full_cause
from joynexus.workflows.context import WorkflowContext, WorkflowTenant, reason_of

__all__ = ["roll_back_to_checkpoint", "save_or_roll_back"]

log = logging.getLogger(__name__)


async def save_or_roll_back(
    ctx: WorkflowContext,
    tenant: WorkflowTenant,
    version: int,
    ledger: Mapping[str, Any],
    *,
    staged: str | None = None,
) -> None:
    """Checkpoint ``tenant`` at ``version``; if the write fails, roll its slot back.

    ``staged``: the token of a ``stage_save`` taken at ``version`` (with ``ledger``),
    written now; None: snapshot and write now.

    Raises:
        StorageFullError: the disk or quota is full (the slot was rolled back).
        Exception: whatever else the save raised (the slot was rolled back).
    """
    tid = tenant.tenant_id
    try:
        if ctx.disk_check is not None:
            ctx.disk_check(tid)  # past its disk quota: refused as a full disk
        if staged is not None:
            await ctx.training.write_staged(staged)
        else:
            await ctx.training.save(version, [tid], include_optim=True, ledger=dict(ledger))
    except Exception as error:
        restored = await roll_back_to_checkpoint(ctx, tenant)
        full = storage_full_cause(error)
        if full is None:
            log.warning("checkpoint of %s failed (%s); rolled back", tid, reason_of(error))
            raise
        where = f" writing {full.filename}" if full.filename else ""
        tenant.fault = (
            f"checkpoint writes fail: {full.reason}{where}; "
            f"the policy was rolled back to version {restored} (its last checkpoint), and "
            "training resumes by itself once space is freed"
        )
        log.error("tenant %s: %s", tid, tenant.fault)
        tenant.metrics.write("checkpoint_failed", policy_version=version, restored=restored)
        raise StorageFullError(
            f"no space left to checkpoint policy version {version}{where}; rolled back "
            f"to version {restored}: free disk space (or raise the quota) and training "
            "resumes by itself",
            tenant_id=tid,
            restored_version=restored,
        ) from error
    if tenant.fault is not None:
        tenant.metrics.write("checkpoint_recovered", policy_version=version)
        tenant.fault = None


async def roll_back_to_checkpoint(ctx: WorkflowContext, tenant: WorkflowTenant) -> int:
    """Make ``tenant``'s training slot its latest checkpoint again; its version.

    Without a checkpoint yet, the slot is recreated as it started, and served so:
    what the slot trains from and what inference serves stay the same weights.
    """
    tid, config = tenant.tenant_id, tenant.config
    tenant.rollbacks += 1
    try:
        restored = await ctx.training.restore(tid)
        # The bookkeeping follows the weights: a save that failed after its files were
        # written restores the update it holds, which the next ledger must count.
        applied = ctx.training.checkpoint_ledger(tid).get("jobs_applied")
        if applied is not None:
            tenant.jobs_applied = int(applied)
        tenant.last_checkpoint_version = restored
        return restored
    except NotFoundError:
        gone = config is None or ctx.tenants.get(tid) is not tenant
        if gone or ctx.training.latest_checkpoint(tid) is not None:
            raise  # no slot at all (its workload ended): nothing to roll back
    assert config is not None
    with contextlib.suppress(NotFoundError):
        await ctx.training.remove_tenant(tid)
    await ctx.training.add_tenant(config)
    payload = await ctx.training.export_params(tid)
    with contextlib.suppress(NotFoundError):
        await ctx.inference.remove_tenant(tid)
    await ctx.inference.add_tenant(config, payload)
    return int(payload.policy_version)
