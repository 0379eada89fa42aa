"""The training role as k data-parallel ranks, seen by callers as one service.

:class:`DataParallelRole` satisfies
:class:`~joynexus.services.protocols.TrainingModelServiceAPI` over the ranks of a
data-parallel training role (each a
:class:`~joynexus.services.data_parallel.DataParallelTrainingService`, here reached
through actor proxies). What changes a tenant's slot — adding, removing, restoring and
every training call — goes to every rank at once, in the same order, so the ranks'
collectives meet and their slots stay identical; what only reads a slot or writes one
copy of it — versions, exports, checkpoints, the actor-forward stage — is rank 0's.
A lease heartbeat goes with rank 0's call only (one caller renews the lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from joynexus.errors import InvalidRequestError
from joynexus.services.protocols import TrainingModelServiceAPI

if TYPE_CHECKING:
    from joynexus.control.job import TrainingJob
    from joynexus.models.checkpoints.payload import TenantPayload
    from joynexus.models.tenant.slots import StepResult
    from joynexus.services.tenancy import TenantConfig, TenantInfo
    from joynexus.services.training import TrainBatch, TrainJobResult

__all__ = ["DataParallelRole"]

T = TypeVar("T")


class DataParallelRole:
    """k training ranks behind the one Training Model Service API (see module docstring).

    Args:
        ranks: The ranks, rank 0 first.

    Raises:
        InvalidRequestError: no ranks.
    """

    def __init__(self, ranks: Sequence[TrainingModelServiceAPI]) -> None:
        if not ranks:
            raise InvalidRequestError("a data-parallel training role needs at least one rank")
        self.ranks = list(ranks)
        self.leader = self.ranks[0]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    async def _all(self, call: Callable[[TrainingModelServiceAPI, bool], Awaitable[T]]) -> T:
        """``call`` on every rank concurrently; rank 0's answer (every rank's error is
        awaited, so none is left running)."""
        results = await asyncio.gather(
            *(call(rank, i == 0) for i, rank in enumerate(self.ranks)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results[0]  # type: ignore[return-value]  # not an exception: checked above

    # --- tenants ----------------------------------------------------------------------

    async def add_tenant(self, config: TenantConfig) -> TenantInfo:
        return await self._all(lambda r, _: r.add_tenant(config))

    async def remove_tenant(self, tenant_id: str) -> None:
        await self._all(lambda r, _: r.remove_tenant(tenant_id))

    def tenant_ids(self) -> list[str]:
        return self.leader.tenant_ids()

    def policy_version(self, tenant_id: str) -> int:
        return self.leader.policy_version(tenant_id)

    def config(self, tenant_id: str) -> TenantConfig:
        return self.leader.config(tenant_id)

    # --- training ---------------------------------------------------------------------

    async def train_job(
        self, job: TrainingJob, *, heartbeat: Callable[[], None] | None = None
    ) -> TrainJobResult:
        return await self._all(
            lambda r, lead: r.train_job(job, heartbeat=heartbeat if lead else None)
        )

    async def train_jobs_isolated(
        self, jobs: Sequence[TrainingJob], *, heartbeat: Callable[[], None] | None = None
    ) -> list[TrainJobResult | Exception]:
        return await self._all(
            lambda r, lead: r.train_jobs_isolated(jobs, heartbeat=heartbeat if lead else None)
        )

    async def train_batch(self, tenant_id: str, batch: TrainBatch) -> StepResult:
        return await self._all(lambda r, _: r.train_batch(tenant_id, batch))

    async def actor_forward(self, job: TrainingJob) -> None:
        # Forward only: no optimizer state changes, one rank writes the results.
        await self.leader.actor_forward(job)

    # --- publication and checkpoints ----------------------------------------------------

    async def export_params(self, tenant_id: str) -> TenantPayload:
        return await self.leader.export_params(tenant_id)

    async def save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> list[Path]:
        return await self.leader.save(step, tenant_ids, include_optim, ledger)

    async def stage_save(
        self,
        step: int,
        tenant_ids: Sequence[str] | None = None,
        include_optim: bool = True,
        ledger: Mapping[str, Any] | None = None,
    ) -> str:
        return await self.leader.stage_save(step, tenant_ids, include_optim, ledger)

    async def write_staged(self, token: str) -> list[Path]:
        return await self.leader.write_staged(token)

    async def discard_staged(self, token: str) -> None:
        await self.leader.discard_staged(token)

    async def prune_checkpoints(
        self, tenant_id: str, *, keep_last: int = 2, keep_every: int = 0
    ) -> list[Path]:
        return await self.leader.prune_checkpoints(
            tenant_id, keep_last=keep_last, keep_every=keep_every
        )

    def latest_checkpoint(self, tenant_id: str) -> Path | None:
        return self.leader.latest_checkpoint(tenant_id)

    def checkpoint_ledger(self, tenant_id: str) -> dict[str, Any]:
        return self.leader.checkpoint_ledger(tenant_id)

    async def restore(self, tenant_id: str, checkpoint: Path | None = None) -> int:
        return await self._all(lambda r, _: r.restore(tenant_id, checkpoint))
