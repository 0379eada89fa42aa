"""A tenant's private π0 action expert from a LeRobot π0 checkpoint (``type: pi0``),
attending to the shared PaliGemma prefix's KV cache.

What LeRobot's π0 computes, and this module computes as lerobot 0.6.1 does (against
π0.5's expert, :mod:`~joynexus.models.policies.pi05_expert.module`):

* **The state is a token.** ``state_proj`` maps the padded, normalized state to one
  token in front of the action tokens (the prompt carries no state).
* **Time is mixed into each action token.** The flow time's sine-cosine embedding
  (float64, then float32) is concatenated to each ``action_in_proj`` token and goes
  through ``action_time_mlp_in`` → SiLU → ``action_time_mlp_out``; the expert's norms
  are plain Gemma RMS norms (no adaptive conditioning, no gated residuals). The layers
  are ``transformers``' own Gemma layers under lerobot's names.
* **Blocks.** The state token sees the valid prefix and itself; the action tokens see
  the valid prefix, the state and each other; positions continue after the prefix's
  valid tokens.

``action_out_proj`` reads the velocity off the action tokens. The time convention,
padding of a narrower schema, loss, sampler and Flow-SDE are
:class:`~joynexus.models.policies.prefix_expert.PrefixFlowExpert`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from joynexus.models.archs.hf import hf
from joynexus.models.archs.lerobot_pi.checkpoint import Pi0LeRobotCheckpoint
from joynexus.models.policies.lerobot_pi_expert import LeRobotPiExpert
from joynexus.models.policies.pi0_expert.config import Pi0ExpertConfig
from joynexus.models.types import BackboneOutput


class LeRobotPi0Expert(LeRobotPiExpert):
    """The action expert of a LeRobot π0 checkpoint as one tenant's action module.

    Args:
        config: The tenant's expert settings.
        pi0: The resident LeRobot π0 checkpoint (sizes, settings, pretrained weights).
        hidden_size, state_dim, action_dim, action_chunk: The backbone width and the
            tenant schema's dims.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    def __init__(
        self,
        config: Pi0ExpertConfig,
        *,
        pi0: Pi0LeRobotCheckpoint,
        hidden_size: int,
        state_dim: int,
        action_dim: int,
        action_chunk: int,
    ):
        super().__init__(
            config,
            pi=pi0,
            hidden_size=hidden_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_chunk=action_chunk,
        )
        width = pi0.expert_sizes.width
        gemma_expert: Any = hf().GemmaModel(pi0.expert_sizes.hf_config())
        # The expert is fed embeddings, never token ids: no vocabulary table.
        gemma_expert.embed_tokens = None
        # lerobot's denoising step runs eager attention with an explicit additive mask.
        gemma_expert.config._attn_implementation = "eager"
        self.gemma_expert = gemma_expert
        self.state_proj = nn.Linear(self.max_state_dim, width)
        self.action_in_proj = nn.Linear(self.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, self.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.load_pretrained(pi0)

    def suffix(self, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The suffix tokens ``[B, 1 + chunk_size, width]``: the state's, then each
        noisy action's mixed with the time's embedding."""
        ref = self.action_in_proj.weight
        actions = self.action_in_proj(x.to(ref.dtype))
        emb = self.time_embedding(t, int(actions.shape[-1]))[:, None, :].expand_as(actions)
        mixed = self.action_time_mlp_out(
            F.silu(self.action_time_mlp_in(torch.cat([actions, emb], 2)))
        )
        return torch.cat([self.state_proj(state.to(ref.dtype))[:, None, :], mixed], dim=1)

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk_size, max_action_dim]`` at ``x`` and ``t``."""
        tokens = self.suffix(padded_state, x, t)
        length = int(tokens.shape[1])
        # The state token sees itself only; the action tokens see the state and each other.
        sees = torch.ones((length, length), dtype=torch.bool, device=tokens.device)
        sees[0, 1:] = False
        return self.run_suffix(features, tokens, sees)
