"""What the tests hold production against, built from production's public pieces.

The grouped executor answers predict requests with ``run_requests`` and trains with
``grouped_step``; these are the baselines the grouped = serial tests compare against
(one backbone forward per tenant, a slot's update on its own rows), and the
save-then-load round trip of a slot (``snapshot_slot`` + ``write_checkpoint``,
``read_checkpoint`` + ``install_checkpoint``: what the Training Model Service does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints.payload import (
    CheckpointManifest,
    install_checkpoint,
    read_checkpoint,
    snapshot_slot,
    write_checkpoint,
)
from joynexus.models.execution.decode import decode_slot
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.tenant.slots import StepResult, TenantSlot
from joynexus.models.types import BackboneOutput

Mode = Literal["mean", "sample"]


def serial_forward(
    executor: GroupedExecutor, batches: Mapping[str, ObservationBatch]
) -> dict[str, BackboneOutput]:
    """One backbone forward per tenant (the serial baseline)."""
    out: dict[str, BackboneOutput] = {}
    for tid, batch in batches.items():
        out.update(executor.shared_forward({tid: batch}))
    return out


def decode(
    executor: GroupedExecutor,
    features: Mapping[str, BackboneOutput],
    batches: Mapping[str, ObservationBatch],
    mode: Mode = "mean",
    generators: Mapping[str, torch.Generator] | None = None,
) -> dict[str, torch.Tensor]:
    """Each tenant's head decodes its rows alone (default: its own generator)."""
    out: dict[str, torch.Tensor] = {}
    for tid, batch in batches.items():
        slot = executor.slot(tid)
        state = torch.as_tensor(batch.state, device=executor.base.device)
        gen = (generators or {}).get(tid, slot.inference_generator)
        out[tid] = decode_slot(slot, features[tid], state, mode, gen).actions
    return out


def grouped_predict(
    executor: GroupedExecutor,
    batches: Mapping[str, ObservationBatch],
    *,
    mode: Mode = "mean",
    generators: Mapping[str, torch.Generator] | None = None,
) -> dict[str, torch.Tensor]:
    """One grouped forward, then each tenant's head on its rows."""
    return decode(executor, executor.shared_forward(batches), batches, mode, generators)


def serial_predict(
    executor: GroupedExecutor,
    batches: Mapping[str, ObservationBatch],
    *,
    mode: Mode = "mean",
    generators: Mapping[str, torch.Generator] | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`grouped_predict` with one backbone forward per tenant."""
    return decode(executor, serial_forward(executor, batches), batches, mode, generators)


def apply_loss(slot: TenantSlot, loss: torch.Tensor) -> StepResult:
    """Backpropagate ``loss`` into ``slot`` and step its optimizer."""
    value = slot.check_loss(loss)
    slot.optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)
    return slot.step_optimizer(value)


def train_step(
    slot: TenantSlot,
    features: BackboneOutput,
    state: torch.Tensor,
    actions: torch.Tensor,
    action_mask: torch.Tensor | None = None,
) -> StepResult:
    """One SFT update of ``slot`` on its rows (a LoRA slot keeps the features' graph)."""
    if slot.lora is None:
        features = features.detach()
    return apply_loss(slot, slot.loss(features, state, actions, action_mask))


def save_slot(
    slot: TenantSlot,
    output_dir: str | os.PathLike[str],
    step: int,
    *,
    include_optim: bool = True,
    **kwargs: Any,
) -> Path:
    """Write ``slot`` to ``<output_dir>/<tenant>/step_<step>/``."""
    return write_checkpoint(
        snapshot_slot(slot, include_optim=include_optim), output_dir, step, **kwargs
    )


def load_slot(
    slot: TenantSlot,
    path: str | os.PathLike[str],
    *,
    base_model_hash: str | None = None,
    load_optim: bool = True,
) -> CheckpointManifest:
    """Restore ``slot`` from the checkpoint at ``path``."""
    loaded = read_checkpoint(slot, path, base_model_hash=base_model_hash, load_optim=load_optim)
    return install_checkpoint(slot, loaded)
