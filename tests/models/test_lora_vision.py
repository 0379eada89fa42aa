"""LoRA on the vision tower and its projection: each tenant's images go through its own
adapter in a grouped forward, equal to serial, gradients stay with their tenant."""

from __future__ import annotations

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import max_abs_diff_left_padded
from joynexus.models.checkpoints.payload import export_params, load_weights
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import LoRAConfig, LoRARows, LoRASegment, lora_rows
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import CALVIN, LIBERO, PUSHT
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone
from tests.models.reference import grouped_predict
from tests.models.test_lora import REL_TOL, _adapter_grads, _feature_loss, _rel

ARCHES = ["smolvlm", "paligemma", "qwen2_5_vl", "qwen3_vl", "pi0"]


def vision_head(rank: int, *, projection: bool = True, language: bool = True) -> OFTHeadConfig:
    lora = LoRAConfig(
        rank=rank,
        alpha=2.0 * rank,
        targets=("q_proj", "v_proj") if language else ("q_proj",),
        vision=True,
        vision_projection=projection,
    )
    return OFTHeadConfig(hidden_dim=32, lora=lora)


def randomize(slot: TenantSlot, seed: int, *, only: str = "") -> None:
    """Non-zero ``B`` (a fresh adapter is the identity), on the layers whose name
    contains ``only``; the others stay zero."""
    assert slot.lora is not None
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, b in slot.lora.B.items():
            if only in key:
                b.copy_(torch.randn(b.shape, generator=gen) * 0.05)


def vision_keys(slot: TenantSlot) -> list[str]:
    assert slot.lora is not None
    return [k for k in slot.lora.A if not any(t in k for t in ("language_model", "text_model"))]


def _executor(base: ResidentBaseModel) -> GroupedExecutor:
    slots = [
        TenantSlot("vis-r4", LIBERO, base, vision_head(4), seed=1),
        TenantSlot("plain", PUSHT, base, OFTHeadConfig(hidden_dim=32), seed=2),
        TenantSlot("vis-r2", CALVIN, base, vision_head(2, projection=False), seed=3),
        TenantSlot("vis-r4b", LIBERO, base, vision_head(4), seed=4),
    ]
    for i, slot in enumerate(slots):
        if slot.lora is not None:
            randomize(slot, 100 + i)
    return GroupedExecutor(base, slots)


def _batches() -> dict[str, ObservationBatch]:
    return {
        "vis-r4": ObservationBatch.synthetic(LIBERO, 2, seed=1),
        "plain": ObservationBatch.synthetic(PUSHT, 1, seed=2),
        "vis-r2": ObservationBatch.synthetic(CALVIN, 2, seed=3),
        "vis-r4b": ObservationBatch.synthetic(LIBERO, 1, seed=4),
    }


@pytest.mark.parametrize("arch", ARCHES)
def test_vision_adapters_grouped_equal_serial(arch: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone(arch)
    executor = _executor(base)
    assert vision_keys(executor.slot("vis-r4")), f"{arch}: no vision layer adapted"
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
        assert diff <= REL_TOL * float(s.hidden_states.detach().abs().max()), f"{arch}/{tid}"
    for tid, grads in grouped_grads.items():
        for name, grad in grads.items():
            assert float(grad.norm()) > 0, f"{arch}/{tid}/{name}: zero gradient"
            rel = _rel(grad, serial_grads[tid][name])
            assert rel <= REL_TOL, f"{arch}/{tid}/{name}: gradient rel diff {rel}"
    assert all(p.grad is None and not p.requires_grad for p in base.model.parameters())


@pytest.mark.parametrize("arch", ["smolvlm", "qwen2_5_vl"])
def test_a_vision_adapter_changes_only_its_own_rows(arch: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone(arch)
    a = TenantSlot("a", LIBERO, base, vision_head(4), seed=1)
    b = TenantSlot("b", LIBERO, base, vision_head(4), seed=2)
    plain = TenantSlot("p", LIBERO, base, OFTHeadConfig(hidden_dim=32), seed=3)
    # Only the vision tower's B is non-zero: any change comes through the images.
    for slot, seed in ((a, 1), (b, 2)):
        for key in vision_keys(slot):
            randomize(slot, seed, only=key)
    obs = ObservationBatch.synthetic(LIBERO, 2, seed=7)
    executor = GroupedExecutor(base, [a, b, plain])
    out = executor.shared_forward({"a": obs, "p": obs, "b": obs})
    bare = executor.shared_forward({"p": obs})["p"]
    torch.testing.assert_close(out["p"].hidden_states, bare.hidden_states, rtol=0, atol=1e-6)
    assert not torch.allclose(out["a"].hidden_states, bare.hidden_states, atol=1e-4)
    assert not torch.allclose(out["a"].hidden_states, out["b"].hidden_states, atol=1e-4)


def test_gradients_reach_only_the_tenants_own_adapter(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("paligemma")
    executor = _executor(base)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    out = executor.shared_forward(_batches(), grad=True)
    # A loss on tenant vis-r2's rows alone.
    _feature_loss(out["vis-r2"]).backward()
    for tid, slot in executor.slots.items():
        if slot.lora is None:
            continue
        grads = [p.grad for p in slot.lora.parameters()]
        if tid == "vis-r2":
            for key in vision_keys(slot):
                grad = slot.lora.A[key].grad
                assert grad is not None and float(grad.norm()) > 0, key
        else:
            assert all(g is None or float(g.abs().max()) == 0 for g in grads), tid
    # A full grouped SFT step moves adapters and heads, never the frozen base.
    batches = {
        tid: ObservationBatch.synthetic(executor.slot(tid).schema, 2, seed=5, with_actions=True)
        for tid in ("vis-r4", "plain", "vis-r2")
    }
    adapter_before = executor.slot("vis-r4").lora.A.state_dict()  # type: ignore[union-attr]
    adapter_before = {k: v.clone() for k, v in adapter_before.items()}
    executor.train_step(batches)
    after = executor.slot("vis-r4").lora.A.state_dict()  # type: ignore[union-attr]
    assert any(not torch.equal(after[k], v) for k, v in adapter_before.items())
    for key, value in base.model.state_dict().items():
        assert torch.equal(value, before[key]), f"base weight {key} changed"


def test_payload_round_trip_restores_the_vision_adapter(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("smolvlm")
    src = TenantSlot("t", LIBERO, base, vision_head(4), seed=0)
    randomize(src, 7)
    payload = export_params(src)
    assert any("vision_model" in n for n in payload.named_tensors)
    assert any("connector" in n for n in payload.named_tensors)
    dst = TenantSlot("t", LIBERO, base, vision_head(4), seed=99)
    load_weights(dst, payload)
    batch = {"t": ObservationBatch.synthetic(LIBERO, 2, seed=5)}
    a = grouped_predict(GroupedExecutor(base, [src]), batch)["t"]
    b = grouped_predict(GroupedExecutor(base, [dst]), batch)["t"]
    torch.testing.assert_close(a, b)


def test_vision_hooks_refuse_images_they_cannot_map(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("paligemma")
    slot = TenantSlot("t", LIBERO, base, vision_head(2), seed=0)
    assert slot.lora is not None
    feature = base.canonicalize([("t", LIBERO, ObservationBatch.synthetic(LIBERO, 2, seed=0))])
    rows = LoRARows(rows=2, segments=(LoRASegment(0, 2, slot.lora),)).with_images([3, 4])
    with lora_rows(rows), pytest.raises(RuntimeError, match="images"):
        base.encode(feature)
    with pytest.raises(ValueError, match="image counts"):
        LoRARows(rows=2, segments=()).with_images([2])


def test_vision_lora_on_a_backbone_without_vision_layers_is_refused(
    tiny_backbone: TinyBackbone,
) -> None:
    base = tiny_backbone("smolvlm")
    host = base.lora
    saved = host.vision_modules
    host.vision_modules = {}
    try:
        with pytest.raises(InvalidRequestError, match=r"lora\.vision .*supports"):
            TenantSlot("t", LIBERO, base, vision_head(2), seed=0)
    finally:
        host.vision_modules = saved
