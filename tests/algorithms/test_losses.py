import pytest
import torch

from joynexus.algorithms.losses import PPOConfig, diag_gaussian_kl, ppo_loss


def test_ppo_on_policy_gradient_matches_policy_gradient() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 2.0])
    cfg = PPOConfig(normalize_advantages=False)
    loss, stats = ppo_loss(logp, logp.detach(), adv, config=cfg)
    loss.backward()
    assert logp.grad is not None
    # At ratio 1 the clipped objective's gradient is -adv / N.
    torch.testing.assert_close(logp.grad, -adv / 3)
    assert stats["clip_fraction"] == 0.0


def test_ppo_clipping_stops_gradient_outside_trust_region() -> None:
    old = torch.zeros(1)
    new = torch.tensor([0.5], requires_grad=True)  # ratio e^0.5 ≈ 1.65 > 1.2
    loss, stats = ppo_loss(
        new, old, torch.tensor([1.0]), config=PPOConfig(normalize_advantages=False)
    )
    loss.backward()
    assert new.grad is not None and float(new.grad.abs().sum()) == 0.0
    assert stats["clip_fraction"] == 1.0


def test_ppo_value_and_entropy_terms() -> None:
    logp = torch.zeros(2, requires_grad=True)
    values = torch.tensor([1.0, 3.0], requires_grad=True)
    returns = torch.tensor([2.0, 3.0])
    cfg = PPOConfig(value_coef=1.0, entropy_coef=0.1, normalize_advantages=False)
    loss, stats = ppo_loss(
        logp,
        logp.detach(),
        torch.zeros(2),
        values=values,
        returns=returns,
        entropy=torch.tensor(2.0),
        config=cfg,
    )
    assert abs(stats["value_loss"] - 0.25) < 1e-6
    assert abs(float(loss) - (0.25 - 0.2)) < 1e-6


def test_diag_gaussian_kl_is_the_closed_form_and_pulls_the_mean_back() -> None:
    mean = torch.tensor([[[0.5, -1.0]]], requires_grad=True)
    ref_mean = torch.tensor([[[0.0, 0.0]]])
    std, ref_std = torch.tensor([0.2, 0.4]), torch.tensor([0.4, 0.4])
    kl = diag_gaussian_kl(mean, std, ref_mean, ref_std)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean.detach(), std),
        torch.distributions.Normal(ref_mean, ref_std),
    ).sum()
    assert float(kl.sum()) == pytest.approx(float(expected), rel=1e-6)
    kl.sum().backward()
    assert mean.grad is not None  # (μ − μ_ref)/σ_ref²: back toward the reference
    torch.testing.assert_close(mean.grad, (mean.detach() - ref_mean) / ref_std**2)
    masked = diag_gaussian_kl(mean, std, ref_mean, ref_std, torch.tensor([1.0, 0.0]))
    assert float(masked.sum()) == pytest.approx(float(kl.sum()) - 0.5 / 0.16, rel=1e-5)
