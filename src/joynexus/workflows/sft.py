"""The SFT producer (paper Figure 7, Appendix A.4 ``produce_sft``) and its data source.

The producer reserves an SFT job, samples demonstrations from the tenant's LeRobot
dataset (training episodes only), ``queue_put``\\ s them in the partition layout of
:mod:`joynexus.services.samples` and marks the job ``ready`` immediately. Prefetch is
bounded by admission: the tenant–task policy's ``max_in_flight`` (at most
``scheduling.prefetch``) caps how many prepared jobs wait in the Training Queue.

:class:`SFTSource` splits the dataset by episode into training and held-out frames
(``dataset.heldout_fraction``); :func:`heldout_action_error` measures the tenant's
mean absolute action error on held-out frames (normalised action units) through the
Inference Model Service's ``predict``.

The tenant trains on the dataset's normalized state and actions, so its
``NormalizationStats`` become part of the tenant (:func:`with_normalization`): serving
then takes env-unit state and returns env-unit actions, and payloads and checkpoints
carry the stats.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from joynexus.control.job import JobState, TaskType
from joynexus.data.sft import SFTBatch, SFTBatchBuilder
from joynexus.models.batch import ObservationBatch
from joynexus.models.schema import DataSchema
from joynexus.queues.meta import SampleMeta
from joynexus.services.samples import camera_field, instructions_array
from joynexus.services.tenancy import TenantConfig
from joynexus.spec.workload import WorkloadSpec
from joynexus.workflows.compile import feature_map_of, norm_mode_of, policy_key
from joynexus.workflows.context import (
    ACTOR_ROLE,
    SFT_ROLE,
    WorkflowContext,
    WorkflowTenant,
    produce_until_target,
)
from joynexus.workflows.storage import fail_until_stored, failure_reason

__all__ = [
    "SFTSource",
    "heldout_action_error",
    "produce_sft",
    "sft_partition_data",
    "sft_producer",
    "with_normalization",
]

log = logging.getLogger(__name__)


@dataclass
class SFTSource:
    """A tenant's demonstrations, split by episode into training and held-out frames."""

    builder: SFTBatchBuilder
    train_indices: np.ndarray
    heldout_indices: np.ndarray

    @classmethod
    def open(cls, spec: WorkloadSpec, schema: DataSchema) -> SFTSource:
        """Open ``spec.dataset`` for ``schema``; the last episodes are held out."""
        ds = spec.dataset
        assert ds is not None
        builder = SFTBatchBuilder(
            ds.path, schema, feature_map_of(spec, schema), norm_mode=norm_mode_of(spec)
        )
        n = len(builder)
        episodes = np.asarray(builder.dataset.column("episode_index")).reshape(n)
        unique = np.unique(episodes)
        held = math.ceil(ds.heldout_fraction * len(unique)) if len(unique) > 1 else 0
        held = min(held, len(unique) - 1)
        held_eps = set(unique[len(unique) - held :].tolist()) if held else set()
        mask = np.array([e in held_eps for e in episodes.tolist()], dtype=bool)
        all_idx = np.arange(n)
        return cls(builder, all_idx[~mask], all_idx[mask])

    def sample(self, num_samples: int, seed: int) -> SFTBatch:
        """``num_samples`` training frames (seeded; without replacement when possible)."""
        rng = np.random.default_rng(seed)
        pool = self.train_indices
        picks = rng.choice(pool, size=num_samples, replace=num_samples > len(pool))
        return self.builder.build(picks)


def with_normalization(config: TenantConfig, source: SFTSource) -> TenantConfig:
    """``config`` carrying the normalization stats its SFT data is normalized with."""
    return config.model_copy(update={"normalization": source.builder.normalization})


def sft_partition_data(batch: SFTBatch, schema: DataSchema) -> dict[str, np.ndarray]:
    """An SFT batch in the Training Queue's partition layout."""
    obs = batch.observations
    assert obs.actions is not None
    data: dict[str, np.ndarray] = {
        camera_field(c): np.ascontiguousarray(obs.cameras[c], dtype=np.uint8)
        for c in schema.camera_names
    }
    data["state"] = np.asarray(obs.state, dtype=np.float32)
    data["instruction"] = instructions_array(list(obs.instructions))
    data["actions"] = np.asarray(obs.actions, dtype=np.float32)
    data["action_is_pad"] = np.asarray(batch.action_is_pad, dtype=bool)
    return data


async def produce_sft(
    ctx: WorkflowContext, tenant: WorkflowTenant, source: SFTSource
) -> str | None:
    """One SFT producer iteration; None when a job was produced, else the refusal reason.

    Raises:
        Whatever sampling or the put raised, after clearing the partition and failing
        the job (App. A.4).
    """
    spec = tenant.spec
    job = ctx.scheduler.reserve(
        policy_key=policy_key(tenant.tenant_id, TaskType.SFT),
        domain=ctx.domain,
        tenant_id=tenant.tenant_id,
        task_type=TaskType.SFT,
        sample_count=spec.algorithm.samples_per_job,
        behavior_policy_version=None,
        producer_role=SFT_ROLE,
        consumer_role=ACTOR_ROLE,
        metadata=tenant.job_metadata(),
    )
    if job is None:
        return ctx.scheduler.last_refusal(tenant.tenant_id, TaskType.SFT) or "refused"
    try:
        seed = spec.seed * 100_003 + job.created_seq
        batch = await asyncio.to_thread(source.sample, job.sample_count, seed)
        data = sft_partition_data(batch, tenant.schema)
        meta = SampleMeta(tenant_id=tenant.tenant_id, schema_signature=tenant.schema_signature)
        await ctx.queue.async_queue_put(job.partition_id, data, meta)
        ctx.scheduler.mark(job.job_id, JobState.READY, lease_epoch=job.lease_epoch)
    except BaseException as error:
        await ctx.queue.async_clear(job.partition_id)
        # A full disk fails it storage_full, recorded once the disk takes it (else its
        # producer lease would expire into a counted producer_lost).
        await fail_until_stored(ctx, job.job_id, tenant.tenant_id, failure_reason(error))
        raise
    return None


async def sft_producer(ctx: WorkflowContext, tenant: WorkflowTenant, source: SFTSource) -> None:
    """Produce SFT jobs until the completion target is reached (or cancelled).

    A refusal (prefetch bound full) backs off on the injected clock; see
    :func:`~joynexus.workflows.context.produce_until_target`.
    """
    await produce_until_target(ctx, tenant, lambda: produce_sft(ctx, tenant, source), "sft")


class _Predictor(Protocol):
    async def predict(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None = None,
        *,
        mode: Any = "mean",
    ) -> Any: ...


async def heldout_action_error(
    inference: _Predictor, tenant_id: str, source: SFTSource, *, max_samples: int = 64
) -> float | None:
    """Mean absolute action error of the tenant's served policy on held-out frames.

    The query goes through ``predict`` in env units (the served tenant carries the
    source's normalization, :func:`with_normalization`); errors are measured in
    normalised action units, over the non-padded chunk steps. None when the dataset has
    no held-out episode.
    """
    idx = source.heldout_indices
    if idx.size == 0:
        return None
    if idx.size > max_samples:
        idx = idx[np.linspace(0, idx.size - 1, max_samples).astype(np.int64)]
    batch = await asyncio.to_thread(source.builder.build, idx)
    target = batch.observations.actions
    assert target is not None
    obs = batch.observations
    norm = source.builder.normalization
    state = obs.state if norm.state is None else norm.unnormalize(obs.state, "state")
    query = ObservationBatch(cameras=obs.cameras, state=state, instructions=obs.instructions)
    result = await inference.predict(query, tenant_id, mode="mean")
    pred = norm.normalize(np.asarray(result.actions, dtype=np.float32), "action")
    valid = ~np.asarray(batch.action_is_pad, dtype=bool)
    err = np.abs(pred - target)[valid]
    return float(err.mean()) if err.size else None
