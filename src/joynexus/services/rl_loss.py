"""Per-tenant policy-gradient losses on top of a slot's Gaussian OFT head.

* ``ppo``: clipped surrogate, value loss (when the tenant has a critic and returns are
  given) and entropy bonus (:func:`joynexus.algorithms.losses.ppo_loss`).
* ``grpo``: the clipped surrogate on group-normalised advantages, no critic (the
  advantages are already normalised by the advantage stage, so they are not
  normalised again per microbatch).
* ``reinforce``: ``-mean(A · log π(a|o))`` minus the entropy bonus, no critic, no ratio.

Flow-matching heads have no tractable log-density here, so RL on them is refused with
a clear error; they support SFT and evaluation.
"""

from __future__ import annotations

from typing import Literal

import torch

from joynexus.algorithms.losses import PPOConfig, ppo_loss
from joynexus.errors import InvalidRequestError
from joynexus.models.heads import OFTHead
from joynexus.models.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.spec.workload import AlgorithmSpec

RLAlgorithm = Literal["ppo", "grpo", "reinforce"]


def gaussian_head(slot: TenantSlot) -> OFTHead:
    """The slot's OFT head, or an error saying RL needs one.

    Raises:
        InvalidRequestError: the tenant's action module is not a Gaussian OFT head.
    """
    head = slot.action_module
    if not isinstance(head, OFTHead):
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: RL (ppo/grpo/reinforce) needs a Gaussian 'oft' "
            f"action module; {type(head).__name__} supports sft and evaluation only",
            tenant_id=slot.tenant_id,
            field="action_module",
        )
    return head


def policy_loss(
    slot: TenantSlot,
    features: BackboneOutput,
    state: torch.Tensor,
    actions: torch.Tensor,
    *,
    algorithm: RLAlgorithm,
    advantages: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    returns: torch.Tensor | None = None,
    config: AlgorithmSpec | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The tenant's RL loss on its rows (with grad through its head and critic).

    Args:
        slot: The tenant slot.
        features: The tenant's rows of the (detached) backbone output.
        state: ``[B, S]`` robot state.
        actions: ``[B, chunk, A]`` behaviour actions.
        algorithm: ``ppo`` | ``grpo`` | ``reinforce``.
        advantages: ``[B]``.
        old_log_probs: ``[B]`` behaviour log-probs (required for ppo / grpo).
        returns: ``[B]`` value targets (ppo with a critic).
        config: Clip ratio and loss coefficients.

    Raises:
        InvalidRequestError: a non-Gaussian head, or ppo/grpo without old log-probs.
    """
    cfg = config or AlgorithmSpec(name=algorithm)
    head = gaussian_head(slot)
    head.train()
    p = next(head.parameters())
    state = state.to(device=p.device, dtype=p.dtype)
    actions = actions.to(device=p.device, dtype=p.dtype)
    advantages = advantages.to(device=p.device, dtype=p.dtype)
    new_log_probs = head.log_prob(features, state, actions)
    entropy = head.entropy()
    if algorithm == "reinforce":
        pg = -(advantages.detach() * new_log_probs).mean()
        loss = pg - cfg.entropy_coef * entropy
        return loss, {"policy_loss": float(pg.detach()), "entropy": float(entropy.detach())}
    if old_log_probs is None:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: {algorithm} needs old (behaviour) log-probs",
            field="old_log_probs",
        )
    values: torch.Tensor | None = None
    if algorithm == "ppo" and slot.value_head is not None and returns is not None:
        slot.value_head.train()
        values = slot.value_head(features, state)
    ppo_cfg = PPOConfig(
        clip_ratio=cfg.clip_ratio,
        value_coef=cfg.value_coef,
        entropy_coef=cfg.entropy_coef,
        normalize_advantages=algorithm == "ppo",
    )
    return ppo_loss(
        new_log_probs,
        old_log_probs.to(new_log_probs),
        advantages,
        values=values,
        returns=None if values is None or returns is None else returns.to(values),
        entropy=entropy,
        config=ppo_cfg,
    )
