"""A data-parallel Training Model Service: the training role as ``k`` ranks.

Every rank is a :class:`DataParallelTrainingService` (the Training Model Service with
one step changed) in its own process, joined by ``torch.distributed`` (gloo on CPU,
NCCL on CUDA). Every rank holds the same tenant slots and is given the same calls in
the same order; for each grouped step:

1. every rank reads the same microbatches (under its own consumption task, so ranks
   sharing one Training Queue do not consume each other's rows) and keeps its
   contiguous share of each tenant's rows (:func:`row_range`);
2. ONE grouped backbone forward over its rows, each tenant's loss on them, scaled by
   the rank's share of the tenant's loss denominator (:func:`loss_share`: its rows, or
   its unpadded action steps for a masked SFT loss), and one backward;
3. per tenant, ONE all-reduce (sum) of the tenant's gradients with its scaled loss
   value and a failure flag: every rank now holds the gradient and loss of the whole
   microbatch, exactly as one process would (up to float reassociation);
4. every rank clips and steps the tenant's own optimizer with those gradients: the
   slots stay identical and nothing is ever averaged across tenants.

A tenant whose loss fails on any rank fails on every rank (the flag), so the ranks'
collectives never go out of step. Exactness holds for losses that are means over rows
or over masked entries (OFT's L1, PPO / GRPO / REINFORCE); a head that draws noise per
row (flow matching) draws different noise per rank than one process would (same
distribution, not the same numbers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from joynexus.errors import InternalError, InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.execution.grouped_step import GradientReduce, LocalLoss, TenantStep
from joynexus.models.tenant.slots import TenantSlot
from joynexus.queues.training import TrainingQueue
from joynexus.services.job_plan import Microbatch
from joynexus.services.samples import as_numpy
from joynexus.services.train_batch import microbatch_loss
from joynexus.services.training import TrainingModelService

__all__ = ["DataParallelTrainingService", "RankGroup", "loss_share", "row_range"]


@dataclasses.dataclass(frozen=True)
class RankGroup:
    """Where one rank sits in the training role's process group.

    Attributes:
        rank / world_size: This rank and the number of ranks.
        init_method: The rendezvous every rank joins (``tcp://127.0.0.1:PORT`` on one
            machine, ``tcp://<rank-0 host>:PORT`` across nodes, or ``file://...``).
        backend: ``gloo`` or ``nccl``; None: NCCL on CUDA, gloo otherwise.
        timeout_s: How long a collective (or the rendezvous) waits for the others.
    """

    rank: int
    world_size: int
    init_method: str
    backend: str | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InvalidRequestError(
                f"rank {self.rank} of world_size {self.world_size}: expected "
                "0 <= rank < world_size",
                field="rank",
            )


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` of ``rows`` that ``rank`` computes (the first
    ``rows % world_size`` ranks take one row more; a rank may get none)."""
    base, extra = divmod(rows, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def loss_share(item: Microbatch, lo: int, hi: int) -> float:
    """The weight of rows ``[lo, hi)`` in the tenant's loss on the whole microbatch.

    A masked SFT loss is a mean over unpadded action steps, so the rows weigh by their
    unpadded steps; every other loss is a mean over rows.
    """
    rows = item.batch.batch_size
    pad = item.data.get("action_is_pad") if item.plan_loss == "sft" else None
    if pad is not None:
        valid = ~as_numpy(pad).astype(bool)
        total = int(valid.sum())
        if total > 0:
            return float(valid[lo:hi].sum()) / total
    return (hi - lo) / rows if rows else 0.0


def _rows(value: Any, lo: int, hi: int, rows: int) -> Any:
    if isinstance(value, np.ndarray | torch.Tensor) and value.ndim > 0 and len(value) == rows:
        return value[lo:hi]
    if isinstance(value, list) and len(value) == rows:
        return value[lo:hi]
    return value


def shard(item: Microbatch, lo: int, hi: int) -> Microbatch:
    """The microbatch's rows ``[lo, hi)`` (observations and every per-row field)."""
    rows = item.batch.batch_size
    batch = item.batch
    local = dataclasses.replace(
        batch,
        cameras={k: v[lo:hi] for k, v in batch.cameras.items()},
        state=batch.state[lo:hi],
        instructions=batch.instructions[lo:hi],
        actions=None if batch.actions is None else batch.actions[lo:hi],
    )
    data = {k: _rows(v, lo, hi, rows) for k, v in item.data.items()}
    return dataclasses.replace(item, batch=local, data=data)


class _RankQueue:
    """The Training Queue as one rank reads it: the same partitions, its own
    consumption tasks (``train`` → ``train@rank1``), so k ranks reading one shared
    queue each see every row."""

    def __init__(self, queue: Any, rank: int) -> None:
        self._queue = queue
        self._suffix = f"@rank{rank}"

    def reset_consumption(self, partition_id: str, task_name: str) -> None:
        self._queue.reset_consumption(partition_id, task_name + self._suffix)

    async def async_reset_consumption(self, partition_id: str, task_name: str) -> None:
        await self._queue.async_reset_consumption(partition_id, task_name + self._suffix)

    async def async_get_meta(
        self, partition_id: str, fields: Sequence[str], batch_size: int, task_name: str
    ) -> Any:
        return await self._queue.async_get_meta(
            partition_id, fields, batch_size, task_name + self._suffix
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class DataParallelTrainingService(TrainingModelService):
    """One rank of a data-parallel training role (see module docstring).

    Args:
        base / queue / kwargs: As :class:`TrainingModelService`.
        ranks: This rank's place in the process group; the group is joined here
            (blocking until every rank has joined), unless this process already has one.
    """

    def __init__(
        self, base: ResidentBaseModel, queue: TrainingQueue, *, ranks: RankGroup, **kwargs: Any
    ) -> None:
        # Every rank reads whole microbatches; rank 0 reads under the plain task names.
        view = queue if ranks.rank == 0 else _RankQueue(queue, ranks.rank)
        super().__init__(base, cast(TrainingQueue, view), **kwargs)
        self.ranks = ranks
        if not dist.is_initialized():
            backend = ranks.backend or ("nccl" if base.device.type == "cuda" else "gloo")
            dist.init_process_group(
                backend,
                init_method=ranks.init_method,
                rank=ranks.rank,
                world_size=ranks.world_size,
                timeout=timedelta(seconds=ranks.timeout_s),
            )

    @property
    def rank(self) -> int:
        return self.ranks.rank

    def _tenant_steps(self, items: list[Microbatch]) -> list[TenantStep]:
        """This rank's contiguous share of each tenant's rows, its loss weighted by the
        share (a tenant with no rows here still takes part in the reduce)."""
        ranks, steps = self.ranks, []
        for it in items:
            lo, hi = row_range(it.batch.batch_size, ranks.rank, ranks.world_size)
            part = shard(it, lo, hi) if hi > lo else None
            steps.append(
                TenantStep(
                    it.slot,
                    None if part is None else part.batch,
                    microbatch_loss(part if part is not None else it),
                    weight=loss_share(it, lo, hi),
                )
            )
        return steps

    def _gradient_reduce(self) -> GradientReduce:
        return self._reduce

    def _reduce(
        self, slot: TenantSlot, local: LocalLoss | Exception | None
    ) -> tuple[float, dict[str, float]] | Exception:
        """All-reduce the tenant's gradients, loss and failure flag (a
        :class:`~joynexus.models.grouped_step.GradientReduce`). Every rank calls this
        for every tenant of the step, in the same order."""
        params = list(slot.parameters())
        failed = isinstance(local, Exception)
        mine = None if isinstance(local, Exception) else local
        value = 0.0 if mine is None else mine.value
        device = params[0].device
        flat = torch.cat(
            [
                torch.tensor([1.0 if p.grad is not None else 0.0 for p in params], device=device),
                *[
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                    for p in params
                ],
                torch.tensor([value, 1.0 if failed else 0.0], device=device),
            ]
        )
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        stats = self._reduce_stats(mine)
        n = len(params)
        value, any_failed = float(flat[-2]), float(flat[-1]) > 0
        if any_failed:
            if isinstance(local, Exception):
                return local
            return InternalError(f"tenant {slot.tenant_id!r}: the step failed on another rank")
        offset = n
        for i, p in enumerate(params):
            size = p.numel()
            if float(flat[i]) > 0:
                p.grad = flat[offset : offset + size].view_as(p).to(p.dtype)
            else:
                p.grad = None
            offset += size
        return value, stats

    def _reduce_stats(self, local: LocalLoss | None) -> dict[str, float]:
        """The loss statistics of the whole microbatch: each rank's, weighted by its
        share (a rank without rows contributes nothing)."""
        mine: tuple[float, Mapping[str, float]] | None = None
        if local is not None:
            mine = (local.weight, local.stats)
        gathered: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, mine)
        out: dict[str, float] = {}
        weights: dict[str, float] = {}
        for entry in gathered:
            if entry is None:
                continue
            weight, stats = entry
            for key, v in stats.items():
                out[key] = out.get(key, 0.0) + weight * float(v)
                weights[key] = weights.get(key, 0.0) + weight
        return {k: out[k] / weights[k] for k in out if weights[k] > 0}
