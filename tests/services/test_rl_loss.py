"""The KL anchor of RL to the reference (SFT) policy, on a Gaussian and a Flow-SDE head.

The anchor is ``kl_coef · KL(π ‖ π_ref)`` at the behaviour samples: zero with a zero
gradient while the policy is its reference, positive once it moves, and its gradient
points back toward the reference.
"""

from __future__ import annotations

import pytest
import torch

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.services.rl_loss import anchored_log_probs, behaviour_log_probs, policy_loss
from joynexus.spec.workload import AlgorithmSpec
from tests.services.test_training_service import FM, OFT, SCHEMA

HEADS = {"oft": OFT, "flow_matching": FM}


def _inputs(
    slot: TenantSlot, hidden: int
) -> tuple[BackboneOutput, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(0)
    features = BackboneOutput(
        hidden_states=torch.randn(6, 5, hidden, generator=g),
        attention_mask=torch.ones(6, 5, dtype=torch.long),
    )
    state = torch.randn(6, SCHEMA.state_dim, generator=g)
    drawn = slot.sample(features, state, generator=g)
    return features, state, drawn.actions, drawn.chain


def _slot(base: ResidentBaseModel, head: OFTHeadConfig | FlowMatchingHeadConfig) -> TenantSlot:
    slot = TenantSlot("anchored", SCHEMA, base, head, seed=3)
    slot.freeze_reference()
    return slot


def _perturb(slot: TenantSlot, scale: float) -> dict[str, torch.Tensor]:
    """Move every head weight by Gaussian noise; returns the move per parameter."""
    g = torch.Generator().manual_seed(1)
    moves = {}
    with torch.no_grad():
        for name, p in slot.action_module.named_parameters():
            moves[name] = scale * torch.randn(p.shape, generator=g)
            p.add_(moves[name])
    return moves


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_anchor_vanishes_with_its_gradient_at_the_reference(
    base: ResidentBaseModel, kind: str
) -> None:
    slot = _slot(base, HEADS[kind])
    features, state, actions, chain = _inputs(slot, base.hidden_size)
    log_probs, kl = anchored_log_probs(slot, features, state, actions, chain)
    # The anchored path computes the same log-probabilities as the plain one.
    plain = behaviour_log_probs(slot, features, state, actions, chain)
    torch.testing.assert_close(log_probs, plain, rtol=1e-5, atol=1e-4)
    assert kl.shape == (6,)
    assert float(kl.abs().max()) < 1e-6
    at_reference = _grad_norm(slot, kl)
    # Float rounding only (a flow step's 1/σ² amplifies it): nothing against the
    # gradient of a policy moved by 1e-3 per weight.
    _perturb(slot, 1e-3)
    _, kl = anchored_log_probs(slot, features, state, actions, chain)
    assert float(kl.min()) > 0
    assert at_reference < 1e-3 * _grad_norm(slot, kl)


def _grad_norm(slot: TenantSlot, kl: torch.Tensor) -> float:
    slot.action_module.zero_grad()
    kl.mean().backward()
    grads = [p.grad for p in slot.action_module.parameters() if p.grad is not None]
    assert grads, "the anchor reaches the head's weights"
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_anchor_gradient_pulls_the_policy_back_toward_the_reference(
    base: ResidentBaseModel, kind: str
) -> None:
    slot = _slot(base, HEADS[kind])
    features, state, actions, chain = _inputs(slot, base.hidden_size)
    moves = _perturb(slot, 0.02)
    _, kl = anchored_log_probs(slot, features, state, actions, chain)
    assert float(kl.min()) > 0
    kl.mean().backward()
    # KL ≈ ½ δᵀFδ near the reference, so its gradient Fδ has a positive inner product
    # with the move δ away from it: descending the anchor undoes the move.
    inner = sum(
        float((p.grad * moves[name]).sum())
        for name, p in slot.action_module.named_parameters()
        if p.grad is not None
    )
    assert inner > 0
    # And descending it alone brings the policy back: the KL falls step after step.
    opt = torch.optim.Adam(slot.action_module.parameters(), lr=2e-3)
    before = float(kl.mean())
    for _ in range(30):
        opt.zero_grad()
        _, kl = anchored_log_probs(slot, features, state, actions, chain)
        kl.mean().backward()
        opt.step()
    _, kl = anchored_log_probs(slot, features, state, actions, chain)
    assert float(kl.mean()) < 0.5 * before


def _anchor_only_loss(
    slot: TenantSlot,
    inputs: tuple[BackboneOutput, torch.Tensor, torch.Tensor, torch.Tensor | None],
    old: torch.Tensor,
    config: AlgorithmSpec,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss with zero advantages: the surrogate is 0, the loss is the anchor alone."""
    features, state, actions, chain = inputs
    return policy_loss(
        slot,
        features,
        state,
        actions,
        algorithm="grpo",
        advantages=torch.zeros(actions.shape[0]),
        old_log_probs=old,
        config=config,
        chain=chain,
    )


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_policy_loss_adds_the_weighted_anchor_only_with_a_reference(
    base: ResidentBaseModel, kind: str
) -> None:
    slot = _slot(base, HEADS[kind])
    features, state, actions, chain = _inputs(slot, base.hidden_size)
    old = behaviour_log_probs(slot, features, state, actions, chain).detach()
    config = AlgorithmSpec(name="grpo", kl_coef=0.5)
    _perturb(slot, 0.02)

    def loss() -> tuple[torch.Tensor, dict[str, float]]:
        return _anchor_only_loss(slot, (features, state, actions, chain), old, config)

    value, stats = loss()
    assert stats["kl_ref"] > 0
    assert float(value) == pytest.approx(0.5 * stats["kl_ref"], rel=1e-4, abs=1e-6)
    config = AlgorithmSpec(name="grpo", kl_coef=0.0)  # off
    value, stats = loss()
    assert "kl_ref" not in stats and float(value) == pytest.approx(0.0, abs=1e-6)
    slot.reference_module = None  # a fresh RL tenant: nothing to anchor to
    config = AlgorithmSpec(name="grpo", kl_coef=0.5)
    _, stats = loss()
    assert "kl_ref" not in stats
    with pytest.raises(InvalidRequestError, match="reference policy"):
        anchored_log_probs(slot, features, state, actions, chain)


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_the_budget_lets_the_policy_move_freely_inside_it_and_pulls_back_past_it(
    base: ResidentBaseModel, kind: str
) -> None:
    slot = _slot(base, HEADS[kind])
    features, state, actions, chain = _inputs(slot, base.hidden_size)
    old = behaviour_log_probs(slot, features, state, actions, chain).detach()
    _perturb(slot, 0.02)
    _, kl = anchored_log_probs(slot, features, state, actions, chain)
    per_sample = kl.detach()

    def anchor(budget: float) -> tuple[torch.Tensor, dict[str, float]]:
        slot.action_module.zero_grad()
        config = AlgorithmSpec(name="grpo", kl_coef=0.5, kl_budget=budget)
        value, stats = _anchor_only_loss(slot, (features, state, actions, chain), old, config)
        value.backward()
        return value, stats

    # A budget above every sample's KL: no anchor, no gradient, the KL still reported.
    value, stats = anchor(float(per_sample.max()) * 2)
    assert float(value) == pytest.approx(0.0, abs=1e-7) and stats["kl_excess"] == 0.0
    assert stats["kl_ref"] == pytest.approx(float(per_sample.mean()), rel=1e-4)
    assert all(
        p.grad is None or float(p.grad.abs().max()) == 0.0 for p in slot.action_module.parameters()
    )
    # A budget at the median: only the samples past it count, by their excess.
    budget = float(per_sample.median())
    value, stats = anchor(budget)
    excess = torch.relu(per_sample - budget).mean()
    assert float(value) == pytest.approx(0.5 * float(excess), rel=1e-4)
    assert stats["kl_excess"] == pytest.approx(float(excess), rel=1e-4)
    grads = [p.grad for p in slot.action_module.parameters() if p.grad is not None]
    assert grads and float(torch.stack([g.norm() for g in grads]).sum()) > 0


def test_a_budget_needs_an_anchor() -> None:
    from joynexus.spec.workload import WorkloadSpec

    base = {
        "tenant": "rl",
        "task": "rl",
        "base_model": {"id": "tiny:qwen2_5_vl"},
        "env": {"kind": "reach2d", "num_envs": 2},
        "action_module": {"type": "oft"},
        "algorithm": {"name": "grpo", "group_size": 2, "kl_budget": 1.0},
    }
    with pytest.raises(ValueError, match=r"kl_budget=1\.0 bounds the KL anchor"):
        WorkloadSpec.model_validate(base)
    anchored = WorkloadSpec.model_validate({**base, "init_from": "sft"})
    assert anchored.algorithm.kl_budget == 1.0 and anchored.anchor_coef() > 0
