"""Per-tenant policy-gradient losses on a slot's stochastic policy.

The policy is the slot's head through its :class:`~joynexus.models.policies.PolicyHead`
contract: a Gaussian OFT head gives the log-density of the action chunk, a flow head
(DiT or a checkpoint's expert) as a Flow-SDE policy the log-density of the recorded denoising chain
(:mod:`joynexus.models.policies.flow`). The losses only see log-probabilities:

* ``ppo``: clipped surrogate, value loss (when the tenant has a critic and returns are
  given) and entropy bonus (:func:`joynexus.algorithms.losses.ppo_loss`).
* ``grpo``: the clipped surrogate on group-normalised advantages, no critic (the
  advantages are already normalised by the advantage stage, so they are not
  normalised again per microbatch).
* ``reinforce``: ``-mean(A · log π(a|o))`` minus the entropy bonus, no critic, no ratio.

Each adds the KL anchor ``kl_coef · mean max(0, KL(π ‖ π_ref) − kl_budget)`` when the slot
has a reference policy (the SFT policy it started from, frozen: ``init_from``). The KL is
exact, not a sampled estimate: both heads give their density at the behaviour samples as Gaussians
(one over the chunk for a Gaussian head; one per Flow-SDE step, given the recorded
chain, for a flow head), so it is a sum of closed-form Gaussian KLs in nats per chunk.
It vanishes with its gradient at the reference and pulls the policy back toward it
(SimpleVLA-RL's and π_RL's guard against RL walking away from what SFT learned). On a
LoRA tenant both heads read the same (current) features: the head is anchored, the
adapter is not.

A head's log-probabilities may need fields its rollout recorded (``rl_fields``: a flow
head's chain, partition field ``flow_chain``); a head whose entropy does not depend on
its weights (a flow head: the SDE's noise schedule is fixed, see the spec check) has no
entropy bonus, and every head's critic is the same
:class:`~joynexus.models.policies.ValueHead` on the shared prefix features.
"""

from __future__ import annotations

from typing import Literal

import torch

from joynexus.algorithms.losses import PPOConfig, diag_gaussian_kl, ppo_loss
from joynexus.errors import InvalidRequestError
from joynexus.models.policies import PolicyHead
from joynexus.models.policies.flow import gaussian_log_density
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput
from joynexus.services.samples import FLOW_CHAIN
from joynexus.spec.workload import AlgorithmSpec

RLAlgorithm = Literal["ppo", "grpo", "reinforce"]


def rl_head(slot: TenantSlot) -> PolicyHead:
    """The slot's action module if RL can train it, else an error saying what can.

    Raises:
        InvalidRequestError: the tenant's action module has no policy log-density.
    """
    head = slot.action_module
    if not head.supports_rl:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: RL (ppo/grpo/reinforce) needs an action module with "
            f"a policy log-density (a Gaussian or Flow-SDE head); action_module type "
            f"{slot.head_config.type!r} supports sft and evaluation only",
            tenant_id=slot.tenant_id,
            field="action_module",
        )
    return head


def rl_fields(slot: TenantSlot) -> list[str]:
    """Partition fields the slot's policy needs besides observations and actions."""
    return list(rl_head(slot).rl_fields)


def behaviour_log_probs(
    slot: TenantSlot,
    features: BackboneOutput,
    state: torch.Tensor,
    actions: torch.Tensor,
    chain: torch.Tensor | None,
) -> torch.Tensor:
    """Log-probabilities ``[B]`` of the behaviour samples under the slot's current policy.

    Args:
        chain: ``[B, steps + 1, chunk, A]`` recorded Flow-SDE chains (flow heads).

    Raises:
        InvalidRequestError: a head whose recorded rollout fields are missing.
    """
    head = rl_head(slot)
    return head.rl_log_prob(features, state, actions, _recorded(slot, head, chain))


def _recorded(
    slot: TenantSlot, head: PolicyHead, chain: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    recorded = {FLOW_CHAIN: chain} if chain is not None else {}
    missing = [name for name in head.rl_fields if name not in recorded]
    if missing:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: RL on a {slot.head_config.type!r} head needs "
            f"{missing[0]!r} for each sample (recorded by rollouts); these samples carry none",
            tenant_id=slot.tenant_id,
            field=missing[0],
        )
    return recorded


def anchored_log_probs(
    slot: TenantSlot,
    features: BackboneOutput,
    state: torch.Tensor,
    actions: torch.Tensor,
    chain: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities ``[B]`` of the behaviour samples under the current policy and
    their KL ``[B]`` to the slot's reference policy, from one forward of each head.

    Raises:
        InvalidRequestError: no reference policy, a head without Gaussian densities, or
            samples without the fields it needs.
    """
    head = rl_head(slot)
    reference = slot.reference_module
    if reference is None:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: the KL anchor needs a reference policy (the one "
            "an init_from workload starts from); this tenant has none",
            tenant_id=slot.tenant_id,
            field="algorithm.kl_coef",
        )
    recorded = _recorded(slot, head, chain)
    try:
        current = head.rl_gaussians(features, state, actions, recorded)
    except NotImplementedError:
        raise InvalidRequestError(
            f"tenant {slot.tenant_id!r}: a {slot.head_config.type!r} head gives no Gaussian "
            "policy density, so no KL anchor; set algorithm.kl_coef: 0",
            tenant_id=slot.tenant_id,
            field="algorithm.kl_coef",
        ) from None
    with torch.no_grad():
        ref = reference.rl_gaussians(features, state, actions, recorded)
    log_probs = gaussian_log_density(current.sample, current.mean, current.std, current.mask)
    kl = diag_gaussian_kl(current.mean, current.std, ref.mean, ref.std, current.mask)
    return log_probs, kl


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
    chain: torch.Tensor | None = None,
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
        config: Clip ratio and loss coefficients (``kl_coef``: the KL anchor's weight,
            applied when the slot has a reference policy; ``kl_budget``: the KL per
            sample the anchor lets pass).
        chain: ``[B, steps + 1, chunk, A]`` recorded Flow-SDE chains (flow heads).

    Raises:
        InvalidRequestError: a head without a policy log-density, samples without the
            fields it needs, or ppo/grpo without old log-probs.
    """
    cfg = config or AlgorithmSpec(name=algorithm)
    head = rl_head(slot)
    head.train()
    p = next(head.parameters())
    state = state.to(device=p.device, dtype=p.dtype)
    actions = actions.to(device=p.device, dtype=p.dtype)
    advantages = advantages.to(device=p.device, dtype=p.dtype)
    kl_coef = cfg.kl_coef or 0.0
    kl: torch.Tensor | None = None
    if kl_coef > 0 and slot.reference_module is not None:
        new_log_probs, kl = anchored_log_probs(slot, features, state, actions, chain)
    else:
        new_log_probs = behaviour_log_probs(slot, features, state, actions, chain)
    loss, stats = _surrogate(
        slot,
        head,
        features,
        state,
        algorithm,
        new_log_probs,
        advantages,
        old_log_probs,
        returns,
        cfg,
    )
    if kl is None:
        return loss, stats
    # Past the budget only: inside it the policy moves freely (kl_budget 0: everywhere).
    anchor = torch.relu(kl - cfg.kl_budget).mean() if cfg.kl_budget > 0 else kl.mean()
    stats["kl_ref"] = float(kl.detach().mean())
    if cfg.kl_budget > 0:
        stats["kl_excess"] = float(anchor.detach())
    return loss + kl_coef * anchor, stats


def _surrogate(
    slot: TenantSlot,
    head: PolicyHead,
    features: BackboneOutput,
    state: torch.Tensor,
    algorithm: RLAlgorithm,
    new_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    returns: torch.Tensor | None,
    cfg: AlgorithmSpec,
) -> tuple[torch.Tensor, dict[str, float]]:
    entropy = head.entropy()
    if algorithm == "reinforce":
        pg = -(advantages.detach() * new_log_probs).mean()
        stats = {"policy_loss": float(pg.detach())}
        if entropy is None:
            return pg, stats
        stats["entropy"] = float(entropy.detach())
        return pg - cfg.entropy_coef * entropy, stats
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
