"""Policy-gradient losses computed per tenant by the actor (never across tenants)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field


class PPOConfig(BaseModel):
    """Knobs of the clipped PPO objective."""

    model_config = ConfigDict(extra="forbid")

    clip_ratio: float = Field(default=0.2, gt=0, lt=1)
    value_coef: float = Field(default=0.5, ge=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    normalize_advantages: bool = True


def ppo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    config: PPOConfig | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss (+ value and entropy terms) over one tenant's samples.

    Args:
        new_log_probs: ``[N]`` log-probabilities of the behaviour actions under the
            current policy (with grad).
        old_log_probs: ``[N]`` log-probabilities recorded at rollout (behaviour policy).
        advantages: ``[N]`` advantages from the advantage stage.
        values: ``[N]`` current value predictions (with grad), if a critic is trained.
        returns: ``[N]`` value targets; required with ``values``.
        entropy: scalar or ``[N]`` policy entropy, for the entropy bonus.
        config: PPO knobs.

    Returns:
        ``(loss, stats)`` where stats holds floats for logging (clip fraction, approx KL).
    """
    cfg = config or PPOConfig()
    adv = advantages.detach()
    if cfg.normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    log_ratio = new_log_probs - old_log_probs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_ratio, 1.0 + cfg.clip_ratio) * adv
    policy_loss = -torch.minimum(unclipped, clipped).mean()
    loss = policy_loss
    stats = {
        "policy_loss": float(policy_loss.detach()),
        "clip_fraction": float(((ratio - 1.0).abs() > cfg.clip_ratio).float().mean()),
        "approx_kl": float(((ratio - 1.0) - log_ratio).mean().detach()),
    }
    if values is not None:
        if returns is None:
            raise ValueError("returns are required when values are given")
        value_loss = 0.5 * (values - returns.detach()).pow(2).mean()
        loss = loss + cfg.value_coef * value_loss
        stats["value_loss"] = float(value_loss.detach())
    if entropy is not None:
        ent = entropy.mean()
        loss = loss - cfg.entropy_coef * ent
        stats["entropy"] = float(ent.detach())
    return loss, stats


def diag_gaussian_kl(
    mean: torch.Tensor,
    std: torch.Tensor,
    ref_mean: torch.Tensor,
    ref_std: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``KL(N(mean, std²) ‖ N(ref_mean, ref_std²))`` per row, summed over the entries
    ``mask`` keeps: ``[B, ...]`` → ``[B]`` (in nats, the units of a log-probability).

    Per entry ``log(σ_ref/σ) + (σ² + (μ − μ_ref)²) / (2σ_ref²) − ½``: zero, with a zero
    gradient, exactly when the two Gaussians agree; its gradient in ``μ`` is
    ``(μ − μ_ref)/σ_ref²``, which pulls the mean back toward the reference.
    """
    # ``mean − ref_mean`` has the full shape; the stds may be per action dim.
    var_ratio = (std / ref_std).pow(2)
    per_entry = 0.5 * (var_ratio + ((mean - ref_mean) / ref_std).pow(2) - 1.0) - torch.log(
        std / ref_std
    )
    if mask is not None:
        per_entry = per_entry * torch.broadcast_to(mask.to(per_entry), per_entry.shape)
    return per_entry.flatten(1).sum(dim=-1)
