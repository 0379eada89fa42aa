"""Low-level model primitives of the Master Service (paper Figure 4), per tenant slot.

:class:`ModelPrimitives` is one part :class:`~joynexus.master.service.MasterService`
is composed of: every call first checks that the tenant has a resident slot (from a
running or finished workload; task ``custom`` creates one and nothing else) and that a
scheduler job it names is the tenant's own — another tenant's job answers exactly as
an unknown one (:func:`joynexus.errors.unknown_id`) — then calls the Training /
Inference Model Service. Tensors cross this boundary as numpy arrays, so the HTTP
routes never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from joynexus.control.job import JobState, TrainingJob
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import ConflictError, NotFoundError, unknown_id
from joynexus.master.records import WorkloadBook
from joynexus.models.batch import ObservationBatch
from joynexus.models.tenant.slots import StepResult
from joynexus.services.protocols import InferenceModelServiceAPI, TrainingModelServiceAPI
from joynexus.services.rollout import PredictResult, RolloutConfig
from joynexus.services.training import TrainBatch
from joynexus.workflows.context import WorkflowTenant

__all__ = ["ModelPrimitives"]


class ModelPrimitives:
    """``predict``, ``train_batch``, ``export_params``, ``export``, ``load_weights``,
    ``save``, ``rollout`` and ``train_job`` on the caller's own slot.

    The one model surface: the HTTP routes, the fronts' hub, the openpi gateway and
    in-process callers all call it (``master.primitives``); the Master repeats none of it.
    """

    def __init__(
        self,
        book: WorkloadBook,
        *,
        training: TrainingModelServiceAPI,
        inference: InferenceModelServiceAPI,
    ) -> None:
        self.book = book
        self.scheduler: TrainingScheduler = book.scheduler
        self.training = training
        self.inference = inference

    def require_slot(self, tenant_id: str) -> WorkflowTenant:
        """The tenant's resident slot (from a running or finished workload).

        Raises:
            NotFoundError: the tenant has none; submit a workload (e.g. ``custom``).
        """
        tenant = self.book.tenants.get(tenant_id)
        if tenant is None:
            raise NotFoundError(
                f"tenant {tenant_id!r} has no model slot; submit a workload (task 'custom' "
                "for endpoints only) first",
                tenant_id=tenant_id,
            )
        return tenant

    def served_version(self, tenant_id: str) -> int:
        """The tenant's latest published (served) policy version."""
        self.require_slot(tenant_id)
        return self.inference.current_policy_version(tenant_id)

    async def predict(
        self,
        tenant_id: str,
        observations: ObservationBatch,
        policy_version: int | None = None,
        mode: Literal["mean", "sample"] = "mean",
    ) -> PredictResult:
        self.require_slot(tenant_id)
        return await self.inference.predict(
            observations, tenant_id, policy_version, mode=mode, session_id="api"
        )

    async def train_batch(self, tenant_id: str, batch: TrainBatch) -> StepResult:
        """One optimizer step on the tenant's slot, checkpointed before it returns.

        The checkpoint makes the new version durable, so a restarted server resumes the
        tenant at it and never issues the same version for other weights.
        """
        tenant = self.require_slot(tenant_id)
        result = await self.training.train_batch(tenant_id, batch)
        version = int(result.policy_version)
        tenant.jobs_applied += 1
        ledger = {"jobs_applied": tenant.jobs_applied, "workload_id": tenant.workload_id}
        await self.training.save(version, [tenant_id], include_optim=True, ledger=ledger)
        tenant.last_checkpoint_version = version
        await self.training.prune_checkpoints(tenant_id, keep_last=2)
        return result

    async def export_params(self, tenant_id: str) -> tuple[int, str, dict[str, np.ndarray]]:
        """(policy version, schema signature, named tensors as numpy)."""
        self.require_slot(tenant_id)
        payload = await self.training.export_params(tenant_id)
        named = {k: v.detach().cpu().numpy() for k, v in payload.named_tensors.items()}
        return int(payload.policy_version), payload.schema_signature, named

    async def export(self, tenant_id: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The tenant's action module: (manifest, named tensors); never the base model."""
        tenant = self.require_slot(tenant_id)
        version, signature, named = await self.export_params(tenant_id)
        config = self.training.config(tenant_id)
        manifest = {
            "format": "joynexus.action_module/v1",
            "tenant_id": tenant_id,
            "policy_version": version,
            "schema_signature": signature,
            "schema": tenant.schema.model_dump(mode="json"),
            "head": config.head.model_dump(mode="json"),
            "value_head": config.value_head,
            "base_model": self.book.base_model_id,
            "tensors": {
                k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in named.items()
            },
        }
        return manifest, named

    async def load_weights(
        self, tenant_id: str, version: int, named: Mapping[str, np.ndarray]
    ) -> int:
        """Publish ``named`` as the tenant's serving ``version``; the version now served."""
        self.require_slot(tenant_id)
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in named.items()}
        await self.inference.load_weights(tenant_id, version, tensors)
        return self.inference.current_policy_version(tenant_id)

    async def save(self, tenant_id: str, include_optim: bool = True) -> list[str]:
        """Checkpoint the tenant at its current version; paths relative to its dir."""
        tenant = self.require_slot(tenant_id)
        version = self.training.policy_version(tenant_id)
        latest = self.training.latest_checkpoint(tenant_id)
        if latest is not None and latest.name == f"step_{version}":
            paths = [latest]  # every update is checkpointed already: nothing new to write
        else:
            paths = await self.training.save(version, [tenant_id], include_optim=include_optim)
            tenant.last_checkpoint_version = version
            await self.training.prune_checkpoints(
                tenant_id, keep_last=tenant.spec.scheduling.keep_last
            )
        root = self.book.tenant_dir(tenant_id).resolve()
        return [str(Path(p).resolve().relative_to(root)) for p in paths]

    def _own_job(self, tenant_id: str, job_id: str) -> TrainingJob:
        job = self.scheduler.get(job_id)  # unknown_id("job", ...) for an unknown id
        if job.tenant_id != tenant_id:  # ... and exactly the same for another tenant's
            raise unknown_id("job", job_id)
        return job

    async def rollout(
        self,
        tenant_id: str,
        job_id: str,
        session_id: str,
        *,
        num_envs: int,
        horizon: int,
        version: int | None = None,
        seed: int | None = None,
    ) -> dict[str, Any]:
        """Collect a rollout into the partition of the tenant's reserved job ``job_id``."""
        tenant = self.require_slot(tenant_id)
        job = self._own_job(tenant_id, job_id)
        if job.state is not JobState.RESERVED:
            raise ConflictError(
                f"rollout needs a reserved job; {job_id!r} is {job.state.value}", job_id=job_id
            )
        v = self.inference.current_policy_version(tenant_id) if version is None else version
        config = RolloutConfig(
            tenant_id=tenant_id,
            session_id=session_id,
            schema_signature=tenant.schema_signature,
            seed=seed,
        )
        epoch = job.lease_epoch

        def beat() -> None:
            self.scheduler.heartbeat(job_id, epoch)

        stats = await self.inference.rollout(
            config, job_id, job.partition_id, num_envs, horizon, v, heartbeat=beat
        )
        return {
            "num_samples": stats.num_samples,
            "episode_returns": list(stats.episode_returns),
            "success_rate": stats.success_rate,
            "mean_reward": stats.mean_reward,
            "policy_version": v,
        }

    async def train_job(self, tenant_id: str, job_id: str) -> dict[str, Any]:
        """Train the tenant's leased job ``job_id`` from its partition."""
        self.require_slot(tenant_id)
        job = self._own_job(tenant_id, job_id)
        if job.state is not JobState.LEASED:
            raise ConflictError(
                f"train_job needs a leased job; {job_id!r} is {job.state.value}", job_id=job_id
            )

        def beat() -> None:
            self.scheduler.heartbeat(job_id, job.lease_epoch)

        result = await self.training.train_job(job, heartbeat=beat)
        return {
            "job_id": result.job_id,
            "num_microbatches": result.num_microbatches,
            "num_samples": result.num_samples,
            "losses": list(result.losses),
            "metrics": dict(result.metrics),
            "policy_version": result.policy_version,
        }
