"""Flow-SDE policy: chain log-likelihood, its SDE, and grouped = serial for flow heads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from joynexus.errors import SchemaMismatchError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.policies import FlowMatchingHead, FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.policies.flow import chain_log_prob, sample_chain
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from tests.models.conftest import TinyBackbone
from tests.models.reference import serial_forward

D, S, A, CHUNK = 16, 3, 2, 4
CFG = FlowMatchingHeadConfig(hidden_dim=32, num_heads=4, num_layers=1, num_inference_steps=4)


def _head(seed: int = 0, **kw: object) -> FlowMatchingHead:
    torch.manual_seed(seed)
    cfg = CFG.model_copy(update=kw)
    return FlowMatchingHead(cfg, hidden_size=D, state_dim=S, action_dim=A, action_chunk=CHUNK)


def _features(b: int = 6, seed: int = 0) -> tuple[BackboneOutput, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, 5, dtype=torch.long)
    mask[0, :2] = 0  # left padding, as a grouped batch adds
    hs = torch.randn(b, 5, D, generator=g)
    return BackboneOutput(hidden_states=hs, attention_mask=mask), torch.randn(b, S, generator=g)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_log_prob_of_a_chain_matches_the_one_recorded_when_sampling() -> None:
    head = _head()
    f, state = _features()
    actions, logp, chain = head.sample(f, state, generator=_gen(1))
    assert chain.shape == (6, CFG.num_inference_steps + 1, CHUNK, A)
    assert torch.equal(chain[:, -1], actions)
    again = head.log_prob(f, state, chain)
    torch.testing.assert_close(again, logp, rtol=1e-5, atol=1e-4)
    # Importance ratio at the behaviour weights: 1.
    torch.testing.assert_close(torch.exp(again - logp), torch.ones(6), rtol=0, atol=1e-4)
    # Seeded: the same generator state draws the same chain.
    _, logp2, chain2 = head.sample(f, state, generator=_gen(1))
    assert torch.equal(chain2, chain) and torch.equal(logp2, logp)
    # Another policy (other weights) gives the same chain another density.
    assert not torch.allclose(_head(seed=5).log_prob(f, state, chain), logp, atol=1e-2)


def test_masked_entries_do_not_count_and_bad_chains_are_refused() -> None:
    head = _head()
    f, state = _features()
    _, _, chain = head.sample(f, state, generator=_gen(2))
    mask = torch.ones(6, CHUNK, 1)
    mask[:, -1] = 0  # the last chunk step is past the episode's end
    full, masked = head.log_prob(f, state, chain), head.log_prob(f, state, chain, mask)
    moved = chain.clone()
    moved[:, 1:, -1] += 3.0  # a masked-out entry changes...
    torch.testing.assert_close(head.log_prob(f, state, moved, mask), masked)  # ...nothing
    assert not torch.allclose(head.log_prob(f, state, moved), full)
    with pytest.raises(SchemaMismatchError, match="flow_chain"):
        head.log_prob(f, state, chain[:, :, :, :1])
    with pytest.raises(SchemaMismatchError, match="flow_chain"):
        head.log_prob(f, state, chain[:, :1])


def test_the_sde_keeps_the_marginals_of_an_exact_flow() -> None:
    """With the exact velocity of Gaussian data N(m, s²), Flow-SDE samples N(m, s²).

    Without the score term in the drift the injected noise would widen the result
    (std ≈ 0.53 instead of 0.3 here), so this pins the drift's correction.
    """
    m, s = 1.5, 0.3

    def exact(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tt = t[:, None, None]
        var = (1 - tt) ** 2 + tt**2 * s**2
        centred = x - tt * m
        return m + (tt * s**2 - (1 - tt)) / var * centred

    x0 = torch.randn(40_000, 1, 1, generator=_gen(0), dtype=torch.float64)
    chain, logp = sample_chain(exact, x0, steps=200, noise_level=0.8, generator=_gen(1))
    out = chain[:, -1].flatten()
    assert abs(float(out.mean()) - m) < 0.02
    assert abs(float(out.std()) - s) < 0.02
    # The density of a chain is a sum of per-step Gaussians of the schedule's std.
    steps = 200
    expected_log_std = sum(math.log(0.8 * math.sqrt((1 - k / steps) / steps)) for k in range(steps))
    residual = logp + expected_log_std + 0.5 * steps * math.log(2 * math.pi)
    assert float(residual.max()) <= 0  # −½ Σ z² ≤ 0 for every row
    again = chain_log_prob(exact, chain[:8], noise_level=0.8)
    torch.testing.assert_close(again, logp[:8])


def test_a_small_noise_level_is_the_deterministic_ode() -> None:
    head = _head(sde_noise_level=1e-4)
    f, state = _features()
    ode = head.predict(f, state, generator=_gen(3))
    sde, _, _ = head.sample(f, state, generator=_gen(3))
    torch.testing.assert_close(sde, ode, rtol=0, atol=5e-3)


def _one_observation(rows: int) -> tuple[BackboneOutput, torch.Tensor]:
    f, state = _features(b=1)
    hs, mask = f.hidden_states.expand(rows, -1, -1), f.attention_mask.expand(rows, -1)
    return BackboneOutput(hidden_states=hs, attention_mask=mask), state.expand(rows, -1)


def test_ppo_moves_a_flow_policy_in_the_advantages_direction() -> None:
    """On a fixed batch (one observation, 48 sampled chains), the clipped surrogate makes
    positive-advantage chains likelier and negative ones less likely, and both samplers
    (SDE and the deterministic ODE) move their actions towards the advantaged side."""
    head = _head()
    f, state = _one_observation(48)
    actions, old, chain = head.sample(f, state, generator=_gen(4))
    first = actions[:, :, 0].mean(dim=1)
    adv = torch.where(first > first.median(), 1.0, -1.0)  # "more of action dim 0"
    fe, se = _one_observation(256)

    def dim0_means() -> tuple[float, float]:
        sde = head.sample(fe, se, generator=_gen(9))[0][:, :, 0].mean()
        ode = head.predict(fe, se, generator=_gen(9))[:, :, 0].mean()
        return float(sde), float(ode)

    before = dim0_means()
    opt = torch.optim.Adam(head.parameters(), lr=3e-4)
    for _ in range(10):
        ratio = torch.exp(head.log_prob(f, state, chain) - old)
        loss = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        new = head.log_prob(f, state, chain)
    assert float((new - old)[adv > 0].mean()) > 0 > float((new - old)[adv < 0].mean())
    after = dim0_means()
    assert after[0] > before[0] + 0.03 and after[1] > before[1] + 0.03, (before, after)


def _small_schema(name: str, action_dim: int, chunk: int) -> DataSchema:
    return DataSchema(
        name=name,
        cameras={"cam": CameraSpec(height=24, width=24)},
        state_dim=3,
        action_dim=action_dim,
        action_chunk=chunk,
        instruction="reach",
    )


@pytest.fixture
def base(tiny_backbone: TinyBackbone) -> ResidentBaseModel:
    return tiny_backbone("qwen2_5_vl")


def test_grouped_flow_log_probs_equal_serial(base: ResidentBaseModel) -> None:
    """Several tenants in one backbone forward: each flow tenant's sampled chains and
    recomputed log-probs equal those of its own forward (fixed noise)."""
    heads = {
        "fa": (_small_schema("a", 2, 4), CFG),
        "fb": (_small_schema("b", 3, 2), CFG.model_copy(update={"num_inference_steps": 3})),
        "oft": (_small_schema("c", 2, 1), OFTHeadConfig(hidden_dim=32, num_blocks=1)),
    }
    slots = [TenantSlot(t, sch, base, h, seed=i) for i, (t, (sch, h)) in enumerate(heads.items())]
    ex = GroupedExecutor(base, slots)
    batches = {
        t: ObservationBatch.synthetic(sch, 2 + i, seed=i)
        for i, (t, (sch, _)) in enumerate(heads.items())
    }
    grouped = ex.shared_forward(batches)
    serial = serial_forward(ex, batches)
    for tid in ("fa", "fb"):
        slot = ex.slot(tid)
        state = torch.from_numpy(batches[tid].state)
        g = slot.sample(grouped[tid], state, generator=_gen(7))
        s = slot.sample(serial[tid], state, generator=_gen(7))
        assert g.chain is not None and s.chain is not None
        assert g.log_probs is not None and s.log_probs is not None
        np.testing.assert_allclose(g.chain.numpy(), s.chain.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g.log_probs.numpy(), s.log_probs.numpy(), rtol=1e-5)
        head = slot.action_module
        assert isinstance(head, FlowMatchingHead)
        recomputed_g = head.log_prob(grouped[tid], state, s.chain)
        recomputed_s = head.log_prob(serial[tid], state, s.chain)
        torch.testing.assert_close(recomputed_g, recomputed_s, rtol=1e-5, atol=1e-4)
