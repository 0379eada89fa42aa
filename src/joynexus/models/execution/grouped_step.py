"""THE grouped training step (paper §4.3, Appendix A.6): the only place tenants train.

:func:`grouped_step` runs, under the backbone lock:

1. ONE shared backbone forward over every tenant's rows (graph kept for LoRA tenants;
   batches were validated once, at the caller's boundary, so it does not re-validate);
2. each tenant's own loss on its rows (a non-LoRA tenant's features are cut from the
   graph, so its gradient stops at its head);
3. ONE backward of the summed losses: the tenants' rows never mix in the backbone, so
   each tenant's heads and adapter get exactly the gradient of its own loss;
4. per tenant, the optional gradient-reduce hook (a data-parallel rank all-reduces the
   tenant's gradients here), then its own clip, AdamW step and version bump.

Nothing is averaged across tenants. The Training Model Service, its data-parallel
ranks (:class:`GradientReduce`), :meth:`GroupedExecutor.train_step` and the benches all
call it. A tenant whose loss fails (not a finite scalar, or raising) leaves the step and
the others still step; with ``isolate=False`` its error is raised afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.batch import ObservationBatch
from joynexus.models.tenant.slots import StepResult, TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.utils.priority_lock import PriorityRLock

__all__ = [
    "GradientReduce",
    "LocalLoss",
    "LossFn",
    "Outcome",
    "SharedForward",
    "StepTimes",
    "TenantStep",
    "grouped_step",
    "sft_step",
]

#: A tenant's loss on its rows of the shared forward, with statistics to report.
LossFn = Callable[[BackboneOutput], tuple[torch.Tensor, dict[str, float]]]
#: One tenant's result of a step: its step and loss statistics, or its error.
Outcome = tuple[StepResult, dict[str, float]] | Exception


class SharedForward(Protocol):
    """The grouped backbone forward (:meth:`GroupedExecutor.shared_forward`)."""

    def __call__(
        self, batches: Mapping[str, ObservationBatch], *, grad: bool, validated: bool
    ) -> dict[str, BackboneOutput]: ...


@dataclass(frozen=True)
class TenantStep:
    """One tenant's part of a grouped step.

    Attributes:
        slot: The tenant's slot (heads, adapter, optimizer).
        batch: Its rows, validated against ``slot.schema``; None when this process
            holds none of them (a data-parallel rank with an empty share).
        loss: Its loss on its rows' backbone output.
        weight: The loss is scaled by it before the backward (a data-parallel rank's
            share of the tenant's loss denominator).
    """

    slot: TenantSlot
    batch: ObservationBatch | None
    loss: LossFn
    weight: float = 1.0


@dataclass(frozen=True)
class LocalLoss:
    """A tenant's loss in this process: its weighted value, statistics and weight."""

    value: float
    stats: dict[str, float]
    weight: float


class GradientReduce(Protocol):
    """Combines a tenant's local gradients with the other processes' (data parallel).

    Called for every tenant of the step, in order, after the backward; ``local`` is
    None when this process had no rows of the tenant. It leaves the whole microbatch's
    gradients in the slot's ``.grad`` and returns the whole microbatch's loss value and
    statistics, or the error when the tenant failed in any process.
    """

    def __call__(
        self, slot: TenantSlot, local: LocalLoss | Exception | None
    ) -> tuple[float, dict[str, float]] | Exception: ...


@dataclass
class StepTimes:
    """Where a step spent its time: the shared forward, and each tenant's own work
    (its loss, an equal share of the joint backward, its reduce and optimizer step),
    and the rows each tenant had in this process."""

    shared_s: float = 0.0
    own_s: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class _Local:
    loss: torch.Tensor
    local: LocalLoss


def grouped_step(
    steps: Sequence[TenantStep],
    *,
    forward: SharedForward,
    lock: AbstractContextManager[Any],
    reduce: GradientReduce | None = None,
    isolate: bool = False,
    times: StepTimes | None = None,
    sync: Callable[[], None] | None = None,
) -> list[Outcome]:
    """One grouped training step over ``steps`` (see module docstring).

    Args:
        steps: One entry per tenant (a tenant at most once).
        forward: The grouped backbone forward.
        lock: The backbone lock, held for the forward, losses, backward and steps; a
            :class:`~joynexus.utils.priority_lock.PriorityRLock` is yielded to waiting
            predict batches after the forward, the losses and the backward.
        reduce: The gradient-reduce hook of a data-parallel rank (None: one process).
        isolate: Return a failed tenant's error in its place instead of raising it.
        times: Filled with the step's timings (:class:`StepTimes`).
        sync: Called before each timing (waits for queued device kernels).

    Returns:
        One outcome per entry, in order.
    """
    wait = sync or _no_sync
    clock = time.perf_counter
    own = {s.slot.tenant_id: 0.0 for s in steps}
    # Between phases the step lets waiting predict batches run (a PriorityRLock); the
    # time it spends yielded is theirs, not the step's.
    pause = lock.yield_to_priority if isinstance(lock, PriorityRLock) else _no_yield
    with lock:
        start = clock()
        batches = {s.slot.tenant_id: s.batch for s in steps if s.batch is not None}
        lora = any(s.slot.lora is not None for s in steps)
        features = forward(batches, grad=lora, validated=True) if batches else {}
        wait()
        shared_s = clock() - start
        pause()
        parts: list[_Local | Exception | None] = []
        for s in steps:
            t0 = clock()
            parts.append(_loss(s, features, finite=reduce is None))
            wait()
            own[s.slot.tenant_id] += clock() - t0
        pause()
        good = [p for p in parts if isinstance(p, _Local)]
        t0 = clock()
        if any(p.loss.requires_grad for p in good):
            torch.autograd.backward(torch.stack([p.loss for p in good]).sum())
        wait()
        share = (clock() - t0) / max(len(good), 1)
        pause()
        outcomes: list[Outcome] = []
        for s, part in zip(steps, parts, strict=True):
            t0 = clock()
            outcomes.append(_finish(s.slot, part, reduce))
            wait()
            own[s.slot.tenant_id] += clock() - t0 + (share if isinstance(part, _Local) else 0.0)
    if times is not None:
        times.shared_s += shared_s
        times.own_s.update(own)
        times.rows.update({tid: b.batch_size for tid, b in batches.items()})
    if not isolate:
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
    return outcomes


def _no_sync() -> None:
    return None


def _no_yield() -> bool:
    return False


def _loss(
    step: TenantStep, features: Mapping[str, BackboneOutput], *, finite: bool
) -> _Local | Exception | None:
    """The tenant's (weighted) loss, or its error; None without rows. Gradients are
    cleared here, so a tenant without rows reduces zeros, not last step's."""
    slot = step.slot
    slot.optimizer.zero_grad(set_to_none=True)
    if step.batch is None:
        return None
    try:
        feats = features[slot.tenant_id]
        if slot.lora is None:
            feats = feats.detach()
        loss, stats = step.loss(feats)
        if finite:
            value = slot.check_loss(loss)
        else:  # a data-parallel rank checks the reduced value (every rank agrees)
            if loss.dim() != 0:
                raise InvalidRequestError(
                    f"loss must be a scalar tensor, got shape {list(loss.shape)}", field="loss"
                )
            value = float(loss.detach())
        if step.weight != 1.0:
            loss = loss * step.weight
            value = float(loss.detach())
        return _Local(loss, LocalLoss(value, stats, step.weight))
    except Exception as error:
        return error


def _finish(
    slot: TenantSlot, part: _Local | Exception | None, reduce: GradientReduce | None
) -> Outcome:
    """Reduce (data parallel), then clip and step the tenant's own optimizer."""
    if reduce is None:
        if part is None:
            return InvalidRequestError(
                f"tenant {slot.tenant_id!r}: a step without rows", tenant_id=slot.tenant_id
            )
        if isinstance(part, Exception):
            return part
        value, stats = part.local.value, part.local.stats
    else:
        reduced = reduce(slot, part.local if isinstance(part, _Local) else part)
        if isinstance(reduced, Exception):
            return reduced
        value, stats = reduced
        if not math.isfinite(value):
            return InvalidRequestError(
                f"tenant {slot.tenant_id!r}: loss is {value}; refusing to step", field="loss"
            )
    try:
        return slot.step_optimizer(value), stats
    except Exception as error:
        return error


def sft_step(
    slots: Mapping[str, TenantSlot],
    batches: Mapping[str, ObservationBatch],
    *,
    forward: SharedForward,
    lock: AbstractContextManager[Any],
    action_masks: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, StepResult]:
    """One grouped SFT step of ``batches`` (tenant id → its batch with actions): each
    tenant's head's supervised loss, with ``action_masks`` marking valid action entries.

    Raises:
        InvalidRequestError: a batch without actions, or a mask of a tenant without one.
        SchemaMismatchError: a batch that does not match its tenant's schema.
    """
    for tid in action_masks or {}:
        if tid not in batches:
            raise InvalidRequestError(
                f"action_masks names tenant {tid!r}, which has no batch in this step",
                tenant_id=tid,
            )
    steps: list[TenantStep] = []
    for tid, batch in batches.items():
        slot = slots[tid]
        actions = batch.actions
        if actions is None:
            raise InvalidRequestError(
                f"tenant {tid!r}: a training batch needs actions "
                "(float32 [B, action_chunk, action_dim])",
                tenant_id=tid,
                field="actions",
            )
        batch.validate(slot.schema)  # once, here: the forward does not validate again
        mask = (action_masks or {}).get(tid)
        steps.append(TenantStep(slot, batch, _sft_loss(slot, batch.state, actions, mask)))
    outcomes = grouped_step(steps, forward=forward, lock=lock)
    return {
        s.slot.tenant_id: o[0]
        for s, o in zip(steps, outcomes, strict=True)
        if not isinstance(o, Exception)
    }


def _sft_loss(slot: TenantSlot, state: Any, actions: Any, mask: torch.Tensor | None) -> LossFn:
    device = slot.base.device

    def loss(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
        return slot.loss(features, _tensor(state, device), _tensor(actions, device), mask), {}

    return loss


def _tensor(value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.as_tensor(value).to(device)
