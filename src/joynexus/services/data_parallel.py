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
import math
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from joynexus.errors import InternalError, InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.slots import StepResult, TenantSlot
from joynexus.queues.training import TrainingQueue
from joynexus.services.job_plan import Microbatch
from joynexus.services.samples import as_numpy
from joynexus.services.training import TrainingModelService

__all__ = ["DataParallelTrainingService", "RankGroup", "loss_share", "row_range"]

_Outcome = tuple[StepResult, dict[str, float]] | Exception
#: A rank's part of one tenant's step: its scaled loss, its loss statistics, its share.
_Local = tuple[torch.Tensor, dict[str, float], float]


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

    def _grouped_step(self, items: list[Microbatch], isolate: bool = False) -> list[_Outcome]:
        ranks = self.ranks
        parts: list[tuple[Microbatch, Microbatch | None, float]] = []
        for it in items:
            lo, hi = row_range(it.batch.batch_size, ranks.rank, ranks.world_size)
            parts.append((it, shard(it, lo, hi) if hi > lo else None, loss_share(it, lo, hi)))
        with self._lock:
            start = time.perf_counter()
            local = {it.slot.tenant_id: p.batch for it, p, _ in parts if p is not None}
            lora = any(it.slot.lora is not None for it in items)
            features = self._executor.shared_forward(local, grad=lora) if local else {}
            self._sync_for_timing()
            shared_s = time.perf_counter() - start
            t0 = time.perf_counter()
            losses: dict[str, _Local | Exception] = {}
            for it, part, weight in parts:
                it.slot.optimizer.zero_grad(set_to_none=True)
                if part is None:
                    continue
                try:
                    loss, stats = self._loss_one(part, features[it.slot.tenant_id])
                    if loss.dim() != 0:
                        raise InvalidRequestError(
                            f"loss must be a scalar tensor, got shape {list(loss.shape)}",
                            field="loss",
                        )
                    losses[it.slot.tenant_id] = (loss * weight, stats, weight)
                except Exception as error:
                    losses[it.slot.tenant_id] = error
            scaled = [out[0] for out in losses.values() if not isinstance(out, Exception)]
            if scaled and any(t.requires_grad for t in scaled):
                torch.autograd.backward(torch.stack(scaled).sum())
            outcomes = [
                self._reduce_and_step(it.slot, losses.get(it.slot.tenant_id)) for it in items
            ]
            self._sync_for_timing()
            # Heads, the joint backward and the all-reduces: split evenly by tenant.
            own = (time.perf_counter() - t0) / max(len(items), 1)
        for outcome in outcomes:
            if isinstance(outcome, Exception) and not isolate:
                raise outcome
        if self._instruments.enabled:
            # This rank's own work: its rows, its time (each rank meters itself).
            rows = {it.slot.tenant_id: p.batch.batch_size for it, p, _ in parts if p is not None}
            self._instruments.training_step(rows, shared_s, {t: own for t in rows})
            for it, outcome in zip(items, outcomes, strict=True):
                if not isinstance(outcome, Exception):
                    step = outcome[0]
                    self._instruments.learning_step(
                        it.slot.tenant_id, step.policy_version, step.loss, step.grad_norm
                    )
        return outcomes

    def _reduce_and_step(self, slot: TenantSlot, local: _Local | Exception | None) -> _Outcome:
        """All-reduce the tenant's gradients, loss and failure flag; step if no rank
        failed. Every rank calls this for every tenant of the step, in the same order."""
        params = list(slot.parameters())
        failed = isinstance(local, Exception)
        mine = None if isinstance(local, Exception) else local
        value = 0.0 if mine is None else float(mine[0].detach())
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
        if not math.isfinite(value):
            return InvalidRequestError(
                f"tenant {slot.tenant_id!r}: loss is {value}; refusing to step", field="loss"
            )
        offset = n
        for i, p in enumerate(params):
            size = p.numel()
            if float(flat[i]) > 0:
                p.grad = flat[offset : offset + size].view_as(p).to(p.dtype)
            else:
                p.grad = None
            offset += size
        return slot.step_optimizer(value), stats

    def _reduce_stats(self, local: _Local | None) -> dict[str, float]:
        """The loss statistics of the whole microbatch: each rank's, weighted by its
        share (a rank without rows contributes nothing)."""
        mine: tuple[float, Mapping[str, float]] | None = None
        if local is not None:
            mine = (local[2], local[1])
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
