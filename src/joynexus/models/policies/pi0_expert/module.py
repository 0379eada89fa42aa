"""A tenant's private π0 action expert, attending to the shared PaliGemma prefix KV cache.

The module holds exactly the expert half of ``transformers``' ``PI0ForConditionalGeneration``
under the same names (``model.dit``, ``embed_action_time``, ``action_out_proj``) and runs
``transformers``' own forward code on it, with the prefix cache coming from the resident
backbone (:attr:`~joynexus.models.types.BackboneOutput.prefix_kv`). So a tenant's expert
computes what the checkpoint's expert computes, and exports back into a complete
checkpoint key for key (:func:`joynexus.models.checkpoints.pi0_export.export_pi0`).

The time convention, the padding of a narrower schema, the loss, the sampler and RL
(Flow-SDE) are :class:`~joynexus.models.policies.prefix_expert.PrefixFlowExpert`'s,
shared with the SmolVLA expert; this module supplies π0's velocity.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch
from torch import nn

from joynexus.models.archs.paligemma.pi0 import EXPERT_EMBED_KEY, Pi0Checkpoint, hf_pi0
from joynexus.models.policies.base import PolicyHead
from joynexus.models.policies.pi0_expert.config import (
    PI0_EXPERT_NEEDS,
    Pi0ExpertConfig,
    pi0_resident_of,
)
from joynexus.models.policies.pi0_expert.lerobot import LeRobotPi0Expert
from joynexus.models.policies.prefix_expert import PrefixFlowExpert
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput


class _Pi0Suffix(nn.Module):
    """``PI0Model`` without its VLM: transformers' suffix path (the expert over a given
    prefix cache). ``PI0Model.forward`` reads only ``config`` and ``dit`` when it gets a
    cache and no pixels, which is all this module has."""

    def __init__(self, config: Any, dit: nn.Module):
        super().__init__()
        self.config = config
        self.dit = dit

    def forward(self, **kwargs: Any) -> Any:
        return hf_pi0().PI0Model.forward(self, **kwargs)


class Pi0Expert(PrefixFlowExpert):
    """The action expert of a π0 checkpoint as one tenant's action module.

    Args:
        config: The tenant's expert settings.
        pi0: The resident π0 checkpoint (architecture and pretrained weights).
        hidden_size, state_dim, action_dim, action_chunk: The backbone width and the
            tenant schema's dims.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    def __init__(
        self,
        config: Pi0ExpertConfig,
        *,
        pi0: Pi0Checkpoint,
        hidden_size: int,
        state_dim: int,
        action_dim: int,
        action_chunk: int,
    ):
        super().__init__(
            hidden_size=hidden_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_chunk=action_chunk,
        )
        pi0.check_dims(
            "tenant", state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk
        )
        hf_config = pi0.config
        self.expert_config = config
        # ``config`` is what transformers' forward code reads (the PI0Config).
        self.config = hf_config
        self.chunk_size = pi0.chunk_size
        self.max_action_dim = pi0.max_action_dim
        self.max_state_dim = pi0.max_state_dim
        self.num_inference_steps = config.num_inference_steps or pi0.num_inference_steps
        self._beta_alpha = float(hf_config.time_sampling_beta_alpha)
        self._time_scale = float(hf_config.time_sampling_scale)
        self._time_offset = float(hf_config.time_sampling_offset)
        hf = importlib.import_module("transformers")
        dit_config = copy.deepcopy(hf_config.dit_config)
        dit: Any = hf.AutoModel.from_config(dit_config)
        # The expert always gets embeddings, never token ids: no vocabulary table.
        dit.embed_tokens = None
        self.model = _Pi0Suffix(hf_config, dit)
        self.embed_action_time = hf_pi0().PI0ActionTimeEmbedding(hf_config)
        self.action_out_proj = nn.Linear(int(dit_config.hidden_size), self.max_action_dim)
        if config.init == "pretrained":
            state = {k: v for k, v in pi0.expert_state.items() if k != EXPERT_EMBED_KEY}
            self.load_state_dict(state, strict=True)

    # --- the checkpoint's names ------------------------------------------------------

    def expert_state(self) -> dict[str, torch.Tensor]:
        """The expert's tensors under their ``PI0ForConditionalGeneration`` names."""
        return dict(self.state_dict())

    # --- compute ---------------------------------------------------------------------

    def velocity(
        self,
        features: BackboneOutput,
        padded_state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's velocity ``[B, chunk_size, max_action_dim]`` at ``x`` and ``t``.

        Args:
            features: This tenant's rows of the prefix (with ``prefix_kv``).
            padded_state: ``[B, max_state_dim]``.
            x: ``[B, chunk_size, max_action_dim]`` noisy chunk.
            t: ``[B]`` times (float32).
        """
        if features.prefix_kv is None:
            raise ValueError(
                "pi0_expert needs the π0 prefix KV cache (BackboneOutput.prefix_kv); "
                "the base model did not produce one"
            )
        cache_utils = importlib.import_module("transformers.cache_utils")
        # A fresh cache per call: the expert's layers append their own keys and values,
        # which must never leak into the next denoising step (or another tenant).
        cache = cache_utils.DynamicCache(ddp_cache_data=list(features.prefix_kv))
        out = hf_pi0().PI0ForConditionalGeneration.forward(
            self,
            state=padded_state,
            noise=x,
            timestep=t,
            attention_mask=features.attention_mask,
            cache=cache,
        )
        velocity: torch.Tensor = out.logits
        return velocity


def build_pi0_expert(
    config: Pi0ExpertConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    """A tenant's expert from the resident π0 checkpoint (its expert for ``init:
    pretrained``): transformers' π0 expert, or a LeRobot π0 one on a LeRobot ``pi0``
    base model.

    Raises:
        SpecError: no π0 base model, or a schema that does not fit its checkpoint.
    """
    pi0 = pi0_resident_of(base, what=PI0_EXPERT_NEEDS)
    dims = {
        "hidden_size": hidden_size,
        "state_dim": schema.state_dim,
        "action_dim": schema.action_dim,
        "action_chunk": schema.action_chunk,
    }
    if isinstance(pi0, Pi0Checkpoint):
        return Pi0Expert(config, pi0=pi0, **dims)
    return LeRobotPi0Expert(config, pi0=pi0, **dims)
