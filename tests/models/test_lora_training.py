"""Figure 12 with LoRA: 4 LoRA tenants (2 schemas, 2 ranks) trained grouped == serial.

ONE mixed-adapter backbone forward per step (grad through the adapters only) and one
backward, then a per-tenant clip + AdamW step, reproduce one forward + backward per
tenant, step by step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from joynexus.bench.figure12 import TENANTS, step_batches
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot
from tests.models.conftest import TinyBackbone
from tests.models.reference import save_slot

STEPS = 20
BATCH = 2
REL_TOL = 1e-4
RANKS = {"libero-a": 4, "libero-b": 8, "calvin-a": 8, "calvin-b": 4}


def _executor(base: ResidentBaseModel, head_type: str) -> GroupedExecutor:
    slots = []
    for i, (tid, schema) in enumerate(TENANTS):
        lora = LoRAConfig(rank=RANKS[tid], alpha=2.0 * RANKS[tid])
        head: OFTHeadConfig | FlowMatchingHeadConfig = (
            OFTHeadConfig(hidden_dim=64, lora=lora)
            if head_type == "oft"
            else FlowMatchingHeadConfig(hidden_dim=32, num_heads=4, lora=lora)
        )
        slots.append(
            TenantSlot(tid, schema, base, head, seed=i, optimizer=OptimizerConfig(lr=1e-3))
        )
    return GroupedExecutor(base, slots)


@pytest.mark.parametrize("head_type", ["oft", "flow_matching"])
def test_lora_grouped_training_matches_serial(head_type: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    grouped, serial = _executor(base, head_type), _executor(base, head_type)
    start: dict[str, dict[str, torch.Tensor]] = {}
    for tid, _ in TENANTS:
        adapter = grouped.slot(tid).lora
        assert adapter is not None
        start[tid] = {n: p.detach().clone() for n, p in adapter.named_parameters()}
    losses: dict[str, list[tuple[float, float]]] = {tid: [] for tid, _ in TENANTS}
    for step in range(STEPS):
        batches = step_batches(step, BATCH)
        g = grouped.train_step(batches)
        s = serial.serial_train_step(batches)
        for tid in batches:
            losses[tid].append((g[tid].loss, s[tid].loss))
            assert g[tid].policy_version == s[tid].policy_version == step + 1
    for tid, pairs in losses.items():
        for step, (lg, ls) in enumerate(pairs):
            assert abs(lg - ls) <= REL_TOL * abs(ls), f"{tid} step {step}: {lg} vs {ls}"
        assert len({round(lg, 6) for lg, _ in pairs}) > STEPS // 2
        slot_g, slot_s = grouped.slot(tid), serial.slot(tid)
        for (name, pg), (_, ps) in zip(
            slot_g.named_parameters(), slot_s.named_parameters(), strict=True
        ):
            # atol 1e-4 = a tenth of one AdamW step (lr 1e-3): Adam divides by the
            # gradient's own scale, so an element whose gradient is near zero moves by a
            # step whose size depends on float32 rounding (one grouped forward vs one per
            # tenant sum in another order); the losses above agree to 1e-4 relative.
            torch.testing.assert_close(pg, ps, rtol=1e-4, atol=1e-4, msg=f"{tid}/{name}")
        # The adapter trained (B left zero) and the frozen base did not.
        assert slot_g.lora is not None
        moved = [not torch.equal(p, start[tid][n]) for n, p in slot_g.lora.named_parameters()]
        assert all(moved), f"{tid}: some adapter tensors never changed"
    assert all(p.grad is None for p in base.model.parameters())


def test_lora_checkpoint_resumes_training_exactly(
    tiny_backbone: TinyBackbone, tmp_path: Path
) -> None:
    from tests.models.reference import load_slot

    base = tiny_backbone("qwen2_5_vl")
    a, b = _executor(base, "oft"), _executor(base, "oft")
    for step in range(3):
        a.train_step(step_batches(step, BATCH))
    for tid, _ in TENANTS:
        load_slot(b.slot(tid), save_slot(a.slot(tid), tmp_path, step=3))
        assert b.slot(tid).policy_version == 3
    for step in range(3, 5):
        batches = step_batches(step, BATCH)
        ra, rb = a.train_step(batches), b.train_step(batches)
        for tid in batches:
            assert ra[tid].loss == pytest.approx(rb[tid].loss, rel=1e-6), (tid, step)
