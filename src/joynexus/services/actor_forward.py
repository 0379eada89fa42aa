"""The actor forward (paper Appendix A.5): behaviour log-probs under the current actor.

Before an RL update, every sample of the job's partition gets ``actor_log_probs`` (and
``actor_values``) of its recorded actions under the tenant's current policy, read under
the consumption task ``"actor_forward"`` and written back to the Training Queue. Only
the forward and the tenant's head run under the backbone lock.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from joynexus.errors import ConflictError
from joynexus.metrics.hooks import Instruments
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped_step import SharedForward
from joynexus.models.tenant.slots import TenantSlot
from joynexus.queues.training import TrainingQueue
from joynexus.services.job_plan import JobPlan, check_annotations
from joynexus.services.rl_loss import behaviour_log_probs, rl_fields
from joynexus.services.samples import (
    FLOW_CHAIN,
    float_tensor,
    observation_batch,
    observation_fields,
)
from joynexus.utils.affinity import on_device

__all__ = ["ACTOR_FORWARD_TASK", "actor_forward"]

ACTOR_FORWARD_TASK = "actor_forward"


async def actor_forward(
    queue: TrainingQueue,
    plan: JobPlan,
    *,
    forward: SharedForward,
    lock: AbstractContextManager[Any],
    instruments: Instruments,
) -> None:
    """Attach ``actor_log_probs`` / ``actor_values`` to every sample of ``plan``'s job.

    Raises:
        ConflictError: fewer samples than the job's ``sample_count``.
        PermissionDeniedError / SchemaMismatchError: a sample of another tenant or
            schema (:func:`~joynexus.services.job_plan.check_annotations`).
    """
    job = plan.job
    fields = [*observation_fields(plan.slot.schema), "actions", *rl_fields(plan.slot)]
    pid = job.partition_id
    await queue.async_reset_consumption(pid, ACTOR_FORWARD_TASK)
    done = 0
    while done < job.sample_count:
        size = min(plan.microbatch_size, job.sample_count - done)
        meta = await queue.async_get_meta(pid, fields, size, ACTOR_FORWARD_TASK)
        if meta.size != size:
            raise ConflictError(
                f"job {job.job_id!r}: partition {pid!r} has {done + meta.size} samples, "
                f"fewer than its sample_count {job.sample_count}",
                job_id=job.job_id,
            )
        check_annotations(plan, meta)
        data = await queue.async_get_data(meta)
        batch = observation_batch(plan.slot.schema, data, with_actions=True)
        batch.validate(plan.slot.schema)  # once: the forward does not validate again
        chain = data.get(FLOW_CHAIN)
        log_probs, values = await asyncio.to_thread(
            _evaluate_actions, plan.slot, batch, chain, forward, lock, instruments
        )
        await queue.async_put({"actor_log_probs": log_probs, "actor_values": values}, meta)
        done += size


def _evaluate_actions(
    slot: TenantSlot,
    batch: ObservationBatch,
    chain: Any | None,
    forward: SharedForward,
    lock: AbstractContextManager[Any],
    instruments: Instruments,
) -> tuple[np.ndarray, np.ndarray]:
    device = slot.base.device
    state = torch.from_numpy(batch.state).to(device)
    assert batch.actions is not None  # read with actions
    actions = torch.from_numpy(batch.actions).to(device)
    flow_chain = None if chain is None else float_tensor(chain, device)
    with on_device(), lock, torch.no_grad():
        start = time.perf_counter()
        features = forward({slot.tenant_id: batch}, grad=False, validated=True)[slot.tenant_id]
        slot.action_module.eval()
        lp = behaviour_log_probs(slot, features, state, actions, flow_chain)
        values = slot.value(features, state)
        seconds = time.perf_counter() - start
    # Forward-only work of one tenant: device time, but no samples trained.
    instruments.training_step(
        {slot.tenant_id: batch.batch_size}, 0.0, {slot.tenant_id: seconds}, count_samples=False
    )
    lp_np = lp.float().cpu().numpy().astype(np.float32)
    if values is None:
        return lp_np, np.zeros_like(lp_np)
    return lp_np, values.float().cpu().numpy().astype(np.float32)
