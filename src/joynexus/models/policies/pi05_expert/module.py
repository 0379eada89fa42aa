"""A tenant's private π0.5 action expert, attending to the shared PaliGemma prefix KV cache.

What π0.5 changes against π0, and this module computes as lerobot does:

* **Adaptive RMSNorm time conditioning.** The flow time is not mixed into the action
  tokens; it becomes a sinusoidal embedding (computed in float64, as lerobot's
  ``create_sinusoidal_pos_embedding`` on the CPU, then float32), through
  ``time_mlp_in`` → SiLU → ``time_mlp_out`` → SiLU, and conditions *every* norm of the
  expert: each norm's ``dense`` layer maps it to a scale, a shift and a gate, and the
  residual branches are gated (``x + gate · f(x)``). The layers are ``transformers``'
  own π0.5 expert layers (``PI05ActionExpertModel``: Gemma attention and MLP, adaptive
  norms), under lerobot's parameter names.
* **No state token.** The state reached the prefix as text (the resident writes it into
  the prompt); :meth:`Pi05Expert.velocity` ignores the padded state it is handed.

The suffix is the noisy chunk through ``action_in_proj``; it sees every valid prefix
token and itself (one bidirectional block), positions continue after the prefix's
valid tokens, and ``action_out_proj`` reads the velocity off. The time convention,
padding of a narrower schema, loss, sampler and Flow-SDE are
:class:`~joynexus.models.policies.prefix_expert.PrefixFlowExpert`'s.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from joynexus.models.archs.lerobot_pi.checkpoint import Pi05Checkpoint
from joynexus.models.policies.base import PolicyHead
from joynexus.models.policies.lerobot_pi_expert import LeRobotPiExpert
from joynexus.models.policies.pi05_expert.config import (
    PI05_EXPERT_NEEDS,
    Pi05ExpertConfig,
    pi05_checkpoint_of,
)
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput


def _hf_pi05() -> Any:
    return importlib.import_module("transformers.models.pi05.modeling_pi05")


class Pi05Expert(LeRobotPiExpert):
    """The action expert of a π0.5 checkpoint as one tenant's action module.

    Args:
        config: The tenant's expert settings.
        pi05: The resident π0.5 checkpoint (sizes, settings and pretrained weights).
        hidden_size, state_dim, action_dim, action_chunk: The backbone width and the
            tenant schema's dims.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    def __init__(
        self,
        config: Pi05ExpertConfig,
        *,
        pi05: Pi05Checkpoint,
        hidden_size: int,
        state_dim: int,
        action_dim: int,
        action_chunk: int,
    ):
        super().__init__(
            config,
            pi=pi05,
            hidden_size=hidden_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_chunk=action_chunk,
        )
        sizes = pi05.expert_sizes
        width = sizes.width
        expert_config = sizes.hf_config()
        gemma_expert: Any = _hf_pi05().PI05ActionExpertModel(expert_config)
        # lerobot's denoising step runs eager attention with an explicit additive mask.
        gemma_expert.config._attn_implementation = "eager"
        self.gemma_expert = gemma_expert
        self.action_in_proj = nn.Linear(self.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, self.max_action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        self.load_pretrained(pi05)

    def time_condition(self, t: torch.Tensor) -> torch.Tensor:
        """What modulates every norm: ``silu(time_mlp_out(silu(time_mlp_in(emb(t)))))``."""
        emb = self.time_embedding(t, self.action_in_proj.out_features)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk_size, max_action_dim]`` at ``x`` and ``t``
        (``padded_state`` is unused: π0.5's state is in the prefix's prompt)."""
        ref = self.action_in_proj.weight
        actions = self.action_in_proj(x.to(ref.dtype))
        chunk = int(actions.shape[1])
        # One bidirectional block of action tokens over the valid prefix.
        block = torch.ones((chunk, chunk), dtype=torch.bool, device=ref.device)
        return self.run_suffix(
            features, actions, block, timestep_embeds=self.time_condition(t.float())
        )


def build_pi05_expert(
    config: Pi05ExpertConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A tenant's expert from the resident π0.5 checkpoint (its expert for ``init:
    pretrained``).

    Raises:
        SpecError: no π0.5 base model, or a schema that does not fit its checkpoint.
    """
    return Pi05Expert(
        config,
        pi05=pi05_checkpoint_of(base, what=PI05_EXPERT_NEEDS),
        hidden_size=hidden_size,
        state_dim=schema.state_dim,
        action_dim=schema.action_dim,
        action_chunk=schema.action_chunk,
    )
