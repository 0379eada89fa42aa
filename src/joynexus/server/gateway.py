"""The tenant gateway: every route that names an id goes through it.

One rule for every tenant-scoped id — job, workload, session, partition, future,
artifact: another tenant's id answers exactly as an unknown one (the same status,
error code and message, built by :func:`joynexus.errors.unknown_id`, which the
services also raise for ids they do not know). So nobody learns by probing which ids
exist. The one answer that differs is inherent to names a tenant chooses:
``queue_put`` to a partition name another tenant uses is 409 (taken).

Routes reach the Training Scheduler, the Training Queue, the Environment Service, the
futures and the Master through this object only; the checks are here, once, and a
route cannot call a service with an id it has not checked. Every entry that reaches a
tenant's model slot — the ``/v1/models`` routes, the fronts' hub and the openpi
gateway — goes through :attr:`TenantGateway.primitives`, the one predict surface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from joynexus.errors import PermissionDeniedError, ServiceUnavailableError, unknown_id
from joynexus.server.futures import FutureRegistry
from joynexus.server.ownership import PartitionOwnership

if TYPE_CHECKING:  # the Training Queue and the Master import torch; the server must not
    from joynexus.control.job import JobState, TrainingJob
    from joynexus.control.scheduler import TrainingScheduler
    from joynexus.master.primitives import ModelPrimitives
    from joynexus.master.service import MasterService
    from joynexus.queues._arrays import Array
    from joynexus.queues.meta import BatchMeta, PartitionInfo
    from joynexus.services.protocols import EnvironmentServiceAPI, TrainingQueueAPI

__all__ = ["TenantGateway"]


class TenantGateway:
    """Ownership checks and the tenant-scoped calls behind them (see module docstring).

    Args:
        scheduler: The Training Scheduler.
        queue: The Training Queue.
        env: The Environment Service (it checks its sessions' owner by the same rule).
        futures: The server's futures (they check their owner by the same rule).
        partitions: Who owns which Training Queue partition.
        master: The Master, where this server hosts one (workloads, model slots).
    """

    def __init__(
        self,
        *,
        scheduler: TrainingScheduler,
        queue: TrainingQueueAPI,
        env: EnvironmentServiceAPI,
        futures: FutureRegistry,
        partitions: PartitionOwnership,
        master: MasterService | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.queue = queue
        self.env = env
        self.futures = futures
        self.partitions = partitions
        self._master = master

    @property
    def master(self) -> MasterService:
        """The Master; 503 when this server was built without one."""
        if self._master is None:
            raise ServiceUnavailableError("this server has no master service", service="master")
        return self._master

    @property
    def primitives(self) -> ModelPrimitives:
        """The Master's model primitives on the caller's slot; 503 without a Master."""
        return self.master.primitives

    # --------------------------------------------------------------- model slots

    @staticmethod
    def own_slot(slot_tenant: str, caller: str) -> str:
        """The caller's own model slot: ``/v1/models/{tenant_id}`` names the caller.

        Any other name — another tenant's or one never issued — answers the same 403,
        so the path is no oracle either.
        """
        if caller != slot_tenant:
            raise PermissionDeniedError(
                f"model slot {slot_tenant!r} belongs to another tenant", tenant_id=slot_tenant
            )
        return caller

    # ---------------------------------------------------------------------- jobs

    def job(self, tenant_id: str, job_id: str) -> TrainingJob:
        """The tenant's job; another tenant's answers as an unknown one."""
        job = self.scheduler.get(job_id)  # unknown_id("job", ...) for an unknown id
        if job.tenant_id != tenant_id:
            raise unknown_id("job", job_id)
        return job

    def mark(
        self, tenant_id: str, job_id: str, state: JobState, lease_epoch: int | None
    ) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.mark(job_id, state, lease_epoch=lease_epoch)

    def hand_off(self, tenant_id: str, job_id: str, lease_epoch: int | None) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.hand_off(job_id, lease_epoch)

    def heartbeat(self, tenant_id: str, job_id: str, lease_epoch: int) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.heartbeat(job_id, lease_epoch)

    def complete(
        self,
        tenant_id: str,
        job_id: str,
        lease_epoch: int | None,
        metadata: dict[str, Any] | None,
    ) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.complete(job_id, lease_epoch, metadata)

    def fail(
        self, tenant_id: str, job_id: str, reason: str, lease_epoch: int | None
    ) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.fail(job_id, reason, lease_epoch)

    def drop(
        self, tenant_id: str, job_id: str, reason: str, lease_epoch: int | None
    ) -> TrainingJob:
        self.job(tenant_id, job_id)
        return self.scheduler.drop(job_id, reason, lease_epoch)

    # ---------------------------------------------------------------- partitions

    def partition(self, tenant_id: str, partition_id: str) -> None:
        """Pass the tenant's partition (or an unused name, which the queue then answers
        as unknown); another tenant's answers as an unknown one."""
        owner = self.partitions.owner(partition_id)
        if owner is not None and owner != tenant_id:
            raise unknown_id("partition", partition_id)

    def partition_info(self, tenant_id: str, partition_id: str) -> PartitionInfo:
        self.partition(tenant_id, partition_id)
        return self.queue.info(partition_id)

    def partitions_of(self, tenant_id: str) -> list[str]:
        return self.partitions.partitions_of(tenant_id)

    async def get_meta(
        self,
        tenant_id: str,
        partition_id: str,
        fields: Sequence[str],
        batch_size: int,
        task_name: str,
    ) -> BatchMeta:
        self.partition(tenant_id, partition_id)
        return await self.queue.async_get_meta(partition_id, list(fields), batch_size, task_name)

    def read_nbytes(
        self, tenant_id: str, partition_id: str, fields: Sequence[str], count: int
    ) -> int:
        """Bytes a ``get_data`` of ``count`` samples of ``fields`` would return."""
        self.partition(tenant_id, partition_id)
        return self.queue.read_nbytes(partition_id, fields, count)

    async def get_data(self, tenant_id: str, meta: BatchMeta) -> dict[str, Array]:
        self.partition(tenant_id, meta.partition_id)
        return await self.queue.async_get_data(meta)

    async def put_fields(self, tenant_id: str, data: Mapping[str, Array], meta: BatchMeta) -> None:
        self.partition(tenant_id, meta.partition_id)
        await self.queue.async_put(data, meta)

    async def clear(self, tenant_id: str, partition_id: str) -> None:
        """Release a partition: a no-op for an unknown one, and so for another tenant's."""
        owner = self.partitions.owner(partition_id)
        if owner is None or owner == tenant_id:
            await self.queue.async_clear(partition_id)
