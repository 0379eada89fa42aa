"""TenantSlot: deterministic init, private optimizer/version, clipping, shared base memory."""

from __future__ import annotations

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.execution.grouped import resident_bytes
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig, ValueHeadConfig
from joynexus.models.schema import CALVIN, LIBERO
from joynexus.models.tenant.slots import OptimizerConfig, TenantSlot, validate_tenant_id
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone
from tests.models.reference import apply_loss, train_step

OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)
FM = FlowMatchingHeadConfig(hidden_dim=32, num_layers=1, num_heads=2)


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:
    return tiny_backbone("qwen2_5_vl")


def _features(base: ResidentBaseModel, b: int = 2, seed: int = 0) -> BackboneOutput:
    g = torch.Generator().manual_seed(seed)
    return BackboneOutput(
        hidden_states=torch.randn(b, 6, base.hidden_size, generator=g),
        attention_mask=torch.ones(b, 6, dtype=torch.long),
    )


def _batch(slot: TenantSlot, b: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = slot.schema
    return (
        torch.randn(b, s.state_dim, generator=g),
        torch.randn(b, s.action_chunk, s.action_dim, generator=g),
    )


def test_init_is_seeded_private_and_references_the_base(base: ResidentBaseModel) -> None:
    before = torch.random.get_rng_state()
    a = TenantSlot("a", LIBERO, base, OFT, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before), "slot init touched global RNG"
    b = TenantSlot("b", LIBERO, base, OFT, seed=3)
    c = TenantSlot("c", LIBERO, base, OFT, seed=4)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert pa.data_ptr() != pb.data_ptr()
    assert any(
        not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True)
    )
    assert a.base is base and b.base is base
    assert a.schema_signature == base.signature_for(LIBERO)
    assert a.policy_version == 0
    assert TenantSlot("d", CALVIN, base, OFT).schema_signature != a.schema_signature


@pytest.mark.parametrize("head", [OFT, FM], ids=["oft", "flow"])
def test_train_step_updates_only_this_slot(
    base: ResidentBaseModel, head: OFTHeadConfig | FlowMatchingHeadConfig
) -> None:
    a = TenantSlot("a", LIBERO, base, head, seed=0)
    b = TenantSlot("b", LIBERO, base, head, seed=0)
    b_before = {n: p.detach().clone() for n, p in b.named_parameters()}
    a_before = {n: p.detach().clone() for n, p in a.named_parameters()}
    state, actions = _batch(a)
    result = train_step(a, _features(base), state, actions)
    assert result.policy_version == 1 == a.policy_version
    assert b.policy_version == 0
    assert result.loss > 0 and result.grad_norm > 0
    assert any(not torch.equal(p, a_before[n]) for n, p in a.named_parameters())
    assert all(torch.equal(p, b_before[n]) for n, p in b.named_parameters())
    assert all(p.grad is None for p in b.parameters())


def test_grad_norm_is_reported_before_clipping_and_clipped(base: ResidentBaseModel) -> None:
    slot = TenantSlot("a", LIBERO, base, OFT, optimizer=OptimizerConfig(grad_clip=1e-3))
    state, actions = _batch(slot)
    result = train_step(slot, _features(base), state, actions)
    grads = [p.grad for p in slot.parameters() if p.grad is not None]
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert result.grad_norm > 1e-2  # the raw norm, well above the clip
    assert float(clipped) <= 1e-3 * 1.001


def test_per_tenant_learning_rate(base: ResidentBaseModel) -> None:
    slow = TenantSlot("slow", LIBERO, base, OFT, optimizer=OptimizerConfig(lr=1e-4))
    fast = TenantSlot("fast", LIBERO, base, OFT, optimizer=OptimizerConfig(lr=1e-2))
    init = [p.detach().clone() for p in slow.parameters()]
    state, actions = _batch(slow)
    for slot in (slow, fast):
        train_step(slot, _features(base), state, actions)
    d_slow = max(
        float((p.detach() - q).abs().max()) for p, q in zip(slow.parameters(), init, strict=True)
    )
    d_fast = max(
        float((p.detach() - q).abs().max()) for p, q in zip(fast.parameters(), init, strict=True)
    )
    # Adam's first step moves each weight by about lr.
    assert d_fast / d_slow == pytest.approx(100, rel=0.2)
    assert fast.optimizer.param_groups[0]["weight_decay"] == 0.01


def test_apply_loss_rejects_bad_losses_without_stepping(base: ResidentBaseModel) -> None:
    slot = TenantSlot("a", LIBERO, base, OFT)
    p = next(slot.parameters())
    with pytest.raises(InvalidRequestError, match="scalar"):
        apply_loss(slot, p.reshape(-1)[:2] * 2.0)
    with pytest.raises(InvalidRequestError, match="nan"):
        apply_loss(slot, p.sum() * float("nan"))
    assert slot.policy_version == 0


def test_value_head_and_sampling(base: ResidentBaseModel) -> None:
    slot = TenantSlot("rl", LIBERO, base, OFT, value_head=ValueHeadConfig(hidden_dim=16))
    names = [n for n, _ in slot.named_parameters()]
    assert any(n.startswith("value_head.") for n in names)
    assert any(n.startswith("action_module.") for n in names)
    f = _features(base, b=3)
    state, _ = _batch(slot, b=3)
    values = slot.value(f, state)
    assert values is not None and values.shape == (3,)
    actions, logp, chain = slot.sample(f, state, generator=torch.Generator().manual_seed(0))
    assert actions.shape == (3, 8, 7) and logp is not None and logp.shape == (3,)
    assert chain is None  # a Gaussian head's sample is its own record
    fm = TenantSlot("fm", LIBERO, base, FM)
    assert fm.value(f, state) is None
    fm_actions, fm_logp, fm_chain = fm.sample(f, state)
    steps = FM.num_inference_steps
    assert fm_actions.shape == (3, 8, 7) and fm_logp is not None and fm_logp.shape == (3,)
    assert fm_chain is not None and fm_chain.shape == (3, steps + 1, 8, 7)
    assert torch.equal(fm_chain[:, -1], fm_actions)


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "a..b", "x" * 200, "sp ace"])
def test_tenant_ids_are_safe_path_components(bad: str, base: ResidentBaseModel) -> None:
    with pytest.raises(InvalidRequestError, match="tenant_id"):
        validate_tenant_id(bad)
    with pytest.raises(InvalidRequestError):
        TenantSlot(bad, LIBERO, base, OFT)
    assert validate_tenant_id("lab-1.tenant_A") == "lab-1.tenant_A"


def test_memory_is_base_once_plus_sum_of_slots(base: ResidentBaseModel) -> None:
    slots = [
        TenantSlot(f"t{i}", schema, base, head, seed=i)
        for i, (schema, head) in enumerate(
            [(LIBERO, OFT), (CALVIN, FM), (LIBERO, FM), (CALVIN, OFT)]
        )
    ]
    base_params = list(base.model.parameters())
    base_storages = {p.untyped_storage().data_ptr() for p in base_params}
    for slot in slots:
        assert all(p.untyped_storage().data_ptr() not in base_storages for p in slot.parameters())
    total = resident_bytes(base_params, slots)
    assert total == base.parameter_bytes() + sum(s.parameter_bytes() for s in slots)
    # Adding tenants grows memory by their slots only: the base is never copied.
    assert (
        resident_bytes(base_params, slots[:1])
        == base.parameter_bytes() + slots[0].parameter_bytes()
    )
    assert all(s.parameter_bytes() < base.parameter_bytes() for s in slots)
