"""The interfaces of the resident services, as their callers use them.

The execution plane hands these services to the Master Service, the workflow loops,
the health wiring, the server routes and the metrics sampler. Where a service lives
decides what object answers: the service object itself (in process), an
:class:`~joynexus.runtime.scaling.EnginePool` of rollout engines (inference), or a Ray
:class:`~joynexus.runtime.ray_proxy.ActorProxy` of the very same class. Each protocol
lists exactly the members those callers use, with the service class's own signatures,
so all three satisfy it structurally (mypy checks the assignments; no casts).

Members are methods and read-only properties only: a proxy answers every attribute
through ``__getattr__``, which a type checker accepts for a method or a read-only
property but not for a settable attribute.

The service modules do not import this one (a service knows its own class, not its
callers' view of it); the types named here are imported for type checking only, so
importing the protocols pulls in no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from joynexus.control.job import TrainingJob
    from joynexus.envs.base import EnvObservation, EnvSpec, EnvStep
    from joynexus.models.batch import ObservationBatch
    from joynexus.models.checkpoints.payload import TenantPayload
    from joynexus.models.tenant.slots import StepResult
    from joynexus.queues._arrays import Array
    from joynexus.queues.inference_metrics import InferenceQueueMetrics
    from joynexus.queues.meta import BatchMeta, PartitionInfo, SampleMeta
    from joynexus.services.environment import SessionInfo
    from joynexus.services.rollout import EvalResult, PredictResult, RolloutConfig, RolloutStats
    from joynexus.services.tenancy import TenantConfig, TenantInfo
    from joynexus.services.training import TrainBatch, TrainJobResult

__all__ = [
    "EnvironmentServiceAPI",
    "InferenceModelServiceAPI",
    "TrainingModelServiceAPI",
    "TrainingQueueAPI",
]


class TrainingModelServiceAPI(Protocol):
    """What callers use of :class:`~joynexus.services.training.TrainingModelService`."""

    # Tenants (workflows.launch, the Master's slot release).
    async def add_tenant(self, config: TenantConfig) -> TenantInfo: ...

    async def remove_tenant(self, tenant_id: str) -> None: ...

    def tenant_ids(self) -> list[str]: ...

    def policy_version(self, tenant_id: str) -> int: ...

    def config(self, tenant_id: str) -> TenantConfig: ...

    # Training (actor consumer, actor-forward stage, the Master's primitives).
    async def train_job(
        self, job: TrainingJob, *, heartbeat: Callable[[], None] | None = None
    ) -> TrainJobResult: ...

    async def train_jobs_isolated(
        self,
        jobs: Sequence[TrainingJob],
        *,
        heartbeat: Callable[[], None] | None = None,
    ) -> list[TrainJobResult | Exception]: ...

    async def train_batch(self, tenant_id: str, batch: TrainBatch) -> StepResult: ...

    async def actor_forward(self, job: TrainingJob) -> None: ...

    # Publication and checkpoints.
    async def export_params(self, tenant_id: str) -> TenantPayload: ...

    async def save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> list[Path]: ...

    async def stage_save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> str: ...

    async def write_staged(self, token: str) -> list[Path]: ...

    async def discard_staged(self, token: str) -> None: ...

    async def prune_checkpoints(
        self, tenant_id: str, *, keep_last: int = 2, keep_every: int = 0
    ) -> list[Path]: ...

    def latest_checkpoint(self, tenant_id: str) -> Path | None: ...

    def checkpoint_ledger(self, tenant_id: str) -> dict[str, Any]: ...

    async def restore(self, tenant_id: str, checkpoint: Path | None = None) -> int: ...


class InferenceModelServiceAPI(Protocol):
    """What callers use of :class:`~joynexus.services.inference.InferenceModelService`."""

    # Lifecycle (the plane).
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def metrics(self) -> InferenceQueueMetrics:
        """The Inference Queue's batching metrics (the control sampler)."""
        ...

    # Tenants and published weights (workflows.launch, publication, the Master).
    async def add_tenant(
        self, config: TenantConfig, payload: TenantPayload | None = None
    ) -> None: ...

    async def remove_tenant(self, tenant_id: str) -> None: ...

    async def load_weights(
        self, tenant_id: str, version: int, named_tensors: Mapping[str, torch.Tensor]
    ) -> None: ...

    def current_policy_version(self, tenant_id: str) -> int: ...

    # Serving (the RL producer, evaluator, SFT held-out error, the Master's primitives).
    async def predict(
        self,
        observations: ObservationBatch,
        tenant_id: str,
        policy_version: int | None = None,
        *,
        mode: Literal["mean", "sample"] = "mean",
        session_id: str = "predict",
    ) -> PredictResult: ...

    async def rollout(
        self,
        config: RolloutConfig,
        job_id: str,
        partition_id: str,
        num_envs: int,
        horizon: int,
        version: int,
        *,
        heartbeat: Callable[[], None] | None = None,
    ) -> RolloutStats: ...

    async def evaluate(
        self,
        tenant_id: str,
        session_id: str,
        *,
        episodes: int,
        version: int | None = None,
        deterministic: bool = True,
        session_tenant: str | None = None,
        seed: int | None = None,
        max_decisions: int = 100_000,
    ) -> EvalResult: ...


class EnvironmentServiceAPI(Protocol):
    """What callers use of :class:`~joynexus.services.environment.EnvironmentService`."""

    async def create_session(self, tenant_id: str, spec: EnvSpec) -> SessionInfo: ...

    async def list_sessions(self, tenant_id: str) -> list[SessionInfo]: ...

    async def reset(
        self,
        session_id: str,
        rollout_id: str,
        seed: int | None = None,
        *,
        tenant_id: str,
        group_size: int = 1,
    ) -> EnvObservation: ...

    async def step(self, session_id: str, actions: Any, *, tenant_id: str) -> EnvStep: ...

    async def close(self, session_id: str, *, tenant_id: str) -> None: ...

    async def aclose(self) -> None: ...

    def is_crashed(self, session_id: str) -> bool: ...


class TrainingQueueAPI(Protocol):
    """What callers outside the services use of
    :class:`~joynexus.queues.training.TrainingQueue` (the workflow loops, the Master,
    the queue routes, the control sampler)."""

    async def async_queue_put(
        self,
        partition_id: str,
        data: Mapping[str, Array],
        metadata: SampleMeta | Sequence[SampleMeta],
    ) -> list[int]: ...

    async def async_get_meta(
        self, partition_id: str, data_fields: Sequence[str], batch_size: int, task_name: str
    ) -> BatchMeta: ...

    async def async_get_data(self, meta: BatchMeta) -> dict[str, Array]: ...

    async def async_put(self, data: Mapping[str, Array], metadata: BatchMeta) -> None: ...

    async def async_clear(self, partition_id: str, *, missing_ok: bool = True) -> None: ...

    async def async_info(self, partition_id: str) -> PartitionInfo: ...

    async def async_reset_consumption(self, partition_id: str, task_name: str) -> None: ...

    def partitions(self) -> list[PartitionInfo]: ...

    def info(self, partition_id: str) -> PartitionInfo: ...

    def read_nbytes(self, partition_id: str, fields: Sequence[str], count: int) -> int:
        """Bytes ``get_data`` of ``count`` samples of ``fields`` would return."""
        ...

    def has_partition(self, partition_id: str) -> bool: ...

    @property
    def nbytes(self) -> int:
        """Bytes held in the visible partitions."""
        ...
