"""What a tenant's expert of a LeRobot π0 or π0.5 checkpoint takes from the checkpoint
alike (:class:`LeRobotPiExpert`): its sizes, denoising steps, training-time distribution
and time-embedding periods, the check that the tenant's schema fits, and the pretrained
tensors. The π0.5 expert (:mod:`~joynexus.models.policies.pi05_expert.module`) and
LeRobot's π0 expert (:mod:`~joynexus.models.policies.pi0_expert.lerobot`) add their
layers and their velocity.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from joynexus.models.archs.lerobot_pi.checkpoint import LeRobotPiCheckpoint
from joynexus.models.archs.lerobot_pi.expert import suffix_attention, time_embedding
from joynexus.models.policies.prefix_expert import PrefixFlowExpert
from joynexus.models.types import BackboneOutput


class LeRobotPiExpert(PrefixFlowExpert):
    """A LeRobot π checkpoint's action expert as one tenant's action module.

    Args:
        config: The tenant's expert settings (``num_inference_steps``, ``init``...).
        pi: The resident checkpoint (sizes, settings and pretrained weights).
        hidden_size, state_dim, action_dim, action_chunk: The backbone width and the
            tenant schema's dims.

    Raises:
        SpecError: the schema is wider or longer than the checkpoint allows.
    """

    #: Set by each family: its Gemma expert (layers under lerobot's names) and the
    #: projection that reads the velocity off the action tokens.
    gemma_expert: Any
    action_out_proj: nn.Linear

    def __init__(
        self,
        config: Any,
        *,
        pi: LeRobotPiCheckpoint,
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
        pi.check_dims(
            "tenant", state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk
        )
        self.expert_config = config
        self.label = pi.LABEL
        self.chunk_size = pi.chunk_size
        self.max_action_dim = pi.max_action_dim
        self.max_state_dim = pi.max_state_dim
        self.num_inference_steps = config.num_inference_steps or pi.num_inference_steps
        self._beta_alpha = pi.setting("time_sampling_beta_alpha", 1.5)
        self._time_scale = pi.setting("time_sampling_scale", 0.999)
        self._time_offset = pi.setting("time_sampling_offset", 0.001)
        self._min_period = pi.setting("min_period", 4e-3)
        self._max_period = pi.setting("max_period", 4.0)

    def load_pretrained(self, pi: LeRobotPiCheckpoint) -> None:
        """Start from the checkpoint's expert (``init: pretrained``; a subclass calls it
        once its modules exist).

        Raises:
            ValueError: the checkpoint lacks one of the expert's tensors.
        """
        if self.expert_config.init != "pretrained":
            return
        missing = set(self.state_dict()) - set(pi.expert_state)
        if missing:
            raise ValueError(f"{pi.LABEL} checkpoint lacks expert tensors {sorted(missing)[:4]}")
        self.load_state_dict(pi.expert_state, strict=False)

    def expert_state(self) -> dict[str, torch.Tensor]:
        """The expert's tensors under the names the checkpoint class gives them."""
        return dict(self.state_dict())

    def time_embedding(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """The flow time's sine-cosine embedding ``[B, width]`` with the checkpoint's
        periods, in the expert's dtype."""
        emb = time_embedding(t.float(), width, self._min_period, self._max_period)
        return emb.to(self.action_out_proj.weight.dtype)

    def run_suffix(
        self,
        features: BackboneOutput,
        tokens: torch.Tensor,
        sees: torch.Tensor,
        **expert_inputs: Any,
    ) -> torch.Tensor:
        """The velocity ``[B, chunk_size, max_action_dim]``: the suffix ``tokens`` through
        the expert over the shared prefix's KV cache, read off the last ``chunk_size``.

        Args:
            features: The backbone's output (its prefix KV cache and attention mask).
            tokens: The suffix embeddings ``[B, L, width]``.
            sees: ``[L, L]`` which suffix token attends to which (every one sees the
                valid prefix).
            expert_inputs: What else the expert's forward takes (π0.5's time condition).

        Raises:
            ValueError: the backbone produced no prefix KV cache.
        """
        if features.prefix_kv is None:
            raise ValueError(
                f"the {self.label} expert needs the prefix KV cache "
                "(BackboneOutput.prefix_kv); the base model did not produce one"
            )
        cache_utils = importlib.import_module("transformers.cache_utils")
        # A fresh cache per call: the expert's layers append their keys and values.
        cache = cache_utils.DynamicCache(ddp_cache_data=list(features.prefix_kv))
        ref = self.action_out_proj.weight
        mask, positions = suffix_attention(features.attention_mask.bool(), sees, ref.dtype)
        out = self.gemma_expert(
            inputs_embeds=tokens,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            **expert_inputs,
        )
        hidden = out.last_hidden_state[:, -self.chunk_size :]
        velocity: torch.Tensor = self.action_out_proj(hidden.to(ref.dtype))
        return velocity
