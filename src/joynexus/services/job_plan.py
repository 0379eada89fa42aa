"""How the Training Model Service reads one leased job: its batch plan and microbatches.

A job's *plan* fixes the loss (from the task type and the tenant's algorithm), the fields
to read from the partition, the microbatch size and the number of epochs; each
microbatch is read with ``get_meta`` / ``get_data`` under the task name ``"train"``, its
samples' tenant and schema annotations are checked against the job, and it is turned
into the tenant's :class:`~joynexus.models.batch.ObservationBatch`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from joynexus.control.job import TaskType, TrainingJob
from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    PermissionDeniedError,
    SchemaMismatchError,
)
from joynexus.models.batch import ObservationBatch
from joynexus.models.tenant.slots import TenantSlot
from joynexus.queues.meta import BatchMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.rl_loss import rl_fields
from joynexus.services.samples import observation_batch, observation_fields
from joynexus.services.tenancy import TenantConfig

__all__ = [
    "TRAIN_TASK",
    "JobPlan",
    "Microbatch",
    "TrainJobResult",
    "check_annotations",
    "job_seed",
    "plan_job",
    "read_microbatch",
]

TRAIN_TASK = "train"


@dataclass(frozen=True)
class TrainJobResult:
    """Outcome of one ``train_job``.

    Attributes:
        losses: One loss per optimizer step (microbatch), in order.
        metrics: Means over microbatches (``loss``, ``grad_norm``, PPO statistics).
        policy_version: The tenant's version after the job.
    """

    job_id: str
    tenant_id: str
    task_type: str
    num_microbatches: int
    num_samples: int
    losses: list[float]
    metrics: dict[str, float]
    policy_version: int


@dataclass
class JobPlan:
    """Global batch plan of one job."""

    job: TrainingJob
    config: TenantConfig
    slot: TenantSlot
    loss: Literal["sft", "ppo", "grpo", "reinforce"]
    fields: list[str]
    microbatch_size: int
    per_epoch: int
    epochs: int
    losses: list[float] = field(default_factory=list)
    stats: dict[str, list[float]] = field(default_factory=dict)
    samples: int = 0
    error: Exception | None = None

    @property
    def num_microbatches(self) -> int:
        return self.per_epoch * self.epochs

    def size_of(self, k: int) -> int:
        i = k % self.per_epoch
        return min(self.microbatch_size, self.job.sample_count - i * self.microbatch_size)

    def result(self) -> TrainJobResult:
        """What ``train_job`` answers for this plan once every microbatch stepped."""
        metrics = {"loss": float(np.mean(self.losses))} if self.losses else {}
        metrics.update({k: float(np.mean(v)) for k, v in self.stats.items()})
        return TrainJobResult(
            job_id=self.job.job_id,
            tenant_id=self.job.tenant_id,
            task_type=str(self.job.task_type),
            num_microbatches=len(self.losses),
            num_samples=self.samples,
            losses=list(self.losses),
            metrics=metrics,
            policy_version=self.slot.policy_version,
        )


@dataclass
class Microbatch:
    """One tenant's microbatch in a (possibly grouped) step."""

    plan_loss: Literal["sft", "ppo", "grpo", "reinforce"]
    config: TenantConfig
    slot: TenantSlot
    batch: ObservationBatch
    data: Mapping[str, Any]


def job_seed(seed: int, version: int) -> int:
    # Stochastic losses draw from the slot's generator; reseeding it from (seed, version)
    # at every job makes a resumed run draw exactly what an uninterrupted one would.
    return (seed * 1_000_003 + version * 7_919 + 1) % (2**63 - 1)


async def plan_job(
    job: TrainingJob, config: TenantConfig, slot: TenantSlot, queue: TrainingQueue
) -> JobPlan:
    """The job's global batch plan: loss, fields to read, microbatch size, epochs.

    Resets the job's consumption (a retried job re-reads from the start) and reseeds the
    slot's training generator (see :func:`job_seed`).

    Raises:
        SchemaMismatchError: the job declares another schema signature than the tenant's.
        InvalidRequestError: a non-positive sample count, or RL on an SFT-configured or
            tenant whose head has no policy log-density.
    """
    if job.schema_signature is not None and job.schema_signature != slot.schema_signature:
        raise SchemaMismatchError(
            f"job {job.job_id!r} declares schema signature {job.schema_signature!r}; "
            f"tenant {job.tenant_id!r} trains {slot.schema_signature!r}",
            job_id=job.job_id,
            field="schema_signature",
        )
    if job.sample_count <= 0:
        raise InvalidRequestError(
            f"job {job.job_id!r}: sample_count must be positive, got {job.sample_count}",
            job_id=job.job_id,
        )
    algo = config.algorithm
    fields = [*observation_fields(slot.schema), "actions"]
    available = set((await queue.async_info(job.partition_id)).fields)
    loss: Literal["sft", "ppo", "grpo", "reinforce"]
    if job.task_type == TaskType.SFT:
        loss = "sft"
        if "action_is_pad" in available:
            fields.append("action_is_pad")
    else:
        if algo.name == "sft":
            raise InvalidRequestError(
                f"job {job.job_id!r} is an RL job but tenant {job.tenant_id!r} is "
                "configured with algorithm 'sft'; use ppo, grpo or reinforce",
                job_id=job.job_id,
            )
        loss = algo.name
        fields.extend(rl_fields(slot))
        fields.append("advantages")
        if loss != "reinforce":
            fields.append("actor_log_probs" if "actor_log_probs" in available else "log_probs")
        if loss == "ppo" and slot.value_head is not None:
            fields.append("returns")
    await queue.async_reset_consumption(job.partition_id, TRAIN_TASK)
    slot.generator.manual_seed(job_seed(config.seed, slot.policy_version))
    mb = algo.microbatch_size
    return JobPlan(
        job=job,
        config=config,
        slot=slot,
        loss=loss,
        fields=fields,
        microbatch_size=mb,
        per_epoch=math.ceil(job.sample_count / mb),
        epochs=algo.epochs,
    )


async def read_microbatch(queue: TrainingQueue, plan: JobPlan, k: int) -> Microbatch:
    """Microbatch ``k`` of the plan, annotations checked and batch validated.

    Raises:
        ConflictError: the partition holds fewer ready samples than planned.
        PermissionDeniedError / SchemaMismatchError: see :func:`check_annotations`.
    """
    job = plan.job
    if k > 0 and k % plan.per_epoch == 0:
        await queue.async_reset_consumption(job.partition_id, TRAIN_TASK)
    size = plan.size_of(k)
    meta = await queue.async_get_meta(job.partition_id, plan.fields, size, TRAIN_TASK)
    if meta.size != size:
        raise ConflictError(
            f"job {job.job_id!r}: partition {job.partition_id!r} has fewer ready samples "
            f"than its sample_count {job.sample_count} (microbatch {k} expected {size}, "
            f"got {meta.size} with fields {plan.fields})",
            job_id=job.job_id,
            partition_id=job.partition_id,
        )
    check_annotations(plan, meta)
    data = await queue.async_get_data(meta)
    batch = observation_batch(plan.slot.schema, data, with_actions=True)
    # Before the shared forward, so a bad batch fails its own job, not the group.
    batch.validate(plan.slot.schema)
    return Microbatch(plan.loss, plan.config, plan.slot, batch, data)


def check_annotations(plan: JobPlan, meta: BatchMeta) -> None:
    """Every sample must belong to the job's tenant and carry the tenant's signature.

    Raises:
        PermissionDeniedError: a sample of another tenant.
        SchemaMismatchError: a sample with another schema signature.
    """
    job, sig = plan.job, plan.slot.schema_signature
    for index, sm in zip(meta.indexes, meta.sample_meta, strict=True):
        if sm.tenant_id != job.tenant_id:
            raise PermissionDeniedError(
                f"job {job.job_id!r}: sample {index} of partition {job.partition_id!r} "
                f"belongs to tenant {sm.tenant_id!r}, not the job's tenant "
                f"{job.tenant_id!r}",
                job_id=job.job_id,
                sample=index,
            )
        if sm.schema_signature != sig:
            raise SchemaMismatchError(
                f"job {job.job_id!r}: sample {index} of partition {job.partition_id!r} "
                f"has schema signature {sm.schema_signature!r}; tenant "
                f"{job.tenant_id!r} trains {sig!r}",
                job_id=job.job_id,
                sample=index,
                field="schema_signature",
            )
