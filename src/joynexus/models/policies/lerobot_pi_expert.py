"""What a tenant's expert of a LeRobot π0 or π0.5 checkpoint takes from the checkpoint
alike (:class:`LeRobotPiExpert`): its sizes, denoising steps, training-time distribution
and time-embedding periods, the check that the tenant's schema fits, and the pretrained
tensors. The π0.5 expert (:mod:`~joynexus.models.policies.pi05_expert.module`) and
LeRobot's π0 expert (:mod:`~joynexus.models.policies.pi0_expert.lerobot`) add their
layers and their velocity.
"""

from __future__ import annotations

from typing import Any

import torch

from joynexus.models.archs.lerobot_pi.checkpoint import LeRobotPiCheckpoint
from joynexus.models.archs.lerobot_pi.expert import time_embedding
from joynexus.models.policies.prefix_expert import PrefixFlowExpert


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
