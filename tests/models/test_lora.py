"""Tenant LoRA adapters: mixed-adapter grouped forward/backward equals serial, per row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import max_abs_diff_left_padded
from joynexus.models.checkpoints.payload import export_params, load_weights
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import (
    PEFT_CONFIG_FILE,
    LoRAAdapter,
    LoRAConfig,
    LoRARows,
    LoRASegment,
    lora_rows,
    peft_deltas,
    save_peft_adapter,
    sgmv_torch,
)
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CALVIN, LIBERO, PUSHT
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone
from tests.models.reference import grouped_predict

REL_TOL = 1e-5


def lora_head(rank: int, targets: tuple[str, ...] | None = None) -> OFTHeadConfig:
    lora = LoRAConfig(rank=rank, alpha=2.0 * rank, **({"targets": targets} if targets else {}))
    return OFTHeadConfig(hidden_dim=32, lora=lora)


def randomize_b(slot: TenantSlot, seed: int) -> None:
    """A fresh adapter's B is zero (no effect, zero A-gradient): make it non-trivial."""
    assert slot.lora is not None
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in slot.lora.B.values():
            b.copy_(torch.randn(b.shape, generator=gen) * 0.05)


def _mixed_executor(base: ResidentBaseModel) -> GroupedExecutor:
    r8 = lora_head(8, ("q_proj", "v_proj", "down_proj"))
    slots = [
        TenantSlot("lora-r4", LIBERO, base, lora_head(4), seed=1),
        TenantSlot("plain", PUSHT, base, OFTHeadConfig(hidden_dim=32), seed=2),
        TenantSlot("lora-r8", CALVIN, base, r8, seed=3),
        TenantSlot("lora-r4b", LIBERO, base, lora_head(4), seed=4),
    ]
    for i, slot in enumerate(slots):
        if slot.lora is not None:
            randomize_b(slot, 100 + i)
    return GroupedExecutor(base, slots)


def _batches() -> dict[str, ObservationBatch]:
    return {
        "lora-r4": ObservationBatch.synthetic(LIBERO, 2, seed=1),
        "plain": ObservationBatch.synthetic(PUSHT, 1, seed=2),
        "lora-r8": ObservationBatch.synthetic(CALVIN, 2, seed=3),
        "lora-r4b": ObservationBatch.synthetic(LIBERO, 1, seed=4),
    }


def _feature_loss(out: BackboneOutput) -> torch.Tensor:
    """A well-conditioned probe: a fixed random projection of the pooled features.

    (Not the features' squared norm: after the final RMSNorm that is nearly constant,
    its gradient nearly cancels and relative differences mean nothing.)
    """
    hidden = out.hidden_states
    mask = out.attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    proj = torch.randn(hidden.shape[-1], 4, generator=torch.Generator().manual_seed(0))
    return ((pooled @ proj.to(hidden)) ** 2).sum()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _adapter_grads(executor: GroupedExecutor) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {}
    for tid, slot in executor.slots.items():
        if slot.lora is not None:
            grads = {}
            for name, p in slot.lora.named_parameters():
                assert p.grad is not None, f"{tid}/{name} got no gradient"
                grads[name] = p.grad.detach().clone()
                p.grad = None
            out[tid] = grads
    return out


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "paligemma", "smolvlm"])
def test_mixed_adapter_batch_equals_serial(arch: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone(arch)
    executor = _mixed_executor(base)
    batches = _batches()

    grouped = executor.shared_forward(batches, grad=True)
    torch.autograd.backward(torch.stack([_feature_loss(f) for f in grouped.values()]).sum())
    grouped_grads = _adapter_grads(executor)

    serial: dict[str, BackboneOutput] = {}
    for tid, batch in batches.items():
        serial[tid] = executor.shared_forward({tid: batch}, grad=True)[tid]
        if executor.slot(tid).lora is not None:
            torch.autograd.backward(_feature_loss(serial[tid]))
    serial_grads = _adapter_grads(executor)

    for tid in batches:
        g, s = grouped[tid], serial[tid]
        diff = max_abs_diff_left_padded(
            g.hidden_states.detach(), g.attention_mask, s.hidden_states.detach(), s.attention_mask
        )
        scale = float(s.hidden_states.detach().abs().max())
        assert diff <= REL_TOL * scale, f"{arch}/{tid}: features differ by {diff}"
    assert set(grouped_grads) == {"lora-r4", "lora-r8", "lora-r4b"}
    for tid, grads in grouped_grads.items():
        for name, grad in grads.items():
            assert float(grad.norm()) > 0, f"{tid}/{name}: zero gradient"
            rel = _rel(grad, serial_grads[tid][name])
            assert rel <= REL_TOL, f"{arch}/{tid}/{name}: gradient rel diff {rel}"
    # The frozen base never receives gradients.
    assert all(p.grad is None and not p.requires_grad for p in base.model.parameters())


def test_rows_without_adapter_take_the_base_path(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    executor = _mixed_executor(base)
    batches = _batches()
    mixed = executor.shared_forward(batches)
    plain = executor.shared_forward(batches, adapters=dict.fromkeys(batches))
    assert torch.equal(mixed["plain"].hidden_states, plain["plain"].hidden_states)
    # ... and an adapter row does change its features.
    assert not torch.allclose(mixed["lora-r4"].hidden_states, plain["lora-r4"].hidden_states)
    # Same schema, different adapters: different features for the same observations.
    same = {"lora-r4": batches["lora-r4"], "lora-r4b": batches["lora-r4"]}
    out = executor.shared_forward(same)
    assert not torch.allclose(out["lora-r4"].hidden_states, out["lora-r4b"].hidden_states)


def test_segmented_kernel_matches_dense_loop() -> None:
    from joynexus.models.lora import KernelSegment

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 8, generator=gen)
    base_out = torch.randn(5, 3, 6, generator=gen)
    a1, b1 = torch.randn(2, 8, generator=gen), torch.randn(6, 2, generator=gen)
    a2, b2 = torch.randn(4, 8, generator=gen), torch.randn(6, 4, generator=gen)
    segs = [KernelSegment(0, 2, a1, b1, 0.5, 0.0), KernelSegment(3, 5, a2, b2, 2.0, 0.0)]
    out = sgmv_torch(x, base_out, segs, training=False)
    expect = base_out.clone()
    expect[0:2] += 0.5 * x[0:2] @ a1.t() @ b1.t()
    expect[3:5] += 2.0 * x[3:5] @ a2.t() @ b2.t()
    torch.testing.assert_close(out, expect)


def test_hooks_refuse_a_wrong_row_count(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    slot = TenantSlot("t", LIBERO, base, lora_head(2), seed=0)
    assert slot.lora is not None
    feature = base.canonicalize([("t", LIBERO, ObservationBatch.synthetic(LIBERO, 2, seed=0))])
    with (
        lora_rows(LoRARows(rows=3, segments=(LoRASegment(0, 2, slot.lora),))),
        pytest.raises(RuntimeError, match="rows"),
    ):
        base.encode(feature)


def test_payload_carries_the_adapter(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    src = TenantSlot("t", LIBERO, base, lora_head(4), seed=0)
    randomize_b(src, 7)
    payload = export_params(src)
    assert any(n.startswith("lora.") for n in payload.named_tensors)
    # Only the adapter and head: far smaller than the base model.
    assert payload.nbytes() < base.parameter_bytes() // 4
    dst = TenantSlot("t", LIBERO, base, lora_head(4), seed=99)
    load_weights(dst, payload)
    batch = {"t": ObservationBatch.synthetic(LIBERO, 2, seed=5)}
    a = grouped_predict(GroupedExecutor(base, [src]), batch)["t"]
    b = grouped_predict(GroupedExecutor(base, [dst]), batch)["t"]
    torch.testing.assert_close(a, b)


def test_uniform_segments_take_the_batched_path_and_agree() -> None:
    from joynexus.models.lora import KernelSegment

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 8, generator=gen, requires_grad=True)
    base_out = torch.randn(6, 3, 5, generator=gen)
    pairs = [
        (torch.randn(4, 8, generator=gen, requires_grad=True), torch.randn(5, 4, generator=gen))
        for _ in range(3)
    ]
    segs = [KernelSegment(2 * i, 2 * i + 2, a, b, 0.5 + i, 0.0) for i, (a, b) in enumerate(pairs)]
    out = sgmv_torch(x, base_out, segs, training=False)
    expect = torch.cat(
        [
            base_out[s.start : s.stop] + s.scaling * x[s.start : s.stop] @ s.a.t() @ s.b.t()
            for s in segs
        ]
    )
    torch.testing.assert_close(out, expect)
    (ga,) = torch.autograd.grad(out.sum(), [pairs[1][0]])
    (ea,) = torch.autograd.grad(expect.sum(), [pairs[1][0]])
    torch.testing.assert_close(ga, ea)


def test_tenant_memory_budget_refuses_the_tenant_that_does_not_fit(
    tiny_backbone: TinyBackbone,
) -> None:
    from joynexus.errors import CapacityError

    base = tiny_backbone("qwen2_5_vl")
    r4 = TenantSlot("a", LIBERO, base, lora_head(4), seed=0)
    r8 = TenantSlot("b", LIBERO, base, lora_head(8), seed=1)
    assert r4.lora is not None and r8.lora is not None
    # Bytes per tenant: adapter + head, times 3 with AdamW's moments; rank doubles adapter.
    assert r4.training_bytes() == 3 * r4.parameter_bytes()
    adapter = sum(p.numel() * 4 for p in r4.lora.parameters())
    assert sum(p.numel() * 4 for p in r8.lora.parameters()) == 2 * adapter
    budget = 2 * r4.training_bytes() + r8.training_bytes() // 2
    executor = GroupedExecutor(base, [r4], tenant_memory_budget=budget)
    executor.add_slot(TenantSlot("c", LIBERO, base, lora_head(4), seed=2))
    with pytest.raises(CapacityError, match=r"'b' needs .* tenant memory budget") as info:
        executor.add_slot(r8)
    assert info.value.details["budget_bytes"] == budget
    assert sorted(executor.slots) == ["a", "c"]


def test_peft_deltas_are_scale_b_a_and_refuse_other_adapters(tmp_path: Path) -> None:
    shapes = {"m.layers.0.self_attn.q_proj": (5, 3), "m.layers.0.mlp.up_proj": (3, 7)}
    adapter = LoRAAdapter(LoRAConfig(rank=2, alpha=6.0), shapes)
    with torch.no_grad():
        for b in adapter.B.values():
            b.copy_(torch.randn(b.shape))
    assert peft_deltas(tmp_path) == {}  # no adapter there
    save_peft_adapter(adapter, tmp_path)
    deltas = peft_deltas(tmp_path)
    assert set(deltas) == set(shapes)
    for name, (fan_in, fan_out) in shapes.items():
        pair = adapter.pair(name)
        assert pair is not None and deltas[name].shape == (fan_out, fan_in)
        torch.testing.assert_close(deltas[name], 3.0 * pair[1].detach() @ pair[0].detach())
    config = json.loads((tmp_path / PEFT_CONFIG_FILE).read_text())
    (tmp_path / PEFT_CONFIG_FILE).write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="not a plain LoRA"):
        peft_deltas(tmp_path)
